"""Randomized positions (Ruoss et al. 2023; linrope.positions.randomized, docs/schemes.md ``randomized``).

The draw (sorted, distinct, in range, seeded, uniform), the model with ``max_position`` against its base scheme
given the drawn positions explicitly (every scheme: the input and every layer see one draw), evaluation as the
release (drawn too), a float64 formula of a one-layer model written out with the drawn positions (softmax with
RoPE and ALiBi, linear attention with RoPE in the numerator, the learned table), and the refusals."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from linrope.base.errors import ConfigError, IncompatiblePairing, SequenceTooLong
from linrope.models.model import TransformerLM
from linrope.positions import REGISTRY, check_pairing
from linrope.positions.randomized import draw_positions
from tests.positions.contract import cases, params

V, D, H, HD = 11, 16, 2, 8  # vocabulary, d_model, heads, head dim
L = 40  # max_position of the model tests


def lm(kind, name, *, max_position=None, max_len=L, n_layers=2, **opts):
    position = {"name": name, **opts}
    if max_position is not None:
        position["max_position"] = max_position
    cfg = dict(vocab_size=V, d_model=D, n_layers=n_layers, n_heads=H, d_ff=32, max_len=max_len,
               attention={"kind": kind}, position=position)  # fmt: skip
    return TransformerLM(cfg).double()


def large(model):
    """Every parameter drawn large (std 0.5; tables 1.0) so each position term moves the output."""
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.5 if p.dim() > 1 else 0.2)
    return model


def tokens(n, b=2, seed=0):
    return torch.randint(0, V, (b, n), generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------------------------------------------
# the draw
# ---------------------------------------------------------------------------------------------------


def test_the_draw_is_sorted_distinct_in_range_and_seeded():
    for n, high in ((1, 1), (5, 5), (7, 50), (200, 2048)):
        torch.manual_seed(n)
        p = draw_positions(n, high)
        assert p.dtype == torch.int64 and p.shape == (n,)
        assert (p[1:] > p[:-1]).all() and p.min() >= 0 and p.max() < high, (n, high)
        torch.manual_seed(n)
        assert torch.equal(draw_positions(n, high), p)
    assert torch.equal(draw_positions(5, 5), torch.arange(5))  # N = L: every position
    torch.manual_seed(0)
    a, b = draw_positions(20, 2048), draw_positions(20, 2048)
    assert not torch.equal(a, b)  # a fresh draw each call


def test_the_draw_is_uniform_over_subsets():
    """Marginals: each of L positions is in the subset with probability N/L (chi-square, 31 degrees of
    freedom, bound at p ≈ 1e-4); the smallest has the mean (L - N)/(N + 1) of a uniform N-subset of 0 … L-1."""
    high, n, draws = 32, 8, 3000
    torch.manual_seed(1)
    picks = torch.stack([draw_positions(n, high) for _ in range(draws)])
    counts = torch.bincount(picks.flatten(), minlength=high).double()
    expected = draws * n / high
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 70.0, chi2
    mean_min = float(picks[:, 0].double().mean())
    assert abs(mean_min - (high - n) / (n + 1)) < 0.15, mean_min  # sd of the mean ≈ 0.05


def test_more_tokens_than_positions_are_refused_in_one_line():
    with pytest.raises(SequenceTooLong, match=r"9 tokens cannot take distinct positions below max_position=8") as e:
        draw_positions(9, 8)
    assert "\n" not in str(e.value)
    with pytest.raises(SequenceTooLong, match="max_position=8"):
        lm("softmax", "rope", max_position=8)(tokens(9))


# ---------------------------------------------------------------------------------------------------
# the model: one draw per forward, equal to the base scheme at the drawn positions
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name,opts", params(cases()))  # every scheme and its variants
def test_every_scheme_at_drawn_positions_is_its_base_scheme_at_those_positions(name, opts):
    """Seeded, the randomized model's output is the base model's with the drawn positions handed in: the input
    scheme and both layers saw the same draw (a second draw anywhere would differ), and the span bound handed to
    the schemes (0, L-1) sizes their tables as the exact span does."""
    base = large(lm("softmax", name, **opts))
    rand = lm("softmax", name, max_position=L, **opts)
    rand.load_state_dict(base.state_dict())
    x = tokens(12)
    torch.manual_seed(3)
    drawn = draw_positions(12, L)
    assert not torch.equal(drawn, torch.arange(12))
    rand.train()
    torch.manual_seed(3)
    got = rand(x)
    expected = base(x, positions=drawn)
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)
    # given explicitly, the positions are used as they are: the base scheme exactly
    torch.testing.assert_close(rand(x, positions=drawn), expected, rtol=0, atol=0)
    if REGISTRY[name].kind not in (
        "none",
        "contextual",
    ):  # the drawn positions matter (none to see; or counted from q, k)
        assert not torch.allclose(got, base(x), atol=1e-6), name


def test_linear_attention_at_drawn_positions_is_its_base_at_those_positions():
    """The chunk kernel (chunk 4, 13 tokens: several chunks and a ragged last one) takes any increasing positions:
    seeded, the randomized linear model equals the base linear model handed the drawn positions."""
    cfg_attention = {"kind": "linear", "chunk_size": 4}
    base = lm("linear", "rope")
    base = TransformerLM({**base.cfg.to_dict(), "attention": cfg_attention}).double()
    large(base)
    rand = TransformerLM({**base.cfg.to_dict(), "position": {"name": "rope", "max_position": L}}).double()
    rand.load_state_dict(base.state_dict())
    x = tokens(13)
    torch.manual_seed(5)
    drawn = draw_positions(13, L)
    torch.manual_seed(5)
    got = rand(x)
    torch.testing.assert_close(got, base(x, positions=drawn), rtol=1e-10, atol=1e-10)
    assert not torch.allclose(got, base(x), atol=1e-6)


def test_evaluation_draws_as_the_release_does():
    """The release draws whenever the model runs, evaluation included: in eval mode two calls differ, a seed
    repeats one, and each is the base scheme at its drawn positions."""
    base = large(lm("softmax", "rope"))
    rand = lm("softmax", "rope", max_position=L)
    rand.load_state_dict(base.state_dict())
    rand.eval()
    x = tokens(10)
    with torch.no_grad():
        torch.manual_seed(7)
        first, second = rand(x), rand(x)
        torch.manual_seed(7)
        again = rand(x)
        torch.manual_seed(7)
        drawn = draw_positions(10, L)
        expected = base(x, positions=drawn)
    assert not torch.allclose(first, second, atol=1e-6)
    torch.testing.assert_close(again, first, rtol=0, atol=0)
    torch.testing.assert_close(first, expected, rtol=1e-10, atol=1e-10)


# ---------------------------------------------------------------------------------------------------
# float64 formula: a one-layer model written out at the drawn positions
# ---------------------------------------------------------------------------------------------------


def rotate(x, m):
    """RoPE written out: pair (2t, 2t+1) of x turned by m·10000^(-2t/d)."""
    d = x.shape[-1]
    out = x.clone()
    for t in range(d // 2):
        a = m * 10000.0 ** (-2 * t / d)
        out[2 * t] = x[2 * t] * math.cos(a) - x[2 * t + 1] * math.sin(a)
        out[2 * t + 1] = x[2 * t + 1] * math.cos(a) + x[2 * t] * math.sin(a)
    return out


def alibi_slope(h):  # H = 2 heads: m_h = 2^(-8h/H), h = 1 … H
    return 2.0 ** (-8.0 * (h + 1) / H)


def reference(model, x, p, kind, name):
    """One layer, every sum a loop: embedding (·sqrt(D), + P[p_i] for learned), pre-norm block, the head."""
    blk = model.blocks[0]
    e = model.embed.weight[x] * math.sqrt(D)
    if name == "learned":
        e = e + model.pos.table[p]
    h = F.layer_norm(e, (D,), blk.ln1.weight, blk.ln1.bias)
    qkv = h @ blk.attn.qkv.weight.T
    q, k, v = (qkv[..., i * D : (i + 1) * D].reshape(*x.shape, H, HD) for i in range(3))
    B, N = x.shape
    o = torch.zeros(B, N, H, HD, dtype=torch.float64)
    for b in range(B):
        for hh in range(H):
            for i in range(N):
                if kind == "softmax":
                    s = []
                    for j in range(i + 1):
                        qi, kj = q[b, i, hh], k[b, j, hh]
                        if name == "rope":
                            qi, kj = rotate(qi, float(p[i])), rotate(kj, float(p[j]))
                        sij = qi @ kj / math.sqrt(HD)
                        if name == "alibi":
                            sij = sij - alibi_slope(hh) * abs(float(p[i] - p[j]))
                        s.append(sij)
                    a = torch.stack(s).softmax(0)
                    o[b, i, hh] = sum(a[j] * v[b, j, hh] for j in range(i + 1))
                else:  # elu+1 features, RoPE in the numerator only
                    fq = F.elu(q[b, i, hh]) + 1
                    num = sum((rotate(fq, float(p[i])) @ rotate(F.elu(k[b, j, hh]) + 1, float(p[j]))) * v[b, j, hh]
                              for j in range(i + 1))  # fmt: skip
                    den = sum(fq @ (F.elu(k[b, j, hh]) + 1) for j in range(i + 1))
                    o[b, i, hh] = num / (den + 1e-6)
    y = e + o.reshape(B, N, D) @ blk.attn.out.weight.T
    m = F.layer_norm(y, (D,), blk.ln2.weight, blk.ln2.bias)
    y = y + F.gelu(m @ blk.mlp.up.weight.T + blk.mlp.up.bias) @ blk.mlp.down.weight.T + blk.mlp.down.bias
    return F.layer_norm(y, (D,), model.ln_f.weight, model.ln_f.bias) @ model.head.weight.T


@pytest.mark.parametrize(
    "kind,name", [("softmax", "rope"), ("softmax", "alibi"), ("softmax", "learned"), ("linear", "rope")]
)
def test_model_output_is_the_formula_at_the_drawn_positions(kind, name):
    model = large(lm(kind, name, max_position=L, n_layers=1))
    x = tokens(9)
    torch.manual_seed(11)
    p = draw_positions(9, L)
    assert int(p[-1]) - int(p[0]) > 9  # scattered, not 0 … N-1 shifted
    torch.manual_seed(11)
    got = model(x)
    torch.testing.assert_close(got, reference(model, x, p, kind, name), rtol=1e-9, atol=1e-9)


# ---------------------------------------------------------------------------------------------------
# refusals
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name,opts", [("alibi", {}), ("rope", {"decay": "retnet"}), ("rope", {"decay": "alibi"})])
def test_linear_refuses_a_decay_at_randomized_positions(name, opts):
    """The kernels' decay γ_h^(i-j) counts tokens: refused when the config is checked, and by the model."""
    check_pairing("linear", name, opts)  # without max_position: linear attention takes it
    check_pairing("softmax", name, {**opts, "max_position": 64})  # softmax: the bias reads the positions
    with pytest.raises(IncompatiblePairing, match="counts tokens, not positions") as e:
        check_pairing("linear", name, {**opts, "max_position": 64})
    assert "\n" not in str(e.value)
    with pytest.raises(IncompatiblePairing, match="counts tokens, not positions"):
        lm("linear", name, max_position=64, **opts)


