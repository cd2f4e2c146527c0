"""The benchmark scripts: one registry of forms, one timing helper; every script runs at tiny sizes and labels
its rows with what they time."""

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks import (
    forms,
    generation,
    gpu_check,
    grid,
    kernel_time,
    loaded,
    memory,
    precision,
    timing,
    train_throughput,
)
from linrope.ops import BACKENDS, naive_linear_attention

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--repeats", "1", "--warmup", "0", "--peak-size", "64", "--heads", "2", "--dim", "16"]


def table_rows(text: str, first: str) -> list[list[str]]:
    """The cells of the markdown rows of ``text`` whose first cell is ``first``."""
    return [
        [c.strip() for c in line.strip().strip("|").split("|")]
        for line in text.splitlines()
        if re.match(r"\| " + re.escape(first) + r" \|", line)
    ]


@pytest.mark.parametrize("rope", ["numerator", "none"])
def test_plain_chunked_form_equals_naive_with_gradients(rope):
    """The reference "before" form computes causal elu+1 linear attention exactly (float64, N not a multiple of C)."""
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(2, 3, 77, 8, generator=g, dtype=torch.float64) for _ in range(3))
    w = torch.randn(2, 3, 77, 8, generator=g, dtype=torch.float64)
    grads = []
    for fn in (naive_linear_attention, lambda *a, **kw: forms.plain_chunk_linear_attention(*a, chunk_size=16, **kw)):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = fn(*leaves, rope=rope)
        (out * w).sum().backward()
        grads.append((out.detach(), [t.grad for t in leaves]))
    (ref, ref_g), (out, out_g) = grads
    assert ((out - ref).norm() / ref.norm()).item() < 1e-12
    for a, b in zip(out_g, ref_g):
        assert ((a - b).norm() / b.norm()).item() < 1e-12


# --------------------------------------------------------------------------------------------------------
# the registry and the timing helper
# --------------------------------------------------------------------------------------------------------
def test_registry_has_every_linrope_backend_and_labels_that_say_what_they_time():
    reg = forms.REGISTRY
    assert {n for n, b in BACKENDS.items() if b.choose is None} <= set(reg)  # read from linrope's registry
    assert "auto" not in reg  # it only chooses
    assert len({f.label for f in reg.values()}) == len(reg)  # a label names one form
    for key, f in reg.items():  # every label names whose code it times
        assert f.key == key and f.what and f.label.split()[0] in ("linrope", "plain", "sdpa", "fla"), f
    assert reg["naive"].growth == reg["sdpa"].growth == 2 and reg["chunk"].growth == 1
    assert forms.lookup("linrope chunk") is forms.lookup("chunk") is reg["chunk"]
    with pytest.raises(KeyError, match="unknown form 'flash'; forms: naive, chunk"):
        forms.lookup("flash")


def test_fla_naive_form_says_it_is_fla_s_pure_pytorch_reference():
    """The row once labelled "fla" timed fla's pure-PyTorch naive_chunk_linear_attn: its label now says so, and
    its description names the function and that it is not fla's Triton kernel."""
    f = forms.REGISTRY["fla-naive-torch"]
    assert "fla's pure-PyTorch reference" in f.label and "naive_chunk_linear_attn" in f.label
    assert "fla.ops.linear_attn.naive.naive_chunk_linear_attn" in f.what and "not its Triton kernel" in f.what
    triton = forms.REGISTRY["fla-triton"]
    assert "Triton kernel" in triton.what and "chunk_simple_gla" in triton.label


@pytest.mark.slow  # importing fla takes 5-15 s here
def test_fla_naive_row_is_fla_s_reference_beside_linrope_without_rope(capsys):
    """kernel_time.py's row for it carries that label, and its ratio to linrope chunk rope=none is measured in the
    same run (or the row says fla is unavailable)."""
    rc = kernel_time.main(
        ["--lengths", "64", "--forms", "chunk-none", "fla-naive-torch", "--ratios", "fla-naive-torch/chunk-none", *TINY]
    )
    text = capsys.readouterr().out
    label = forms.REGISTRY["fla-naive-torch"].label
    (row,) = table_rows(text, f"1 | 64 | {label}")
    assert f"- {label} [fla-naive-torch]: fla.ops.linear_attn.naive.naive_chunk_linear_attn" in text  # the legend
    if row[-1] == "ok":
        (ratio,) = table_rows(text, f"1 | 64 | {label} ÷ linrope chunk, rope=none")
        assert re.fullmatch(r"\d+\.\d\d×", ratio[-1]) and rc == 0
    else:
        assert row[-1].startswith("unavailable: flash-linear-attention does not import")


def test_timing_helper_takes_the_median_and_alternates_the_keys(monkeypatch):
    order, durations = [], iter([5.0, 1.0, 2.0])  # seconds the fake clock advances per timed call
    clock = [0.0]

    def fake():
        clock[0] += next(durations)

    with monkeypatch.context() as m:
        m.setattr(timing.time, "perf_counter", lambda: clock[0])
        assert timing.median_time(fake, warmup=0, repeats=3) == 2.0  # not the mean, 2.67
    times = timing.rounds({"a": lambda: order.append("a"), "b": lambda: order.append("b")}, rounds=3, warmup=1)
    assert order == ["a", "b"] * 4 and [len(v) for v in times.values()] == [3, 3]
    assert timing.ratio(6.0, 2.0) == 3.0 and timing.ratio(None, 2.0) is None and timing.ratio(1.0, None) is None


