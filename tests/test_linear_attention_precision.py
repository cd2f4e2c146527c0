"""Low precision and devices: float32 states for float16/bfloat16 inputs, long sequences, CUDA."""
import itertools
import zlib

import pytest
import torch

from linrope.ops.linear_attn.chunk import chunk_linear_attention
from linrope.ops.linear_attn.naive import naive_linear_attention
from linrope.ops.linear_attn.recurrent import recurrent_linear_attention

DECAY = torch.tensor([0.99, 0.9])


pytestmark = pytest.mark.usefixtures("kernel_env")  # NaN-poisoned buffers, one thread (tests/conftest.py)


def gen(*key) -> torch.Generator:
    return torch.Generator().manual_seed(zlib.crc32(repr(key).encode()))


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


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
