"""The registry of forms the benchmarks time: one entry per form, with a label that says exactly what it times.

A form is a callable ``f(q, k, v) -> output`` on one causal attention problem.  ``REGISTRY[key]`` holds its
command-line name (``key``, what ``--forms`` takes), the label its rows carry (``label``), one sentence on the
call, what it computes and what its time includes (``what``), how its time grows with N (``growth``, for the
budget predictions) and its input layout.  Every benchmark script takes its forms from here, so a row labelled
"fla naive_chunk_linear_attn (fla's pure-PyTorch reference)" times exactly that in every script.

linrope's own forms are read from the backend registry ``linrope.ops.BACKENDS`` as it is (one form per backend
that runs, ``auto`` excluded because it only chooses); the others are the baselines and variants below.
``python benchmarks/kernel_time.py --help`` lists them all.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from linrope.ops import BACKENDS, linear_attention  # noqa: E402
from linrope.ops.linear_attn import fla_backend, heads, scans  # noqa: E402
from linrope.ops.linear_attn.features import reference_features  # noqa: E402

B, H, D = 1, 8, 64  # the shapes every benchmark uses unless told otherwise
C = 64  # linrope's chunk size
COMPUTES = "elu+1 features, RoPE in the numerator, normalised"  # what linear_attention computes by default


class FormUnavailable(Exception):
    """The form cannot run here (fla's Triton kernels on a CPU, fla not installed): not a failure of the form."""


@dataclass(frozen=True)
class Form:
    key: str
    label: str
    what: str
    build: Callable[[int, torch.device], Callable]  # (chunk size, device) -> f(q, k, v); may raise FormUnavailable
    growth: int = 1  # time grows as N**growth
    layout: str = "BHND"  # "BNHD": fla's own [B, N, H, d], so that no transpose is timed
    multiple_of: int = 1  # N must be a multiple of this
    chunk_flops: bool = False  # the chunked linear-attention FLOP count (8·C·d + 8·d² per token per head) applies


# ------------------------------------------------------------------------------------------------------------
# the forms that are not linrope backends
# ------------------------------------------------------------------------------------------------------------
def plain_chunk_linear_attention(q, k, v, *, rope: str = "numerator", chunk_size: int = C, eps: float = 1e-6):
    """Causal elu+1 linear attention as a first chunked version would write it (the reference "before").

    Every chunk's state kᵀv is materialised, (B, H, N/C, d, d_v), and turned into the states entering the
    chunks by a cumsum; autograd differentiates it all and keeps what it needs for the backward."""
    qn, kn, qd, kd = reference_features(q, k, feature_map="elu", rope=rope, positions=None, theta=None, dtype=q.dtype)
    n = q.shape[2]
    nc = -(-n // chunk_size)

    def chunks(x):
        return F.pad(x, (0, 0, 0, nc * chunk_size - n)).unflatten(2, (nc, chunk_size))

    qc, kc, vc, qdc, kdc = map(chunks, (qn, kn, v, qd, kd))
    future = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=q.device).triu(1)
    U = kc.transpose(-1, -2) @ vc
    num = (qc @ kc.transpose(-1, -2)).masked_fill(future, 0) @ vc + qc @ (U.cumsum(2) - U)
    zk = kdc.sum(3)
    den = (qdc @ kdc.transpose(-1, -2)).masked_fill(future, 0).sum(-1) + (qdc * (zk.cumsum(2) - zk).unsqueeze(3)).sum(
        -1
    )
    return (num / (den.unsqueeze(-1) + eps)).flatten(2, 3)[:, :, :n]


@functools.lru_cache(maxsize=None)
def check_plain(chunk_size: int) -> None:
    """The "before" form computes what linrope's naive form computes (float64, N not a multiple of C): run once
    before the form is first timed."""
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 3 * chunk_size + 5, 16, generator=g, dtype=torch.float64) for _ in range(3))
    for rope in ("numerator", "none"):
        ref = linear_attention(q, k, v, impl="naive", rope=rope)
        out = plain_chunk_linear_attention(q, k, v, rope=rope, chunk_size=chunk_size)
        err = ((out - ref).norm() / ref.norm()).item()
        if not err < 1e-10:
            raise RuntimeError(f"plain chunked form disagrees with naive (rope={rope}): relative error {err:.2e}")


