"""Linear attention without a denominator (``normalize=False``): the output is the numerator alone,
o_i = Σ_{j≤i} γ^(i-j) w^num_ij v_j (+ γ^(i+1) φ^num(q_i)ᵀ S0), in every form.

The naive form is checked against that sum written out pair by pair; the chunk form (its operators' forward
and backward), the recurrence and the generation step against the naive form in float64 on fresh random
inputs, every placement and feature map, with and without decay and initial state, chunk sizes that do not
divide N and N beyond one chunk (in one block and in several); bfloat16 under autocast beyond one chunk.
Every buffer a kernel preallocates starts as NaN (``kernel_env``)."""

import contextlib
import itertools

import pytest
import torch
import torch.nn.functional as F

from linrope.ops import LinearAttentionState, linear_attention, recurrent_step
from linrope.ops.linear_attn import tables
from linrope.ops.rope import apply_rope
from tests.helpers import gen, rel
from tests.ops.fla_cases import DECAY, inputs, results

pytestmark = pytest.mark.usefixtures("kernel_env")  # NaN-poisoned buffers, one thread (tests/conftest.py)

PLACEMENTS = ("numerator", "both", "none")
FEATURE_MAPS = ("elu", "cosine")
TOL = 1e-10  # float64 against float64: the same sums in another order
NAMES = ("out", "S", "z", "dq", "dk", "dv", "dS0", "dz0")


def by_hand(q, k, v, feature_map, placement, causal, decay=None):
    """o_i = Σ_j γ^|i-j| w^num_ij v_j, each weight computed pair by pair: no denominator anywhere."""
    B, H, N, _ = q.shape
    out = torch.full((B, H, N, v.shape[-1]), float("nan"), dtype=torch.float64)
    if feature_map == "elu":
        fq, fk = F.elu(q) + 1, F.elu(k) + 1
    else:
        fq, fk = q / q.norm(dim=-1, keepdim=True), k / k.norm(dim=-1, keepdim=True)
    rq, rk = apply_rope(fq, torch.arange(N)), apply_rope(fk, torch.arange(N))
    one = 1.0 if feature_map == "cosine" else 0.0
    for b, h, i in itertools.product(range(B), range(H), range(N)):
        num = torch.zeros(v.shape[-1], dtype=torch.float64)
        for j in range(N):
            if causal and j > i:
                continue
            a, c = (fq, fk) if placement == "none" else (rq, rk)
            gamma = 1.0 if decay is None else float(decay[h]) ** abs(i - j)
            num += gamma * (one + a[b, h, i] @ c[b, h, j]) * v[b, h, j]
        out[b, h, i] = num
    return out


@pytest.mark.parametrize("feature_map", FEATURE_MAPS)
@pytest.mark.parametrize("causal", [True, False])
def test_naive_is_the_numerator_written_out(feature_map, causal):
    g = gen("by hand", feature_map, causal)
    q, k, v = (torch.randn(2, 2, 9, 6, generator=g, dtype=torch.float64) for _ in range(3))
    for placement, decay in itertools.product(PLACEMENTS, (None, DECAY.double())):
        kw = dict(feature_map=feature_map, rope=placement, causal=causal, decay=decay)
        got = linear_attention(q, k, v, impl="naive", normalize=False, **kw)
        ref = by_hand(q, k, v, feature_map, placement, causal, decay)
        torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-12)
        # eps belongs to the denominator: without one it changes nothing
        torch.testing.assert_close(linear_attention(q, k, v, impl="naive", normalize=False, eps=0.5, **kw), got)
    # without a denominator the placement question disappears: "both" rotates only what "numerator" rotates
    both, numerator = (
        linear_attention(q, k, v, impl="naive", normalize=False, feature_map=feature_map, rope=r, causal=causal)
        for r in ("both", "numerator")
    )
    assert torch.equal(both, numerator)


@contextlib.contextmanager
def blocks_of(elements):
    """The chunk kernel walks a causal sequence in blocks of ``elements`` numbers (None: its default)."""
    old = dict(tables.BLOCK_ELEMENTS)
    if elements:
        tables.BLOCK_ELEMENTS.update(cpu=elements)
    try:
        yield
    finally:
        tables.BLOCK_ELEMENTS.clear()
        tables.BLOCK_ELEMENTS.update(old)


