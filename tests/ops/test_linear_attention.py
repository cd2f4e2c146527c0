"""The chunk and recurrent forms of linear attention against the naive reference.

float64, forward and backward (q, k, v and the initial state), lengths that are not multiples of the chunk
size, every feature map / placement / causality / decay, preallocated buffers poisoned with NaN.
"""

import contextlib
import itertools

import pytest
import torch

from linrope.ops import (
    IMPLS,
    chunk_linear_attention,
    linear_attention,
    naive_linear_attention,
    recurrent_linear_attention,
    recurrent_step,
)
from linrope.ops.linear_attn import matrix as matrix_mod
from linrope.ops.linear_attn import native_chunk
from linrope.ops.linear_attn import scans as scans_mod
from linrope.ops.linear_attn import tables as tables_mod
from linrope.ops.linear_attn.buffers import alloc, poison_buffers
from linrope.ops.linear_attn.common import LinearAttentionState
from tests.helpers import gen, rel

FEATURE_MAPS = ("elu", "cosine")
PLACEMENTS = ("numerator", "both", "none")
B, H, D, DV = 2, 2, 8, 6
DECAY = torch.tensor([0.97, 0.6], dtype=torch.float64)


pytestmark = pytest.mark.usefixtures("kernel_env")  # NaN-poisoned buffers, one thread (tests/conftest.py)


@contextlib.contextmanager
def small_blocks(elements=1024):
    """Causal chunk attention walks the sequence in blocks; make them tiny (2 chunks of 16 here)."""
    old = dict(tables_mod.BLOCK_ELEMENTS)
    tables_mod.BLOCK_ELEMENTS.update(cpu=elements, cuda=elements)
    try:
        yield
    finally:
        tables_mod.BLOCK_ELEMENTS.clear()
        tables_mod.BLOCK_ELEMENTS.update(old)


def inputs(n, g, dtype=torch.float64, d=D, dv=DV, b=B, h=H):
    q = torch.randn(b, h, n, d, generator=g, dtype=dtype)
    k = torch.randn(b, h, n, d, generator=g, dtype=dtype)
    v = torch.randn(b, h, n, dv, generator=g, dtype=dtype)
    return q, k, v


def random_state(g, feature_map, dtype=torch.float64, d=D, dv=DV):
    dd = d + 1 if feature_map == "cosine" else d
    S = torch.randn(B, H, dd, dv, generator=g, dtype=dtype)
    z = torch.rand(B, H, dd, generator=g, dtype=dtype) + 0.5  # a plausible (positive-ish) normaliser
    if feature_map == "cosine":
        z[..., 0] += 3.0  # the constant feature dominates a real cosine state
    return LinearAttentionState(S, z)


def run_with_grads(fn, q, k, v, state, weights, **kw):
    """Output, final state and the gradients of a fixed random linear functional of both."""
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    init = None
    if state is not None:
        init = LinearAttentionState(*(t.detach().clone().requires_grad_() for t in state))
        leaves += list(init)
    res = fn(*leaves[:3], initial_state=init, output_final_state=kw["causal"], **kw)
    out, fin = res if kw["causal"] else (res, None)
    loss = (out * weights[0]).sum()
    if fin is not None:
        loss = loss + (fin.S * weights[1]).sum() + (fin.z * weights[2]).sum()
    grads = torch.autograd.grad(loss, leaves)
    return out.detach(), fin, grads


def chunked(*args, chunk_size, **kw):
    """C=16 runs in blocks of 2 chunks (the state handed from block to block), C=64 in a single block."""
    with small_blocks() if chunk_size == 16 else contextlib.nullcontext():
        return chunk_linear_attention(*args, chunk_size=chunk_size, **kw)


def case(g, n, feature_map, with_state):
    """q, k, v, the initial state (or None) and float64 weights of (out, S, z) for the loss, all drawn from g."""
    q, k, v = inputs(n, g)
    state = random_state(g, feature_map) if with_state else None
    dd = D + 1 if feature_map == "cosine" else D
    weights = (
        torch.randn(B, H, n, DV, generator=g, dtype=torch.float64),
        torch.randn(B, H, dd, DV, generator=g, dtype=torch.float64),
        torch.randn(B, H, dd, generator=g, dtype=torch.float64),
    )
    return q, k, v, state, weights


