"""Low precision and devices: float32 states for float16/bfloat16 inputs, long sequences, CUDA."""

import contextlib
import itertools

import pytest
import torch

from linrope.ops import (
    LinearAttentionState,
    chunk_linear_attention,
    linear_attention,
    naive_linear_attention,
    recurrent_linear_attention,
    recurrent_step,
)
from tests.helpers import gen, rel

DECAY = torch.tensor([0.99, 0.9])


pytestmark = pytest.mark.usefixtures("kernel_env")  # NaN-poisoned buffers, one thread (tests/conftest.py)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("feature_map", ["elu", "cosine"])
def test_low_precision_chunk_against_float64_naive(dtype, feature_map):
    tol = {torch.bfloat16: 2e-2, torch.float16: 5e-3, torch.float32: 1e-5}[dtype]
    g = gen("lowp", dtype, feature_map)
    q, k, v = (torch.randn(2, 2, 300, 16, generator=g) for _ in range(3))
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)  # the reference sees exactly the rounded inputs
    for rope, causal, decayed in itertools.product(("numerator", "both", "none"), (True, False), (False, True)):
        kw = dict(feature_map=feature_map, rope=rope, causal=causal, decay=DECAY if decayed else None)
        ref = naive_linear_attention(q.double(), k.double(), v.double(), **kw)
        res = chunk_linear_attention(q, k, v, chunk_size=64, output_final_state=causal, **kw)
        out = res[0] if causal else res
        assert out.dtype == dtype
        assert rel(out, ref) < tol, (rope, causal, decayed, rel(out, ref))
        if causal:
            assert res[1].S.dtype == torch.float32 and res[1].z.dtype == torch.float32
    if dtype != torch.float32:
        rec = recurrent_linear_attention(q, k, v, feature_map=feature_map)
        assert rec.dtype == dtype
        assert rel(rec, naive_linear_attention(q.double(), k.double(), v.double(), feature_map=feature_map)) < tol


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("feature_map", ["elu", "cosine"])
def test_low_precision_gradients_against_float64_naive(dtype, feature_map):
    """The backward computes in float32 and hands back gradients in the input precision."""
    tol = {torch.bfloat16: 1e-2, torch.float16: 2e-3}[dtype]  # about one rounding of the result (seen: 2.7e-3, 4.4e-4)
    g = gen("lowp-grad", dtype, feature_map)
    q, k, v = (torch.randn(2, 2, 300, 16, generator=g).to(dtype) for _ in range(3))
    w = torch.randn(2, 2, 300, 16, generator=g, dtype=torch.float64)
    for rope in ("numerator", "both", "none"):
        grads = []
        for fn, t in ((naive_linear_attention, torch.float64), (chunk_linear_attention, dtype)):
            leaves = [x.detach().to(t).requires_grad_() for x in (q, k, v)]
            (fn(*leaves, feature_map=feature_map, rope=rope).double() * w).sum().backward()
            grads.append([x.grad for x in leaves])
        for name, gr, ref in zip("qkv", grads[1], grads[0]):
            assert gr.dtype == dtype and rel(gr, ref) < tol, (rope, name, rel(gr, ref))


