"""Linear attention on flash-linear-attention's chunked Triton kernels (``impl="fla"``, CUDA), and
the facts ``impl="auto"`` chooses by (``backends.py``).

The mapping (docs/mathematics.md, "GPU backend (fla)").  For q, k: [B, T, H, K], v: [B, T, H, V], a per-head
log-decay g_h = log γ_h and an initial state h0: [B, H, K, V], fla's ``chunk_simple_gla`` with scale 1 gives

    o_t = Σ_{j≤t} γ^(t-j) (q_t·k_j) v_j + γ^(t+1) q_t h0,        h_T = Σ_{j<T} γ^(T-1-j) k_j v_jᵀ + γ^T h0.

On the numerator's features (R φ(q), R φ(k); unrotated for placement "none") with v and S0 that is linrope's
numerator and its state S; on the denominator's features with a column of ones for v and z0 for h0 it is the
denominator (o_t[0]) and z (h_T[:, 0]).  So each call is one fla computation, in two registered operators
(``linrope::fla_chunk_fwd`` / ``_bwd``, as chunk.py registers its kernel): torch.compile sees one opaque
operator, not fla's public function, which is ``@torch.compiler.disable`` and would break the graph.  The
features, the division, eps (added once to the summed denominator) and the guard of placement "both"
(``guard_denominator``) are the same torch code as the naive form's; autograd differentiates them.

``normalize=False`` (no denominator): the output is the numerator's call alone, in v's dtype; the denominator's
call runs only when the final state is asked for (for z, which the state always carries).

Why a second fla call for the denominator: it reuses the same tuned kernels for the decay, the initial and
final state and the backward, at about half the cost of the numerator's call (the same q·k products, a
value column of width 2).  A decayed prefix sum written in torch would need either a loop over chunks (the
launches this backend exists to avoid) or γ^(-j) factors that overflow.

Precision: features are formed in float32; the kernels run in bfloat16 when the inputs (or autocast) are
bfloat16, else in float32: float16 inputs are computed in float32 too.  fla keeps its outputs and its
per-chunk states in the kernel dtype, and the denominator grows like d·t (elu+1, unit-normal inputs,
d = 64: about 86·t), past float16's 65504 within a thousand positions; bfloat16 has float32's range.
States returned are float32.
fla asserts even widths for 16-bit inputs, so odd widths (cosine's d+1; the ones column) are padded with zeros,
which add nothing.  fla has no float64: float64 inputs are refused.  Causal only.  fla-core 0.6.0 needs
torch >= 2.7 (``TORCH_FLOOR``).

Packed documents (``documents``): the rows flattened into fla's variable-length batch, ``cu_seqlens`` at every
document's start (``varlen``; a host read of their number per call).

Nothing here imports fla or triton before a call needs them (``import linrope.ops`` stays free of both).
"""

import functools
import importlib.metadata
import importlib.util
import math
import os
import re
import sys
from contextlib import nullcontext
from typing import NamedTuple, Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from .common import Args, LinearAttentionState, decay_log, guard_denominator, zero_state
from .features import feature_width, reference_features

FLA_VERSION = "0.6.0"  # the fla-core release this mapping was checked against (pyproject's `gpu` extra)
FLA_CHUNK = 64  # fla's chunk length (its default, the one its kernels are tuned for)
# Hopper (sm_90): Triton >= 3.6 miscompiles kernels with several tl.dot at block sizes 16 and 32 there (illegal
# memory accesses; pytorch/helion#1905, triton-lang/triton#10486).  fla's training step faulted in chunk_bwd_kernel_dv,
# whose value block was 16 for the denominator's padded two-column value, and ran once no block was under 64
# (docs/benchmarks.md, "Device check").  On Hopper every width handed to fla is padded to SAFE_WIDTH and fla's autotune
# configurations with a block of 16 or 32 are dropped (``safe_blocks``); elsewhere widths are padded to even only.
UNSAFE_BLOCKS = (16, 32)
SAFE_WIDTH = 64
HOPPER_GUARD = True  # False: fla as it is on Hopper too (benchmarks/fla_probe.py's variant as-is)
# the narrowest key / value width handed to fla (zero columns up to it, and to even); None: ``min_width`` decides
MIN_WIDTH: Optional[int] = None
_LOG2E = 1.0 / math.log(2.0)  # fla's kernels take the log-decay in base 2
_NONE = (0,)  # the shape of a placeholder output
TORCH_FLOOR = (2, 7)  # fla-core 0.6.0's own requirement (its metadata: torch>=2.7.0 with its cuda extra)
INSTALLED = all(importlib.util.find_spec(m) is not None for m in ("fla", "triton"))  # finds, does not import
# (fla-core, triton) versions whose training step passed the device check (benchmarks/gpu_check.sh) on a GPU:
# ``impl=auto`` takes fla only with one of these.  On an H200 (torch 2.11.0, triton 3.6.0, fla-core 0.6.0) the
# bfloat16 training step of size=base at context 4096, batch 4, faulted in all four tries without the Hopper guard,
# and passed with it, as did the CUDA tests against float64 (2026-11-27; docs/benchmarks.md, "Device check").
VERIFIED: frozenset = frozenset({("0.6.0", "3.6.0")})


