"""The windows a row scores through (linrope.data.windows), read by the models' rows (SlidingWindows) and the
reference rows alike: the context each scored byte gets is the one the model's window gives it."""

import numpy as np
import pytest

from linrope.data.bytes import SlidingWindows
from linrope.data.windows import scored_context, segments, window_context


@pytest.mark.parametrize("length, stride, n", [(8, 8, 50), (8, 4, 50), (8, 3, 8), (16, 16, 17), (5, 1, 23)])
def test_each_scored_byte_sees_what_its_sliding_window_holds(length, stride, n):
    data = np.arange(n + 1, dtype=np.uint8)
    seen = np.full(n, -1)
    windows = SlidingWindows(data, length, stride, n, offsets=True)
    for k in range(len(windows)):
        x, _, where = windows[k]
        start = int(x[0])  # data[i] = i: the window's first input is its offset
        for t in where[where >= 0].tolist():
            assert seen[t - 1] == -1
            seen[t - 1] = t - start  # the inputs at offsets start … t − 1 come before target t
    assert (window_context(length, stride, n) == seen).all()


def test_the_test_windows_restart_and_a_sliding_row_keeps_half_the_length():
    ctx = window_context(4, 4, 12)
    assert ctx.tolist() == [1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4]
    assert window_context(4, 2, 8).tolist() == [1, 2, 3, 4, 3, 4, 3, 4]


def test_segments_and_an_attention_window_cut_the_context():
    parts = segments(101, 40, 8)  # 40 targets in 5 segments of 8 over a split of 101 bytes
    ctx = scored_context(101, parts, 8, 8, window=3)
    assert (ctx >= 0).sum() == 40 and ctx.max() == 3
    for start, size in parts:
        assert (ctx[start : start + size] == np.minimum(window_context(8, 8, size), 3)).all()