def _plain(rope: str):
    def build(chunk_size, device):
        check_plain(chunk_size)
        return lambda q, k, v: plain_chunk_linear_attention(q, k, v, rope=rope, chunk_size=chunk_size)

    return build


def _needs_cuda(device: torch.device) -> None:
    why = fla_backend.unavailable(device)
    if why is not None:
        raise FormUnavailable(why)


def _sdpa(chunk_size, device):
    return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)


def _sdpa_flash(chunk_size, device):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def run(q, k, v):
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    return run


def _fla_triton(chunk_size, device):
    """fla's own chunk_simple_gla, imported now (not merely found): an import error is this form's row.  Under the
    Hopper guard of linrope's fla form (``fla_backend.kernels``), so that both fla rows choose among the same
    autotune configurations."""
    _needs_cuda(device)
    from fla.ops.simple_gla import chunk_simple_gla

    from linrope.ops.linear_attn import fla_backend

    fla_backend.kernels(device)
    return lambda q, k, v: chunk_simple_gla(q, k, v, scale=1.0)[0]


def _fla_naive_torch(chunk_size, device):
    try:
        from fla.ops.linear_attn.naive import naive_chunk_linear_attn
    except Exception as e:  # noqa: BLE001 - any failure to import means "no row"
        raise FormUnavailable(
            f"flash-linear-attention does not import ({type(e).__name__}: {e}); pip install -e '.[gpu]' (fla-core)"
        ) from e

    def run(q, k, v):  # fla takes and returns (B, N, H, d); the transposes are views
        o = naive_chunk_linear_attn(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), normalize=True)
        return o.transpose(1, 2)

    return run


@contextlib.contextmanager
def old_plan():
    """The chunk kernel's plan before issue 31: a Python loop over chunks in every scan, every head in one call
    walking blocks of 2^18 numbers (512 positions at B·H = 8, d = 64) at any N (``scans.SEQUENTIAL = True``,
    ``heads.ENABLED = False``); restored on leaving."""
    saved, scans.SEQUENTIAL = scans.SEQUENTIAL, True
    try:
        with whole_heads():
            yield
    finally:
        scans.SEQUENTIAL = saved


@contextlib.contextmanager
def whole_heads():
    """Every head in one call, each operation split between torch's threads (``heads.ENABLED = False``)."""
    saved, heads.ENABLED = heads.ENABLED, False
    try:
        yield
    finally:
        heads.ENABLED = saved


def _chunk_whole(chunk_size, device):
    def run(q, k, v):
        with whole_heads():
            return linear_attention(q, k, v, impl="chunk", chunk_size=chunk_size)

    return run


def _chunk_old(chunk_size, device):
    def run(q, k, v):
        with old_plan():
            return linear_attention(q, k, v, impl="chunk", chunk_size=chunk_size)

    return run


def _linrope(impl: str, **options):
    def build(chunk_size, device):
        why = BACKENDS[impl].unavailable(device)
        if why is not None:
            raise FormUnavailable(why)
        return lambda q, k, v: linear_attention(q, k, v, impl=impl, chunk_size=chunk_size, **options)

    return build


# ------------------------------------------------------------------------------------------------------------
# the registry
# ------------------------------------------------------------------------------------------------------------
LINROPE_LABELS = {"fla": "linrope on fla"}  # the device check's label; the others are "linrope <impl>"
GROWTH = {"naive": 2}  # the N×N reference; every other backend is linear in N


