"""Causal linear attention on linrope's own Triton kernels (``impl="triton"``; the kernels: triton_kernels.py).

One forward operator and one backward operator (``linrope::triton_fwd`` / ``_bwd``, registered with
``torch.library`` as chunk.py's are: fake implementations and an autograd formula, so torch.compile sees one opaque
operator).  The forward runs three kernels (every chunk's own part of the state after it, in parallel; a scan that
sums them in order; every chunk's output, in parallel), the backward five (the states again, two kernels;
∂L/∂den with every chunk's part of the state gradient; the scan in reverse; dq, dk, dv in parallel): ``SCAN``
"split".  ``SCAN = "loop"`` sums the states in one sequential kernel instead (triton_kernels.py).  Autograd keeps
q, k, v, the output and the denominator (float32, (B, H, N)) and nothing else.

What it takes: causal calls in float32, float16 and bfloat16; elu and cosine; placements numerator, both and none;
decay; initial and final state (and the gradient of the initial state); ``normalize=False``; packed documents
(``documents``: the chunk weights zeroed across a boundary, triton_kernels._weights); q, k, v in any strides (a
(B, N, H, d) tensor handed in as ``x.transpose(1, 2)``, or the model's view of its fused projection, is read in
place; the output and gradients keep the input's order of heads and positions, ``like``).  What it refuses, in one
line: ``causal=False``, a window, the gradients of ``decay`` and ``rope_theta``, head widths above ``MAX_WIDTH``;
float64 (the registry).

Precision: tiles are loaded and φ, RoPE, the decays, the states, the denominator and every sum are float32.  The
products over a chunk's positions take bfloat16 operands for bfloat16 inputs (tensor cores), float32 otherwise:
float16 inputs are computed in float32 (the denominator grows like 86·t and ∂L/∂num = do / den shrinks with it, out
of float16's range at long N).  Products with a float32 state are tf32 for bfloat16 inputs, tf32x3 for float16
inputs (every product: Triton cannot compile _grad's float32 products in tf32 for sm_90) and exact float32 for float32
inputs (``PREC``).

Where it runs: CUDA and triton (the ``gpu`` extra), or the CPU under Triton's interpreter (``TRITON_INTERPRET=1``,
the tests).  ``impl=auto`` takes it on CUDA only with a triton version in ``VERIFIED`` (none yet: no GPU has run
it; benchmarks/gpu_check.sh --triton measures it against issue 50's goals).
Nothing here imports triton before a call needs it.
"""

from __future__ import annotations

import importlib.util
import os
from contextlib import nullcontext
from typing import Optional

import torch
from torch import Tensor

from . import fla_backend
from .buffers import alloc
from .common import Args, LinearAttentionState, autocast_off, decay_log, zero_state
from .features import feature_width, rope_rotors

INSTALLED = importlib.util.find_spec("triton") is not None  # finds, does not import
CHUNK = 64  # triton_kernels.BT
STATE_BV = 64  # the value block of the "loop" scan's kernels (more blocks, more programs, when d_v > 64)
# How the chunks' states are summed: "split" (every chunk's own part in parallel, then _scan down the slots, each
# program a block of the state's entries) or "loop" (one program per (batch row, head, value block) over the chunks
# in order, each chunk's features and product in the loop).  Both are exact; the device check times both
# (benchmarks/forms.py, "triton-loop"), and the slower goes once a GPU has measured them.
SCAN = "split"
SCAN_BW, SCAN_U = 256, 16  # _scan's block of state entries and slots per step
# ``impl=auto`` takes these kernels on CUDA only with a triton version listed here: one with which the device check
# (benchmarks/gpu_check.sh --triton) met issue 50's goals on a GPU (docs/benchmarks.md, "Issue 50").  None yet.
VERIFIED: frozenset = frozenset()
MAX_WIDTH = 256  # the widest head (q's d, v's d_v) the one-block kernels take
PLACEMENT = {"none": 0, "numerator": 1, "both": 2}
FP16_DOTS = False  # tests only: float16 inputs multiply in float16 (the bfloat16 path's casts, on the interpreter)
_NONE = (0,)


