"""Keep freed memory for reuse: a process-wide malloc setting that long sequences on CPU need.

glibc's malloc serves every block above 32 MB (a (1, 8, 8192, 64) float32 tensor is 16 MB, at N = 65536
it is 134 MB) with a fresh ``mmap`` and hands it back to the operating system as it is freed.  A
training or benchmark loop frees and allocates the same large tensors every step, so each step touches
fresh pages again and the kernel faults them in 4 KiB at a time.  On this machine that costs about
0.3 ms per MB: a quarter of a forward+backward of chunked linear attention at N = 65536, and the reason
time(65536)/time(8192) reads about 9 rather than 8.

``retain_freed_memory()`` asks malloc to serve large blocks from its heap (``M_MMAP_MAX = 0``) and to keep
freed memory there (``M_TRIM_THRESHOLD`` at its largest), so the next step reuses pages that are already
mapped.  The resident size then stays at the peak of the run instead of falling between steps.  It is the
effect that PyTorch's CPU performance notes get by preloading jemalloc or tcmalloc, without a preload.
Only glibc has these knobs; elsewhere the call does nothing and says so.
"""

from __future__ import annotations

import ctypes
import platform

M_TRIM_THRESHOLD = -1  # <malloc.h>
M_MMAP_MAX = -4
_INT_MAX = 2**31 - 1

_applied: bool | None = None


def retain_freed_memory() -> bool:
    """Make malloc keep freed memory for reuse (idempotent).  True if the setting is in effect."""
    global _applied
    if _applied is None:
        _applied = _mallopt()
    return _applied


def _mallopt() -> bool:
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return mallopt(M_MMAP_MAX, 0) == 1 and mallopt(M_TRIM_THRESHOLD, _INT_MAX) == 1