# ------------------------------------------------------------------------------------------------------
# chunk and recurrent == naive in float64, forward and backward
# ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [1, 63, 64, 65, 200, 1000])
@pytest.mark.parametrize("feature_map", FEATURE_MAPS)
@pytest.mark.parametrize("rope", PLACEMENTS)
def test_chunk_and_recurrent_match_naive(n, feature_map, rope):
    for causal, decayed, with_state in itertools.product((True, False), (False, True), (False, True)):
        if with_state and not causal:
            continue
        q, k, v, state, weights = case(
            gen(n, feature_map, rope, causal, decayed, with_state), n, feature_map, with_state
        )
        # one key and no state: o = v·w/(w+eps), so ∂o/∂q = O(eps) is pure cancellation in every form;
        # a larger eps keeps that gradient well-conditioned enough to compare to 1e-10
        eps = 0.1 if n == 1 and not with_state else 1e-6
        kw = dict(feature_map=feature_map, rope=rope, causal=causal, eps=eps, decay=DECAY if decayed else None)
        ref_out, ref_fin, ref_grads = run_with_grads(naive_linear_attention, q, k, v, state, weights, **kw)
        forms = [(f"chunk C={c}", lambda *a, c=c, **k_: chunked(*a, chunk_size=c, **k_)) for c in (16, 64)]
        if causal and (n < 1000 or with_state):  # (the 1000-step autograd loop is slow: 2 of 4 configs there)
            forms.append(("recurrent", recurrent_linear_attention))
        for name, fn in forms:
            what = f"{name} causal={causal} decay={decayed} state={with_state}"
            out, fin, grads = run_with_grads(fn, q, k, v, state, weights, **kw)
            assert out.shape == ref_out.shape and out.dtype == torch.float64, what
            assert rel(out, ref_out) < 1e-10, what
            if causal:
                assert rel(fin.S, ref_fin.S) < 1e-10 and rel(fin.z, ref_fin.z) < 1e-10, what
            names = ["q", "k", "v", "S0", "z0"]
            for nm, gr, rg in zip(names, grads, ref_grads):
                assert not torch.isnan(gr).any(), f"{what}: NaN in d{nm}"
                assert rel(gr, rg) < 1e-10, f"{what}: d{nm} rel err {rel(gr, rg):.2e}"


# ------------------------------------------------------------------------------------------------------
# the scans over chunks and the block plan (issue 31: a bounded number of operations at any N)
# ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("nc", [1, 2, 32, 33, 40, 600])  # one matmul; groups (+ padding); three levels
@pytest.mark.parametrize("decayed", [False, True])
def test_scans_match_the_sequential_loop(nc, decayed, monkeypatch):
    g = gen("scans", nc, decayed)
    n = nc * 4 - 1  # the last chunk one short: its own weight γ^3
    ch = tables_mod.Chunks(n, 4, DECAY.log() if decayed else None, torch.float64, torch.device("cpu"))
    U = torch.randn(B, H, nc, 3, 5, generator=g, dtype=torch.float64)
    for first in (None, torch.randn(B, H, 3, 5, generator=g, dtype=torch.float64)):
        got = (*scans_mod.scan_states(U, ch, first), *scans_mod.scan_states_reverse(U, ch, first))
        monkeypatch.setattr(scans_mod, "SEQUENTIAL", True)
        ref = (*scans_mod.scan_states(U, ch, first), *scans_mod.scan_states_reverse(U, ch, first))
        monkeypatch.setattr(scans_mod, "SEQUENTIAL", False)
        for what, a, b in zip(("S_in", "S_final", "R_in", "R_before"), got, ref):
            assert torch.isfinite(a).all() and a.shape == b.shape, what
            assert (a - b).abs().max() <= 1e-12 * b.abs().max().clamp_min(1), (what, first is None)


