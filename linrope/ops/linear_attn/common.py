"""Pieces shared by every form of linear attention: the argument spec (``Args``) and its checks, the state, the
denominator's guard, autocast.  (φ and the RoPE features are in ``features.py``.)"""

from __future__ import annotations

import contextlib
import functools
from typing import NamedTuple, Optional

import torch
from torch import Tensor

from linrope.ops.rope import check_rope_dim

from .documents import check_documents
from .features import FEATURE_MAPS, feature_width

PLACEMENTS = ("numerator", "both", "none")


class LinearAttentionState(NamedTuple):
    """Running state of causal linear attention after a prefix.

    ``S``: (B, H, D', d_v) = Σ_j γ^(n-1-j) (R_j φ(k_j)) v_jᵀ   (rotated as the numerator wants)
    ``z``: (B, H, D')      = Σ_j γ^(n-1-j) φ_den(k_j)          (rotated only for placement "both")
    Always float32 (float64 for float64 inputs), whatever the input precision.
    """

    S: torch.Tensor
    z: torch.Tensor


# Autocast does not reach inside linear attention.  Every form computes by the rule of its inputs' dtypes
# (docs/mathematics.md, "Precision"): under ``torch.autocast`` the tensors the model hands in (bf16 from an autocast
# Linear) decide, and no matmul inside is re-cast behind the kernel's back (that re-cast used to meet float32
# states with bfloat16 operands in the chunk kernel).  The registered operators run their implementation
# inside ``autocast_off``; the naive and recurrent forms are wrapped whole by ``without_autocast``, so that
# their autograd graphs are recorded, and differentiated, in the dtypes they chose.
def autocast_off(device_type: str):
    """A context with autocast disabled for ``device_type`` (a no-op where it is not enabled)."""
    try:
        enabled = torch.is_autocast_enabled(device_type)
    except RuntimeError:  # a device type autocast does not know (meta, …)
        return contextlib.nullcontext()
    return torch.autocast(device_type, enabled=False) if enabled else contextlib.nullcontext()


def without_autocast(fn):
    """Decorate a form ``fn(q, k, v, …)`` to run with autocast disabled for q's device."""

    @functools.wraps(fn)
    def wrapper(q, *args, **kwargs):
        with autocast_off(q.device.type):
            return fn(q, *args, **kwargs)

    return wrapper


class Args(NamedTuple):
    """Everything a call of linear attention says besides q, k, v and ``impl``: the keywords of
    ``linrope.ops.linear_attention``, written once.  Every form is ``form(q, k, v, args)``;
    ``checked`` makes the checks all forms share (shapes, names, state, positions, decay), once per call.
    ``chunk_size`` is the chunk kernel's; the other forms ignore it.  ``window``: key j visible to query i only
    for i - window < j <= i (``window.py``).  ``normalize=False``: the output is the
    numerator alone (no denominator, no eps, no guard); the state still carries z (``LinearAttentionState``).
    ``documents`` (B, N) ids of packed documents: the state resets where the id changes (``documents.py``)."""

    feature_map: str = "elu"
    rope: str = "numerator"
    causal: bool = True
    chunk_size: int = 64
    positions: Optional[Tensor] = None
    eps: float = 1e-6
    decay: Optional[Tensor] = None
    rope_theta: Optional[Tensor] = None
    initial_state: Optional[LinearAttentionState] = None
    output_final_state: bool = False
    window: Optional[int] = None
    normalize: bool = True
    documents: Optional[Tensor] = None

    def checked(self, q: Tensor, k: Tensor, v: Tensor) -> "Args":
        """These arguments checked against q, k, v (a one-line ValueError naming the problem), with the tensors
        on q's device and the numbers of the types the operators take."""
        check_args(q, k, v, self.feature_map, self.rope, self.chunk_size)
        check_theta(self.rope_theta, q, self.rope)
        check_normalize(self.normalize)
        if not self.causal and (self.initial_state is not None or self.output_final_state):
            raise ValueError("initial/final states only make sense for causal linear attention")
        check_state(self.initial_state, q, v, self.feature_map)
        window = check_window(self.window, self.causal, self.initial_state is not None or self.output_final_state)
        positions, n = self.positions, q.shape[2]
        if positions is not None:
            positions = positions.to(q.device)
            if positions.dim() != 1 or positions.shape[0] != n:
                raise ValueError(f"positions must be a 1-D tensor of length N={n}; got shape {tuple(positions.shape)}")
        # built field by field, not with ``_replace``: torch 2.4's compiler does not trace into collections
        return Args(
            self.feature_map,
            self.rope,
            bool(self.causal),
            int(self.chunk_size),
            positions,
            float(self.eps),
            check_decay(self.decay, q.shape[1], q.device),
            self.rope_theta,
            self.initial_state,
            self.output_final_state,
            window,
            self.normalize,
            check_documents(self.documents, q, self.causal),
        )