# --------------------------------------------------------------------------------------------------------
# one script per question, at tiny sizes
# --------------------------------------------------------------------------------------------------------
def test_kernel_time_reports_every_form_it_timed_with_ratios_growth_and_flop_rate(tmp_path, capsys):
    rows_file = tmp_path / "rows.jsonl"
    assert (
        kernel_time.main(
            [
                "--lengths",
                "64",
                "128",
                "--shapes",
                "2x64",
                "--forms",
                "chunk",
                "plain",
                "sdpa",
                "--ratios",
                "sdpa/chunk",
                "plain/chunk",
                "--jsonl",
                str(rows_file),
                *TINY,
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    got = [json.loads(line) for line in rows_file.read_text().splitlines()]
    assert [(r["batch"], r["n"], r["key"], r["form"]) for r in got] == [
        (b, n, k, forms.REGISTRY[k].label) for b, n in ((1, 64), (1, 128), (2, 64)) for k in ("chunk", "plain", "sdpa")
    ]
    ms = {(r["n"], r["key"]): r for r in got if r["batch"] == 1}
    at_2 = {r["key"]: r for r in got if r["batch"] == 2}  # the --shapes row: its own ratio, no growth
    (ratio,) = table_rows(text, f"2 | 64 | {forms.REGISTRY['sdpa'].label} ÷ linrope chunk")
    assert ratio[-1] == f"{at_2['sdpa']['fwd_bwd_ms'] / at_2['chunk']['fwd_bwd_ms']:.2f}×"
    for n in (64, 128):
        for key in ("chunk", "plain", "sdpa"):
            row = table_rows(text, f"1 | {n} | {forms.REGISTRY[key].label}")[0]  # the kernel table's (then FLOP rate)
            assert row[-1] == "ok" and float(row[3]) > 0 and float(row[4]) > 0, row  # fwd+bwd ms, fwd ms
        for key in ("sdpa", "plain"):  # the ratio of the two times this run measured
            (ratio,) = table_rows(text, f"1 | {n} | {forms.REGISTRY[key].label} ÷ linrope chunk")
            for cell, kind in zip(ratio[3:], ("fwd_ms", "fwd_bwd_ms")):
                assert cell == f"{ms[n, key][kind] / ms[n, 'chunk'][kind]:.2f}×", (ratio, kind)
        (flops,) = table_rows(text, f"1 | {n} | linrope chunk")[1:]  # the FLOP-rate table's row
        rate = 1 * 2 * n * (8 * 64 * 16 + 8 * 16**2) / (ms[n, "chunk"]["fwd_ms"] / 1e3) / 1e9  # B H N (8Cd + 8d²)
        assert flops[3] == f"{rate:.1f}" and flops[4].endswith("%")
    (growth,) = table_rows(text, "linrope chunk | 64 → 128")
    assert growth[2] == f"{ms[128, 'chunk']['fwd_bwd_ms'] / ms[64, 'chunk']['fwd_bwd_ms']:.2f}" and growth[3] == "2"


def test_kernel_time_says_why_it_skipped_a_row(capsys):
    kernel_time.main(["--lengths", "64", "128", "--forms", "naive", "--naive-max", "64", *TINY])
    kernel_time.main(["--lengths", "64", "128", "--forms", "chunk", "--max-run-s", "0", *TINY])
    text = capsys.readouterr().out
    assert table_rows(text, "1 | 128 | linrope naive")[0][-1] == "skipped: N above --naive-max 64 (B·H·N² weights)"
    assert re.fullmatch(
        r"skipped: one fwd\+bwd predicted to take \d+ s, over --max-run-s 0",
        table_rows(text, "1 | 128 | linrope chunk")[0][-1],
    )


def test_kernel_time_refuses_an_unknown_form_in_one_line(capsys):
    with pytest.raises(SystemExit):
        kernel_time.main(["--forms", "chunk", "flash"])
    assert "unknown form 'flash'; forms: naive, chunk" in capsys.readouterr().err


def test_every_script_explains_itself_in_help(capsys):
    for main in (kernel_time.main, memory.main, generation.main, precision.main, loaded.main, grid.main):
        with pytest.raises(SystemExit) as e:
            main(["--help"])
        assert e.value.code == 0
    text = capsys.readouterr().out
    for f in forms.REGISTRY.values():  # kernel_time's and memory's help list every form, label and key
        assert text.count(f"- {f.label} [{f.key}]: ") == 2, f.key


def test_memory_reports_the_peak_of_a_fresh_process(capsys):
    assert memory.main(["--lengths", "128", "--forms", "chunk"]) == 0
    (row,) = table_rows(capsys.readouterr().out, "128 | linrope chunk")
    rise, peak = (float(c.replace(" ", "")) for c in row[2:4])
    assert row[-1] == "ok" and 0 <= rise < peak and peak > 100, row  # torch alone is > 100 MB


def test_generation_reports_time_per_token_of_both_forms(capsys):
    res = generation.main(["--positions", "16", "32", "--tokens", "2", "--rounds", "1"])
    assert set(res) == {"recurrent_step", "linear_rope model"}
    assert all(t > 0 for per in res.values() for t in per.values())
    text = capsys.readouterr().out
    for label in res:
        assert float(table_rows(text, label)[0][-1]) > 0


def test_precision_reports_the_speed_ratio_and_what_bfloat16_products_cost(capsys):
    import linrope.ops.linear_attn.chunk_kernel as CK

    rule = CK.matmul_dtype
    precision.main(["--lengths", "64", "--rounds", "1", "--mm-size", "64", "--error-length", "64"])
    assert CK.matmul_dtype is rule  # swapped only for the run
    text = capsys.readouterr().out
    (speed,) = table_rows(text, "64 | linrope chunk")
    assert all(float(c.rstrip("×")) > 0 for c in speed[2:]), speed
    bf16, f32 = table_rows(text, "elu, numerator, no decay")
    assert (bf16[1], f32[1]) == ("bfloat16 products", "float32 products")
    assert float(bf16[3]) > 100 * float(f32[3])  # the final state: bfloat16-exact against float32-exact


def test_training_throughput_benchmark_reports_a_ratio(capsys):
    train_throughput.main(
        [
            "--context",
            "128",
            "--d-model",
            "32",
            "--layers",
            "1",
            "--heads",
            "2",
            "--d-ff",
            "64",
            "--warmup",
            "0",
            "--steps",
            "1",
        ]
    )
    text = capsys.readouterr().out
    row = next(line for line in text.splitlines() if line.startswith("| 128 |"))
    ratio = float(row.rstrip(" |").split("|")[-1].strip().rstrip("×"))
    assert ratio > 0


# --------------------------------------------------------------------------------------------------------
# the device check: benchmarks/gpu_check.sh (gpu_check.py), its kernel table (kernel_time.py), its training rows
# --------------------------------------------------------------------------------------------------------
def read_rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_kernel_table_keeps_the_other_forms_when_one_fails(tmp_path, monkeypatch, capsys):
    """A form that raises becomes its own row; the forms after it, and the next N, are still measured; fla on a CPU
    is "unavailable", not a failure; every row is printed as it is measured."""
    monkeypatch.setenv("LINROPE_BENCH_FAIL", gpu_check.SDPA)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    rows = tmp_path / "rows.jsonl"
    forms = [gpu_check.SDPA, gpu_check.LINROPE_CHUNK, gpu_check.FLA_KERNEL]
    rc = kernel_time.main(
        [
            "--device",
            "cpu",
            "--dtype",
            "bf16",
            "--peak-size",
            "0",
            "--lengths",
            "64",
            "128",
            "--forms",
            *forms,
            "--heads",
            "2",
            "--dim",
            "16",
            "--warmup",
            "0",
            "--repeats",
            "1",
            "--jsonl",
            str(rows),
        ]
    )
    got = read_rows(rows)
    assert [(r["n"], r["form"], r["status"]) for r in got] == [
        (n, f, s) for n in (64, 128) for f, s in zip(forms, ("failed", "ok", "unavailable"))
    ]
    assert rc == 1
    assert all("forced failure" in r["note"] for r in got if r["status"] == "failed")
    assert all(r["fwd_bwd_ms"] > 0 and r["fwd_ms"] > 0 and r["first_s"] > 0 for r in got if r["status"] == "ok")
    printed = capsys.readouterr().out
    assert all(table_rows(printed, f"1 | {n} | {gpu_check.LINROPE_CHUNK}")[0][-1] == "ok" for n in (64, 128))
    assert printed.count("| failed: RuntimeError") == 2


def test_kernel_table_says_when_its_budget_is_spent(tmp_path):
    rows = tmp_path / "rows.jsonl"
    assert (
        kernel_time.main(
            [
                "--device",
                "cpu",
                "--dtype",
                "bf16",
                "--lengths",
                "64",
                "--forms",
                gpu_check.LINROPE_CHUNK,
                "--budget-s",
                "0",
                "--jsonl",
                str(rows),
            ]
        )
        == 0
    )
    (row,) = read_rows(rows)
    assert row["status"] == "skipped" and "budget" in row["note"] and "fwd_bwd_ms" not in row


def test_training_throughput_keeps_the_other_models_when_one_fails(tmp_path, monkeypatch):
    monkeypatch.setenv("LINROPE_BENCH_FAIL", "softmax_rope")
    rows = tmp_path / "rows.jsonl"
    rc = train_throughput.main(
        [
            "--context",
            "32",
            "--override",
            "size=tiny",
            "--warmup",
            "0",
            "--steps",
            "1",
            "--models",
            "linear_rope:model.attention.chunk_size=16",
            "softmax_rope",
            "--jsonl",
            str(rows),
        ]
    )
    lin, soft = read_rows(rows)
    assert rc == 1
    assert (lin["model"], lin["status"], soft["model"], soft["status"]) == (
        "linear_rope:model.attention.chunk_size=16",
        "ok",
        "softmax_rope",
        "failed",
    )
    assert lin["tokens_per_s"] > 0 and lin["peak_mib"] is None  # peak memory: CUDA only
    assert "forced failure" in soft["note"]


def test_training_throughput_holds_batch_times_context_with_tokens(tmp_path, capsys):
    rows = tmp_path / "rows.jsonl"
    sizes = ["--d-model", "32", "--layers", "1", "--heads", "2", "--d-ff", "64", "--warmup", "0", "--steps", "1"]
    args = ["--context", "32", "64", "--tokens", "128", "--models", "linear_rope", "--jsonl", str(rows), *sizes]
    assert train_throughput.main(args) == 0
    got = read_rows(rows)
    assert [(r["context"], r["batch"]) for r in got] == [(32, 4), (64, 2)]
    assert all(r["tokens_per_s"] == pytest.approx(128 / (r["ms_per_step"] / 1e3)) for r in got)
    text = capsys.readouterr().out
    assert table_rows(text, "32 | 4") and table_rows(text, "64 | 2")  # the summary's context and batch
    with pytest.raises(SystemExit):
        train_throughput.main(["--context", "48", "--tokens", "128"])
    assert "--tokens 128: not a multiple of --context 48" in capsys.readouterr().err


def test_training_throughput_refuses_a_model_spec_that_is_not_key_value(capsys):
    with pytest.raises(SystemExit):
        train_throughput.main(["--models", "linear_rope:model.attention.impl"])
    assert "is not KEY=VALUE" in capsys.readouterr().err


@pytest.mark.parametrize("fla_ms,met", [(13.0, "yes"), (13.5, "no")])
def test_device_check_goals_read_the_measured_rows(tmp_path, fla_ms, met):
    ctx = gpu_check.Context(argparse.Namespace(cpu=False, out=tmp_path, parts=list(gpu_check.PARTS), total_s=None))
    for process, form, ms in (  # each form against the sdpa flash of its own process
        (1, gpu_check.SDPA, 80.0),
        (1, gpu_check.LINROPE_CHUNK, 20.0),
        (2, gpu_check.SDPA, 90.0),
        (2, gpu_check.FLA_KERNEL, 10.0),
        (2, gpu_check.LINROPE_FLA, fla_ms),
    ):
        ctx.add_row(
            {
                "part": "kernels",
                "process": process,
                "n": 16384,
                "form": form,
                "status": "ok",
                "fwd_bwd_ms": ms,
                "fwd_ms": 1.0,
            }
        )
    for process, model, tps in (  # each linear form beside its own process's softmax baseline, at 4096
        (1, gpu_check.LINEAR_CHUNK, 750.0),
        (1, gpu_check.SOFTMAX, 1000.0),
        (2, gpu_check.LINEAR_FLA, 1100.0),
        (2, gpu_check.SOFTMAX, 500.0),
    ):
        ctx.add_row(
            {"part": "train", "process": process, "model": model, "context": 4096, "status": "ok", "tokens_per_s": tps}
        )
    rows = gpu_check.goals(ctx)
    assert len(rows) == 8 + 2 * 4  # the kernels' goals, then three contexts and the memory for chunk, then fla
    within, fla_sdpa, chunk_sdpa, train_chunk, train_fla = (rows[i] for i in (0, 6, 7, 8, 12))
    assert all(r[2] == "not measured" for r in rows[1:6])  # issue 50's kernel goals, measured with --triton
    assert all(r[2] == "not measured" for r in rows[9:12] + rows[13:])  # 8k, 16k and the memory: no rows
    assert within[1].endswith(f"= {fla_ms / 10:.2f}×") and within[2] == met
    assert fla_sdpa[1].endswith(f"= {90 / fla_ms:.2f}×") and fla_sdpa[2] == "yes"
    assert chunk_sdpa[1].endswith("= 4.00×") and chunk_sdpa[2] == "no"
    assert "context 4096" in train_chunk[0] and "≥ 0.8× softmax_rope's" in train_chunk[0]
    assert (train_fla[2], train_chunk[2]) == ("yes", "no") and train_fla[1].endswith("= 2.20×")
    assert train_chunk[1].endswith("= 0.75×")
    md = gpu_check.report(ctx)
    assert f"| 2 | 1 | 16384 | {gpu_check.LINROPE_FLA} | {fla_ms:.2f} | 1.00 | {fla_ms - 1:.2f} | – | – | " in md
    assert f"| {fla_ms / 10:.2f}× | {90 / fla_ms:.2f}× | ok |" in md


def test_device_check_triton_goals_read_their_process(tmp_path):
    """``--triton``: one kernel process (sdpa flash, fla chunk_simple_gla, linrope triton) and one training process;
    issue 50's goals read the ratios within it."""
    args = argparse.Namespace(cpu=False, out=tmp_path, parts=list(gpu_check.PARTS), total_s=None, triton=True)
    ctx = gpu_check.Context(args)
    assert ctx.kernel_processes == gpu_check.TRITON_KERNEL_PROCESSES and "--triton" in ctx.command
    goal, other = ctx.kernel_processes  # the other design and layout apart: a fault there leaves the goal's rows
    assert goal == ("sdpa-flash", "fla-triton", "triton") and other[0] == "sdpa-flash" and "triton" not in other
    for n, sdpa, fla, ours in ((4096, 5.0, 1.0, 1.1), (16384, 40.0, 2.0, 2.5), (65536, 300.0, 5.0, 14.0)):
        for form, ms in ((gpu_check.SDPA, sdpa), (gpu_check.FLA_KERNEL, fla), (gpu_check.LINROPE_TRITON, ours)):
            ctx.add_row({"part": "kernels", "process": 1, "n": n, "form": form, "status": "ok", "fwd_bwd_ms": ms})
    for model, context, tps, peak in (  # 0.85×, 0.95× and 1.4× softmax_rope's tokens/s; less memory at 16k
        (gpu_check.LINEAR_TRITON, 4096, 850.0, 900.0),
        (gpu_check.SOFTMAX, 4096, 1000.0, 800.0),
        (gpu_check.LINEAR_TRITON, 8192, 950.0, 900.0),
        (gpu_check.SOFTMAX, 8192, 1000.0, 1000.0),
        (gpu_check.LINEAR_TRITON, 16384, 1400.0, 900.0),
        (gpu_check.SOFTMAX, 16384, 1000.0, 1200.0),
    ):
        row = dict(part="train", process=1, model=model, context=context, status="ok", tokens_per_s=tps, peak_mib=peak)
        ctx.add_row(row)
    rows = gpu_check.goals(ctx)
    assert len(rows) == 8 + 4  # the kernels' goals, then impl=triton's alone (this run's only linear form)
    assert [r[2] for r in rows[1:6]] == ["yes", "no", "no", "yes", "yes"]  # ÷ fla 1.10, 1.25, 2.80; sdpa ÷ 16, 21.4
    assert rows[5][1].endswith(f"= {300 / 14:.2f}×")
    assert [r[2] for r in rows[8:]] == ["yes", "no", "no", "yes"]  # ≥ 0.8×, 1×, 1.5×; memory 900 ≤ 1200 MiB
    assert rows[11][1] == "900 vs 1 200 MiB = 0.75×" and gpu_check.LINEAR_TRITON in rows[11][0]
    assert rows[0][2] == rows[6][2] == "not measured"  # linrope on fla: not in this run


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_device_check_trains_at_every_goal_context_and_its_shares_fit_the_total(device):
    """The training sweep covers the contexts its goals name at one batch × context (a whole batch at each), the
    kernel table's extra shape is a training step's attention call, and the parts' shares fit the total."""
    shares, sizes = gpu_check.SHARES[device], gpu_check.SIZES[device]
    assert set(sizes["train_goals"]) <= set(sizes["contexts"])
    assert all(sizes["tokens"] % c == 0 for c in sizes["contexts"])
    for b, n in sizes["shapes"]:
        assert n in sizes["contexts"] and b * n == sizes["tokens"]
    assert sum(shares.values()) <= gpu_check.TOTAL_S[device]
    assert gpu_check.TOTAL_S["cuda"] + 60 <= 600  # with the device machine's start, within one 10-minute command
    triton = dict(shares, **gpu_check.TRITON_SHARES[device])  # --triton: its own shares, FSDP left out
    assert sum(v for p, v in triton.items() if p != "fsdp") <= gpu_check.TOTAL_S[device]


def test_device_check_gives_each_part_its_own_share_when_the_total_is_short(tmp_path):
    """--total-s below the shares' sum: the first part still gets its share (the env part once got 5 s of 400 and
    printed nothing), the later ones what is left less the shares after them."""
    ctx = gpu_check.Context(
        argparse.Namespace(cpu=False, out=tmp_path, parts=["env", "kernels", "tests", "train"], total_s=400.0)
    )
    shares = gpu_check.SHARES["cuda"]
    assert shares["kernels"] + shares["tests"] + shares["train"] > 400 - shares["env"]  # the case itself
    assert ctx.budget("env") == pytest.approx(shares["env"], abs=1)
    assert ctx.budget("train") == pytest.approx(400, abs=1)  # the last part: everything left


def test_device_check_tests_part_runs_the_quick_gpu_tests_with_blocking_launches(tmp_path, monkeypatch):
    """The tests part: the gpu tests that are not slow (fla's full matrix compiles for minutes), each CUDA launch
    blocking so a fault names its kernel."""
    seen = {}

    def fake_run_part(cmd, budget_s, log, env=None):
        seen.update(cmd=cmd, env=env)
        return {"rc": 0, "timed_out": False, "wall_s": 1.0, "lines": ["3 passed in 1.0s"]}

    monkeypatch.setattr(gpu_check, "run_part", fake_run_part)
    ctx = gpu_check.Context(argparse.Namespace(cpu=False, out=tmp_path, parts=list(gpu_check.PARTS), total_s=None))
    assert gpu_check.part_tests(ctx)["status"] == "ok"
    assert seen["cmd"][seen["cmd"].index("-m", 3) + 1] == "gpu and not slow"
    assert seen["env"] == {"CUDA_LAUNCH_BLOCKING": "1"}
    assert "tests/ops/test_fla.py" in seen["cmd"]
    # --triton: every case of linrope's Triton kernels (the slow ones too), and no FSDP part unless named
    args = argparse.Namespace(cpu=False, out=tmp_path / "t", parts=None, total_s=None, triton=True)
    ctx = gpu_check.Context(args)
    assert ctx.parts == ["env", "kernels", "tests", "train"] and ctx.command.endswith("gpu_check.sh --triton")
    assert gpu_check.part_tests(ctx)["status"] == "ok"
    assert (
        seen["cmd"][seen["cmd"].index("-m", 3) + 1] == "gpu" and seen["cmd"][-1] == "tests/ops/test_triton_kernels.py"
    )
    assert '## CUDA tests (`pytest -m "gpu"`)' in gpu_check.report(ctx)
    assert ctx.budget("tests") >= gpu_check.TRITON_SHARES["cuda"]["tests"]


@pytest.mark.slow
def test_device_check_stand_in_runs_end_to_end(tmp_path):
    """bash benchmarks/gpu_check.sh --cpu: every part, every table and row label in gpu_check.md; a form and a
    model made to fail leave every other row measured, and the exit status says a part failed."""
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "OUT", "GPU_CHECK_CPU")}
    env.update(PYTHON=sys.executable, OUT=str(out), LINROPE_BENCH_FAIL=f"{gpu_check.LINROPE_CHUNK},softmax_rope")
    res = subprocess.run(
        ["bash", "benchmarks/gpu_check.sh", "--cpu"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900
    )
    assert res.returncode == 1, res.stdout[-3000:] + res.stderr[-3000:]
    md = (out / "gpu_check.md").read_text()
    for heading in (
        "## Environment",
        "## Parts",
        '## CUDA tests (`pytest -m "gpu and not slow"`)',
        "## Kernel table",
        "## Training throughput",
        "## FSDP",
        "## GPU goals",
    ):
        assert heading in md, heading

    def rows(*first):
        found = re.findall(r"^\| " + re.escape(" | ".join(map(str, first))) + r" \| (.*) \|$", md, re.M)
        return [[c.strip() for c in one.split("|")] for one in found]

    def row(*first):
        (found,) = rows(*first)
        return found

    for part in gpu_check.PARTS:
        row(part)
    assert row("tests")[0] == "ok" and "skipped" in row("tests")[-1]  # no CUDA: the gpu tests skip
    assert row("kernels")[0] == row("train")[0] == "failed"
    sizes = gpu_check.SIZES["cpu"]
    shapes = [(1, n) for n in sizes["lengths"]] + sizes["shapes"]
    for b, n in shapes:
        for process in (1, 2):  # the baseline in each process
            sdpa = row(process, b, n, gpu_check.SDPA)
            assert float(sdpa[0]) > 0 and float(sdpa[2]) > 0 and sdpa[-1] == "ok"  # fwd+bwd, bwd ms
        assert row(1, b, n, gpu_check.LINROPE_CHUNK)[-1].startswith("failed: RuntimeError: forced failure")
        for form in (gpu_check.FLA_KERNEL, gpu_check.LINROPE_FLA):
            assert row(2, b, n, form)[-1].startswith("unavailable: fla's Triton kernels need a CUDA device")
    chunk = rows(1, gpu_check.LINEAR_CHUNK)
    assert [(int(r[1]), int(r[2])) for r in chunk] == [(c, sizes["tokens"] // c) for c in sizes["contexts"]]
    assert all(float(r[4].replace(" ", "")) > 0 and r[-1] == "ok" for r in chunk)  # tokens/s
    for process in (1, 2):  # the baseline beside each linear form, in its own process, at every context
        assert [r[-1][:36] for r in rows(process, gpu_check.SOFTMAX)] == ["failed: RuntimeError: forced failure"] * 3
    (fla,) = {r[-1] for r in rows(2, gpu_check.LINEAR_FLA)}
    assert fla.startswith("unavailable: impl=fla: fla's Triton kernels need a CUDA device")
    assert re.search(
        r"^\| `python train.py model=linear_rope size=tiny trainer=fsdp .*\| (missing|unavailable) \|", md, re.M
    )
    goals = md.split("## GPU goals")[1]
    assert goals.count("\n| ") == 1 + 8 + 2 * 4  # the header, the kernels' 8 goals, 4 for each linear form trained
    assert "## summary" in (out / "gpu_check.log").read_text()

    # nothing forced to fail: the kernel part alone passes, exit status 0
    del env["LINROPE_BENCH_FAIL"]
    res = subprocess.run(
        ["bash", "benchmarks/gpu_check.sh", "--cpu", "--parts", "kernels"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stdout[-3000:]
    assert row("kernels") and "| kernels | ok |" in (out / "gpu_check.md").read_text()


def test_grid_times_this_checkout_against_another_commit_in_alternating_processes(tmp_path, capsys):
    """benchmarks/grid.py: a worker per source and round (this checkout, then HEAD's linrope/ from git archive), each
    importing its own tree; the table gives the chunk time, this ÷ HEAD and SDPA ÷ chunk, and --out keeps it."""
    out = tmp_path / "grid.md"
    args = ["--rows", "tiny", "--rounds", "1", "--repeats", "1", "--no-loaded", "--no-fla", "--compare", "HEAD"]
    assert grid.main(args + ["--out", str(out)]) == 0
    text = capsys.readouterr().out
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert "round 1/1 quiet new done" in text and f"round 1/1 quiet {head} done" in text
    rows = [line for line in out.read_text().splitlines() if line.startswith("| tiny |")]
    assert len(rows) == 2 and rows[0].startswith("| tiny | 16 4 16 64 | fp32 |"), rows
    cells = [c.strip() for c in rows[0].split("|")[1:-1]]
    assert float(cells[3]) > 0 and cells[4].endswith("×") and cells[5] == "–" and cells[6].endswith("×"), cells
    with pytest.raises(SystemExit, match="not a commit"):
        grid.main(["--rows", "tiny", "--compare", "no-such-rev"])


def test_loaded_benchmark_reports_both_states_and_restores_the_plan(capsys):
    from linrope.ops.linear_attn import heads, scans, tables

    plan = scans.SEQUENTIAL, dict(tables.BLOCK_ELEMENTS), heads.ENABLED
    adv = loaded.main(["--length", "256", "--rounds", "1", "--warmup", "0"])
    text = capsys.readouterr().out
    assert set(adv) == {(f, s) for f in ("chunk", "chunk-whole", "chunk-old") for s in ("quiet", "loaded")}
    assert all(a > 0 for a in adv.values()), adv
    assert "linrope chunk, old plan: loaded / quiet advantage" in text and "new / old plan" in text
    assert "linrope chunk, heads whole: loaded / quiet advantage" in text
    assert (scans.SEQUENTIAL, tables.BLOCK_ELEMENTS, heads.ENABLED) == plan  # the old plan was only borrowed


# ---- benchmarks/fla_probe.py: the variants of fla's training-shape call (docs/benchmarks.md, "Device check") ----
def test_the_fla_probe_runs_the_guard_off_and_on_and_says_it_needs_a_gpu(capsys):
    from benchmarks import fla_probe

    assert fla_probe.VARIANTS == {"as-is": False, "guarded": True}  # fla_backend.HOPPER_GUARD per variant
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the probe would run")
    assert fla_probe.main([]) == 0 and capsys.readouterr().out.strip() == fla_probe.NEEDS_GPU


def test_kernel_time_says_which_num_warps_the_autotuner_chose(monkeypatch):
    """On a GPU the Triton kernels' autotuner picks num_warps per key; the table's log says which (none: not run)."""
    import types

    monkeypatch.delitem(sys.modules, "linrope.ops.linear_attn.triton_kernels", raising=False)
    assert kernel_time.autotuned() == []
    config = types.SimpleNamespace(num_warps=8)
    tuned = types.SimpleNamespace(keys=["D", "COS"], configs=[config], cache={(64, False, "torch.bfloat16"): config})
    untuned = types.SimpleNamespace(keys=["D"], configs=[config], cache={})
    plain = types.SimpleNamespace(cache={0: {"key": "a compiled kernel"}})  # a kernel without autotuning: not read
    fake = types.SimpleNamespace(_state_fwd=tuned, _grad=untuned, _dden=plain, BT=64)
    monkeypatch.setitem(sys.modules, "linrope.ops.linear_attn.triton_kernels", fake)
    assert kernel_time.autotuned()[1:] == [
        "Autotuned (linrope triton):",
        "_state_fwd (D 64, COS False; torch.bfloat16): num_warps 8",
    ]


def test_a_forms_plan_holds_through_its_backward(monkeypatch):
    """A form run under patched settings (chunk-old: scans.SEQUENTIAL) has them
    in its backward too, which reads them as well: kernel_time's rows time forward and backward under the plan."""
    import dataclasses
    import types

    flags, seen = types.SimpleNamespace(on=False), []

    class Spy(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            seen.append(("fwd", flags.on))
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            seen.append(("bwd", flags.on))
            return g

    monkeypatch.setattr(forms, "linear_attention", lambda q, k, v, **kw: Spy.apply(q) * k + v)
    build = forms._linrope("chunk", (flags, "on", True))
    old = kernel_time.REGISTRY["chunk-old"]
    monkeypatch.setitem(kernel_time.REGISTRY, "chunk-old", dataclasses.replace(old, build=build))
    args = argparse.Namespace(chunk_size=64, heads=1, dim=2, dtype="fp32", warmup=0, repeats=1)
    kernel_time.measure("chunk-old", 1, 8, args, torch.device("cpu"))
    assert {s for s in seen} == {("fwd", True), ("bwd", True)} and flags.on is False


def test_kernel_time_profiles_where_a_pass_spends_its_time(tmp_path, monkeypatch, capsys):
    """``--profile N``: after the table, one fwd+bwd of each form measured at N under torch.profiler, time by
    kernel (on a CPU by operator): the largest first, the rest in one line, shares of the pass adding up to one.  A
    profile that fails is its row, and the exit status stays that of the table."""
    out = tmp_path / "rows.jsonl"
    argv = ["--lengths", "256", "--forms", "chunk", "sdpa", "--profile", "256", "--jsonl", str(out)]
    assert kernel_time.main([*TINY, *argv]) == 0
    rows = [json.loads(ln) for ln in out.read_text().splitlines()]
    prof = [r for r in rows if r["part"] == "kernels:profile"]
    assert {r["key"] for r in prof} == {"chunk", "sdpa"} and all(r["n"] == 256 for r in prof)
    for key in ("chunk", "sdpa"):
        mine = [r for r in prof if r["key"] == key]
        assert len(mine) <= kernel_time.PROFILE_TOP + 1 and abs(sum(r["share"] for r in mine) - 1) < 1e-6
        listed = [r["ms"] for r in mine if not r["kernel"].endswith("others)")]
        assert listed == sorted(listed, reverse=True) and all(r["calls"] > 0 for r in mine)
    assert "Where one fwd+bwd's time goes" in capsys.readouterr().out

    def broken(*a, **kw):
        raise RuntimeError("CUPTI_ERROR_NOT_INITIALIZED")

    monkeypatch.setattr(kernel_time, "_profiled", broken)
    out.unlink()
    assert kernel_time.main([*TINY, *argv]) == 0
    prof = [r for r in map(json.loads, out.read_text().splitlines()) if r["part"] == "kernels:profile"]
    assert [(r["kernel"], r["status"]) for r in prof] == [("(profile failed)", "failed")] * 2
    assert "CUPTI_ERROR_NOT_INITIALIZED" in prof[0]["note"]


def test_device_check_triton_profiles_and_reports_where_the_time_goes(tmp_path, monkeypatch):
    """``--triton`` asks the kernel table for its profile; the report lists the profile rows its processes wrote."""
    args = argparse.Namespace(cpu=False, out=tmp_path, parts=["kernels"], total_s=None, triton=True)
    ctx = gpu_check.Context(args)
    commands = []

    def fake_run(cmd, share, log):
        commands.append(cmd)
        path = Path(cmd[cmd.index("--jsonl") + 1])
        rows = [dict(part="kernels", batch=1, n=16384, form=gpu_check.LINROPE_TRITON, status="ok", fwd_bwd_ms=2.0)]
        if "--profile" in cmd:
            rows.append(dict(part="kernels:profile", batch=1, n=16384, form=gpu_check.LINROPE_TRITON, kernel="_grad",
                             calls=3, ms=0.9, share=0.45, status="ok"))  # fmt: skip
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        return {"rc": 0, "timed_out": False, "lines": []}

    monkeypatch.setattr(gpu_check, "run_part", fake_run)
    gpu_check.part_kernels(ctx)
    assert commands[0][commands[0].index("--profile") + 1 :][:2] == ["16384", "65536"]
    assert len(commands) == 2 and "--profile" not in commands[1]  # the goal's process only
    assert [r["kernel"] for r in ctx.rows("kernels:profile")] == ["_grad"]
    assert len(ctx.rows("kernels")) >= 1 and all(r["part"] == "kernels" for r in ctx.rows("kernels"))
    report = gpu_check.report(ctx)
    assert "### Where the time goes" in report and "| 1 | 16384 | linrope triton | _grad | 3 | 0.900 | 45% |" in report


def test_kernel_time_skips_a_profile_past_its_time(tmp_path, monkeypatch):
    """The profile gets PROFILE_S after the table's budget (the device check leaves it that much of the part's
    share): a form's profile not begun by then is skipped, saying so, so that the process ends within its share."""
    monkeypatch.setattr(kernel_time, "PROFILE_S", 0.0)
    out = tmp_path / "rows.jsonl"
    argv = ["--lengths", "256", "--forms", "chunk", "--profile", "256", "--jsonl", str(out), "--budget-s", "0.001"]
    assert kernel_time.main([*TINY, *argv]) == 0
    prof = [r for r in map(json.loads, out.read_text().splitlines()) if r["part"] == "kernels:profile"]
    assert [(r["kernel"], r["status"]) for r in prof] == [("(not profiled)", "skipped")]


def test_training_throughput_sets_each_linear_model_against_softmax_rope():
    """The tokens/s ratio of every linear model (a preset with overrides, as the device check names them; in each
    precision) to softmax_rope's: the column was dropped unless a model was named exactly linear_rope."""
    args = argparse.Namespace(
        precision=["32-true", "bf16-mixed"], compile=False, tokens=None, batch=2,
        models=["linear_rope:model.attention.impl=chunk", "softmax_rope"],
    )  # fmt: skip
    lin, soft = args.models
    row = {"context": 64}
    row.update({f"{lin} 32-true": 0.02, f"{soft} 32-true": 0.01, f"{lin} bf16-mixed": 0.01, f"{soft} bf16-mixed": 0.03})
    head, _, cells = (ln.strip("|").split("|") for ln in train_throughput.summary([row], args)[-3:])
    got = {h.strip(): c.strip() for h, c in zip(head, cells)}
    assert got[f"{lin} 32-true / {soft} 32-true tokens/s"] == "0.50×"
    assert got[f"{lin} bf16-mixed / {soft} bf16-mixed tokens/s"] == "3.00×"


def test_device_check_a_process_killed_by_a_signal_fails_its_part(tmp_path):
    """A benchmark process killed by a signal (a negative status) beside one that exits 0: the part's status is the
    killed one's (max() over the statuses reported 0, "ok")."""
    args = argparse.Namespace(cpu=True, out=tmp_path, parts=["kernels"], total_s=None, triton=False)
    ctx = gpu_check.Context(args)
    code = {"killed": "import os, signal; os.kill(os.getpid(), signal.SIGKILL)", "exits": "pass"}
    res, rows, each = gpu_check.processes(
        ctx, "kernels", ("killed", "exits"), (1, 1), lambda entry, share: [sys.executable, "-c", code[entry]],
        lambda entry, rows, res: [],
    )  # fmt: skip
    assert [r["rc"] for r in each] == [-9, 0] and res["rc"] == -9 and not rows


def test_device_check_on_the_gpu_stops_at_once_without_its_wheels(tmp_path):
    """On the GPU (no --cpu) with no wheels to install, the check stops before any part (exit 2, one line saying
    what to run): the device lacks hydra-core, omegaconf and fla, and the run would spend its minutes failing."""
    env = dict(os.environ, OUT=str(tmp_path / "out"), GPU_CHECK_WHEEL_DIR=str(tmp_path / "none"))
    res = subprocess.run(
        ["bash", "benchmarks/gpu_check.sh", "--triton"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert res.returncode == 2
    assert "the device lacks hydra-core, omegaconf and fla: run bash tools/device_wheels.sh" in res.stderr
    assert "no CUDA GPU" not in res.stdout + res.stderr  # stopped before gpu_check.py ran
