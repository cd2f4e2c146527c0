"""Chunked linear attention: the public entry point, and the forward and backward passes of
``chunk_kernel.py`` registered as PyTorch operators.

``linrope::chunk_fwd`` and ``linrope::chunk_bwd`` are ``torch.library`` custom operators with fake (shape
only) implementations and an autograd formula, so ``torch.compile`` sees one opaque operator per call: no
graph break at the kernels' in-place writes into preallocated buffers, and no output that aliases an input.
The fake implementations only compute shapes from shapes and create tensors on the inputs' device, so the
registration holds for any device the kernels run on.

Operator outputs are always tensors: where a result does not exist (no final state without causality, no
saved state with a single block, no gradient that was not asked for) an empty placeholder stands in, and the
wrappers below turn it back into None.
"""

from typing import Optional

import torch
from torch import Tensor

from linrope.ops.rope import compute_dtype

from . import heads
from .buffers import alloc
from .chunk_kernel import Cfg, chunk_backward, chunk_forward
from .common import Args, LinearAttentionState, autocast_off, decay_log, shared_features, zero_state
from .features import feature_width
from .tables import plan_blocks
from .window import windowed_form

_NONE = (0,)  # the shape of a placeholder


def _or_empty(t: Optional[Tensor], like: Tensor, dtype=None) -> Tensor:
    return like.new_empty(_NONE, dtype=dtype or like.dtype) if t is None else t


def _or_none(t: Tensor) -> Optional[Tensor]:
    return None if t.dim() == 1 and t.shape[0] == 0 else t


def _or_none_opt(t: Optional[Tensor]) -> Optional[Tensor]:
    return None if t is None else _or_none(t)


def _fwd_shapes(q: Tensor, v: Tensor, feature_map: str, rope: str, causal: bool, chunk_size: int, normalize: bool):
    """Shapes of (out, denom, S, z, saved_S, saved_z) as ``chunk_forward`` makes them (placeholders included)."""
    B, H, N, d = q.shape
    dv, D = v.shape[-1], feature_width(feature_map, q.shape[-1])
    shared = shared_features(rope)
    nb = len(plan(B, H, N, max(d, dv), chunk_size, causal, q.device)[1]) - 1
    state = ((B, H, D, dv), (B, H, D)) if causal else (_NONE, _NONE)
    saved_S = (nb, B, H, D, dv + 1 if shared else dv) if nb else _NONE
    saved_z = (nb, B, H, D) if (nb and not shared) else _NONE
    return (tuple(v.shape), (B, H, N) if normalize else _NONE, *state, saved_S, saved_z)


