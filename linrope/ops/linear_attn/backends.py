"""The registry of linear-attention backends: what each form is for and what it supports.

``linrope.ops.linear_attention(q, k, v, impl=…, **options)`` checks its options once (``common.Args``), looks
``impl`` up here, asks the backend whether it takes this call (``Backend.refusal``: causality, dtype,
differentiated tables, device), and runs ``backend.run(q, k, v, args)``.  Every refusal of the kind
"fla is causal only" comes from that one method, worded from the backend's declaration; the config's allowed
``model.attention.impl`` values are ``BACKENDS``' names.

    naive      the N×N reference (the oracle every other form is tested against), float64, autograd in all
    chunk      chunked, hand-written backward: training (the default)
    recurrent  position by position through autograd: a check of the recurrence
    fla        fla's chunked Triton kernels (CUDA and the ``gpu`` extra)
    triton     linrope's own Triton kernels: φ and RoPE fused, the denominator a running sum (CUDA, triton)
    auto       chooses on a CUDA device: triton, then fla, the first the registry accepts whose versions passed the
               device check (``triton_backend.VERIFIED``: none yet; ``fla_backend.VERIFIED``: fla-core 0.6.0 with
               triton 3.6.0); else, and on other devices, chunk (logged once)

A new backend is one ``Backend(...)`` entry below and one form ``fn(q, k, v, args)`` beside its naive twin.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Optional, Tuple

import torch
from torch import Tensor

from linrope.base.errors import BackendUnavailable

from . import fla_backend, triton_backend
from .chunk import chunk_form
from .common import Args
from .naive import naive_form
from .recurrent import recurrent_form

ALL_DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16)
log = logging.getLogger("linrope.ops")


@dataclass(frozen=True)
class Backend:
    """One linear-attention backend and what it supports.

    ``run(q, k, v, args)`` computes the call; ``causal_only``: refuses ``causal=False``; ``dtypes``: the input
    dtypes it computes; ``grads``: the table arguments (``decay``, ``rope_theta``) it differentiates (a tensor
    that requires grad elsewhere is refused rather than silently not differentiated); ``unavailable(device)``:
    why it cannot run on a device, or None; ``choose(q, args)``: for ``auto``, the backend to run instead;
    ``windowed``: takes a ``window`` (the context-limited control, ``window.py``); ``documents``: takes packed
    documents (``documents.py``)."""

    name: str
    what: str
    run: Optional[Callable] = None
    causal_only: bool = False
    dtypes: Tuple[torch.dtype, ...] = ALL_DTYPES
    grads: Tuple[str, ...] = ("decay", "rope_theta")
    unavailable: Callable[[torch.device], Optional[str]] = lambda device: None
    choose: Optional[Callable[[Tensor, Args], str]] = None
    instead: str = "impl=chunk or impl=naive"
    windowed: bool = True
    documents: bool = True

    def refusal(self, q: Tensor, a: Args) -> Optional[Exception]:
        """The one-line error for a call this backend does not take, or None."""
        if self.causal_only and not a.causal:
            return ValueError(f"impl={self.name} is causal only; use {self.instead} for causal=False")
        if a.window is not None and not self.windowed:
            return ValueError(f"impl={self.name} takes no window; use {self.instead} for window={a.window}")
        if a.documents is not None and not self.documents:
            return ValueError(f"impl={self.name} takes no documents (packed sequences); use {self.instead}")
        if q.dtype not in self.dtypes:
            most = "float32 at most" if torch.float64 not in self.dtypes else "not " + str(q.dtype)
            return ValueError(f"impl={self.name} computes in {most} (got {q.dtype}); use {self.instead}")
        why = self.unavailable(q.device)
        if why:
            return BackendUnavailable(f"impl={self.name}: {why}")
        for name in ("decay", "rope_theta"):
            t = getattr(a, name)
            if name not in self.grads and torch.is_tensor(t) and t.requires_grad and torch.is_grad_enabled():
                return ValueError(
                    f"impl={self.name} does not differentiate {name}; pass a fixed tensor "
                    f"({name}.detach()) or use impl=naive"
                )
        return None


_CHOSEN: dict = {}


def _auto(q: Tensor, a: Args) -> str:
    """On a CUDA device triton, then fla: the first the registry accepts (causal, 16/32-bit, installed) whose versions
    passed the device check (``triton_backend.VERIFIED``, ``fla_backend.VERIFIED``); else chunk.  The choice is
    logged once per device type and choice (outside torch.compile's tracing), with fla's refusal when it is chunk."""
    kind = q.device.type
    impl, why = "chunk", f"fla needs CUDA, these tensors are on {kind}"
    if kind == "cuda":
        for name, unverified in (("triton", triton_backend.unverified), ("fla", fla_backend.unverified)):
            refused = BACKENDS[name].refusal(q, a) or unverified()
            if refused is None:
                impl, why = name, "CUDA, and these versions passed the device check"
                break
            why = str(refused)
    if (kind, impl) not in _CHOSEN and not torch.compiler.is_compiling():
        _CHOSEN[(kind, impl)] = True
        log.info("linear attention impl=auto: %s (%s)", impl, why)
    return impl


BACKENDS = {
    b.name: b
    for b in (
        Backend(
            "naive", "the N×N reference: every other form is tested against it; autograd in everything", naive_form
        ),
        Backend("chunk", "chunked, hand-written backward: training and long sequences", chunk_form, grads=()),
        Backend(
            "recurrent",
            "position by position through autograd: a check of the recurrence",
            recurrent_form,
            causal_only=True,
            windowed=False,
        ),
        Backend(
            "fla",
            "fla's chunked Triton kernels (CUDA, the gpu extra)",
            fla_backend.fla_form,
            causal_only=True,
            dtypes=(torch.float32, torch.float16, torch.bfloat16),
            grads=("rope_theta",),
            unavailable=fla_backend.unavailable,
            windowed=False,
        ),
        Backend(
            "triton",
            "linrope's own Triton kernels: φ and RoPE fused, the denominator a running sum (CUDA)",
            triton_backend.triton_form,
            causal_only=True,
            dtypes=(torch.float32, torch.float16, torch.bfloat16),
            grads=(),
            unavailable=triton_backend.unavailable,
            windowed=False,
        ),
        Backend("auto", "triton or fla where it runs on CUDA and passed the device check, else chunk", choose=_auto),
    )
}


def resolve(impl: str, q: Tensor, a: Args) -> Backend:
    """The backend that runs this call (``auto`` resolved), or the one-line error why none does."""
    backend = BACKENDS.get(impl)
    if backend is None:
        raise ValueError(f"unknown linear attention impl {impl!r}; available: {', '.join(BACKENDS)}")
    if backend.choose is not None:
        backend = BACKENDS[backend.choose(q, a)]
    refused = backend.refusal(q, a)
    if refused is not None:
        raise refused
    return backend


__all__ = ["Backend", "BACKENDS", "resolve"]
