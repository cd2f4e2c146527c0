"""The context-limited control in the attention layers: ``model.attention.window`` (both kinds) and
``attention_window(model, window)``, which the extrapolation uses to score a model trained without a window with
attention limited to its training context."""

import pytest
import torch

from linrope.models.attention import LinearAttention, SoftmaxAttention, attention_window
from linrope.models.spec import ModelConfig
from linrope.positions import REGISTRY, build_position
from tests import helpers
from tests.helpers import case_id, gen, rel, scheme_cases

D, H, HD = 16, 2, 8

pytestmark = pytest.mark.usefixtures("kernel_env")


def scheme(name, **opts):
    return build_position(name, where="attention", d_model=D, n_heads=H, head_dim=HD, max_len=64, **opts)


def masked_softmax(att, x, positions, window):
    """softmax((q·k)/√d + bias, keys i - window < j <= i only) @ v, written out in float64."""
    q, k, v = att.split(x)
    q, k = att.pos.rotate_qk(q, k, positions)
    s = (q @ k.transpose(-1, -2)) * att.pos.score_scale()
    bias = att.pos.score_bias(q, k, positions)
    if bias is not None:
        s = s + bias
    idx = torch.arange(len(positions))
    visible = (idx[None, :] <= idx[:, None]) & (idx[:, None] - idx[None, :] < window)
    return att.merge(s.masked_fill(~visible, float("-inf")).softmax(-1) @ v)


# every scheme that acts inside attention (an absolute one's attention role adds nothing) and its variants, through
# SDPA (a value term takes the explicit path: the test below)
THROUGH_SDPA = [
    pytest.param(n, o, id=case_id(n, o))
    for n, o in scheme_cases()
    if REGISTRY[n].kind != "absolute" and not scheme(n, **o).has_value_term
]


@pytest.mark.parametrize("name,opts", THROUGH_SDPA)
@pytest.mark.parametrize("n,window", [(13, 4), (16, 4), (9, 1), (9, 9), (9, 40)])
def test_softmax_window_is_a_masked_softmax(name, opts, n, window):
    """SDPA's path, with a scheme's score bias or none, against the masked softmax written out in float64."""
    torch.manual_seed(hash((name, n, window)) % 2**31)
    att = SoftmaxAttention(D, H, scheme(name, **opts), window=window).double()
    x = torch.randn(2, n, D, dtype=torch.float64, generator=gen("softmax-window", name, n, window))
    positions = torch.arange(n) + 3
    got, _ = att(x, positions)
    torch.testing.assert_close(got, masked_softmax(att, x, positions, window), rtol=1e-10, atol=1e-12)
    if window == 1:  # one key: o_i = v_i, projected
        q, k, v = att.split(x)
        torch.testing.assert_close(got, att.merge(v), rtol=1e-10, atol=1e-12)


def test_softmax_window_narrows_the_explicit_path_too():
    """shaw needs the probabilities (its value term): the band masks them as it masks SDPA's scores."""
    att = SoftmaxAttention(D, H, scheme("shaw"), window=3).double()
    with torch.no_grad():
        for p in att.pos.parameters():
            p.normal_(0.0, 0.5)
    x = torch.randn(1, 10, D, dtype=torch.float64, generator=gen("shaw-window"))
    pos = torch.arange(10)
    got, _ = att(x, pos)
    # a key outside every query's window changes nothing: perturb the first position's input, look at queries ≥ 3
    y = x.clone()
    y[:, 0] += 1.0
    moved, _ = att(y, pos)
    torch.testing.assert_close(moved[:, 3:], got[:, 3:], rtol=0, atol=1e-12)
    assert (moved[:, :3] - got[:, :3]).abs().max() > 1e-3


@pytest.mark.parametrize("placement", ["numerator", "both", "none"])
@pytest.mark.parametrize("decay", [None, "retnet"])
def test_linear_window_layer_every_impl(placement, decay):
    """The linear layer with a window, RoPE placement and decay: chunk (blocked) equals naive in float64, forward
    and backward, at a length that is not a multiple of the window or the chunk; a key outside the window does
    not reach the query."""
    att = LinearAttention(D, H, scheme("rope", decay=decay), placement=placement, window=5, chunk_size=4).double()
    x = torch.randn(2, 23, D, dtype=torch.float64, generator=gen("linear-window", placement, decay))
    pos = torch.arange(23)
    outs = {}
    for impl in ("naive", "chunk"):
        att.impl = impl
        xx = x.clone().requires_grad_()
        out, _ = att(xx, pos)
        (grad,) = torch.autograd.grad(out.pow(2).sum(), xx)
        outs[impl] = (out.detach(), grad)
    assert rel(outs["chunk"][0], outs["naive"][0]) < 1e-12
    assert rel(outs["chunk"][1], outs["naive"][1]) < 1e-10
    y = x.clone()
    y[:, 2] += 1.0  # seen by queries 2 … 6 only
    moved, _ = att(y, pos)
    torch.testing.assert_close(moved[:, 7:], outs["chunk"][0][:, 7:], rtol=0, atol=1e-12)
    assert (moved[:, 2:7] - outs["chunk"][0][:, 2:7]).abs().min() > 0