@pytest.mark.parametrize("chunk_size", [2, 4])
def test_chunk_matches_naive_over_many_chunks(chunk_size):
    """Hundreds of chunks in a block (550 at C=2: a scan of three levels), in one block and in four."""
    n = 1099
    for feature_map, rope, causal, decayed, with_state in (
        ("elu", "numerator", True, True, True),
        ("cosine", "both", True, False, True),
        ("elu", "none", True, True, False),
        ("elu", "numerator", False, True, False),
    ):
        q, k, v, state, weights = case(
            gen("many", chunk_size, feature_map, rope, causal, decayed), n, feature_map, with_state
        )
        kw = dict(feature_map=feature_map, rope=rope, causal=causal, decay=DECAY if decayed else None)
        ref_out, ref_fin, ref_grads = run_with_grads(naive_linear_attention, q, k, v, state, weights, **kw)
        for blocks in (contextlib.nullcontext, small_blocks):
            with blocks():
                out, fin, grads = run_with_grads(
                    chunk_linear_attention, q, k, v, state, weights, chunk_size=chunk_size, **kw
                )
            what = (feature_map, rope, causal, decayed, with_state, blocks.__name__)
            assert rel(out, ref_out) < 1e-10, what
            if causal:
                assert rel(fin.S, ref_fin.S) < 1e-10 and rel(fin.z, ref_fin.z) < 1e-10, what
            for nm, gr, rg in zip(("q", "k", "v", "S0", "z0"), grads, ref_grads):
                assert rel(gr, rg) < 1e-10, (*what, nm)


