"""The benchmark scripts: their reference ("before") form is exact, and they run and report what they measured."""
import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks import gpu_check, gpu_table, train_throughput
from benchmarks import linear_attention as bench
from benchmarks import loaded
from linrope.ops import naive_linear_attention

ROOT = Path(__file__).resolve().parents[1]


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


# --------------------------------------------------------------------------------------------------------
# the device check: benchmarks/gpu_check.sh (gpu_check.py), its kernel table (gpu_table.py), its training rows
# --------------------------------------------------------------------------------------------------------
def read_rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_kernel_table_keeps_the_other_forms_when_one_fails(tmp_path, monkeypatch, capsys):
    """A form that raises becomes its own row; the forms after it, and the next N, are still measured; fla on a CPU
    is "unavailable", not a failure; every row is printed as it is measured."""
    monkeypatch.setenv("LINROPE_BENCH_FAIL", gpu_table.SDPA)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    rows = tmp_path / "rows.jsonl"
    forms = [gpu_table.SDPA, gpu_table.LINROPE_CHUNK, gpu_table.FLA_KERNEL]
    rc = gpu_table.main(["--device", "cpu", "--lengths", "64", "128", "--forms", *forms, "--heads", "2", "--dim", "16",
                         "--warmup", "0", "--repeats", "1", "--jsonl", str(rows)])
    got = read_rows(rows)
    assert [(r["n"], r["form"], r["status"]) for r in got] == [
        (n, f, s) for n in (64, 128) for f, s in zip(forms, ("failed", "ok", "unavailable"))]
    assert rc == 1
    assert all("forced failure" in r["note"] for r in got if r["status"] == "failed")
    assert all(r["fwd_bwd_ms"] > 0 and r["fwd_ms"] > 0 and r["first_s"] > 0 for r in got if r["status"] == "ok")
    printed = capsys.readouterr().out
    assert printed.count(f"| {gpu_table.LINROPE_CHUNK} | ") == 2 and printed.count("| failed: RuntimeError") == 2


def test_kernel_table_says_when_its_budget_is_spent(tmp_path):
    rows = tmp_path / "rows.jsonl"
    assert gpu_table.main(["--device", "cpu", "--lengths", "64", "--forms", gpu_table.LINROPE_CHUNK,
                           "--budget-s", "0", "--jsonl", str(rows)]) == 0
    (row,) = read_rows(rows)
    assert row["status"] == "skipped" and "budget" in row["note"] and "fwd_bwd_ms" not in row


def test_training_throughput_keeps_the_other_models_when_one_fails(tmp_path, monkeypatch):
    monkeypatch.setenv("LINROPE_BENCH_FAIL", "softmax_rope")
    rows = tmp_path / "rows.jsonl"
    rc = train_throughput.main(["--context", "32", "--override", "size=tiny", "--warmup", "0", "--steps", "1",
                                "--models", "linear_rope:model.attention.chunk_size=16", "softmax_rope",
                                "--jsonl", str(rows)])
    lin, soft = read_rows(rows)
    assert rc == 1
    assert (lin["model"], lin["status"], soft["model"], soft["status"]) == \
        ("linear_rope:model.attention.chunk_size=16", "ok", "softmax_rope", "failed")
    assert lin["tokens_per_s"] > 0 and lin["peak_mib"] is None  # peak memory: CUDA only
    assert "forced failure" in soft["note"]


def test_training_throughput_refuses_a_model_spec_that_is_not_key_value(capsys):
    with pytest.raises(SystemExit):
        train_throughput.main(["--models", "linear_rope:model.attention.impl"])
    assert "is not KEY=VALUE" in capsys.readouterr().err


@pytest.mark.parametrize("fla_ms,met", [(13.0, "yes"), (13.5, "no")])
def test_device_check_goals_read_the_measured_rows(tmp_path, fla_ms, met):
    ctx = gpu_check.Context(argparse.Namespace(cpu=False, out=tmp_path, parts=list(gpu_check.PARTS), total_s=None))
    for form, ms in ((gpu_table.SDPA, 80.0), (gpu_table.FLA_KERNEL, 10.0), (gpu_table.LINROPE_FLA, fla_ms),
                     (gpu_table.LINROPE_CHUNK, 20.0)):
        ctx.add_row({"part": "kernels", "n": 16384, "form": form, "status": "ok", "fwd_bwd_ms": ms, "fwd_ms": 1.0})
    for model, tps in zip(gpu_check.TRAIN_MODELS, (900.0, 1100.0, 1000.0)):  # impl=chunk, impl=fla, softmax
        ctx.add_row({"part": "train", "model": model, "context": 4096, "status": "ok", "tokens_per_s": tps})
    within, fla_sdpa, chunk_sdpa, train_fla, train_chunk = gpu_check.goals(ctx)
    assert within[1].endswith(f"= {fla_ms / 10:.2f}×") and within[2] == met
    assert fla_sdpa[2] == "yes" and chunk_sdpa[1].endswith("= 4.00×") and chunk_sdpa[2] == "no"
    assert (train_fla[2], train_chunk[2]) == ("yes", "no") and train_fla[1].endswith("= 1.10×")
    md = gpu_check.report(ctx)
    assert f"| 16384 | {gpu_table.LINROPE_FLA} | {fla_ms:.2f} | 1.00 | – | – | {fla_ms / 10:.2f}× | " in md


