"""Generation with the recurrent state reproduces the chunk form's logits position by position."""

import pytest
import torch

from linrope.models.model import TransformerLM
from linrope.positions import REGISTRY
from tests.evaluation.helpers import compose_generate, tiny

# every scheme linear attention takes; RoPE also with the cosine features rotated in both places
LINEAR = [{"name": n} for n, cls in sorted(REGISTRY.items()) if cls.linear_ok]
CASES = [(p, {}) for p in LINEAR] + [({"name": "rope"}, {"feature_map": "cosine", "placement": "both"})]


@pytest.mark.parametrize(
    "position,attention", CASES, ids=["-".join(map(str, [*p.values(), *a.values()])) for p, a in CASES]
)
@pytest.mark.parametrize("short_conv", [0, 3])
def test_recurrent_steps_match_chunk_logits(position, attention, short_conv):
    """With a short convolution the state also carries its last inputs."""
    model = tiny(position, short_conv, **attention)
    idx = torch.randint(0, 256, (2, 37), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model(idx)
        # a prompt of 5 tokens through the chunk form, then one token at a time with the state
        logits, states = model(idx[:, :5], return_states=True)
        steps = [logits]
        for t in range(5, idx.shape[1]):
            logits, states = model(idx[:, t : t + 1], offset=t, states=states, return_states=True)
            steps.append(logits)
    stepped = torch.cat(steps, dim=1)
    torch.testing.assert_close(stepped, full, rtol=1e-10, atol=1e-10)


def test_generate_is_seeded_and_constant_state():
    model = tiny({"name": "rope"}).float()
    prompt = torch.tensor([[100, 101, 102]])
    a = model.generate(prompt, 20, generator=torch.Generator().manual_seed(3))
    b = model.generate(prompt, 20, generator=torch.Generator().manual_seed(3))
    assert a.shape == (1, 23) and torch.equal(a, b) and torch.equal(a[:, :3], prompt)
    # the state carried per layer does not grow with the number of generated tokens
    _, s1 = model(prompt, return_states=True)
    _, s2 = model(torch.randint(0, 256, (1, 50)), return_states=True)
    assert [tuple(s.S.shape) for s in s1] == [tuple(s.S.shape) for s in s2]


def test_generate_text_with_randomized_positions_is_seeded():
    """A model that draws its positions (randomized positions) draws them from the global RNG: generate_text seeds
    that too, so seed= fixes the text (three calls with seed 0 gave three texts), and leaves the caller's RNG as it
    was."""
    from linrope.evaluation.generate import generate_text
    from linrope.models.model import TransformerLM

    torch.manual_seed(0)
    model = TransformerLM(
        dict(vocab_size=256, d_model=32, n_layers=2, n_heads=4, d_ff=64, max_len=64, attention={"kind": "softmax"},
             position={"name": "rope", "max_position": 128})
    )  # fmt: skip
    texts = []
    for state in (1, 2):
        torch.manual_seed(state)
        before = torch.get_rng_state()
        texts.append(generate_text(model, "ab", 12, seed=0))
        assert torch.equal(torch.get_rng_state(), before)  # the caller's RNG untouched
    assert texts[0] == texts[1]
    assert generate_text(model, "ab", 12, seed=1) != texts[0]


def test_generate_command_on_a_trained_checkpoint(compose, small_corpus, capsys):
    """python -m linrope generate ckpt=... (conf/generate.yaml) samples prompt + bytes from a real checkpoint."""
    from pathlib import Path

    from hydra.errors import ConfigCompositionException

    import train
    from linrope.base.errors import CheckpointError
    from linrope.evaluation.generate import generate

    cfg = compose(
        "model=linear_rope",
        "size=tiny",
        "logger=none",
        "trainer.enable_progress_bar=false",
        f"data.path={small_corpus}",
        "trainer.max_steps=2",
        "trainer.val_check_interval=2",
        "data.val_windows=2",
        "data.test_windows=2",
        "data.batch_size=4",
        "test=false",
    )
    train.main(cfg)
    capsys.readouterr()  # drop the training output
    ckpt = Path(cfg.paths.output_dir, "checkpoints", "last.ckpt")
    assert ckpt.exists()
    out = generate(compose_generate(f"ckpt={ckpt}", "prompt='def main('", "max_new_tokens=40", "seed=1"))
    assert out.startswith("def main(") and len(out.encode("utf-8", errors="replace")) >= 40
    again = generate(compose_generate(f"ckpt={ckpt}", "prompt='def main('", "max_new_tokens=40", "seed=1"))
    assert again == out  # seeded
    with pytest.raises(ConfigCompositionException, match="tokens"):
        compose_generate(f"ckpt={ckpt}", "tokens=3")  # an unknown key: Hydra refuses it

    # a checkpoint whose model config linrope does not build: one line naming the problem, not a traceback
    saved = torch.load(ckpt, weights_only=True)
    d = saved["hyper_parameters"]["model"]["d_model"]
    saved["hyper_parameters"]["model"]["n_heads"] = d  # head dimension 1
    odd = ckpt.with_name("odd-head.ckpt")
    torch.save(saved, odd)
    with pytest.raises(
        CheckpointError, match=f"position=rope needs an even head dimension, but d_model/n_heads = {d}/{d}"
    ):
        generate(compose_generate(f"ckpt={odd}"))


@pytest.mark.parametrize("kind", ["linear", "softmax"])
def test_a_model_with_a_short_convolution_stays_causal(kind):
    torch.manual_seed(0)
    model = (
        TransformerLM(
            dict(
                d_model=16,
                n_heads=2,
                n_layers=2,
                d_ff=32,
                max_len=32,
                short_conv=4,
                attention={"kind": kind},
                position={"name": "rope"},
            )
        )
        .double()
        .eval()
    )
    idx = torch.randint(0, 256, (1, 20), generator=torch.Generator().manual_seed(2))
    other = idx.clone()
    other[0, 9] = (idx[0, 9] + 1) % 256
    with torch.no_grad():
        a, b = model(idx), model(other)
    assert torch.equal(a[:, :9], b[:, :9]) and not torch.equal(a[:, 9:], b[:, 9:])


@pytest.mark.parametrize("causal", [True, False])
def test_the_short_convolution_reaches_its_kernel_and_continues_from_its_tail(causal):
    """A causal kernel of 4 moves outputs t … t+3 when input t changes (centred: t-2 … t+1); fed in two pieces
    with the tail carried, it gives what the whole sequence gives."""
    from linrope.models.model import ShortConv

    torch.manual_seed(0)
    conv = ShortConv(8, 4, causal).double()
    h = torch.randn(2, 20, 8, dtype=torch.float64)
    other = h.clone()
    other[:, 9] += 1.0
    with torch.no_grad():
        (a, _), (b, _) = conv(h), conv(other)
        moved = [t for t in range(20) if not torch.equal(a[:, t], b[:, t])]
        assert moved == ([9, 10, 11, 12] if causal else [7, 8, 9, 10])
        if causal:
            first, tail = conv(h[:, :7])
            second, _ = conv(h[:, 7:], tail)
            torch.testing.assert_close(torch.cat([first, second], 1), a, rtol=1e-12, atol=1e-12)


def test_the_prompt_is_written_after_the_model_has_read_it():
    """A line the first forward prints (impl=auto says which kernel it took) came between the prompt and the
    sample in a terminal, reading as model output: the prompt is written once the model has read it."""
    from linrope.evaluation.generate import generate_text

    events = []

    class Model:
        def stream(self, ids, n, **kw):
            events.append("log")  # the first forward
            for _ in range(n):
                yield torch.tensor([[ord("x")]])

    text = generate_text(Model(), "def ", 2, write=lambda t: events.append(t))
    assert text == "def xx" and events[:2] == ["log", "def "] and "".join(events[1:]) == "def xx"
    events.clear()
    assert generate_text(Model(), "p", 0, write=lambda t: events.append(t)) == "p" and "".join(events[1:]) == "p"