def test_block_plan_holds_a_cache_sized_block():
    """Blocks of about BLOCK_ELEMENTS numbers (2^18) for the heads walked together, whole chunks, covering the
    sequence; one block where a device has no entry (CUDA) or the call is not causal."""
    cpu = torch.device("cpu")
    assert len(tables_mod.plan_blocks(1, 8, 1024, 64, 64, True, cpu)) == 2  # 512 positions of eight heads
    for n in (16384, 65536, 65536 + 1):
        blocks = tables_mod.plan_blocks(1, 1, n, 64, 64, True, cpu)  # one head: 4 096 positions
        assert len(blocks) == -(-n // 4096) and blocks[1] == (4096, 8192), n
        assert blocks[0][0] == 0 and blocks[-1][1] == n and all(a[1] == b[0] for a, b in zip(blocks, blocks[1:]))
    assert tables_mod.plan_blocks(1, 8, 65536, 64, 64, True, torch.device("meta")) == [(0, 65536)]
    assert tables_mod.plan_blocks(1, 8, 65536, 64, 64, False, cpu) == [(0, 65536)]


def test_a_one_position_block_at_an_odd_offset_rotates_in_the_backward():
    """The cosine map's rotated part starts one column in: for a block of one position and one head that view is
    contiguous at an odd offset, which ``view_as_complex`` refuses (a RuntimeError in the backward before issue 53)."""
    g = gen("odd-offset")
    q, k = (torch.randn(1, 1, 9, 8, generator=g, dtype=torch.float64) for _ in range(2))
    v = torch.randn(1, 1, 9, 6, generator=g, dtype=torch.float64)
    w = [torch.randn(*s, generator=g, dtype=torch.float64) for s in ((1, 1, 9, 6), (1, 1, 9, 6), (1, 1, 9))]
    kw = dict(feature_map="cosine", causal=True)
    with small_blocks(8 * 4 * 2):  # blocks of 2 chunks of 4: the last block is position 8 alone
        got = run_with_grads(chunk_linear_attention, q, k, v, None, w, chunk_size=4, **kw)
    want = run_with_grads(naive_linear_attention, q, k, v, None, w, **kw)
    assert rel(got[0], want[0]) < 1e-12 and all(rel(a, b) < 1e-12 for a, b in zip(got[2], want[2]))


def aten_ops(fn) -> int:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return sum(e.count for e in prof.key_averages() if e.key.startswith("aten::"))


def test_operations_grow_with_the_blocks_not_the_chunks():
    """Fwd+bwd at N = 64k (B 1, H 8, d 64, elu, RoPE in the numerator, causal, C 64, float32) runs each head as a
    task of 16 blocks: at most 700 aten operations per (task, block) walked (about 620), where a loop over the
    chunks in the scans (``scans.SEQUENTIAL``) runs about 1 770.  At 1k the call runs whole, in two blocks."""
    from linrope.ops.linear_attn.chunk import plan

    def fwd_bwd(n):
        g = gen("ops", n)
        q, k, v = (torch.randn(1, 8, n, 64, generator=g).requires_grad_() for _ in range(3))
        return lambda: chunk_linear_attention(q, k, v, chunk_size=64).sum().backward()

    small, large = fwd_bwd(1024), fwd_bwd(65536)
    cpu = torch.device("cpu")
    parts, blocks = plan(1, 8, 65536, 64, 64, True, cpu)
    assert plan(1, 8, 1024, 64, 64, True, cpu)[0] is None and len(parts) == 8 and len(blocks) == 16
    with poison_buffers(False):  # the operations of a real run (a poisoned buffer is filled: two more)
        small()  # first-call set-up (RoPE tables) is not the kernel's
        n_small, n_large = aten_ops(small), aten_ops(large)
    assert n_small <= 2 * 700, n_small
    assert n_large <= 700 * len(parts) * len(blocks), n_large


def test_dispatcher_reaches_every_form():
    g = gen("dispatch")
    q, k, v = inputs(37, g)
    assert {"naive", "chunk", "recurrent"} <= set(IMPLS)
    ref = linear_attention(q, k, v, impl="naive")
    for impl in ("chunk", "recurrent"):
        assert rel(linear_attention(q, k, v, impl=impl, chunk_size=8), ref) < 1e-12


def test_inference_mode_then_training():
    """Generation under inference_mode, then a training step on the same shapes (cached RoPE tables)."""
    g = gen("inference")
    q, k, v = inputs(50, g)
    with torch.inference_mode():
        first = chunk_linear_attention(q, k, v)
    q.requires_grad_()
    out = chunk_linear_attention(q, k, v)
    out.sum().backward()
    assert rel(out.detach(), first) == 0 and torch.isfinite(q.grad).all()


def test_non_contiguous_inputs():
    """(B, N, H, d) tensors viewed as (B, H, N, d), as a model's projections hand them over."""
    g = gen("layout")
    x = torch.randn(B, 70, H, 3 * D, generator=g, dtype=torch.float64)
    q, k, v = x.transpose(1, 2).split(D, dim=-1)
    for rope in PLACEMENTS:
        ref = naive_linear_attention(q, k, v, rope=rope)
        assert rel(chunk_linear_attention(q, k, v, rope=rope, chunk_size=16), ref) < 1e-12


@pytest.mark.parametrize("feature_map", FEATURE_MAPS)
@pytest.mark.parametrize("rope", PLACEMENTS)
def test_gradient_of_one_input_alone(feature_map, rope):
    """Only one of q, k, v requires a gradient (as for frozen projections): the others get none, and that
    one equals naive's; the inputs are non-contiguous views, as a model hands them over."""
    g = gen("one-grad", feature_map, rope)
    x = torch.randn(B, 90, H, 3 * D, generator=g, dtype=torch.float64)
    w = torch.randn(B, H, 90, D, generator=g, dtype=torch.float64)
    for i, name in enumerate("qkv"):
        grads = []
        for fn in (naive_linear_attention, lambda *a, **k_: chunked(*a, chunk_size=16, **k_)):
            leaf = x.clone().requires_grad_()
            parts = list(x.transpose(1, 2).split(D, dim=-1))
            parts[i] = leaf.transpose(1, 2).split(D, dim=-1)[i]
            out = fn(*parts, feature_map=feature_map, rope=rope, decay=DECAY)
            (out * w).sum().backward()
            assert all(not p.requires_grad for j, p in enumerate(parts) if j != i)
            grads.append(leaf.grad)
        assert rel(grads[1], grads[0]) < 1e-10, name


# ------------------------------------------------------------------------------------------------------
# state hand-over: two pieces == one pass; generation step by step
# ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("decayed", [False, True])
@pytest.mark.parametrize("feature_map", FEATURE_MAPS)
def test_two_pieces_equal_one_pass(decayed, feature_map):
    n, cut = 150, 77
    g = gen("pieces", decayed, feature_map)
    q, k, v = inputs(n, g)
    for rope in PLACEMENTS:
        kw = dict(feature_map=feature_map, rope=rope, decay=DECAY if decayed else None)
        full, fin = chunk_linear_attention(q, k, v, chunk_size=16, output_final_state=True, **kw)
        for fn in (lambda *a, **k_: chunk_linear_attention(*a, chunk_size=16, **k_), recurrent_linear_attention):
            o1, s1 = fn(q[:, :, :cut], k[:, :, :cut], v[:, :, :cut], output_final_state=True, **kw)
            o2, s2 = fn(
                q[:, :, cut:],
                k[:, :, cut:],
                v[:, :, cut:],
                positions=torch.arange(cut, n),
                initial_state=s1,
                output_final_state=True,
                **kw,
            )
            assert rel(torch.cat((o1, o2), dim=2), full) < 1e-12, (rope, fn)
            assert rel(s2.S, fin.S) < 1e-12 and rel(s2.z, fin.z) < 1e-12, (rope, fn)


@pytest.mark.parametrize("decayed", [False, True])
def test_recurrent_step_generates_like_chunk(decayed):
    n = 40
    g = gen("steps", decayed)
    q, k, v = inputs(n, g)
    for feature_map, rope in itertools.product(FEATURE_MAPS, PLACEMENTS):
        kw = dict(feature_map=feature_map, rope=rope, decay=DECAY if decayed else None)
        ref, ref_state = chunk_linear_attention(q, k, v, chunk_size=16, output_final_state=True, **kw)
        state = None
        for t in range(n):
            o_t, state = recurrent_step(q[:, :, t], k[:, :, t], v[:, :, t], state, position=t, **kw)
            assert o_t.shape == (B, H, DV)
            assert rel(o_t, ref[:, :, t]) < 1e-12, (feature_map, rope, t)
        assert rel(state.S, ref_state.S) < 1e-12 and rel(state.z, ref_state.z) < 1e-12


def test_recurrent_step_cost_does_not_grow_with_position():
    """O(1) per token: the state keeps its shape, and a far position needs no table of earlier angles."""
    g = gen("far")
    q, k, v = inputs(1, g, dtype=torch.float32)
    state = None
    for pos in (0, 10**6, 10**9):
        o, state = recurrent_step(q[:, :, 0], k[:, :, 0], v[:, :, 0], state, position=pos)
        assert state.S.shape == (B, H, D, DV) and state.z.shape == (B, H, D)
        assert state.S.dtype == torch.float32 and torch.isfinite(o).all()


# ------------------------------------------------------------------------------------------------------
# RoPE: relative (shift-invariant), and it matters in the numerator
# ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("rope", ["numerator", "both"])
@pytest.mark.parametrize("causal", [True, False])
def test_shifting_all_positions_changes_nothing(rope, causal):
    n = 90
    g = gen("shift", rope, causal)
    q, k, v = inputs(n, g)
    for feature_map in FEATURE_MAPS:
        kw = dict(feature_map=feature_map, rope=rope, causal=causal, chunk_size=32)
        base = chunk_linear_attention(q, k, v, **kw)
        shifted = chunk_linear_attention(q, k, v, positions=torch.arange(n) + 12345, **kw)
        assert rel(shifted, base) < 1e-9, feature_map
        if causal:
            stepped = recurrent_linear_attention(
                q, k, v, feature_map=feature_map, rope=rope, positions=torch.arange(n) + 777
            )
            assert rel(stepped, base) < 1e-9, feature_map


def test_rope_in_numerator_changes_the_output():
    g = gen("matters")
    q, k, v = inputs(64, g)
    for feature_map, causal in itertools.product(FEATURE_MAPS, (True, False)):
        with_rope = chunk_linear_attention(q, k, v, feature_map=feature_map, rope="numerator", causal=causal)
        without = chunk_linear_attention(q, k, v, feature_map=feature_map, rope="none", causal=causal)
        assert rel(with_rope, without) > 1e-2, (feature_map, causal)


# ------------------------------------------------------------------------------------------------------
# poisoned buffers, saved tensors, errors
# ------------------------------------------------------------------------------------------------------
def test_poisoning_is_active_and_catches_an_unwritten_element(monkeypatch):
    buf = alloc((3, 4), dtype=torch.float32, device="cpu")
    assert torch.isnan(buf).all()
    g = gen("poison")
    q, k, v = inputs(100, g)
    assert torch.isfinite(chunk_linear_attention(q, k, v, chunk_size=16)).all()

    real_scan = matrix_mod.scan_states

    def forgetful_scan(U, ch, S0):  # "forgets" to write the state entering the last chunk
        S_in, S_fin = real_scan(U, ch, S0)
        S_in[:, :, -1] = alloc(S_in[:, :, -1].shape, dtype=S_in.dtype, device=S_in.device)
        return S_in, S_fin

    monkeypatch.setattr(matrix_mod, "scan_states", forgetful_scan)
    monkeypatch.setattr(native_chunk, "ENABLED", False)  # the torch path's matrix kernel (the walk has its own tests)
    out = chunk_linear_attention(q, k, v, chunk_size=16)
    assert torch.isnan(out[:, :, 96:]).all() and torch.isfinite(out[:, :, :96]).all()


@pytest.mark.parametrize("rope", PLACEMENTS)
@pytest.mark.parametrize("decayed", [False, True])
@pytest.mark.parametrize("block", [None, 256])
def test_backward_saves_nothing_quadratic_or_of_size_n_d2(rope, decayed, block):
    b, h, n, d = 1, 2, 2048, 16
    g = gen("saved", rope, decayed)
    q, k, v = (t.float().requires_grad_() for t in inputs(n, g, d=d, dv=d, b=b, h=h))
    sizes = []

    def pack(t):
        sizes.append(t.numel())
        return t

    blocks = lambda: small_blocks(b * h * d * block) if block else contextlib.nullcontext()  # noqa: E731
    with blocks(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = chunk_linear_attention(q, k, v, rope=rope, decay=DECAY.float() if decayed else None)
    bhnd = b * h * n * d
    assert max(sizes) <= bhnd, sizes  # q, k, v, the output: nothing larger than an input
    # ... plus the (B, H, N) denominator and the states at block boundaries, (N / block)·d·(d+1) numbers
    boundary = (n // block - 1) * b * h * d * (d + 1) if block else 0
    assert sum(sizes) <= 4 * bhnd + b * h * n + boundary + 64, sizes  # (+ γ, θ)
    with blocks():
        out.square().sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))

    # the hook does see what autograd keeps: the naive form saves its N×N weights
    sizes.clear()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        naive_linear_attention(q[:, :, :256], k[:, :, :256], v[:, :, :256], rope=rope)
    assert max(sizes) >= 256 * 256


def test_bad_input_raises_clear_errors():
    g = gen("errors")
    q, k, v = inputs(10, g)
    odd = torch.randn(1, 1, 10, 7, generator=g, dtype=torch.float64)
    for impl in ("naive", "chunk", "recurrent"):
        with pytest.raises(ValueError, match="even head dimension"):
            linear_attention(odd, odd, odd, impl=impl)
        linear_attention(odd, odd, odd, impl=impl, rope="none")  # no RoPE: any head dimension
        with pytest.raises(ValueError, match="same shape"):
            linear_attention(q, k[:, :, :5], v, impl=impl)
        with pytest.raises(ValueError, match="share"):
            linear_attention(q, k, v[:, :, :5], impl=impl)
        with pytest.raises(ValueError, match=r"\(B, H, N, d\)"):
            linear_attention(q[0], k[0], v[0], impl=impl)
        with pytest.raises(ValueError, match="feature_map"):
            linear_attention(q, k, v, impl=impl, feature_map="relu")
        with pytest.raises(ValueError, match="placement"):
            linear_attention(q, k, v, impl=impl, rope="sideways")
        with pytest.raises(ValueError, match="one factor per head"):
            linear_attention(q, k, v, impl=impl, decay=torch.tensor([0.9]))
        with pytest.raises(ValueError, match=r"\(0, 1\]"):
            linear_attention(q, k, v, impl=impl, decay=torch.tensor([0.9, 1.5]))
        with pytest.raises(ValueError, match="positions"):
            linear_attention(q, k, v, impl=impl, positions=torch.arange(9))
        for theta in (torch.tensor([0.5]), torch.rand(2, D // 2)):  # broadcast silently before: one frequency
            with pytest.raises(ValueError, match=f"^rope_theta must be a 1-D tensor of d/2 = {D // 2} frequencies"):
                linear_attention(q, k, v, impl=impl, rope_theta=theta)
    with pytest.raises(ValueError, match="^rope_theta must be"):
        recurrent_step(q[:, :, 0], k[:, :, 0], v[:, :, 0], rope_theta=torch.tensor([0.5]))
    for c in (0, -4):
        with pytest.raises(ValueError, match="chunk_size"):
            linear_attention(q, k, v, impl="chunk", chunk_size=c)
        with pytest.raises(ValueError, match="chunk_size"):
            chunk_linear_attention(q, k, v, chunk_size=c)
    with pytest.raises(ValueError, match="unknown linear attention impl"):
        linear_attention(q, k, v, impl="fused_magic")
    with pytest.raises(ValueError, match="causal only"):
        linear_attention(q, k, v, impl="recurrent", causal=False)
    bad_state = LinearAttentionState(
        torch.zeros(B, H, D + 1, DV, dtype=torch.float64), torch.zeros(B, H, D + 1, dtype=torch.float64)
    )
    one_row = LinearAttentionState(
        torch.zeros(1, H, D, DV, dtype=torch.float64), torch.zeros(1, H, D, dtype=torch.float64)
    )
    for impl in ("naive", "chunk", "recurrent"):
        with pytest.raises(ValueError, match="expected S"):
            linear_attention(q, k, v, impl=impl, initial_state=bad_state)  # elu wants d, not d+1
        with pytest.raises(ValueError, match=rf"initial_state has S\(1, {H}, {D}, {DV}\)"):
            linear_attention(q, k, v, impl=impl, initial_state=one_row)  # would broadcast over the batch
    with pytest.raises(ValueError, match=r"^state has S"):
        recurrent_step(q[:, :, 0], k[:, :, 0], v[:, :, 0], bad_state)
    with pytest.raises(ValueError, match="causal"):
        chunk_linear_attention(q, k, v, causal=False, output_final_state=True)
    with pytest.raises(ValueError, match="does not differentiate decay"):
        chunk_linear_attention(q, k, v, decay=DECAY.clone().requires_grad_())
    with pytest.raises(ValueError, match="one position"):
        recurrent_step(q[:, :, :2], k[:, :, :2], v[:, :, :2])


@pytest.mark.parametrize("impl", ["chunk", "recurrent"])
@pytest.mark.parametrize("loss_on", ["out", "S"])
def test_unnormalised_with_an_initial_state_and_a_loss_that_skips_z(impl, loss_on):
    """normalize=False: z0 reaches nothing but the final z, so a loss on the output (or on S) has no gradient for
    it; the backward hands autograd zeros there (not a placeholder: it crashed), and every other gradient agrees
    with the naive form's, each feature map and placement, over two chunks."""
    for feature_map, rope in itertools.product(FEATURE_MAPS, PLACEMENTS):
        g = gen("unnormalised state", impl, loss_on, feature_map, rope)
        q, k, v = inputs(70, g)
        state = random_state(g, feature_map)
        grads = []
        for form in ("naive", impl):
            leaves = [t.clone().requires_grad_() for t in (q, k, v, *state)]
            out, (S, _) = linear_attention(
                *leaves[:3], impl=form, feature_map=feature_map, rope=rope, normalize=False, chunk_size=32,
                initial_state=LinearAttentionState(*leaves[3:]), output_final_state=True,
            )  # fmt: skip
            w = torch.randn((out if loss_on == "out" else S).shape, generator=gen("weights", loss_on), dtype=S.dtype)
            ((out if loss_on == "out" else S) * w).sum().backward()
            grads.append([x.grad for x in leaves])
        for b, a in zip(*grads):  # None where the loss does not reach a leaf (z0; q for a loss on S)
            if b is None:
                assert a is None or not a.any(), (feature_map, rope)
            else:
                assert rel(a, b) < 1e-10, (feature_map, rope)
        assert grads[0][4] is None


# ------------------------------------------------------------------------------------------------------
# placement "both": a rotated denominator that cancels is clamped alike in every form
# ------------------------------------------------------------------------------------------------------
def cancelling_both_inputs():
    """Two positions, d = 2, elu features: the query at position 355 sees key 0 turned by 355 rad (cos ≈ -1),
    weight 2·cos(355) < 0, and key 1 unrotated with weight -2·cos(355): the rotated denominator is 0 + eps."""
    c = torch.cos(torch.tensor(355.0, dtype=torch.float64))
    q = torch.zeros(1, 1, 2, 2, dtype=torch.float64)  # φ(0) = 1
    k = torch.zeros(1, 1, 2, 2, dtype=torch.float64)
    k[..., 1, :] = torch.log(-c)  # φ = exp(x) = -cos(355) for x < 0
    v = torch.tensor([[1.0, 0.0], [0.0, 0.0]], dtype=torch.float64).view(1, 1, 2, 2)
    return q, k, v, torch.tensor([0, 355])


def test_both_placement_clamps_a_cancelling_denominator():
    q, k, v, positions = cancelling_both_inputs()
    outs, grads = [], []
    for fn in (naive_linear_attention, chunk_linear_attention, recurrent_linear_attention):
        qq = q.clone().requires_grad_()
        out = fn(qq, k, v, rope="both", positions=positions)
        out.sum().backward()
        outs.append(out.detach())
        grads.append(qq.grad)
        # unguarded: |o| ≈ 2 / eps = 2e6 and |dq| ≈ 1e12; guarded: |o| ≤ |num| / DEN_FLOOR = 200
        assert out.abs().max() <= 250, (fn.__name__, out.abs().max().item())
        assert torch.isfinite(qq.grad).all() and qq.grad.abs().max() < 1e5, (fn.__name__, qq.grad.abs().max().item())
    for out, gr in zip(outs[1:], grads[1:]):
        assert rel(out, outs[0]) < 1e-12 and rel(gr, grads[0]) < 1e-10
    # the guard is for "both" only: the unrotated denominator of "numerator" is positive and left alone
    out = chunk_linear_attention(q, k, v, rope="numerator", positions=positions)
    assert out.abs().max() <= 1.0


@pytest.mark.parametrize("only", [False, True])
def test_recurrent_steps_differentiate_the_decay_and_the_frequencies(only):
    """Two generation steps against naive at the same two positions: the gradients of γ and θ too (they were
    dropped), and with ``only`` those two the sole leaves (the backward had nothing to differentiate and failed)."""
    g = gen("step decay theta", only)
    q, k, v = inputs(2, g)
    theta = torch.rand(D // 2, generator=g, dtype=torch.float64)
    grads = []
    for step in (True, False):
        decay, th = DECAY.double().clone().requires_grad_(), theta.clone().requires_grad_()
        leaves = [t.clone().requires_grad_(not only) for t in (q, k, v)]
        kw = dict(decay=decay, rope_theta=th)
        if step:
            o, state = recurrent_step(*(t[:, :, 0] for t in leaves), position=3, **kw)
            o, _ = recurrent_step(*(t[:, :, 1] for t in leaves), state, position=4, **kw)
        else:
            o = naive_linear_attention(*leaves, positions=torch.tensor([3, 4]), **kw)[:, :, 1]
        (o * torch.randn(o.shape, generator=gen("step weights"), dtype=o.dtype)).sum().backward()
        grads.append([t.grad for t in (decay, th, *leaves)])
    assert grads[0][0] is not None and grads[0][1] is not None
    for a, b in zip(*grads):  # γ, θ, then q, k, v (None in both with ``only``)
        assert a is None if b is None else rel(a, b) < 1e-12


@pytest.mark.parametrize("feature_map", FEATURE_MAPS)
def test_recurrent_step_gradients_match_naive(feature_map):
    """The step operator's backward (autograd of the step, recomputed) against autograd through naive."""
    for rope, decayed in itertools.product(PLACEMENTS, (False, True)):
        g = gen("step-grad", feature_map, rope, decayed)
        q, k, v = inputs(1, g)
        state = random_state(g, feature_map)
        kw = dict(feature_map=feature_map, rope=rope, decay=DECAY if decayed else None)
        dd = D + 1 if feature_map == "cosine" else D
        w = (
            torch.randn(B, H, DV, generator=g, dtype=torch.float64),
            torch.randn(B, H, dd, DV, generator=g, dtype=torch.float64),
            torch.randn(B, H, dd, generator=g, dtype=torch.float64),
        )
        grads = []
        for step in (True, False):
            leaves = [t.clone().requires_grad_() for t in (q, k, v, *state)]
            init = LinearAttentionState(*leaves[3:])
            if step:
                o, fin = recurrent_step(*(t[:, :, 0] for t in leaves[:3]), init, position=9, **kw)
            else:
                o, fin = naive_linear_attention(
                    *leaves[:3], positions=torch.tensor([9]), initial_state=init, output_final_state=True, **kw
                )
                o = o[:, :, 0]
            loss = (o * w[0]).sum() + (fin.S * w[1]).sum() + (fin.z * w[2]).sum()
            grads.append(torch.autograd.grad(loss, leaves))
        for name, a, b in zip(("q", "k", "v", "S", "z"), *grads):
            assert rel(a, b) < 1e-10, (rope, decayed, name, rel(a, b))