def torch_too_old() -> Optional[str]:
    """Why this torch is older than fla-core's floor, or None (read from ``torch.__version__`` at each call)."""
    found = re.match(r"(\d+)\.(\d+)", str(torch.__version__))
    if found and tuple(map(int, found.groups())) < TORCH_FLOOR:
        return (
            f"fla-core {FLA_VERSION} needs torch >= {'.'.join(map(str, TORCH_FLOOR))} "
            f"(here {torch.__version__}); use impl=chunk"
        )
    return None


@functools.cache
def versions() -> tuple:
    """(fla-core, triton) as installed, from their package metadata (neither is imported), read once: ``auto``
    asks at every CUDA call."""
    found = []
    for dist in ("fla-core", "triton"):
        try:
            found.append(importlib.metadata.version(dist))
        except importlib.metadata.PackageNotFoundError:
            found.append("not installed")
    return tuple(found)


def unverified() -> Optional[str]:
    """Why ``impl=auto`` does not take fla even where it can run, or None: these versions are not in ``VERIFIED``."""
    fla, triton = versions()
    if (fla, triton) in VERIFIED:
        return None
    return (
        f"fla-core {fla} with triton {triton} has not passed the device check's training step on a GPU "
        "(docs/benchmarks.md); impl=fla runs it"
    )


def unavailable(device) -> Optional[str]:
    """Why fla's kernels cannot run on ``device`` (a device or its type), or None.  They need fla and triton,
    torch >= 2.7 and CUDA, unless Triton's CPU interpreter is switched on (``TRITON_INTERPRET=1``) with the tests'
    shim loaded (tests/ops/fla_interpreter.py: ``_one_config``)."""
    if not INSTALLED:
        return "fla and triton are not installed: pip install 'linrope[gpu]'"
    old = torch_too_old()
    if old:
        return old
    kind = torch.device(device).type
    if kind != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        return (
            f"fla's Triton kernels need a CUDA device (here: {kind}); use impl=chunk, or impl=auto to choose by device"
        )
    if kind != "cuda" and not _one_config():
        return (
            "fla's kernels autotune on a device: under TRITON_INTERPRET=1 on the CPU they run only with the test "
            "shim (tests/ops/fla_interpreter.py); use impl=chunk"
        )
    return None


def _one_config() -> bool:
    """Whether triton's autotuners keep one configuration in this process (the test shim's patch, which the
    interpreter needs for fla: with more it times them on a device, and fails with "0 active drivers")."""
    tuner = sys.modules.get("triton.runtime.autotuner")  # the shim imports it; nothing is imported here
    return tuner is not None and getattr(tuner.Autotuner.__init__, "_linrope_one_config", False)


def hopper(device) -> bool:
    """Whether ``device`` is a CUDA GPU of compute capability 9.x (Hopper: H100, H200).  Read from the device's
    properties, which torch.compile folds to a constant (``get_device_capability`` it would trace)."""
    device = torch.device(device)
    return device.type == "cuda" and torch.cuda.get_device_properties(device).major == 9