@pytest.mark.parametrize("decayed", [False, True])
def test_bfloat16_at_65536_positions_stays_finite(decayed):
    n, d = 65536, 16
    g = gen("long", decayed)
    q, k, v = (torch.randn(1, 1, n, d, generator=g).bfloat16().requires_grad_() for _ in range(3))
    decay = torch.tensor([0.999]) if decayed else None
    out, state = chunk_linear_attention(q, k, v, decay=decay, output_final_state=True)
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
    assert torch.isfinite(state.S).all() and torch.isfinite(state.z).all()
    out.float().square().mean().backward()
    for t in (q, k, v):
        assert t.grad.dtype == torch.bfloat16 and torch.isfinite(t.grad).all()
    # against the same kernel in float32 (naive cannot hold 65536² weights)
    with torch.no_grad():
        ref = chunk_linear_attention(q.float(), k.float(), v.float(), decay=decay)
    assert rel(out.detach(), ref) < 2e-2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chunk_on_cuda_matches_naive(dtype):
    g = gen("cuda", dtype)
    q, k, v = (torch.randn(2, 2, 333, 16, generator=g) for _ in range(3))
    for rope, causal, decayed in itertools.product(("numerator", "both", "none"), (True, False), (False, True)):
        kw = dict(rope=rope, causal=causal, decay=DECAY if decayed else None)
        ref_leaves = [t.double().requires_grad_() for t in (q, k, v)]
        ref = naive_linear_attention(*ref_leaves, **kw)
        ref.square().sum().backward()
        leaves = [t.to("cuda", dtype).requires_grad_() for t in (q, k, v)]
        out = chunk_linear_attention(*leaves, **kw)
        assert out.device.type == "cuda" and out.dtype == dtype
        tol = 1e-4 if dtype == torch.float32 else 3e-2
        assert rel(out.cpu(), ref) < tol, (rope, causal, decayed)
        out.float().square().sum().backward()
        for leaf, ref_leaf in zip(leaves, ref_leaves):
            assert rel(leaf.grad.cpu(), ref_leaf.grad) < 10 * tol, (rope, causal, decayed)


# ---- the precision matrix (issue 24): every form under autocast and with 16-bit inputs ---------------------
# Each case is compared with the float64 naive form on exactly the rounded inputs it saw, forward (output and
# final state) and backward (q, k, v and the initial state), as a relative error in norm.  N = 200 with
# chunk 64: more than one chunk and not a multiple of it (a partial last chunk, several blocks of state).
# Tolerances per mode (forward: output and final state; backward: every gradient), documented in
# docs/mathematics.md ("Precision"), about 3x the largest error seen over the 24 cases of each test:
#   autocast-bf16 / bf16: inputs and output rounded to bfloat16 (8 significant bits); the chunk form's large
#       products run in bfloat16 with float32 accumulation (``chunk_kernel.matmul_dtype``).  Seen: forward
#       4.6e-3 (chunk; 1.8e-3 the other forms), backward 1.3e-2 (chunk; 5.2e-3 the other forms).
#   fp16 / autocast-fp16: float16 inputs (11 bits), float32 compute.  Seen: 3.0e-4, 1.4e-3.
#   autocast-fp32-inputs: autocast does not reach inside linear attention (``common.autocast_off``), so
#       float32 inputs are computed in float32 under autocast too.  Seen: 5.7e-6, 9.2e-6.
MATRIX_TOL = {
    "autocast-bf16": (1.5e-2, 4e-2),
    "bf16": (1.5e-2, 4e-2),
    "fp16": (1e-3, 4e-3),
    "autocast-fp16": (1e-3, 4e-3),
    "autocast-fp32-inputs": (2e-5, 3e-5),
}  # (forward, backward)
MATRIX_N, MATRIX_D, MATRIX_CHUNK = 200, 8, 64
VERBOSE = False
MATRIX_DECAY = torch.tensor([0.97, 0.9])


def _as_mode(x: torch.Tensor, mode: str) -> torch.Tensor:
    """The tensor a form receives in ``mode`` (called inside the autocast context for autocast modes)."""
    if mode == "bf16":
        return x.bfloat16()
    if mode == "fp16":
        return x.half()
    if mode in ("autocast-bf16", "autocast-fp16"):  # what a Linear under autocast hands on: x @ I, recast
        return x @ torch.eye(x.shape[-1], dtype=x.dtype)
    return x


