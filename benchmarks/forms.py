"""The registry of forms the benchmarks time: one entry per form, with a label that says exactly what it times.

A form is a callable ``f(q, k, v) -> output`` on one causal attention problem.  ``REGISTRY[key]`` holds its
command-line name (``key``, what ``--forms`` takes), the label its rows carry, what it computes and what its time
includes (``what``), how its time grows with N (``growth``, for the budget predictions) and its input layout.
linrope's own forms are read from the backend registry ``linrope.ops.BACKENDS`` (``auto`` excluded: it only
chooses); the others are the baselines and variants below.  ``python benchmarks/kernel_time.py --help`` lists them.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable
from unittest import mock

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from linrope.ops import BACKENDS, linear_attention  # noqa: E402
from linrope.ops.linear_attn import fla_backend, heads, scans, triton_backend  # noqa: E402
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
    den = (qdc @ kdc.transpose(-1, -2)).masked_fill(future, 0).sum(-1)
    den = den + (qdc * (zk.cumsum(2) - zk).unsqueeze(3)).sum(-1)
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
    why = fla_backend.unavailable(device)
    if why is not None:
        raise FormUnavailable(why)
    from fla.ops.simple_gla import chunk_simple_gla

    fla_backend.kernels(device)
    return lambda q, k, v: chunk_simple_gla(q, k, v, scale=1.0)[0]


def _fla_naive_torch(chunk_size, device):
    try:
        from fla.ops.linear_attn.naive import naive_chunk_linear_attn
    except Exception as e:  # noqa: BLE001 - any failure to import means "no row"
        raise FormUnavailable(
            f"flash-linear-attention does not import ({type(e).__name__}: {e}); pip install -e '.[gpu]' (fla-core)"
        ) from e
    t = lambda x: x.transpose(1, 2)  # noqa: E731 - fla takes and returns (B, N, H, d); the transposes are views
    return lambda q, k, v: t(naive_chunk_linear_attn(t(q), t(k), t(v), normalize=True))


@contextlib.contextmanager
def under(plan: tuple):
    """``plan``'s (module, attribute, value) patched inside the block, restored after."""
    with contextlib.ExitStack() as stack:
        for module, name, value in plan:
            stack.enter_context(mock.patch.object(module, name, value))
        yield


def _linrope(impl: str, *plan: tuple, **options):
    """linrope's ``impl``, under ``plan``: (module, attribute, value) patched for the call and restored after.  The
    call's ``plan`` attribute is that context, which ``timing.passes`` holds through the backward too (a backward
    reads the same settings: triton_backend.SCAN, scans.SEQUENTIAL)."""

    def build(chunk_size, device):
        why = BACKENDS[impl].unavailable(device)
        if why is not None:
            raise FormUnavailable(why)

        def call(q, k, v):
            return linear_attention(q, k, v, impl=impl, chunk_size=chunk_size, **options)

        def planned(q, k, v):
            with under(plan):
                return call(q, k, v)

        if not plan:
            return call
        planned.plan = functools.partial(under, plan)
        return planned

    return build


def _bnhd(impl: str):
    """linrope's ``impl`` on fla's [B, N, H, d] layout, handed in as transposed views (read in place: no copy)."""
    inner = _linrope(impl)

    def build(chunk_size, device):
        call = inner(chunk_size, device)
        return lambda q, k, v: call(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2)

    return build


WHOLE = (heads, "ENABLED", False)  # every head in one call, each operation split between torch's threads
OLD_PLAN = (WHOLE, (scans, "SEQUENTIAL", True))  # before issue 31: a Python loop over chunks in every scan as well