def check_theta(theta, q: Tensor, rope: str) -> None:
    """RoPE's frequencies: d/2 of them, one per pair of channels (a shorter tensor would broadcast silently)."""
    if theta is None or rope == "none":
        return
    half = q.shape[-1] // 2
    if not torch.is_tensor(theta) or tuple(theta.shape) != (half,):
        got = tuple(theta.shape) if torch.is_tensor(theta) else type(theta).__name__
        raise ValueError(f"rope_theta must be a 1-D tensor of d/2 = {half} frequencies; got {got}")


def check_args(q, k, v, feature_map: str, rope: str, chunk_size: int | None = None):
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(
            f"linear_attention expects (B, H, N, d) tensors; got q{tuple(q.shape)} k{tuple(k.shape)} v{tuple(v.shape)}"
        )
    if q.shape != k.shape:
        raise ValueError(f"q and k must have the same shape; got {tuple(q.shape)} and {tuple(k.shape)}")
    if v.shape[:3] != q.shape[:3]:
        raise ValueError(f"v must share (B, H, N) with q; got {tuple(v.shape)} vs {tuple(q.shape)}")
    if feature_map not in FEATURE_MAPS:
        raise ValueError(f"unknown feature_map {feature_map!r}; expected one of {', '.join(FEATURE_MAPS)}")
    if rope not in PLACEMENTS:
        raise ValueError(f"unknown rope placement {rope!r}; expected one of {', '.join(PLACEMENTS)}")
    if rope != "none":
        check_rope_dim(q.shape[-1])
    if chunk_size is not None and int(chunk_size) < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")


def check_window(window, causal: bool, stateful: bool) -> Optional[int]:
    """``window`` as an int >= 1 (or None); a window needs causal attention and carries no state."""
    if window is None:
        return None
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"window must be an integer >= 1 or None; got {window!r}")
    if not causal:
        raise ValueError("window limits causal attention (keys i - window < j <= i); causal=False has none")
    if stateful:
        raise ValueError("window carries no state: initial_state/output_final_state need window=None")
    return int(window)


def check_normalize(normalize) -> None:
    """``normalize`` is a bool: a string such as "false" would otherwise read as true."""
    if not isinstance(normalize, bool):
        raise ValueError(f"normalize must be True or False; got {normalize!r}")


# Placement "both" rotates the denominator too: den_i = Σ_j γ^(i-j) (R_i φ(q_i))·(R_j φ(k_j)) is then a sum of
# terms of either sign and can cancel to (nearly) zero while the numerator does not, so that o_i = num_i / den_i
# grows without bound (and ∂o/∂q with its square).  For that placement every form clamps the magnitude of
# den_i + eps to at least DEN_FLOOR, keeping its sign, and a clamped denominator passes no gradient.  This bounds
# |o_i| by |num_i| / DEN_FLOOR; a denominator that is small only relative to its usual size (it grows with the
# number of keys) is not caught.  The other placements' denominators are sums of positive terms and untouched.
DEN_FLOOR = 1e-2