def test_a_table_shorter_than_max_position_is_refused_at_build():
    with pytest.raises(ConfigError, match=r"max_position=64 draws positions up to 63, but the learned position "
                       r"table has model.max_len=40 rows; raise model.max_len to 64") as e:  # fmt: skip
        lm("softmax", "learned", max_position=64, max_len=40)
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="multiplicative position table"):
        lm("softmax", "multiplicative", max_position=64, max_len=40, table="learned")
    lm("softmax", "learned", max_position=64, max_len=64)  # a table of max_position rows holds every draw
    lm("softmax", "multiplicative", max_position=64, max_len=40)  # sinusoidal gate: no table


def test_a_call_that_continues_a_sequence_is_refused_and_generation_rereads():
    """A forward that continues a sequence is refused (its earlier positions were drawn in another call), so
    linear attention's generation re-reads the sequence at every token instead of carrying states (it crashed
    after the first sampled token): each token drawn from a whole forward at freshly drawn positions."""
    model = lm("linear", "rope", max_position=L)
    with pytest.raises(ValueError, match="drawn for a whole sequence in one call; this call continues one"):
        model(tokens(3), offset=4)
    _, states = model(tokens(3, b=1), return_states=True)
    with pytest.raises(ValueError, match="carried states"):
        model(tokens(1, b=1), offset=3, states=states)
    prompt = tokens(3, b=1)
    torch.manual_seed(5)
    out = model.generate(prompt, 2, temperature=0)
    torch.manual_seed(5)
    first = model(prompt)[0, -1].argmax()  # the same draws: the first re-read
    assert out.shape == (1, 5) and out[0, 3] == first


def test_max_position_is_checked_as_an_option():
    from linrope.positions import option_errors

    assert option_errors("rope", {"max_position": 0})[0].startswith(
        "model.position.max_position=0: expected an integer >= 1"
    )
    assert option_errors("t5", {"max_posiiton": 8})[0].startswith("model.position.max_posiiton: unknown option")