WHAT = {  # what each form that is not a linrope backend computes, and what its time includes
    "chunk-none": 'linear_attention(impl="chunk", rope="none"): elu+1 features, no RoPE, normalised: what '
    "fla-naive-torch computes, plus the feature map",
    "chunk-whole": 'linear_attention(impl="chunk") with every head in one call (linrope.ops.linear_attn.heads off): '
    "each operation split between torch's threads",
    "chunk-old": 'linear_attention(impl="chunk") under the plan before issue 31: a Python loop over chunks in every '
    "scan (scans.SEQUENTIAL) and every head in one call (heads.ENABLED False): 512-position blocks at any N",
    "plain": f"plain_chunk_linear_attention (benchmarks/forms.py), {COMPUTES}: a first chunked version in a dozen "
    "lines of PyTorch: every chunk's state materialised, a cumsum, autograd for the backward; checked against "
    "linrope naive before it is timed",
    "plain-none": "plain_chunk_linear_attention with rope='none': elu+1 features, no RoPE, normalised",
    "sdpa": "torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True), whichever backend torch "
    "picks: softmax attention, no position scheme",
    "sdpa-flash": "scaled_dot_product_attention(is_causal=True) with only the FlashAttention backend allowed (CUDA): "
    "softmax attention",
    "fla-triton": "fla.ops.simple_gla.chunk_simple_gla(q, k, v, scale=1) on fla's [B, N, H, d] layout: fla's own "
    "Triton kernel, unnormalised linear attention with no feature map, RoPE, denominator or decay (CUDA): the speed "
    "bound for linrope on fla",
    "triton-loop": 'linear_attention(impl="triton") with its states summed by the sequential kernel '
    '(triton_backend.SCAN = "loop": one program per batch row and head walks the chunks in order, each chunk\'s '
    f"features and product in the loop) instead of the parallel chunks and _scan: {COMPUTES} (CUDA)",
    "triton-bnhd": 'linear_attention(impl="triton") on fla\'s [B, N, H, d] layout, handed in as transposed views: '
    f"{COMPUTES}; linrope's own Triton kernels read any strides, so no transpose copy is timed (CUDA)",
    "fla-naive-torch": "fla.ops.linear_attn.naive.naive_chunk_linear_attn(q, k, v, normalize=True): fla's "
    "pure-PyTorch reference implementation, not its Triton kernel; on the raw q, k, v (no feature map, no RoPE), "
    "normalised; compare with chunk-none",
}


def _registry() -> dict[str, Form]:
    labels = {"fla": "linrope on fla"}  # the device check's label; the others are "linrope <impl>"
    forms = [
        Form(
            name,
            labels.get(name, f"linrope {name}"),
            f'linrope.ops.linear_attention(q, k, v, impl="{name}"): {COMPUTES}; {b.what}',
            _linrope(name),
            growth=2 if name == "naive" else 1,  # the N×N reference; every other backend is linear in N
            chunk_flops=name == "chunk",
        )
        for name, b in BACKENDS.items()
        if b.choose is None  # "auto" only chooses one of the others
    ]
    others = [  # (key, label, build, options)
        ("chunk-none", "linrope chunk, rope=none", _linrope("chunk", rope="none"), dict(chunk_flops=True)),
        ("chunk-whole", "linrope chunk, heads whole", _linrope("chunk", WHOLE), {}),
        ("chunk-old", "linrope chunk, old plan", _linrope("chunk", *OLD_PLAN), {}),
        ("plain", "plain chunk (before)", _plain("numerator"), dict(chunk_flops=True)),
        ("plain-none", "plain chunk (before), rope=none", _plain("none"), dict(chunk_flops=True)),
        ("sdpa", "sdpa softmax", _sdpa, dict(growth=2)),
        ("sdpa-flash", "sdpa flash", _sdpa_flash, dict(growth=2)),
        ("fla-triton", "fla chunk_simple_gla", _fla_triton, dict(layout="BNHD")),
        ("triton-loop", "linrope triton, loop scan", _linrope("triton", (triton_backend, "SCAN", "loop")), {}),
        ("triton-bnhd", "linrope triton, [B, N, H, d]", _bnhd("triton"), dict(layout="BNHD")),
        (
            "fla-naive-torch",
            "fla naive_chunk_linear_attn (fla's pure-PyTorch reference)",
            _fla_naive_torch,
            dict(multiple_of=64),
        ),
    ]
    forms += [Form(key, label, WHAT[key], build, **options) for key, label, build, options in others]
    return {f.key: f for f in forms}


REGISTRY = _registry()


def lookup(name: str) -> Form:
    """The form named by its key or its label; one line naming the known keys otherwise."""
    form = REGISTRY.get(name) or next((f for f in REGISTRY.values() if f.label == name), None)
    if form is None:
        raise KeyError(f"unknown form {name!r}; forms: {', '.join(REGISTRY)}")
    return form


def legend(keys) -> list[str]:
    """One line per form: its label, its key and what it times (printed above every table)."""
    return [f"- {REGISTRY[k].label} [{k}]: {REGISTRY[k].what}" for k in keys]


def make_inputs(form: Form, n: int, *, device="cpu", dtype=torch.float32, batch=B, heads=H, dim=D, seed=0):
    """q, k, v (requiring gradients) and a gradient for the output, random normal, in the form's layout."""
    g = torch.Generator(device=device).manual_seed(seed)
    shape = (batch, n, heads, dim) if form.layout == "BNHD" else (batch, heads, n, dim)
    q, k, v, grad = (torch.randn(shape, device=device, dtype=dtype, generator=g) for _ in range(4))
    return [t.requires_grad_() for t in (q, k, v)], grad