def noncausal(impl, q, k, v, **kw):
    """Output and the gradients of q, k, v of a fixed random weighting of the output (float64)."""
    leaves = [x.detach().double().requires_grad_() for x in (q, k, v)]
    out = linear_attention(*leaves, impl=impl, causal=False, **kw)
    w = torch.randn(out.shape, generator=gen("weights", tuple(out.shape)), dtype=torch.float64)
    (out * w).sum().backward()
    return [out, *(x.grad for x in leaves)]


# n = 1, 50 (not a multiple of 16 or 64), 130 (beyond two chunks of 64, eight of 16); C = 16 in blocks of three
# chunks (the state handed from block to block: (0, 48), (48, 96), (96, 130)), C = 64 in one block
FORMS = [("chunk C=16", "chunk", dict(chunk_size=16), 1024), ("chunk C=64", "chunk", dict(chunk_size=64), None)]


@pytest.mark.parametrize("n", [1, 50, 130])
@pytest.mark.parametrize("feature_map", FEATURE_MAPS)
@pytest.mark.parametrize("rope", PLACEMENTS)
def test_every_form_matches_naive_without_denominator(n, feature_map, rope):
    for decayed, initial in itertools.product((False, True), (False, True)):
        decay = DECAY.double() if decayed else None
        q, k, v, S0, z0 = inputs(("nodenom", n, feature_map, rope, decayed, initial), feature_map=feature_map,
                                 rope=rope, decay=decay, n=n, initial=initial)  # fmt: skip
        kw = dict(feature_map=feature_map, rope=rope, decay=decay, normalize=False)
        ref = results("naive", torch.float64, q, k, v, S0, z0, **kw)
        for name, impl, extra, blocks in [*FORMS, ("recurrent", "recurrent", {}, None)]:
            with blocks_of(blocks):
                got = results(impl, torch.float64, q, k, v, S0, z0, **kw, **extra)
            what = f"{name} decay={decayed} state={initial}"
            for nm, a, b in zip(NAMES, got, ref):
                assert a.shape == b.shape and torch.isfinite(a).all(), (what, nm)
                assert rel(a, b) < TOL, (what, nm, rel(a, b))
        if not initial:  # non-causal: no state
            ref = noncausal("naive", q, k, v, **kw)
            for name, impl, extra, blocks in FORMS:
                with blocks_of(blocks):
                    got = noncausal(impl, q, k, v, **kw, **extra)
                for nm, a, b in zip(("out", "dq", "dk", "dv"), got, ref):
                    assert torch.isfinite(a).all() and rel(a, b) < TOL, (name, "causal=False", decayed, nm)


@pytest.mark.parametrize("feature_map", FEATURE_MAPS)
def test_recurrent_step_generates_like_naive_without_denominator(feature_map):
    """Token by token from an initial state (generation's path), outputs, final state and the step operator's
    gradients against naive."""
    n = 20
    for rope, decayed in itertools.product(PLACEMENTS, (False, True)):
        decay = DECAY.double() if decayed else None
        q, k, v, S0, z0 = (x.double() for x in inputs(("step", feature_map, rope, decayed), feature_map=feature_map,
                                                      rope=rope, decay=decay, n=n, initial=True))  # fmt: skip
        kw = dict(feature_map=feature_map, rope=rope, decay=decay, normalize=False)
        positions = torch.arange(20, 20 + n)  # the state was left by positions 0 … 19
        ref, fin = linear_attention(
            q, k, v, impl="naive", positions=positions, initial_state=LinearAttentionState(S0, z0),
            output_final_state=True, **kw,
        )  # fmt: skip
        state = LinearAttentionState(S0, z0)
        for t in range(n):
            o_t, state = recurrent_step(q[:, :, t], k[:, :, t], v[:, :, t], state, position=20 + t, **kw)
            assert rel(o_t, ref[:, :, t]) < TOL, (rope, decayed, t)
        assert rel(state.S, fin.S) < TOL and rel(state.z, fin.z) < TOL, (rope, decayed)
        # one step's backward (the registered operator recomputes the step under autograd) against naive
        grads = []
        for step in (True, False):
            leaves = [x[:, :, :1].clone().requires_grad_() for x in (q, k, v)]
            init = LinearAttentionState(S0.clone().requires_grad_(), z0.clone().requires_grad_())
            if step:
                o, st = recurrent_step(*(x[:, :, 0] for x in leaves), init, position=20, **kw)
            else:
                o, st = linear_attention(*leaves, impl="naive", positions=positions[:1], initial_state=init,
                                         output_final_state=True, **kw)  # fmt: skip
                o = o[:, :, 0]
            w = [torch.randn(t.shape, generator=gen("w", t.shape), dtype=torch.float64) for t in (o, st.S, st.z)]
            loss = sum((t * wt).sum() for t, wt in zip((o, st.S, st.z), w))
            grads.append(torch.autograd.grad(loss, [*leaves, *init]))
        for nm, a, b in zip(("q", "k", "v", "S", "z"), *grads):
            assert rel(a, b) < TOL, (rope, decayed, nm, rel(a, b))


