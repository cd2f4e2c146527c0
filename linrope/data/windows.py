"""Which windows score a split's bytes, and what each scored byte sees: the one definition.

A model's test row and every extrapolation row of bytes score their targets through windows of ``length`` bytes
moving by ``stride`` (``linrope.data.bytes.SlidingWindows``, over the stretches ``segments`` chooses); the
reference rows (``linrope.evaluation.references``) score the same targets with the same context cut, from the
functions here.  numpy only: the reference models import it without torch.

Window k ends at e_k (its inputs are the bytes at offsets e_k − length … e_k − 1): e_0 = length,
e_k = min(e_{k−1} + stride, n), and it scores the targets at offsets e_{k−1} + 1 … e_k (the first, 1 … e_0).  The
target at offset t scored by window k is predicted from the t − (e_k − length) bytes before it in its window.
"""

from __future__ import annotations

from typing import List, Optional, Sequence

import numpy as np

MAX_SEGMENTS = 16


def window_ends(length: int, stride: int, n: int) -> List[int]:
    """e_0, e_1, …: where each window over the targets at offsets 1 … n ends (exclusive of its inputs: window k
    reads the inputs at offsets e_k − length … e_k − 1)."""
    if not 1 <= stride <= length:
        raise ValueError(f"stride={stride}: must be between 1 and the length ({length})")
    if n < length:
        raise ValueError(f"the scored text ({n} bytes) is shorter than the length {length}")
    return list(range(length, n, stride)) + [n]


def window_context(length: int, stride: int, n: int) -> np.ndarray:
    """Entry t − 1: how many bytes before the target at offset t (t = 1 … n) the window that scores it holds."""
    out = np.empty(n, np.int64)
    first = 1
    for end in window_ends(length, stride, n):
        out[first - 1 : end] = np.arange(first, end + 1) - (end - length)
        first = end + 1
    return out


def segments(split_bytes: int, scored_bytes: Optional[int], longest: int) -> List[tuple]:
    """The (start, size) stretches every length scores: the whole split (every target but the first byte's)
    when ``scored_bytes`` is None or covers it, else exactly ``scored_bytes`` targets in up to ``MAX_SEGMENTS``
    segments of at least ``longest`` (the longest length scored) bytes, spread evenly from the split's start to
    its end."""
    n = split_bytes - 1
    if scored_bytes is None or scored_bytes >= n:
        return [(0, n)]
    total = int(scored_bytes)
    k = max(1, min(MAX_SEGMENTS, total // max(int(longest), 1)))
    sizes = [total // k + (1 if i < total % k else 0) for i in range(k)]
    gaps = [((n - total) * i) // max(k - 1, 1) for i in range(k)]
    return [(gaps[i] + sum(sizes[:i]), sizes[i]) for i in range(k)]


def scored_context(
    split_bytes: int, parts: Sequence[tuple], length: int, stride: int, window: Optional[int] = None
) -> np.ndarray:
    """Entry t − 1 for each target offset t = 1 … split_bytes − 1: how many bytes before it a model sees when the
    row of windows ``length`` / ``stride`` over the stretches ``parts`` (``segments``: a segment (start, size)'s
    windows read the split from ``start``) scores it, at most ``window`` (attention to the last ``window`` keys
    only); −1 where no window scores it."""
    out = np.full(max(split_bytes - 1, 0), -1, np.int64)
    for start, size in parts:
        out[int(start) : int(start) + int(size)] = window_context(length, stride, int(size))
    if window:
        np.minimum(out, int(window), out=out, where=out >= 0)
    return out
