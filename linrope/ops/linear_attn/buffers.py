"""Buffers the kernels allocate and then fill, and the switch that poisons them for tests.

A kernel that preallocates its output and writes it piece by piece can leave an element unwritten; with
``torch.empty`` that element holds whatever memory held before and may look plausible.  Under
``poison_buffers()`` every such buffer starts as NaN instead, so a test that checks for finite output
catches the gap.  Every form of linear attention allocates through ``alloc``.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import sys

import torch

_POISON = False

# Huge pages for large CPU buffers.  A buffer of many MiB is fresh memory from the OS on each call (the allocator hands
# it back when freed), so every call faults it in again, 4 KiB at a time: at N = 65 536 (B 1, H 8, d 64) that was the
# chunk form's whole excess over linear scaling (docs/benchmarks.md).  Advising huge pages (MADV_HUGEPAGE, honoured
# where the kernel's transparent_hugepage is "madvise" or "always") before the kernel writes the buffer faults it in
# 2 MiB at a time, for these buffers only, where THP_MEM_ALLOC_ENABLE=1 would change every allocation of the process.
HUGE = 2 << 20
HUGE_FROM = 8 << 20  # buffers from this size on
_MADV_HUGEPAGE = 14


def _madvise():
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int), ctypes.c_int
    return fn


_MADVISE = _madvise()


def advise_huge(t: torch.Tensor) -> torch.Tensor:
    """Ask for huge pages on the whole 2 MiB pages inside a large CPU tensor's memory (nothing elsewhere, or where
    the OS refuses)."""
    nbytes = t.numel() * t.element_size()
    if _MADVISE is None or t.device.type != "cpu" or nbytes < HUGE_FROM:
        return t
    start = -(-t.data_ptr() // HUGE) * HUGE
    end = (t.data_ptr() + nbytes) // HUGE * HUGE
    if end > start:
        _MADVISE(start, end - start, _MADV_HUGEPAGE)  # a refusal (EINVAL on a kernel without THP) changes nothing
    return t


@contextlib.contextmanager
def poison_buffers(enabled: bool = True):
    """Within this context every buffer the kernels preallocate starts as NaN (for tests)."""
    global _POISON
    old, _POISON = _POISON, enabled
    try:
        yield
    finally:
        _POISON = old


def alloc(shape, *, dtype, device) -> torch.Tensor:
    """An uninitialised buffer (NaN-filled inside ``poison_buffers``)."""
    if _POISON:
        return torch.full(shape, float("nan"), dtype=dtype, device=device)
    return advise_huge(torch.empty(shape, dtype=dtype, device=device))


__all__ = ["advise_huge", "alloc", "poison_buffers"]
