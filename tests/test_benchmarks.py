"""The benchmark scripts: their reference ("before") form is exact, and they run and report what they measured."""
import re

import pytest
import torch

from benchmarks import linear_attention as bench
from benchmarks import loaded
from benchmarks import train_throughput
from linrope.ops import naive_linear_attention


@pytest.mark.parametrize("rope", ["numerator", "none"])
def test_plain_chunked_form_equals_naive_with_gradients(rope):
    """Issue #7's "before" form computes causal elu+1 linear attention exactly (float64, N not a multiple of C)."""
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(2, 3, 77, 8, generator=g, dtype=torch.float64) for _ in range(3))
    w = torch.randn(2, 3, 77, 8, generator=g, dtype=torch.float64)
    grads = []
    for fn in (naive_linear_attention, lambda *a, **kw: bench.plain_chunk_linear_attention(*a, chunk_size=16, **kw)):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = fn(*leaves, rope=rope)
        (out * w).sum().backward()
        grads.append((out.detach(), [t.grad for t in leaves]))
    (ref, ref_g), (out, out_g) = grads
    assert ((out - ref).norm() / ref.norm()).item() < 1e-12
    for a, b in zip(out_g, ref_g):
        assert ((a - b).norm() / b.norm()).item() < 1e-12


def test_kernel_benchmark_reports_every_form_it_timed(capsys):
    bench.main(["--lengths", "128", "256", "--forms", "chunk", "plain", "sdpa", "--repeats", "1", "--no-memory"])
    text = capsys.readouterr().out
    rows = [line for line in text.splitlines() if re.match(r"\| (128|256) \|", line)]
    assert len(rows) == 2
    header = next(line for line in text.splitlines() if line.startswith("| N |")).split("|")
    cells = rows[1].split("|")
    for col in ("chunk f+b ms", "plain f+b ms", "SDPA f+b ms", "sdpa/chunk f+b", "plain/chunk f+b"):
        value = cells[[h.strip() for h in header].index(col)].strip()
        assert float(value) > 0, (col, value)


def test_training_throughput_benchmark_reports_a_ratio(capsys):
    train_throughput.main(["--context", "128", "--d-model", "32", "--layers", "1", "--heads", "2", "--d-ff", "64",
                           "--warmup", "0", "--steps", "1"])
    text = capsys.readouterr().out
    row = next(line for line in text.splitlines() if line.startswith("| 128 |"))
    ratio = float(row.rstrip(" |").split("|")[-1].strip().rstrip("×"))
    assert ratio > 0


def test_loaded_benchmark_reports_both_states_and_restores_the_plan(capsys):
    from linrope.ops.linear_attn import scans, tables

    plan = scans.SEQUENTIAL, dict(tables.MAX_BLOCKS)
    adv = loaded.main(["--length", "256", "--rounds", "1", "--warmup", "0"])
    text = capsys.readouterr().out
    assert set(adv) == {(f, s) for f in ("chunk", "chunk_old") for s in ("quiet", "loaded")}
    assert all(a > 0 for a in adv.values()), adv
    assert "loaded / quiet advantage" in text and "new / old plan" in text
    assert (scans.SEQUENTIAL, tables.MAX_BLOCKS) == plan  # the old plan was only borrowed
