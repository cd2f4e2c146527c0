"""The chunk form's heads as tasks on the CPU's threads (linrope.ops.linear_attn.heads): float64 against the naive
form, forward and backward, for every feature map and placement, with and without a decay, a denominator, the
state in and out, packed documents and causality, walked in several blocks, buffers poisoned with NaN; the tasks
run single-threaded and leave the caller's threads as they were; bfloat16 under autocast matches the whole call;
an error inside a task reaches the caller."""

from __future__ import annotations

import itertools
import threading

import pytest
import torch

from linrope.ops import chunk_linear_attention, naive_linear_attention
from linrope.ops.linear_attn import chunk_kernel, heads
from linrope.ops.linear_attn import tables as tables_mod
from linrope.ops.linear_attn.buffers import poison_buffers
from linrope.ops.linear_attn.common import LinearAttentionState
from tests.helpers import gen, rel

B, H, D, DV, N, C = 2, 3, 8, 6, 37, 4
DECAY = torch.tensor([0.95, 0.8, 0.6], dtype=torch.float64)
DOCS = torch.tensor([[0] * 9 + [1] * 3 + [2] * 25, [3] * 20 + [4] * 17])


@pytest.fixture
def as_tasks(monkeypatch):
    """Two torch threads, heads as tasks from the first position, blocks of a few chunks, poisoned buffers; counts
    the calls that ran as tasks."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    monkeypatch.setattr(heads, "MIN_POSITIONS", 1)
    monkeypatch.setitem(tables_mod.BLOCK_ELEMENTS, "cpu", 512)
    calls = []
    run = heads.run
    monkeypatch.setattr(heads, "run", lambda task, parts, dims: (calls.append(len(parts)), run(task, parts, dims))[1])
    try:
        with poison_buffers():
            yield calls
    finally:
        torch.set_num_threads(threads)


def draw(g, feature_map, with_state):
    q, k = (torch.randn(B, H, N, D, generator=g, dtype=torch.float64) for _ in range(2))
    v = torch.randn(B, H, N, DV, generator=g, dtype=torch.float64)
    dd = D + 1 if feature_map == "cosine" else D
    state = None
    if with_state:
        z = torch.rand(B, H, dd, generator=g, dtype=torch.float64) + 0.5
        state = LinearAttentionState(torch.randn(B, H, dd, DV, generator=g, dtype=torch.float64), z)
    w = [torch.randn(*s, generator=g, dtype=torch.float64) for s in ((B, H, N, DV), (B, H, dd, DV), (B, H, dd))]
    return (q, k, v), state, w


def outputs(fn, xs, state, w, causal, **kw):
    leaves = [t.clone().requires_grad_() for t in xs]
    init = None if state is None else LinearAttentionState(*(t.clone().requires_grad_() for t in state))
    res = fn(*leaves, initial_state=init, output_final_state=causal, causal=causal, **kw)
    out, fin = res if causal else (res, None)
    loss = (out * w[0]).sum() + (0 if fin is None else (fin.S * w[1]).sum() + (fin.z * w[2]).sum())
    grads = torch.autograd.grad(loss, leaves + ([] if init is None else list(init)))
    return [out] + ([] if fin is None else [fin.S, fin.z]) + list(grads)


# decay with the denominator, and neither: each input a part slices (the decay per head, the denominator or its
# placeholder) is met both ways; the kernels' own numerics are tested whole in test_linear_attention.py
CASES = [(fm, rope, *dn) for fm, rope in itertools.product(("elu", "cosine"), ("numerator", "both", "none"))
         for dn in ((True, True), (False, False))]  # fmt: skip


@pytest.mark.parametrize("feature_map,rope,decayed,normalize", CASES)
def test_heads_as_tasks_match_the_naive_form(as_tasks, feature_map, rope, decayed, normalize):
    for causal, with_state, packed in [(True, False, False), (True, True, False), (True, False, True), (False,) * 3]:
        g = gen("heads", feature_map, rope, decayed, normalize, causal, with_state, packed)
        xs, state, w = draw(g, feature_map, with_state)
        kw = dict(feature_map=feature_map, rope=rope, decay=DECAY if decayed else None, normalize=normalize)
        if packed:
            kw["documents"] = DOCS
        before = len(as_tasks)
        got = outputs(lambda *a, **k: chunk_linear_attention(*a, chunk_size=C, **k), xs, state, w, causal, **kw)
        assert len(as_tasks) == before + 2 and as_tasks[-1] > 1  # forward and backward, several tasks each
        want = outputs(naive_linear_attention, xs, state, w, causal, **kw)
        what = f"causal={causal} state={with_state} documents={packed}"
        for i, (a, b) in enumerate(zip(got, want)):
            assert not torch.isnan(a).any() and rel(a, b) < 1e-10, f"{what}: result {i}, {rel(a, b):.2e}"


def test_the_tasks_run_one_thread_each_and_leave_the_callers_threads(as_tasks):
    seen = []
    x = torch.randn(2, 3, 64, 8)

    def task(rows, hs):
        seen.append((threading.current_thread().name, torch.get_num_threads(), torch.is_grad_enabled()))
        return (x[rows, hs] + 1, None)

    parts = heads.groups(*x.shape, x.device)
    assert len(parts) == 6  # every (row, head) alone: one head is a block (512 numbers)
    out, none = heads.run(task, parts, (1, 1))
    assert torch.equal(out, x + 1) and none is None
    assert {n for _, n, _ in seen} == {1} and not any(grad for *_, grad in seen)
    assert all(name.startswith("linrope-heads") for name, *_ in seen)
    assert torch.get_num_threads() == 2
    other = []
    t = threading.Thread(target=lambda: other.append(torch.get_num_threads()))
    t.start()
    t.join()
    assert other == [2]  # a thread started later takes the caller's setting, not the workers'


def test_short_sequences_and_one_head_run_whole_and_tasks_hold_a_block(monkeypatch):
    monkeypatch.setattr(heads, "MIN_POSITIONS", 2048)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        cpu, meta = torch.device("cpu"), torch.device("meta")
        assert heads.groups(4, 8, 2047, 8, cpu) is None
        assert heads.groups(1, 1, 4096, 8, cpu) is None
        assert heads.groups(1, 8, 4096, 8, meta) is None
        assert len(heads.groups(1, 8, 4096, 64, cpu)) == 8  # one head is a block (2^18 numbers): one each
        assert heads.groups(2, 8, 2048, 64, cpu)[:2] == [(slice(0, 1), slice(0, 2)), (slice(0, 1), slice(2, 4))]
        assert len(heads.groups(1, 8, 4096, 8, cpu)) == 1  # all eight heads make one block
        torch.set_num_threads(1)  # the thread count changes nothing: the plan is the shape's
        assert len(heads.groups(1, 8, 4096, 64, cpu)) == 8
    finally:
        torch.set_num_threads(threads)


def test_bfloat16_under_autocast_beyond_a_chunk_matches_the_whole_call(as_tasks):
    g = gen("heads-bf16")
    q, k, v = (torch.randn(B, H, 3 * 64 + 5, D, generator=g).bfloat16().requires_grad_() for _ in range(3))
    results = []
    for enabled in (True, False):
        heads.ENABLED = enabled
        try:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out = chunk_linear_attention(q, k, v, chunk_size=64)
            results.append([out, *torch.autograd.grad(out.float().square().sum(), (q, k, v))])
        finally:
            heads.ENABLED = True
    assert len(as_tasks) == 2
    for a, b in zip(*results):
        assert a.dtype == torch.bfloat16 and torch.equal(a, b)


def test_an_error_in_a_task_reaches_the_caller(as_tasks, monkeypatch):
    forward = chunk_kernel.chunk_forward

    def failing(q, *args, **kw):
        if q.shape[1] and threading.current_thread().name.startswith("linrope-heads"):
            raise RuntimeError("a task failed")
        return forward(q, *args, **kw)

    monkeypatch.setattr("linrope.ops.linear_attn.chunk.chunk_forward", failing)
    q = torch.randn(B, H, 16, D)
    with pytest.raises(RuntimeError, match="a task failed"):
        chunk_linear_attention(q, q, q, chunk_size=C)


@pytest.mark.parametrize("rope", ["numerator", "both"])
def test_uneven_parts_give_the_shapes_the_fake_implementation_gives(as_tasks, rope, monkeypatch):
    """4 heads of 3 rows in tasks of three heads and of one: every task walks the blocks planned for three, so the
    saved states line up and match the operator's registered shapes (what torch.compile plans with)."""
    from linrope.ops.linear_attn.chunk import _fwd_shapes, chunk_fwd

    monkeypatch.setitem(tables_mod.BLOCK_ELEMENTS, "cpu", 3 * N * D)  # three heads of one row make a block
    g = gen("heads-uneven", rope)
    q, k = (torch.randn(3, 4, N, D, generator=g) for _ in range(2))
    v = torch.randn(3, 4, N, DV, generator=g)
    theta = torch.rand(D // 2, generator=g)
    positions = torch.arange(N)
    res = chunk_fwd(q, k, v, None, None, positions, theta, None, "elu", rope, True, 1e-6, C, True, None)
    assert len(as_tasks) == 1 and {hs.stop - hs.start for _, hs in heads.groups(*q.shape, q.device)} == {1, 3}
    assert [tuple(t.shape) for t in res] == list(_fwd_shapes(q, v, "elu", rope, True, C, True))
    assert res[4].dim() == 5  # several blocks: states were saved
    heads.ENABLED = False
    try:
        whole = chunk_fwd(q, k, v, None, None, positions, theta, None, "elu", rope, True, 1e-6, C, True, None)
    finally:
        heads.ENABLED = True
    for a, b in zip(res[:4], whole[:4]):  # (the whole call walks blocks planned for all 12 heads: other states)
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