def guard_denominator(den: torch.Tensor, rope: str) -> torch.Tensor:
    """den (= den + eps) with its magnitude clamped to >= DEN_FLOOR for placement "both" (differentiable)."""
    if rope != "both":
        return den
    return torch.copysign(den.abs().clamp_min(DEN_FLOOR), den)


def guard_denominator_(den: torch.Tensor, rope: str) -> None:
    """In place, as ``guard_denominator`` (no autograd graph)."""
    if rope == "both":
        den.copy_(torch.copysign(den.abs().clamp_min_(DEN_FLOOR), den))


def unclamped(den: torch.Tensor) -> torch.Tensor:
    """Where a guarded denominator (placement "both") is its own value: elsewhere it is the constant
    DEN_FLOOR, and passes no gradient.  Both backward passes multiply by this."""
    return den.abs() > DEN_FLOOR


def shared_features(rope: str) -> bool:
    """Numerator and denominator use the same features (RoPE in both places, or nowhere)."""
    return rope in ("both", "none")


DECAY_RANGE = "decay factors γ_h must lie in (0, 1]"


def check_decay(decay, n_heads: int, device) -> Optional[Tensor]:
    """``decay`` as a tensor on ``device`` with one factor per head, each in (0, 1] (``check_decay_range``).
    Called once per call, at the entry (``Args.checked``, ``recurrent_step``); the operators do not check."""
    if decay is None:
        return None
    decay = torch.as_tensor(decay, device=device)
    if decay.numel() != n_heads:
        raise ValueError(f"decay needs one factor per head ({n_heads}); got {decay.numel()}")
    check_decay_range(decay)
    return decay


def check_decay_range(decay: Tensor) -> None:
    """Every 0 < γ_h <= 1, without waiting for a device.  A test of values needs them on the host: on the CPU
    that is free, and a bad value raises ValueError here.  On any other device (CUDA), and while torch.compile
    traces, the test is ``torch._assert_async``: queued with the kernels, no host sync, no graph break; a bad
    value then fails at the device's next synchronisation (docs/mathematics.md, "GPU readiness")."""
    ok = ((decay > 0) & (decay <= 1)).all()
    if decay.device.type == "cpu" and not torch.compiler.is_compiling():
        if not bool(ok):
            raise ValueError(DECAY_RANGE)
    else:
        torch._assert_async(ok, DECAY_RANGE)


def decay_log(decay: Optional[Tensor]) -> Optional[Tensor]:
    """log γ_h as float64 (H,), the one form every kernel derives its powers of γ from (checked at the entry)."""
    if decay is None:
        return None
    return decay.to(torch.float64).reshape(-1).log()


def zero_state(B: int, H: int, D: int, dv: int, dtype, device) -> LinearAttentionState:
    return LinearAttentionState(
        torch.zeros(B, H, D, dv, dtype=dtype, device=device), torch.zeros(B, H, D, dtype=dtype, device=device)
    )


def check_state(
    state: Optional[LinearAttentionState],
    q: torch.Tensor,
    v: torch.Tensor,
    feature_map: str,
    name: str = "initial_state",
) -> None:
    """A carried state must have S (B, H, D, d_v) and z (B, H, D) for q (B, H, N, d) and v (B, H, N, d_v)."""
    if state is None:
        return
    B, H, _, d = q.shape
    D = feature_width(feature_map, d)
    want_S, want_z = (B, H, D, v.shape[-1]), (B, H, D)
    if tuple(state.S.shape) != want_S or tuple(state.z.shape) != want_z:
        raise ValueError(
            f"{name} has S{tuple(state.S.shape)} z{tuple(state.z.shape)}; "
            f"expected S{want_S} z{want_z} for feature_map={feature_map!r}"
        )
