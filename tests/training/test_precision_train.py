"""bf16-mixed training beyond one chunk (Lightning's autocast around the model, issue 24).

Before the operators declared what autocast does to them, ``trainer.precision=bf16-mixed`` crashed at step 1
for every linear preset as the context exceeded one chunk (64 tokens): the chunk kernel's matmuls were
re-cast to bfloat16 by autocast while its float32 states met them.  size=tiny has context 64, so these tests
raise the context."""

import math
from pathlib import Path

import pytest
import torch

from tests.helpers import CONF, model_config

FAST = [
    "logger=none",
    "trainer.enable_progress_bar=false",
    "data.max_bytes=400000",
    "data.val_windows=2",
    "data.test_windows=2",
    "data.batch_size=2",
    "data.eval_batch_size=2",
    "test=false",
]
LINEAR_PRESETS = sorted(p.stem for p in (CONF / "model").glob("linear*.yaml"))


def train_bf16(compose, *overrides, steps: int = 3) -> float:
    import train

    cfg = compose(
        *FAST,
        "trainer.precision=bf16-mixed",
        f"trainer.max_steps={steps}",
        f"trainer.val_check_interval={steps}",
        *overrides,
    )
    metric = train.main(cfg)
    assert metric is not None and math.isfinite(metric), metric
    c = torch.load(Path(cfg.paths.output_dir) / "checkpoints" / "last.ckpt", weights_only=True)
    assert c["global_step"] == steps
    assert all(
        v.dtype == torch.float32 and torch.isfinite(v).all() for v in c["state_dict"].values() if v.is_floating_point()
    )
    return metric


@pytest.mark.parametrize("preset", ["linear_rope", "linear_cosine_rope"])
def test_bf16_mixed_trains_a_linear_model_beyond_one_chunk(compose, preset):
    # context 160: two whole chunks and a partial one
    metric = train_bf16(compose, f"model={preset}", "size=tiny", "context=160")
    assert metric < 9  # bits per byte of a barely trained model: finite and below 8 + a margin


def test_bf16_mixed_trains_softmax_rope_beyond_one_chunk(compose):
    assert train_bf16(compose, "model=softmax_rope", "size=tiny", "context=160") < 9


@pytest.mark.slow
@pytest.mark.parametrize("preset", LINEAR_PRESETS)
def test_bf16_mixed_trains_every_linear_preset_at_size_small(compose, preset):
    assert train_bf16(compose, f"model={preset}", "size=small", steps=2) < 9


ALL_PRESETS = sorted(p.stem for p in (CONF / "model").glob("*.yaml"))


def tiny_model_config(preset: str, context: int) -> dict:
    return model_config(f"model={preset}", "size=tiny", "model.n_layers=1", f"context={context}")


@pytest.mark.parametrize("preset", ALL_PRESETS)
def test_every_preset_under_bf16_autocast_matches_float32(preset):
    """The whole model (attention, positions, RoPE) under CPU bf16 autocast, beyond one chunk: finite loss and
    gradients, the loss within bf16 rounding of the float32 loss, parameters' gradients float32."""
    from linrope.models.model import TransformerLM

    torch.manual_seed(0)
    model = TransformerLM(tiny_model_config(preset, 100))  # one whole chunk and a partial one
    x = torch.randint(0, 256, (1, 101), generator=torch.Generator().manual_seed(1))

    def loss_and_grads(autocast: bool):
        model.zero_grad(set_to_none=True)
        torch.manual_seed(1)  # randomized positions (max_position): both forwards draw the same ones
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            logits = model(x[:, :-1])
            loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), x[:, 1:].flatten())
        loss.backward()
        return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    ref_loss, ref_grads = loss_and_grads(False)
    loss, grads = loss_and_grads(True)
    assert math.isfinite(loss) and abs(loss - ref_loss) < 2e-2 * abs(ref_loss), (loss, ref_loss)
    assert grads.keys() == ref_grads.keys()
    for name, g in grads.items():
        assert g.dtype == torch.float32 and torch.isfinite(g).all(), name
    flat, ref_flat = (torch.cat([g[n].flatten() for n in sorted(g)]) for g in (grads, ref_grads))
    assert ((flat - ref_flat).norm() / ref_flat.norm()).item() < 0.1, preset


def test_compiled_linear_model_under_bf16_autocast_matches_eager():
    """torch.compile (Dynamo + AOTAutograd, fullgraph) sees the operators' fake implementations under autocast:
    the compiled model gives eager's loss and gradients, beyond one chunk."""
    import copy

    from linrope.models.model import TransformerLM

    torch._dynamo.reset()
    torch.manual_seed(0)
    eager = TransformerLM(tiny_model_config("linear_rope", 160))
    compiled = copy.deepcopy(eager)
    compiled.compile(backend="aot_eager", fullgraph=True)
    x = torch.randint(0, 256, (2, 161), generator=torch.Generator().manual_seed(1))
    results = []
    for model in (eager, compiled):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(x[:, :-1]).float().flatten(0, 1), x[:, 1:].flatten())
        loss.backward()
        results.append((loss.detach(), [p.grad for p in model.parameters()]))
    assert torch.isfinite(results[0][0])
    torch.testing.assert_close(results[1][0], results[0][0], rtol=1e-5, atol=1e-6)
    for g_c, g_e in zip(results[1][1], results[0][1]):
        torch.testing.assert_close(g_c, g_e, rtol=1e-4, atol=1e-6)