def _registry() -> dict[str, Form]:
    forms = [
        Form(
            name,
            LINROPE_LABELS.get(name, f"linrope {name}"),
            f'linrope.ops.linear_attention(q, k, v, impl="{name}"): {COMPUTES}; {b.what}',
            _linrope(name),
            growth=GROWTH.get(name, 1),
            chunk_flops=name == "chunk",
        )
        for name, b in BACKENDS.items()
        if b.choose is None
    ]  # "auto" only chooses one of the others
    forms += [
        Form(
            "chunk-none",
            "linrope chunk, rope=none",
            'linear_attention(impl="chunk", rope="none"): elu+1 features, no RoPE, normalised: what '
            "fla-naive-torch computes, plus the feature map",
            _linrope("chunk", rope="none"),
            chunk_flops=True,
        ),
        Form(
            "chunk-whole",
            "linrope chunk, heads whole",
            'linear_attention(impl="chunk") with every head in one call (linrope.ops.linear_attn.heads off): each '
            "operation split between torch's threads",
            _chunk_whole,
        ),
        Form(
            "chunk-old",
            "linrope chunk, old plan",
            'linear_attention(impl="chunk") under the plan before issue 31: a Python loop over chunks in every '
            "scan (scans.SEQUENTIAL) and every head in one call (heads.ENABLED False): 512-position blocks at any N",
            _chunk_old,
        ),
        Form(
            "plain",
            "plain chunk (before)",
            f"plain_chunk_linear_attention (benchmarks/forms.py), {COMPUTES}: a first chunked version in a dozen "
            "lines of PyTorch: every chunk's state materialised, a cumsum, autograd for the backward; checked "
            "against linrope naive before it is timed",
            _plain("numerator"),
            chunk_flops=True,
        ),
        Form(
            "plain-none",
            "plain chunk (before), rope=none",
            "plain_chunk_linear_attention with rope='none': elu+1 features, no RoPE, normalised",
            _plain("none"),
            chunk_flops=True,
        ),
        Form(
            "sdpa",
            "sdpa softmax",
            "torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True), whichever backend torch "
            "picks: softmax attention, no position scheme",
            _sdpa,
            growth=2,
        ),
        Form(
            "sdpa-flash",
            "sdpa flash",
            "scaled_dot_product_attention(is_causal=True) with only the FlashAttention backend allowed (CUDA): "
            "softmax attention",
            _sdpa_flash,
            growth=2,
        ),
        Form(
            "fla-triton",
            "fla chunk_simple_gla",
            "fla.ops.simple_gla.chunk_simple_gla(q, k, v, scale=1) on fla's [B, N, H, d] layout: fla's own Triton "
            "kernel, unnormalised linear attention with no feature map, RoPE, denominator or decay (CUDA): the "
            "speed bound for linrope on fla",
            _fla_triton,
            layout="BNHD",
        ),
        Form(
            "fla-naive-torch",
            "fla naive_chunk_linear_attn (fla's pure-PyTorch reference)",
            "fla.ops.linear_attn.naive.naive_chunk_linear_attn(q, k, v, normalize=True): fla's pure-PyTorch "
            "reference implementation, not its Triton kernel; on the raw q, k, v (no feature map, no RoPE), "
            "normalised; compare with chunk-none",
            _fla_naive_torch,
            multiple_of=64,
        ),
    ]
    return {f.key: f for f in forms}


REGISTRY = _registry()
BY_LABEL = {f.label: f for f in REGISTRY.values()}


def lookup(name: str) -> Form:
    """The form named by its key or its label; one line naming the known keys otherwise."""
    form = REGISTRY.get(name) or BY_LABEL.get(name)
    if form is None:
        raise KeyError(f"unknown form {name!r}; forms: {', '.join(REGISTRY)}")
    return form


def legend(keys) -> list[str]:
    """One line per form: its label, its key and what it times (printed above every table)."""
    return [f"- {REGISTRY[k].label} [{k}]: {REGISTRY[k].what}" for k in keys]


def make_inputs(
    form: Form,
    n: int,
    *,
    device="cpu",
    dtype=torch.float32,
    batch: int = B,
    heads: int = H,
    dim: int = D,
    seed: int = 0,
    requires_grad: bool = True,
):
    """q, k, v and a gradient for the output, random normal, in the form's layout."""
    g = torch.Generator(device=device).manual_seed(seed)
    shape = (batch, n, heads, dim) if form.layout == "BNHD" else (batch, heads, n, dim)
    q, k, v, grad = (torch.randn(shape, device=device, dtype=dtype, generator=g) for _ in range(4))
    return [t.requires_grad_(requires_grad) for t in (q, k, v)], grad


def passes(fn, q, k, v, grad):
    """(forward+backward, forward under no_grad): the two calls a row times."""

    def fwd_bwd():
        q.grad = k.grad = v.grad = None
        fn(q, k, v).backward(grad)

    def fwd():
        with torch.no_grad():
            fn(q, k, v)

    return fwd_bwd, fwd
