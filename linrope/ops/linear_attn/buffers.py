"""Buffers the kernels allocate and then fill, and the switch that poisons them for tests.

A kernel that preallocates its output and writes it piece by piece can leave an element unwritten; with
``torch.empty`` that element holds whatever memory held before and may look plausible.  Under
``poison_buffers()`` every such buffer starts as NaN instead, so a test that checks for finite output
catches the gap.  Every form of linear attention allocates through ``alloc``.
"""

from __future__ import annotations

import contextlib

import torch

_POISON = False


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
    return torch.empty(shape, dtype=dtype, device=device)


__all__ = ["alloc", "poison_buffers"]