def min_width(device) -> int:
    """The narrowest key / value width handed to fla on ``device``: ``MIN_WIDTH`` when set, else SAFE_WIDTH on
    Hopper (no 16- or 32-wide block from a narrow width) and 2 elsewhere (even widths, fla's own assertion)."""
    if MIN_WIDTH is not None:
        return MIN_WIDTH
    return SAFE_WIDTH if HOPPER_GUARD and hopper(device) else 2


def safe_configs(configs: list) -> list:
    """Autotune configurations without a block size (a ``B…`` meta-parameter) of 16 or 32; the one whose narrowest
    block is widest when every configuration has such a block."""

    def blocks(config) -> list:
        return [v for k, v in config.kwargs.items() if k.startswith("B") and isinstance(v, int)]

    keep = [c for c in configs if not any(b in UNSAFE_BLOCKS for b in blocks(c))]
    return keep or [max(configs, key=lambda c: min(blocks(c) or [0]))]


@functools.cache
def safe_blocks() -> int:
    """Every Triton autotuner of the fla modules imported so far keeps only its ``safe_configs``, and forgets any
    choice it made among the others (once per process) -> how many autotuners changed."""
    from triton.runtime.autotuner import Autotuner

    changed = 0
    for name, module in list(sys.modules.items()):
        if name != "fla" and not name.startswith("fla."):
            continue
        for obj in list(vars(module).values()):
            if isinstance(obj, Autotuner):
                kept = safe_configs(list(obj.configs))
                changed += len(kept) != len(obj.configs)
                obj.configs = kept
                cache = getattr(obj, "cache", None)
                if isinstance(cache, dict):
                    for key in [key for key, chosen in cache.items() if chosen not in kept]:
                        del cache[key]
    return changed


def kernels(device=None):
    """fla's chunked forward and backward functions: the one seam between linrope and fla.  On Hopper
    (``device``), fla's autotuners lose their 16- and 32-wide configurations first (``safe_blocks``)."""
    from fla.ops.simple_gla.chunk import chunk_simple_gla_bwd, chunk_simple_gla_fwd

    if device is not None and HOPPER_GUARD and hopper(device):
        safe_blocks()
    return chunk_simple_gla_fwd, chunk_simple_gla_bwd


def _g_gamma(decay: Optional[Tensor]) -> Optional[Tensor]:
    log_gamma = decay_log(decay)  # its range was checked once, at the entry (common.check_decay)
    return None if log_gamma is None else (log_gamma * _LOG2E).to(torch.float32)


def _on(x: Tensor):
    """Triton launches on the current CUDA device: make it x's."""
    return torch.cuda.device(x.device) if x.is_cuda else nullcontext()


# --------------------------------------------------------------------------------------------------------
# one fla computation as a registered operator, q, k, v in fla's [B, T, H, ·] layout, contiguous
# --------------------------------------------------------------------------------------------------------
@torch.library.custom_op("linrope::fla_chunk_fwd", mutates_args=())
def fla_chunk_fwd(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    decay: Optional[Tensor],
    h0: Optional[Tensor],
    final: bool,
    cu_seqlens: Optional[Tensor] = None,
) -> tuple[Tensor, Tensor]:
    """-> (o [B, T, H, V] in v's dtype, h_T [B, H, K, V] float32 or an empty placeholder).  ``cu_seqlens``: B = 1
    holds variable-length sequences (packed documents), h0 and h_T one per sequence."""
    fwd, _ = kernels(q.device)
    with _on(q):
        o, ht = fwd(
            q=q,
            k=k,
            v=v,
            g=None,
            g_gamma=_g_gamma(decay),
            scale=1.0,
            initial_state=h0,
            output_final_state=final,
            cu_seqlens=cu_seqlens,
            chunk_size=FLA_CHUNK,
        )
    return o, (ht if final else q.new_empty(_NONE, dtype=torch.float32))


@fla_chunk_fwd.register_fake
def _(q, k, v, decay, h0, final, cu_seqlens=None):
    B, _, H, K = q.shape
    B = B if cu_seqlens is None else cu_seqlens.shape[0] - 1
    return v.new_empty(v.shape), q.new_empty((B, H, K, v.shape[-1]) if final else _NONE, dtype=torch.float32)