@pytest.mark.parametrize("rope", PLACEMENTS)
def test_bfloat16_autocast_beyond_one_chunk(rope):
    """bf16-mixed as a model runs it: q, k, v out of an autocast Linear (bfloat16), 200 positions with chunk 64,
    forward and backward against float64 naive on the same rounded tensors."""
    g = gen("autocast", rope)
    x = torch.randn(2, 200, 16, generator=g)
    proj = torch.nn.Linear(16, 3 * 2 * 8, bias=False)
    torch.nn.init.normal_(proj.weight, std=0.3, generator=g)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        q, k, v = proj(x).unflatten(-1, (3, 2, 8)).permute(2, 0, 3, 1, 4)
    assert q.dtype == torch.bfloat16
    w = torch.randn(2, 2, 200, 8, generator=g, dtype=torch.float64)
    kw = dict(rope=rope, decay=DECAY, normalize=False)
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = linear_attention(*leaves, impl="chunk", chunk_size=64, **kw)
    (out.double() * w).sum().backward()
    ref_leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    ref = linear_attention(*ref_leaves, impl="naive", **kw)
    (ref * w).sum().backward()
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
    assert rel(out, ref) < 2e-2, rel(out, ref)  # bfloat16 products, float32 states (seen: about 4e-3)
    for name, a, b in zip("qkv", leaves, ref_leaves):
        assert a.grad.dtype == torch.bfloat16 and rel(a.grad, b.grad) < 2e-2, (name, rel(a.grad, b.grad))


def test_the_output_grows_with_the_keys_and_normalising_is_the_default():
    """What the model's output norm is for: without a denominator the output's size grows with the number
    of keys (here about linearly: elu+1 weights are positive, the values share a mean); with one it does not."""
    g = gen("growth")
    q, k = (torch.randn(1, 1, 512, 8, generator=g, dtype=torch.float64) for _ in range(2))
    v = torch.randn(1, 1, 512, 8, generator=g, dtype=torch.float64) + 1.0
    raw = linear_attention(q, k, v, rope="none", normalize=False)
    normed = linear_attention(q, k, v, rope="none")
    assert torch.equal(normed, linear_attention(q, k, v, rope="none", normalize=True))
    size = lambda o, s: o[..., s, :].norm(dim=-1).mean().item()  # noqa: E731
    assert size(raw, slice(448, 512)) > 100 * size(raw, slice(0, 4))
    assert size(normed, slice(448, 512)) < 2 * size(normed, slice(0, 4))


def test_normalize_must_be_a_bool():
    q, k, v = (torch.randn(1, 2, 4, 8, generator=gen("bool")) for _ in range(3))
    for impl in ("naive", "chunk", "recurrent"):
        with pytest.raises(ValueError, match=r"^normalize must be True or False; got 'false'$"):
            linear_attention(q, k, v, impl=impl, normalize="false")
    with pytest.raises(ValueError, match=r"^normalize must be True or False; got 0$"):
        recurrent_step(q[:, :, 0], k[:, :, 0], v[:, :, 0], normalize=0)