def unavailable(device) -> Optional[str]:
    """Why linrope's Triton kernels cannot run on ``device``, or None: they need triton and CUDA, unless Triton's CPU
    interpreter is switched on (``TRITON_INTERPRET=1``: the tests)."""
    if not INSTALLED:
        return "triton is not installed: pip install 'linrope[gpu]'"
    kind = torch.device(device).type
    if kind != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        return f"linrope's Triton kernels need a CUDA device (here: {kind}); use impl=chunk, or impl=auto"
    return None


def triton_version() -> str:
    """triton's version as installed (``fla_backend.versions``: package metadata, read once, nothing imported)."""
    return fla_backend.versions()[1]


def unverified() -> Optional[str]:
    """Why ``impl=auto`` does not take these kernels even where they can run, or None (``VERIFIED``)."""
    if triton_version() in VERIFIED:
        return None
    return (
        f"linrope's Triton kernels have not met the device check's goals with triton {triton_version()} "
        '(docs/benchmarks.md, "Issue 50"); impl=triton runs them'
    )


def _kernels():
    from . import triton_kernels

    return triton_kernels


def _on(x: Tensor):
    return torch.cuda.device(x.device) if x.is_cuda else nullcontext()


def _none(q: Tensor) -> Tensor:
    """An empty placeholder output (a new one each time: outputs must not alias)."""
    return q.new_empty(_NONE, dtype=torch.float32)


def like(x: Tensor) -> Tensor:
    """An uninitialised tensor of x's shape and dtype in x's order of heads and positions: (B, N, H, ·) memory viewed
    as (B, H, N, ·) when x's heads are inner to its positions (a view of fla's layout, or of the model's fused qkv
    projection: its output projection then reads o without a copy), else (B, H, N, ·).  Poisoned as ``alloc``."""
    B, H, N, w = x.shape
    if x.stride(1) < x.stride(2):
        return alloc((B, N, H, w), dtype=x.dtype, device=x.device).transpose(1, 2)
    return alloc((B, H, N, w), dtype=x.dtype, device=x.device)


def _pow2(n: int) -> int:
    return 1 << max(int(n) - 1, 0).bit_length()


def _meta(q: Tensor, v: Tensor, feature_map: str, rope: str) -> dict:
    import triton.language as tl

    dt = tl.float32
    if q.dtype == torch.bfloat16:
        dt = tl.bfloat16
    elif q.dtype == torch.float16 and FP16_DOTS:
        dt = tl.float16
    return dict(
        BT=CHUNK,
        BK=max(64, _pow2(q.shape[-1])),  # never a 16- or 32-wide block (fla_backend.UNSAFE_BLOCKS)
        COS=feature_map == "cosine",
        ROPE=PLACEMENT[rope],
        DT=dt,
        # float16 inputs: products with float32 operands (their range), in tf32x3: Triton (3.6 and 3.9) cannot compile
        # _grad's float32 products in plain tf32 for sm_90 (benchmarks/triton_compile.py)
        PREC={torch.float32: "ieee", torch.float16: "tf32x3"}.get(q.dtype, "tf32"),
    )


def _inputs(q: Tensor, positions, theta, decay, rope: str, documents=None):
    """(the (N, d/2, 2) float32 cos/sin table, log γ (H,) float32, the (B, N) document ids), a one-element
    stand-in for what is absent."""
    dummy = q.new_zeros(1, dtype=torch.float32)
    cs = dummy
    if rope != "none":
        rot = rope_rotors(positions, q.shape[2], q.shape[3], theta, q.device, torch.float32)
        cs = torch.view_as_real(rot).contiguous()
    log_gamma = decay_log(decay)  # its range was checked at the entry (common.check_decay)
    docs = dummy if documents is None else documents.contiguous()
    return cs, dummy if log_gamma is None else log_gamma.to(torch.float32).contiguous(), docs