@torch.library.custom_op("linrope::fla_chunk_bwd", mutates_args=())
def fla_chunk_bwd(
    do: Tensor,
    dht: Optional[Tensor],
    q: Tensor,
    k: Tensor,
    v: Tensor,
    decay: Optional[Tensor],
    h0: Optional[Tensor],
    cu_seqlens: Optional[Tensor] = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """-> (dq, dk, dv, dh0), an empty placeholder for dh0 without h0."""
    _, bwd = kernels(q.device)
    with _on(q):
        dq, dk, dv, _, dh0 = bwd(
            q=q,
            k=k,
            v=v,
            g=None,
            g_gamma=_g_gamma(decay),
            initial_state=h0,
            do=do.contiguous(),
            dht=dht,
            scale=1.0,
            cu_seqlens=cu_seqlens,
            chunk_size=FLA_CHUNK,
        )
    return dq, dk, dv, (dh0 if h0 is not None else q.new_empty(_NONE, dtype=torch.float32))


@fla_chunk_bwd.register_fake
def _(do, dht, q, k, v, decay, h0, cu_seqlens=None):
    dh0 = h0.new_empty(h0.shape) if h0 is not None else q.new_empty(_NONE, dtype=torch.float32)
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), dh0


def _setup_context(ctx, inputs, output):
    q, k, v, decay, h0, final, cu_seqlens = inputs
    ctx.final = final
    ctx.save_for_backward(q, k, v, decay, h0, cu_seqlens)


def _backward(ctx, do, dht):
    q, k, v, decay, h0, cu_seqlens = ctx.saved_tensors
    dht = dht.contiguous() if ctx.final else None
    dq, dk, dv, dh0 = fla_chunk_bwd(do, dht, q, k, v, decay, h0, cu_seqlens)
    return dq, dk, dv, None, (dh0 if h0 is not None else None), None, None


fla_chunk_fwd.register_autograd(_backward, setup_context=_setup_context)


def _fla_layout(x: Tensor, pad: int, dtype) -> Tensor:
    """(B, H, N, w) -> (B, N, H, w + pad) contiguous in ``dtype``, the pad zeros."""
    x = F.pad(x, (0, pad)) if pad else x
    out = x.new_empty((x.shape[0], x.shape[2], x.shape[1], x.shape[3]), dtype=dtype)
    return out.copy_(x.transpose(1, 2))  # one copy: layout and dtype at once


class Varlen(NamedTuple):
    """Packed documents as fla's variable-length batch: the (B, N) rows flattened to one sequence of B·N
    positions, ``cu_seqlens`` the offsets of every document (a row's start is always one), ``first`` and ``last``
    (B,) the index of each row's first and last document among them."""

    cu_seqlens: Tensor
    first: Tensor
    last: Tensor


def varlen(documents: Tensor) -> Varlen:
    """The variable-length layout of packed ``documents`` (B, N).  The number of documents sizes
    ``cu_seqlens``: read on the host (``nonzero``), one sync per call, where a data module could hand the
    offsets over (docs/mathematics.md, "Packed documents")."""
    B, N = documents.shape
    starts = torch.ones_like(documents, dtype=torch.bool)
    starts[:, 1:] = documents[:, 1:] != documents[:, :-1]
    offsets = starts.reshape(-1).nonzero().squeeze(1)
    per_row = starts.sum(1).cumsum(0)
    cu = torch.cat([offsets, offsets.new_full((1,), B * N)])
    return Varlen(cu, per_row - starts.sum(1), per_row - 1)