def _autocast(mode: str):
    if mode == "autocast-fp16":
        return torch.autocast("cpu", dtype=torch.float16)
    if mode.startswith("autocast"):
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _run_form(form, q, k, v, S0, z0, *, feature_map, rope, decay):
    """-> (out, S_final, z_final) of one form, continuing from (S0, z0)."""
    kw = dict(feature_map=feature_map, rope=rope, decay=decay)
    state = LinearAttentionState(S0, z0)
    if form == "recurrent_step":
        outs = []
        for t in range(q.shape[2]):
            o, state = recurrent_step(q[:, :, t], k[:, :, t], v[:, :, t], state, position=t, **kw)
            outs.append(o)
        return torch.stack(outs, dim=2), state.S, state.z
    extra = {"chunk_size": MATRIX_CHUNK} if form == "chunk" else {}
    out, st = linear_attention(q, k, v, impl=form, initial_state=state, output_final_state=True, **kw, **extra)
    return out, st.S, st.z


def _loss(res, w):
    return sum((r.double() * wi).sum() for r, wi in zip(res, w))


@pytest.mark.parametrize("mode", list(MATRIX_TOL))
@pytest.mark.parametrize("form", ["naive", "chunk", "recurrent", "recurrent_step"])
def test_precision_matrix_against_float64_naive(form, mode):
    tol_fwd, tol_bwd = MATRIX_TOL[mode]
    worst = {}
    for feature_map, rope, decayed, with_state in itertools.product(
        ("elu", "cosine"), ("numerator", "both", "none"), (False, True), (False, True)
    ):
        case = (feature_map, rope, decayed, with_state)
        g = gen("matrix", form, mode, *case)
        B, H, N, d = 1, 2, (70 if form == "recurrent_step" else MATRIX_N), MATRIX_D  # one operator call a step
        D = d + 1 if feature_map == "cosine" else d
        q, k, v = (torch.randn(B, H, N, d, generator=g) for _ in range(3))
        decay = MATRIX_DECAY if decayed else None
        kw = dict(feature_map=feature_map, rope=rope, decay=decay)
        if with_state:  # a state a real prefix leaves (a random one can make the denominators cancel)
            prefix = [torch.randn(B, H, 37, d, generator=g, dtype=torch.float64) for _ in range(3)]
            S0, z0 = (t.float() for t in naive_linear_attention(*prefix, output_final_state=True, **kw)[1])
        else:
            S0, z0 = torch.zeros(B, H, D, d), torch.zeros(B, H, D)
        w = [
            torch.randn(B, H, N, d, generator=g, dtype=torch.float64),
            torch.randn(B, H, D, d, generator=g, dtype=torch.float64),
            torch.randn(B, H, D, generator=g, dtype=torch.float64),
        ]
        leaves = [t.clone().requires_grad_() for t in (q, k, v, S0, z0)]
        with _autocast(mode):
            qkv = [_as_mode(t, mode) for t in leaves[:3]]
            res = _run_form(form, *qkv, leaves[3], leaves[4], **kw)
        assert res[0].dtype == qkv[2].dtype, (case, res[0].dtype)
        assert res[1].dtype == res[2].dtype == torch.float32, case  # states stay float32
        _loss(res, w).backward()
        # the reference sees exactly the rounded inputs
        ref_leaves = [t.detach().double().requires_grad_() for t in (*qkv, S0, z0)]
        ref = _run_form("naive", *ref_leaves, **kw)
        _loss(ref, w).backward()
        errs = {
            "out": rel(res[0].detach(), ref[0]),
            "S": rel(res[1].detach(), ref[1]),
            "z": rel(res[2].detach(), ref[2]),
        }
        # inputs handed in 16-bit: their gradient is the leaf's (the rounding is the identity for autograd)
        for name, i in zip(("dq", "dk", "dv", "dS0", "dz0"), range(5)):
            gr = leaves[i].grad
            if with_state or i < 3:
                assert gr is not None and torch.isfinite(gr).all(), (case, name)
                errs[name] = rel(gr, ref_leaves[i].grad)
        for name, e in errs.items():
            worst[name] = max(worst.get(name, 0.0), e)
            tol = tol_fwd if name in ("out", "S", "z") else tol_bwd
            assert e < tol, (case, name, e, tol)
        if VERBOSE:
            print(case, {k_: f"{e:.1e}" for k_, e in errs.items()})
    print(form, mode, {k_: f"{e:.1e}" for k_, e in worst.items()})
