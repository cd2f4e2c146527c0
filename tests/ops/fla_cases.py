"""The pieces tests/ops/test_fla.py (CUDA, and its stand-ins) and tests/ops/test_fla_interpreted.py (fla's kernels under
Triton's interpreter) share: seeded inputs, a realistic initial state, the outputs and gradients of one call (the
generator and the relative error are tests/helpers.py's).  Every tensor is made on the CPU from a seeded generator
and moved to the inputs' device explicitly, so a reference on one device multiplied with results on another fails,
whatever the device."""

import torch

from linrope.ops import linear_attention
from linrope.ops.linear_attn.common import LinearAttentionState
from tests.helpers import gen

DECAY = torch.tensor([0.9, 0.99])


def inputs(key, *, feature_map, rope="numerator", decay=None, n, initial, B=2, H=2, d=8, dv=6, device="cpu"):
    """q, k, v (float32, on ``device``) and, when ``initial``, the state (S0, z0) that 20 earlier random positions
    leave (a state that a real prefix could leave: an arbitrary z0 can put the denominator near zero)."""
    g = gen(*key)
    q, k, v = (torch.randn(B, H, n, w, generator=g).to(device) for w in (d, d, dv))
    if not initial:
        return q, k, v, None, None
    p = [torch.randn(B, H, 20, w, generator=g, dtype=torch.float64).to(device) for w in (d, d, dv)]
    decay = None if decay is None else decay.to(device)
    _, (S0, z0) = linear_attention(
        *p, impl="naive", feature_map=feature_map, rope=rope, decay=decay, output_final_state=True
    )
    return q, k, v, S0.float(), z0.float()


def results(impl, dtype, q, k, v, S0, z0, **kw):
    """(out, S, z) and the gradients of (q, k, v, S0, z0) of a fixed random weighting of all three, on the
    inputs' device (the weights are drawn on the CPU and moved there)."""
    leaves = [None if x is None else x.detach().to(dtype).requires_grad_() for x in (q, k, v, S0, z0)]
    state = None if S0 is None else LinearAttentionState(leaves[3], leaves[4])
    out, (S, z) = linear_attention(*leaves[:3], impl=impl, initial_state=state, output_final_state=True, **kw)
    g = gen("weights", tuple(out.shape))
    w = [torch.randn(t.shape, generator=g, dtype=torch.float64).to(t.device) for t in (out, S, z)]
    sum((t.double() * wt).sum() for t, wt in zip((out, S, z), w)).backward()
    return [out, S, z] + [x.grad for x in leaves if x is not None]