@pytest.mark.slow
def test_device_check_stand_in_runs_end_to_end(tmp_path):
    """bash benchmarks/gpu_check.sh --cpu: every part, every table and row label in gpu_check.md; a form and a
    model made to fail leave every other row measured, and the exit status says a part failed."""
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "OUT", "GPU_CHECK_CPU")}
    env.update(PYTHON=sys.executable, OUT=str(out), LINROPE_BENCH_FAIL=f"{gpu_table.LINROPE_CHUNK},softmax_rope")
    res = subprocess.run(["bash", "benchmarks/gpu_check.sh", "--cpu"], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=900)
    assert res.returncode == 1, res.stdout[-3000:] + res.stderr[-3000:]
    md = (out / "gpu_check.md").read_text()
    for heading in ("## Environment", "## Parts", "## CUDA tests (`pytest -m gpu`)", "## Kernel table",
                    "## Training throughput", "## FSDP", "## GPU goals"):
        assert heading in md, heading

    def row(*first):
        found = re.findall(r"^\| " + re.escape(" | ".join(map(str, first))) + r" \| (.*) \|$", md, re.M)
        assert len(found) == 1, (first, found)
        return [c.strip() for c in found[0].split("|")]

    for part in gpu_check.PARTS:
        row(part)
    assert row("tests")[0] == "ok" and "skipped" in row("tests")[-1]  # no CUDA: the gpu tests skip
    assert row("kernels")[0] == row("train")[0] == "failed"
    for n in gpu_check.SIZES["cpu"]["lengths"]:
        sdpa = row(n, gpu_table.SDPA)
        assert float(sdpa[0]) > 0 and sdpa[-1] == "ok"
        assert row(n, gpu_table.LINROPE_CHUNK)[-1].startswith("failed: RuntimeError: forced failure")
        for form in (gpu_table.FLA_KERNEL, gpu_table.LINROPE_FLA):
            assert row(n, form)[-1].startswith("unavailable: fla's Triton kernels need a CUDA device")
    chunk = row(gpu_check.LINEAR_CHUNK)
    assert float(chunk[4].replace(" ", "")) > 0 and chunk[-1] == "ok"  # tokens/s
    assert row(gpu_check.SOFTMAX)[-1].startswith("failed: RuntimeError: forced failure")
    assert row(gpu_check.LINEAR_FLA)[-1].startswith("unavailable: impl=fla: fla's Triton kernels need a CUDA device")
    assert re.search(r"^\| `python train.py model=linear_rope size=tiny trainer=fsdp .*\| (missing|unavailable) \|",
                     md, re.M)
    goals = md.split("## GPU goals")[1]
    assert goals.count("\n| ") == 1 + 5  # the header and the five goal rows
    assert "## summary" in (out / "gpu_check.log").read_text()

    # nothing forced to fail: the kernel part alone passes, exit status 0
    del env["LINROPE_BENCH_FAIL"]
    res = subprocess.run(["bash", "benchmarks/gpu_check.sh", "--cpu", "--parts", "kernels"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:]
    assert row("kernels") and "| kernels | ok |" in (out / "gpu_check.md").read_text()


def test_loaded_benchmark_reports_both_states_and_restores_the_plan(capsys):
    from linrope.ops.linear_attn import scans, tables

    plan = scans.SEQUENTIAL, dict(tables.MAX_BLOCKS)
    adv = loaded.main(["--length", "256", "--rounds", "1", "--warmup", "0"])
    text = capsys.readouterr().out
    assert set(adv) == {(f, s) for f in ("chunk", "chunk_old") for s in ("quiet", "loaded")}
    assert all(a > 0 for a in adv.values()), adv
    assert "loaded / quiet advantage" in text and "new / old plan" in text
    assert (scans.SEQUENTIAL, tables.MAX_BLOCKS) == plan  # the old plan was only borrowed