def tiny_lm(kind, position, **attention):
    return helpers.tiny_lm(position, kind, max_len=32, **attention).double()


@pytest.mark.parametrize("kind", ["softmax", "linear"])
@pytest.mark.parametrize("position", [{"name": "rope"}, {"name": "alibi"}, {"name": "rope", "decay": "retnet"}])
def test_attention_window_limits_then_restores(kind, position):
    """Inside the block the model equals one built with the window; after it, the model is itself again (bit for
    bit); beyond the trained length (max_len 32, here 80 tokens) it scores as before."""
    torch.manual_seed(0)
    m = tiny_lm(kind, position)
    windowed = tiny_lm(kind, position, window=16)
    windowed.load_state_dict(m.state_dict())
    x = torch.randint(0, 32, (2, 80), generator=gen("lm-window", kind, str(position)))
    with torch.no_grad():
        before = m(x)
        with attention_window(m, 16) as same:
            assert same is m
            inside = m(x)
        after = m(x)
        want = windowed(x)
    assert torch.equal(after, before)
    assert torch.equal(inside, want)
    torch.testing.assert_close(inside[:, :16], before[:, :16], rtol=1e-10, atol=1e-10)  # nothing cut yet
    assert (inside[:, 16:] - before[:, 16:]).abs().max() > 1e-6  # cut: another model at long range
    with torch.no_grad(), attention_window(windowed, None):  # and the other way: a windowed model unlimited
        torch.testing.assert_close(windowed(x), before, rtol=1e-10, atol=1e-10)
    assert windowed.blocks[0].attn.window == 16


def test_attention_window_restores_after_an_error_and_refuses_bad_values():
    m = tiny_lm("softmax", {"name": "rope"})
    with pytest.raises(RuntimeError, match="inside"):
        with attention_window(m, 4):
            raise RuntimeError("inside")
    assert all(b.attn.window is None for b in m.blocks)
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="window must be an integer >= 1"):
            with attention_window(m, bad):
                pass
    with pytest.raises(ValueError, match="has no attention layer"):
        with attention_window(torch.nn.Linear(2, 2), 4):
            pass


def test_linear_generation_with_a_window_rereads_its_context():
    """A window carries no running state, so generation re-reads the last max_len tokens at every token, as for
    softmax (it crashed on the first carried step): greedy tokens are the whole sequence's argmax.  Without the
    window the state is carried again."""
    m = tiny_lm("linear", {"name": "rope"})
    prompt = torch.randint(0, 32, (1, 5), generator=torch.Generator().manual_seed(0))
    with attention_window(m, 8):
        out = m.generate(prompt, 6, temperature=0)
        for i in range(prompt.shape[1], out.shape[1]):
            assert out[0, i] == m(out[:, max(0, i - m.cfg.max_len) : i])[0, -1].argmax()
        with pytest.raises(ValueError, match=r"model.attention.window=8: .* carries no state"):
            m(prompt, return_states=True)  # the carried step itself still refuses
    assert m.generate(prompt, 3).shape == (1, 8)  # restored


@pytest.mark.parametrize("position", [{"name": "learned"}, {"name": "multiplicative", "table": "learned"}])
def test_linear_generation_past_a_position_table_rereads_its_context(position):
    """A table of max_len positions has no row for a carried step beyond it: generation re-reads the last max_len
    tokens, as for softmax (it stopped with SequenceTooLong after max_len - prompt tokens had streamed)."""
    m = helpers.tiny_lm(position, "linear", max_len=16)
    assert (
        m.cfg.position_table_bounded() and not helpers.tiny_lm({"name": "rope"}, "linear").cfg.position_table_bounded()
    )
    prompt = torch.randint(0, 32, (1, 5), generator=torch.Generator().manual_seed(0))
    out = m.generate(prompt, 30, temperature=0)
    assert out.shape == (1, 35)
    for i in range(prompt.shape[1], out.shape[1], 7):
        assert out[0, i] == m(out[:, max(0, i - 16) : i])[0, -1].argmax()


@pytest.mark.parametrize("kind", ["softmax", "linear"])
def test_window_is_a_declared_option_of_both_kinds(kind, compose):
    """``model.attention.window=128`` is a plain training override (the files give ``window: null``), checked by
    the layer's declaration: 0 and -1 are one line each."""
    preset = "softmax_rope" if kind == "softmax" else "linear_rope"
    cfg = compose(f"model={preset}", "model.attention.window=128")
    assert cfg.model.attention.window == 128
    ModelConfig.checked(dict(cfg.model))
    spec = ModelConfig.from_dict(dict(cfg.model))
    assert not spec.problems()
    bad = ModelConfig.from_dict({**dict(cfg.model), "attention": {**dict(cfg.model.attention), "window": 0}})
    assert any("model.attention.window=0: expected an integer >= 1" in str(p) for p in bad.problems())
    encoder = ModelConfig.from_dict({**dict(cfg.model), "causal": False})
    assert encoder.problems() == ["model.attention.window=128 limits causal attention; model.causal is false"]
    layer = SoftmaxAttention if kind == "softmax" else LinearAttention
    with pytest.raises(ValueError, match="limits causal attention; this model has causal=false"):
        layer(D, H, scheme("none"), causal=False, window=4)