@torch.library.custom_op("linrope::chunk_fwd", mutates_args=())
def chunk_fwd(q: Tensor, k: Tensor, v: Tensor, S0: Optional[Tensor], z0: Optional[Tensor],
              positions: Optional[Tensor], theta: Optional[Tensor], decay: Optional[Tensor], feature_map: str,
              rope: str, causal: bool, eps: float, chunk_size: int, normalize: bool = True,
              documents: Optional[Tensor] = None
              ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
    """-> (out, denom, S_final, z_final, saved_S, saved_z); see ``chunk_kernel.chunk_forward``.  ``denom`` is a
    placeholder when ``normalize`` is False (the output is the numerator)."""
    log_gamma = decay_log(decay)  # its range was checked at the entry (common.check_decay)
    cfg = Cfg(feature_map, rope, causal, eps, chunk_size, normalize)
    parts, blocks = _plan(q, v, cfg)
    dtype = compute_dtype(q.dtype)
    with autocast_off(q.device.type):  # autocast does not reach inside: the inputs' dtypes decide (common.py)
        if parts is None:
            res = chunk_forward(q, k, v, S0, z0, positions, theta, log_gamma, cfg, documents, blocks)
        else:  # heads as tasks of their own on the CPU's threads (heads.py), writing into views of these buffers
            out = alloc(v.shape, dtype=v.dtype, device=v.device)
            denom = alloc(q.shape[:3], dtype=dtype, device=q.device) if normalize else None

            def task(rows, hs):
                def part(t, dim=1):
                    return heads.rows_heads(t, rows, hs, dim)

                return chunk_forward(*(part(t) for t in (q, k, v, S0, z0)), positions, theta,
                                     None if log_gamma is None else log_gamma[hs], cfg,
                                     None if documents is None else documents[rows], blocks, part(out),
                                     part(denom))[2:]  # fmt: skip

            res = (out, denom, *heads.run(task, parts, (1, 1, 2, 2)))
    return tuple(_or_empty(t, q, dtype) for t in res)


@chunk_fwd.register_fake
def _(q, k, v, S0, z0, positions, theta, decay, feature_map, rope, causal, eps, chunk_size, normalize=True,
      documents=None):  # fmt: skip
    dtype = compute_dtype(q.dtype)
    shapes = _fwd_shapes(q, v, feature_map, rope, causal, chunk_size, normalize)
    return (v.new_empty(shapes[0]), *(q.new_empty(s, dtype=dtype) for s in shapes[1:]))


@torch.library.custom_op("linrope::chunk_bwd", mutates_args=())
def chunk_bwd(g_out: Optional[Tensor], g_S: Optional[Tensor], g_z: Optional[Tensor], q: Tensor, k: Tensor, v: Tensor,
              S0: Optional[Tensor], z0: Optional[Tensor], positions: Optional[Tensor], theta: Optional[Tensor],
              decay: Optional[Tensor], out: Tensor, denom: Tensor, saved_S: Tensor, saved_z: Tensor, feature_map: str,
              rope: str, causal: bool, eps: float, chunk_size: int, need_q: bool, need_k: bool, need_v: bool,
              need_S0: bool, need_z0: bool, normalize: bool = True, documents: Optional[Tensor] = None
              ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
    """-> (dq, dk, dv, dS0, dz0), placeholders for the gradients not asked for."""
    log_gamma = decay_log(decay)
    cfg = Cfg(feature_map, rope, causal, eps, chunk_size, normalize)
    needs = (need_q, need_k, need_v, need_S0, need_z0)
    g_S, g_z, saved_S, saved_z = _or_none_opt(g_S), _or_none_opt(g_z), _or_none(saved_S), _or_none(saved_z)
    parts, blocks = _plan(q, v, cfg)
    with autocast_off(q.device.type):
        if parts is None:
            grads = chunk_backward(g_out, g_S, g_z, q, k, v, S0, z0, positions, theta, log_gamma, out,
                                   denom, saved_S, saved_z, cfg, needs, documents, blocks)  # fmt: skip
        else:  # heads as tasks of their own on the CPU's threads (heads.py), writing into views of these buffers
            buffers = [alloc(x.shape, dtype=x.dtype, device=x.device) if need else None
                       for x, need in zip((q, k, v), needs[:3])]  # fmt: skip

            def task(rows, hs):
                def part(t, dim=1):
                    return heads.rows_heads(t, rows, hs, dim)

                return chunk_backward(*(part(t) for t in (g_out, g_S, g_z, q, k, v, S0, z0)), positions, theta,
                                      None if log_gamma is None else log_gamma[hs], part(out), part(_or_none(denom)),
                                      part(saved_S, 2), part(saved_z, 2), cfg, needs,
                                      None if documents is None else documents[rows], blocks,
                                      [part(b) for b in buffers])[3:]  # fmt: skip

            grads = (*buffers, *heads.run(task, parts, (1, 1)))
    if need_z0 and grads[4] is None:  # no path from the loss to z0 (normalize=False: z0 reaches the final z alone)
        grads = (*grads[:4], torch.zeros_like(z0))
    dq, dk, dv, dS0, dz0 = (_or_empty(g, like) for g, like in zip(grads, (q, k, v, q, q)))
    return dq, dk, dv, dS0.clone(), dz0.clone()  # the state's gradients may be views of one buffer


@chunk_bwd.register_fake
def _(g_out, g_S, g_z, q, k, v, S0, z0, positions, theta, decay, out, denom, saved_S, saved_z, feature_map, rope,
      causal, eps, chunk_size, need_q, need_k, need_v, need_S0, need_z0, normalize=True, documents=None):  # fmt: skip
    def grad(need, x):
        return x.new_empty(x.shape) if (need and x is not None) else q.new_empty(_NONE)

    return grad(need_q, q), grad(need_k, k), grad(need_v, v), grad(need_S0, S0), grad(need_z0, z0)


def plan(B: int, H: int, N: int, d: int, chunk_size: int, causal: bool, device: torch.device):
    """(the tasks' (rows, heads), or None to run the call whole; the blocks every task, or the whole call, walks):
    a function of the shape alone, so that forward, backward and the fake implementation agree."""
    parts = heads.groups(B, H, N, d, device)
    width = H if parts is None else max(hs.stop - hs.start for _, hs in parts)
    return parts, plan_blocks(1 if parts else B, width, N, d, chunk_size, causal, device)


def _plan(q: Tensor, v: Tensor, cfg: Cfg):
    B, H, N, d = q.shape
    return plan(B, H, N, max(d, v.shape[-1]), cfg.chunk_size, cfg.causal, q.device)


def _setup_context(ctx, inputs, output):
    q, k, v, S0, z0, positions, theta, decay, feature_map, rope, causal, eps, chunk_size, normalize, documents = inputs
    out, denom, _, _, saved_S, saved_z = output
    ctx.cfg, ctx.normalize = (feature_map, rope, causal, eps, chunk_size), normalize
    ctx.save_for_backward(q, k, v, S0, z0, positions, theta, decay, out, denom, saved_S, saved_z, documents)
    ctx.mark_non_differentiable(denom, saved_S, saved_z)
    ctx.set_materialize_grads(False)


def _backward(ctx, g_out, _g_denom, g_S, g_z, _g_saved_S, _g_saved_z):
    q, k, v, S0, z0, positions, theta, decay, out, denom, saved_S, saved_z, documents = ctx.saved_tensors
    needs = [bool(n) for n in ctx.needs_input_grad[:5]]
    needs[3] = needs[3] and S0 is not None
    needs[4] = needs[4] and z0 is not None
    if g_out is None and g_S is None and g_z is None:
        return (None,) * 15
    grads = chunk_bwd(g_out, g_S, g_z, q, k, v, S0, z0, positions, theta, decay, out, denom, saved_S, saved_z,
                      *ctx.cfg, *needs, ctx.normalize, documents)  # fmt: skip
    return (*(g if need else None for g, need in zip(grads, needs)), *(None,) * 10)


chunk_fwd.register_autograd(_backward, setup_context=_setup_context)


# --------------------------------------------------------------------------------------------------------
# public entry point
# --------------------------------------------------------------------------------------------------------
def chunk_form(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, a: Args):
    """Chunked linear attention (the semantics of the naive form), ``Args`` checked; memory linear in N in forward
    and backward.  ``linrope.ops.linear_attention`` calls it with impl="chunk".  A window shorter than the
    sequence runs the blocked windowed form (``window.py``); a longer one is no window."""
    B, H, N, d = q.shape
    if a.window is not None and a.window < N:
        return windowed_form(q, k, v, a)
    initial_state = a.initial_state
    if N == 0:
        out = v.new_empty(v.shape)
        if not a.output_final_state:
            return out
        dtype = compute_dtype(q.dtype)
        if initial_state is None:
            return out, zero_state(B, H, feature_width(a.feature_map, d), v.shape[-1], dtype, q.device)
        return out, LinearAttentionState(initial_state.S.to(dtype), initial_state.z.to(dtype))
    S0 = z0 = None
    if initial_state is not None:
        S0, z0 = initial_state.S, initial_state.z
    out, _, S, z, _, _ = chunk_fwd(
        q,
        k,
        v,
        S0,
        z0,
        a.positions,
        a.rope_theta,
        a.decay,
        a.feature_map,
        a.rope,
        a.causal,
        a.eps,
        a.chunk_size,
        a.normalize,
        a.documents,
    )
    if not a.output_final_state:
        return out
    return out, LinearAttentionState(S, z)


__all__ = ["chunk_form", "chunk_fwd", "chunk_bwd"]