@torch.library.custom_op("linrope::triton_fwd", mutates_args=())
def triton_fwd(q: Tensor, k: Tensor, v: Tensor, S0: Optional[Tensor], z0: Optional[Tensor],
               positions: Optional[Tensor], theta: Optional[Tensor], decay: Optional[Tensor], feature_map: str,
               rope: str, eps: float, normalize: bool, final: bool, documents: Optional[Tensor] = None
               ) -> tuple[Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
    """-> (out in v's dtype and order (``like``), den float32 (B, H, N) (a placeholder without ``normalize``),
    S, z float32 (placeholders without ``final``)).  ``documents``: (B, N) ids of packed documents, or None."""
    B, H, N, d = q.shape
    meta = _meta(q, v, feature_map, rope)
    with autocast_off(q.device.type), _on(q):
        cs, g, docs = _inputs(q, positions, theta, decay, rope, documents)
        meta_g = dict(meta, HAS_G=decay is not None, DOCS=documents is not None)
        st, ST, zT = _states(k, v, cs, g, docs, S0, z0, final, meta_g)
        out = like(v)
        den = alloc((B, H, N), dtype=torch.float32, device=q.device) if normalize else _none(q)
        _kernels()._out_fwd[(-(-N // CHUNK), B * H)](
            q, k, v, cs, g, docs, st, out, den if normalize else cs, *q.stride(), *k.stride(), *v.stride(),
            *out.stride(), N, H, d, v.shape[-1], st.shape[1] - 1, float(eps), BV=max(64, _pow2(v.shape[-1])),
            NORM=normalize, **meta_g,
        )  # fmt: skip
    return out, den if normalize else _none(q), ST if final else _none(q), zT if final else _none(q)


def _buffer(B: int, H: int, NT: int, DF: int, dv: int, device) -> Tensor:
    """A state buffer (B·H, NT + 1, DF·d_v + DF) float32: per slot H (DF, d_v) then z (DF,) (triton_kernels._slot)."""
    return alloc((B * H, NT + 1, DF * dv + DF), dtype=torch.float32, device=device)


def _scan(st: Tensor, gate: Tensor, init, last, reverse: bool, cos: bool, d: int, dv: int, gated: bool) -> None:
    """_scan down a filled state buffer (forward, or in ``reverse``) from ``init`` (H, z; None: zero), the last
    state also into ``last`` (H, z) unless None."""
    A0, a0 = init if init is not None else (gate, gate)
    A1, a1 = last if last is not None else (gate, gate)
    _kernels()._scan[(-(-st.shape[2] // SCAN_BW), st.shape[0])](
        st, gate, A0, a0, A1, a1, st.shape[1] - 1, d, dv, COS=cos, REVERSE=reverse, GATE=gated,
        INIT=init is not None, LAST=last is not None, U=SCAN_U, BW=SCAN_BW, num_warps=4,
    )  # fmt: skip


def _states(k, v, cs, g, docs, S0, z0, final: bool, meta: dict):
    """(the state buffer: H_c, z_c before every chunk c in slot c, the final state or stand-ins)."""
    B, H, N, d = k.shape
    dv, DF, NT = v.shape[-1], feature_width("cosine" if meta["COS"] else "elu", d), -(-N // CHUNK)
    f32 = dict(dtype=torch.float32, device=k.device)
    st = _buffer(B, H, NT, DF, dv, k.device)
    ST, zT = (alloc((B, H, DF, dv), **f32), alloc((B, H, DF), **f32)) if final else (cs, cs)
    has_s0 = S0 is not None
    if has_s0:
        S0, z0 = S0.to(torch.float32).contiguous(), z0.to(torch.float32).contiguous()
    if SCAN == "loop":
        if not has_s0:
            S0, z0 = torch.zeros(B, H, DF, dv, **f32), torch.zeros(B, H, DF, **f32)
        _kernels()._state_fwd[(-(-dv // STATE_BV), B * H)](
            k, v, cs, g, docs, S0, z0, st, ST, zT, *k.stride(), *v.stride(), N, H, d, dv, NT, BV=STATE_BV,
            FINAL=final, **meta,
        )  # fmt: skip
        return st, ST, zT
    gated = meta["HAS_G"] or meta["DOCS"]
    gate = alloc((B * H, NT + 1), **f32) if gated else cs
    _kernels()._chunk_state[(NT, B * H)](
        k, v, cs, g, docs, st, gate, *k.stride(), *v.stride(), N, H, d, dv, NT, BV=max(64, _pow2(dv)), GATE=gated,
        **meta,
    )  # fmt: skip
    _scan(st, gate, (S0, z0) if has_s0 else None, (ST, zT) if final else None, False, meta["COS"], d, dv, gated)
    return st, ST, zT


@triton_fwd.register_fake
def _(q, k, v, S0, z0, positions, theta, decay, feature_map, rope, eps, normalize, final, documents=None):
    B, H, N, d = q.shape
    DF, dv = feature_width(feature_map, d), v.shape[-1]
    f32 = dict(dtype=torch.float32)
    return (
        like(v),
        q.new_empty((B, H, N) if normalize else _NONE, **f32),
        q.new_empty((B, H, DF, dv) if final else _NONE, **f32),
        q.new_empty((B, H, DF) if final else _NONE, **f32),
    )


@torch.library.custom_op("linrope::triton_bwd", mutates_args=())
def triton_bwd(g_out: Optional[Tensor], g_S: Optional[Tensor], g_z: Optional[Tensor], q: Tensor, k: Tensor, v: Tensor,
               S0: Optional[Tensor], z0: Optional[Tensor], positions: Optional[Tensor], theta: Optional[Tensor],
               decay: Optional[Tensor], out: Tensor, den: Tensor, feature_map: str, rope: str, normalize: bool,
               need_S0: bool, documents: Optional[Tensor] = None
               ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
    """-> (dq, dk, dv in the inputs' dtypes and orders, dS0, dz0 float32 or placeholders without ``need_S0``)."""
    B, H, N, d = q.shape
    dv_, DF, NT = v.shape[-1], feature_width(feature_map, d), -(-N // CHUNK)
    meta = dict(_meta(q, v, feature_map, rope), HAS_G=decay is not None, DOCS=documents is not None)
    f32 = dict(dtype=torch.float32, device=q.device)
    kern = _kernels()
    with autocast_off(q.device.type), _on(q):
        cs, g, docs = _inputs(q, positions, theta, decay, rope, documents)
        st, _, _ = _states(k, v, cs, g, docs, S0, z0, False, meta)
        do = torch.zeros_like(v) if g_out is None else g_out
        dd = alloc((B, H, N), **f32) if normalize else cs
        dst = _buffer(B, H, NT, DF, dv_, q.device)
        dS0, dz0 = (alloc((B, H, DF, dv_), **f32), alloc((B, H, DF), **f32)) if need_S0 else (cs, cs)
        init = None  # the final state's gradient (zero for the one not given)
        if g_S is not None or g_z is not None or SCAN == "loop":
            init = tuple(
                torch.zeros(shape, **f32) if x is None else x.to(torch.float32).contiguous()
                for x, shape in ((g_S, (B, H, DF, dv_)), (g_z, (B, H, DF)))
            )
        if SCAN == "loop":
            if normalize:
                kern._dden[(NT, B * H)](
                    do, out, den, dd, *do.stride(), *out.stride(), N, H, dv_, BT=CHUNK, BV=max(64, _pow2(dv_)),
                    GUARD=rope == "both", num_warps=4,
                )  # fmt: skip
            kern._state_bwd[(-(-dv_ // STATE_BV), B * H)](
                q, cs, g, docs, do, den if normalize else cs, dd, *init, dst, dS0, dz0, *q.stride(), *do.stride(),
                N, H, d, dv_, NT, BV=STATE_BV, NORM=normalize, D0=need_S0, **meta,
            )  # fmt: skip
        else:
            gated = meta["HAS_G"] or meta["DOCS"]
            gate = alloc((B * H, NT + 1), **f32) if gated else cs
            kern._chunk_dstate[(NT, B * H)](
                q, cs, g, docs, do, out, den if normalize else cs, dd, dst, gate, *q.stride(), *do.stride(),
                *out.stride(), N, H, d, dv_, NT, BV=max(64, _pow2(dv_)), NORM=normalize, GUARD=rope == "both",
                GATE=gated, **meta,
            )  # fmt: skip
            _scan(dst, gate, init, (dS0, dz0) if need_S0 else None, True, meta["COS"], d, dv_, gated)
        dq, dk, dv = like(q), like(k), like(v)
        kern._grad[(NT, B * H)](
            q, k, v, cs, g, docs, st, do, den if normalize else cs, dd, dst, dq, dk, dv,
            *q.stride(), *k.stride(), *v.stride(), *do.stride(), *dq.stride(), *dk.stride(), *dv.stride(),
            N, H, d, dv_, NT, BV=max(64, _pow2(dv_)), NORM=normalize, **meta,
        )  # fmt: skip
    return dq, dk, dv, dS0 if need_S0 else _none(q), dz0 if need_S0 else _none(q)


@triton_bwd.register_fake
def _(g_out, g_S, g_z, q, k, v, S0, z0, positions, theta, decay, out, den, feature_map, rope, normalize, need_S0,
      documents=None):  # fmt: skip
    B, H, _, d = q.shape
    DF, dv = feature_width(feature_map, d), v.shape[-1]
    f32 = dict(dtype=torch.float32)
    dS0 = q.new_empty((B, H, DF, dv) if need_S0 else _NONE, **f32)
    dz0 = q.new_empty((B, H, DF) if need_S0 else _NONE, **f32)
    return like(q), like(k), like(v), dS0, dz0


def _setup_context(ctx, inputs, output):
    q, k, v, S0, z0, positions, theta, decay, feature_map, rope, eps, normalize, final, documents = inputs
    out, den, _, _ = output
    ctx.cfg = (feature_map, rope, normalize)
    ctx.save_for_backward(q, k, v, S0, z0, positions, theta, decay, out, den, documents)
    ctx.mark_non_differentiable(den)
    ctx.set_materialize_grads(False)


def _backward(ctx, g_out, _g_den, g_S, g_z):
    q, k, v, S0, z0, positions, theta, decay, out, den, documents = ctx.saved_tensors
    needs = ctx.needs_input_grad
    if g_out is None and g_S is None and g_z is None:
        return (None,) * 14
    need_S0 = S0 is not None and (needs[3] or needs[4])
    dq, dk, dv, dS0, dz0 = triton_bwd(
        g_out, g_S, g_z, q, k, v, S0, z0, positions, theta, decay, out, den, *ctx.cfg, need_S0, documents
    )
    grads = (dq, dk, dv, dS0.to(S0.dtype) if need_S0 else None, dz0.to(z0.dtype) if need_S0 else None)
    return (*(gr if need else None for gr, need in zip(grads, needs[:5])), *(None,) * 9)


triton_fwd.register_autograd(_backward, setup_context=_setup_context)


def triton_form(q: Tensor, k: Tensor, v: Tensor, a: Args):
    """Causal linear attention on linrope's Triton kernels (the semantics of the naive form), ``Args`` checked and
    the backend's limits checked by the registry (``backends.py``).  -> (B, H, N, d_v) [and the final state]."""
    B, H, N, d = q.shape
    if max(d, v.shape[-1]) > MAX_WIDTH:
        raise ValueError(
            f"impl=triton takes head widths up to {MAX_WIDTH} (got d={d}, d_v={v.shape[-1]}); use impl=chunk"
        )
    state = a.initial_state
    if N == 0:
        out = v.new_empty(v.shape)
        if not a.output_final_state:
            return out
        if state is None:
            return out, zero_state(B, H, feature_width(a.feature_map, d), v.shape[-1], torch.float32, q.device)
        return out, LinearAttentionState(state.S.float(), state.z.float())
    S0, z0 = (None, None) if state is None else (state.S, state.z)
    out, _, S, z = triton_fwd(
        q, k, v, S0, z0, a.positions, a.rope_theta, a.decay, a.feature_map, a.rope, a.eps, a.normalize,
        a.output_final_state, a.documents,
    )  # fmt: skip
    if not a.output_final_state:
        return out
    return out, LinearAttentionState(S, z)


__all__ = ["triton_form", "triton_fwd", "triton_bwd", "unavailable", "unverified", "CHUNK", "MAX_WIDTH", "VERIFIED"]