def _chunk(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    h0: Optional[Tensor],
    decay: Optional[Tensor],
    final: bool,
    dtype,
    packed: Optional[Varlen] = None,
):
    """One fla computation on linrope's (B, H, N, ·) layout -> (o (B, H, N, V), h_T (B, H, K, V) or None).
    Odd widths get a zero column (fla asserts even widths for 16-bit inputs), widths below ``min_width`` zero
    columns up to it.  ``packed``: the rows flattened
    into fla's variable-length batch (the initial state given to each row's first document, the final state
    read from its last)."""
    B, H, N = q.shape[:3]
    K, V = q.shape[-1], v.shape[-1]
    pk, pv = (max(w + w % 2, min_width(q.device)) - w for w in (K, V))
    if h0 is not None:
        h0 = F.pad(h0.to(torch.float32), (0, pv, 0, pk)).contiguous()
    qf, kf, vf = _fla_layout(q, pk, dtype), _fla_layout(k, pk, dtype), _fla_layout(v, pv, dtype)
    cu = None
    if packed is not None:
        qf, kf, vf = (x.view(1, B * N, *x.shape[2:]) for x in (qf, kf, vf))
        cu = packed.cu_seqlens
        if h0 is not None:  # one state per document: the row's first document continues it, the others start at 0
            h0 = h0.new_zeros((cu.shape[0] - 1, *h0.shape[1:])).index_copy(0, packed.first, h0)
    o, ht = fla_chunk_fwd(qf, kf, vf, decay, h0, final, *(() if cu is None else (cu,)))  # one document: as before
    if packed is not None:
        o = o.view(B, N, *o.shape[2:])
        ht = ht[packed.last] if final else ht
    return o.transpose(1, 2)[..., :V], (ht[:, :, :K, :V] if final else None)


def kernel_dtype(q: Tensor) -> torch.dtype:
    """What fla computes in: bfloat16 when autocast's dtype (autocast on) or else q's is bfloat16, else float32.
    float16 is computed in float32: fla keeps outputs and chunk states in the kernel dtype, and the denominator
    (about d·t) passes float16's largest value, 65504, within about a thousand positions at d = 64."""
    kind, dtype = q.device.type, q.dtype
    # (a device type autocast does not know, meta: the tests' stand-in for CUDA, is asked nothing)
    if torch.amp.is_autocast_available(kind) and torch.is_autocast_enabled(kind):
        dtype = torch.get_autocast_dtype(kind)
    return torch.bfloat16 if dtype == torch.bfloat16 else torch.float32


def fla_form(q: Tensor, k: Tensor, v: Tensor, a: Args):
    """Causal linear attention on fla's chunked kernels: the semantics of the naive form, ``Args`` checked and
    the backend's limits (causal, float32 at most, CUDA and the gpu extra) checked by the registry
    (``backends.py``).  -> (B, H, N, d_v) [and the final state, float32]."""
    B, H, N, _ = q.shape
    initial_state = a.initial_state
    if N == 0:
        return _empty(q, v, a.feature_map, initial_state, a.output_final_state)
    f32, dtype = torch.float32, kernel_dtype(q)
    qn, kn, qd, kd = reference_features(
        q, k, feature_map=a.feature_map, rope=a.rope, positions=a.positions, theta=a.rope_theta, dtype=f32
    )
    S0 = z0 = None
    if initial_state is not None:
        S0, z0 = initial_state.S, initial_state.z.unsqueeze(-1)
    packed = None if a.documents is None else varlen(a.documents)
    num, S = _chunk(qn, kn, v, S0, a.decay, a.output_final_state, dtype, packed)
    if not a.normalize and not a.output_final_state:  # the numerator is the output
        return num.to(v.dtype)
    den, z = _chunk(qd, kd, v.new_ones((B, H, N, 1)), z0, a.decay, a.output_final_state, dtype, packed)
    if a.normalize:
        out = (num.to(f32) / guard_denominator(den[..., 0].to(f32) + a.eps, a.rope).unsqueeze(-1)).to(v.dtype)
    else:  # the denominator's call gave z alone
        out = num.to(v.dtype)
    if not a.output_final_state:
        return out
    return out, LinearAttentionState(S, z[..., 0])


def _empty(q, v, feature_map, initial_state, output_final_state):
    out = v.new_empty(v.shape)
    if not output_final_state:
        return out
    if initial_state is None:
        B, H, _, d = q.shape
        return out, zero_state(B, H, feature_width(feature_map, d), v.shape[-1], torch.float32, q.device)
    return out, LinearAttentionState(initial_state.S.float(), initial_state.z.float())


__all__ = ["fla_form", "unavailable", "unverified", "kernels", "kernel_dtype", "FLA_VERSION", "TORCH_FLOOR", "VERIFIED"]
