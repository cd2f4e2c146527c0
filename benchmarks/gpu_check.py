"""The device check: one command that says what linrope does on a GPU, in one markdown file (issue 31).

Run it through ``bash benchmarks/gpu_check.sh`` (which installs the wheels of ``.whl/`` and puts the repo on
PYTHONPATH first); ``--cpu`` is the stand-in that runs the same parts on the CPU at tiny sizes.  The parts, in
order, each a subprocess with its own time budget, each failing without stopping the others:

  env      the Python, torch, CUDA device, triton, fla (imported, not merely found), lightning, hydra versions
  kernels  benchmarks/gpu_table.py: fwd+bwd of sdpa flash and linrope chunk, then in a second process of sdpa
           flash, fla chunk_simple_gla and linrope on fla; bf16, causal, B 1, H 8, d 64, N = 1k, 4k, 16k, 64k
           (cpu: 256, 512)
  tests    ``pytest -m "gpu and not slow"`` on the test files that carry the marker (the CUDA tests that reuse the
           kernels' compiled fla kernels; ``pytest -m gpu`` runs all, fla's full matrix compiling for minutes),
           with CUDA_LAUNCH_BLOCKING=1 so that a fault names its kernel
  train    benchmarks/train_throughput.py: training tokens/s and peak memory, bf16-mixed, size=base, batch 4,
           context 4096 when the part has the time for it, else 2048 (the table says which); linear_rope with
           impl=chunk beside softmax_rope, then in a second process impl=fla beside softmax_rope (cpu: size=tiny,
           context 128)
  fsdp     ``python train.py model=linear_rope size=tiny trainer=fsdp trainer.devices=1 trainer.max_steps=3
           trainer.val_check_interval=3``: fit, a best checkpoint, and the test step loading it under FSDP

A part's budget is what is left of ``--total-s`` less the shares of the parts after it, so time one part does not
use goes to the next.  Rows are written as they are measured (``gpu_check.jsonl``), every output line goes to
``gpu_check.log`` too, and ``gpu_check.md`` (environment, parts, tests, kernel table, training, FSDP, the GPU
goals against the measured rows) is rewritten after every part, so a run killed from outside keeps what it
finished.  Exit status: 0 if every part passed, 1 if any failed, timed out or could not run, 2 if there is no
CUDA GPU and ``--cpu`` was not given.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.forms import REGISTRY  # noqa: E402
from benchmarks.gpu_table import FLA_KERNEL, LINROPE_CHUNK, LINROPE_FLA, SDPA  # noqa: E402
from benchmarks.timing import fmt as _f  # noqa: E402
from benchmarks.timing import table  # noqa: E402

PARTS = ("env", "kernels", "tests", "train", "fsdp")  # kernels first: fla's compiled kernels serve the tests
SHARES = {  # seconds each part may use at least (its timeout when the parts before it used all of theirs)
    # fla compiles and autotunes each kernel set on its first call: 75-85 s on an H200 (2026-11-27)
    "cuda": {"env": 30, "kernels": 200, "tests": 60, "train": 180, "fsdp": 50},
    "cpu": {"env": 30, "kernels": 60, "tests": 60, "train": 60, "fsdp": 60},
}
TOTAL_S = {"cuda": 520, "cpu": 290}
TRAIN_MODELS = ("linear_rope:model.attention.impl=chunk", "linear_rope:model.attention.impl=fla", "softmax_rope")
LINEAR_CHUNK, LINEAR_FLA, SOFTMAX = TRAIN_MODELS
# one process per linear form, each beside the softmax baseline: a CUDA fault in one form's kernels ends its
# process's CUDA context (2026-11-27: fla's, on an H200), and would otherwise take the other form's rows with it
TRAIN_PROCESSES = ((LINEAR_CHUNK, SOFTMAX), (LINEAR_FLA, SOFTMAX))
# the kernel table likewise (registry keys): sdpa flash, the baseline of every ratio, in each process
KERNEL_PROCESSES = (("sdpa-flash", "chunk"), ("sdpa-flash", "fla-triton", "fla"))
KERNEL_LABELS = tuple(tuple(REGISTRY[k].label for k in keys) for keys in KERNEL_PROCESSES)  # the rows' forms
KERNEL_SHARES = (1, 3)  # how the part's budget divides between them: fla compiles for 75-85 s per kernel set
SIZES = {  # what each mode measures
    "cuda": {
        "lengths": [1024, 4096, 16384, 65536],
        "warmup": 3,
        "repeats": 10,
        "size": "base",
        "batch": 4,
        "context": 4096,
        "short_context": 2048,
        "long_context_s": 80,  # per training process (the part runs two)
        "train_warmup": 2,
        "train_steps": 5,
    },
    "cpu": {
        "lengths": [256, 512],
        "warmup": 1,
        "repeats": 2,
        "size": "tiny",
        "batch": 1,
        "context": 128,
        "short_context": 64,
        "long_context_s": 20,  # per training process
        "train_warmup": 1,
        "train_steps": 2,
    },
}
GOAL_N = 16384


# ------------------------------------------------------------------------------------------------------------
# running a part: a subprocess group, its output teed to the console and the log, killed at its budget
# ------------------------------------------------------------------------------------------------------------
class Log:
    def __init__(self, path: Path):
        self.f = open(path, "a", buffering=1)

    def line(self, text: str) -> None:
        print(text, flush=True)
        self.f.write(text + "\n")


def run_part(cmd: list[str], budget_s: float, log: Log, env: Optional[dict] = None) -> dict:
    """Run ``cmd`` (its own process group) for at most ``budget_s``: {rc, timed_out, wall_s, lines}."""
    log.line(f"$ {shlex.join(cmd)}    # budget {budget_s:.0f} s")
    t0 = time.perf_counter()
    lines: list[str] = []
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        start_new_session=True,
        env={**os.environ, **(env or {})},
    )

    def pump():
        for raw in proc.stdout:
            text = raw.rstrip("\n")
            lines.append(text)
            log.line(text)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    timed_out = False
    try:
        proc.wait(timeout=max(budget_s, 1))
    except subprocess.TimeoutExpired:
        timed_out = True
        for sig, grace in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(timeout=grace)
                break
            except subprocess.TimeoutExpired:
                continue
    reader.join(timeout=10)
    wall = time.perf_counter() - t0
    if timed_out:
        log.line(f"# timed out after {wall:.0f} s (budget {budget_s:.0f} s): killed")
    return {"rc": proc.returncode, "timed_out": timed_out, "wall_s": wall, "lines": lines}


# ------------------------------------------------------------------------------------------------------------
# the parts
# ------------------------------------------------------------------------------------------------------------
# the installed distributions the environment part records (and its table lists, in this order)
DISTRIBUTIONS = (
    "torch",
    "triton",
    "fla-core",
    "lightning",
    "hydra-core",
    "omegaconf",
    "antlr4-python3-runtime",
    "einops",
    "numpy",
    "PyYAML",
    "pytest",
    "packaging",
)


def probe_env(device: str) -> dict:
    """What the device has: versions (from the installed metadata) and what does not import."""
    import importlib
    import importlib.metadata as md
    import platform

    env: dict = {"python": platform.python_version()}
    for dist in DISTRIBUTIONS:
        try:
            env[dist] = md.version(dist)
        except md.PackageNotFoundError:
            env[dist] = "not installed"
    missing = []
    mods = ["torch", "hydra", "omegaconf", "einops", "numpy", "yaml", "pytest", "linrope.ops"]
    mods += ["triton", "fla.ops.simple_gla"] if device == "cuda" else []  # imported, not merely found
    for mod in mods:
        try:
            importlib.import_module(mod)
        except Exception as e:  # noqa: BLE001 - any import failure is reported
            first = (str(e).splitlines() or [""])[0][:120]
            missing.append(f"{mod} ({type(e).__name__}: {first})")
    env["not importable"] = missing or ["none"]
    import torch

    env["cuda"] = torch.cuda.is_available()
    env["torch cuda"] = torch.version.cuda
    if env["cuda"]:
        p = torch.cuda.get_device_properties(0)
        env["gpu"] = (
            f"{p.name}, {p.total_memory / 2**30:.0f} GiB, sm_{p.major}{p.minor}, {torch.cuda.device_count()} device(s)"
        )
        env["bf16"] = torch.cuda.is_bf16_supported()
    from linrope.run.provenance import machine_line

    env["machine"] = machine_line()
    return env


def part_env(ctx) -> dict:
    res = run_part([sys.executable, "benchmarks/gpu_check.py", "--probe-env", ctx.device], ctx.budget("env"), ctx.log)
    found = [ln for ln in res["lines"] if ln.startswith("ENV ")]
    if found:
        ctx.env.update(json.loads(found[-1][4:]))
    wheels = os.environ.get("GPU_CHECK_WHEELS")
    if wheels:
        ctx.env["wheels"] = wheels
    ctx.env["PYTHONPATH"] = os.environ.get("PYTHONPATH", "")
    if not found:
        return dict(res, status="failed", note=_last(res, "no environment printed"))
    if ctx.device == "cuda" and not ctx.env.get("cuda"):
        return dict(res, status="failed", note="torch.cuda.is_available() is False")
    missing = [m for m in ctx.env.get("not importable") or [] if m != "none"]
    fla_needed = ctx.device == "cuda"
    bad = [m for m in missing if fla_needed or not m.startswith(("fla", "triton"))]
    for name in ("torch", "lightning", "hydra-core", "omegaconf"):
        if ctx.env.get(name) == "not installed":
            bad.append(f"{name} not installed")
    if bad:
        return dict(res, status="failed", note="not importable: " + "; ".join(bad))
    return dict(res, status="ok", note="")


def gpu_test_files() -> list[str]:
    return sorted(
        str(p.relative_to(ROOT))
        for p in (ROOT / "tests").rglob("test_*.py")
        if "mark.gpu" in p.read_text(errors="replace")
    )


def part_tests(ctx) -> dict:
    files = gpu_test_files()
    if not files:
        return {"status": "failed", "note": "no test file carries the gpu marker", "wall_s": 0.0}
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu and not slow", "-q", "-rfEs", "-p", "no:cacheprovider", *files]
    # each launch waits for its kernel: a fault is raised at the kernel that made it (fla's training step faulted
    # on an H200, reported at later calls: docs/benchmarks.md), at no cost to what the tests check
    res = run_part(cmd, ctx.budget("tests"), ctx.log, env={"CUDA_LAUNCH_BLOCKING": "1"})
    summary = next(
        (
            ln.strip("= ")
            for ln in reversed(res["lines"])
            if re.search(r"\b(passed|failed|skipped|deselected|error|no tests ran)\b", ln)
        ),
        "",
    )
    ctx.tests = {
        "summary": summary,
        "files": files,
        "failures": [ln for ln in res["lines"] if ln.startswith(("FAILED", "ERROR"))][:20],
    }
    passed = int(m.group(1)) if (m := re.search(r"(\d+) passed", summary)) else 0
    if res["timed_out"]:
        return dict(res, status="timed out", note=summary)
    if res["rc"] == 5:
        return dict(res, status="failed", note="no test selected by -m gpu")
    if res["rc"] != 0:
        return dict(res, status="failed", note=summary or _last(res, "pytest failed"))
    if ctx.device == "cuda" and passed == 0:
        return dict(res, status="failed", note=f"on a GPU, no gpu test passed: {summary}")
    return dict(res, status="ok", note=summary)


def part_kernels(ctx) -> dict:
    """benchmarks/gpu_table.py once per entry of KERNEL_PROCESSES (sdpa flash and linrope chunk; then sdpa flash
    and the fla forms), each with its share of the budget; rows carry the process's number, and a ratio is read
    within one process."""
    s = SIZES[ctx.device]
    budget = ctx.budget("kernels")
    t0 = time.perf_counter()
    results, lost = [], 0
    for i, keys in enumerate(KERNEL_PROCESSES, 1):
        share = process_budget(budget, t0, KERNEL_SHARES, i)
        cmd = [
            sys.executable,
            "benchmarks/gpu_table.py",
            "--device",
            ctx.device,
            "--lengths",
            *map(str, s["lengths"]),
            "--forms",
            *keys,
            "--ratios",
            *[f"{keys[0]}/{k}" for k in keys[1:]],
            "--warmup",
            str(s["warmup"]),
            "--repeats",
            str(s["repeats"]),
            "--budget-s",
            f"{max(share - 15, 5):.0f}",
        ]
        res, rows = tagged_process(ctx, "kernels", i, cmd, share)
        results.append(res)
        done = {(r["n"], r["form"]) for r in rows}
        for n, f in [(n, f) for n in s["lengths"] for f in KERNEL_LABELS[i - 1] if (n, f) not in done]:
            lost += 1  # the process died or was killed before these rows: say so, in the rows
            ctx.add_row(
                {
                    "part": "kernels",
                    "process": i,
                    "n": n,
                    "form": f,
                    "device": ctx.device,
                    "status": "not run",
                    "note": "the table's process " + ("timed out" if res["timed_out"] else f"exited {res['rc']}"),
                }
            )
    res = merged(results, t0)
    rows = ctx.rows("kernels")
    failed = [r for r in rows if r["status"] == "failed" or (r["status"] == "unavailable" and ctx.device == "cuda")]
    if res["timed_out"]:
        return dict(res, status="timed out", note=f"{lost} rows not run")
    if failed or res["rc"] != 0:
        what = "; ".join(f"{r['form']} at {r['n']}: {r.get('note')}" for r in failed[:3])
        return dict(res, status="failed", note=what or _last(res, f"exit status {res['rc']}"))
    return dict(res, status="ok", note=f"{len(rows)} rows")


def tagged_process(ctx, part: str, process: int, cmd: list, budget: float):
    """Run one benchmark process (``cmd`` without its ``--jsonl``) for at most ``budget``; its rows, tagged with
    ``process``, go to the check's jsonl.  -> (run_part's result, the rows)."""
    rows_file = ctx.out / f"{part}_process{process}.jsonl.tmp"
    rows_file.unlink(missing_ok=True)
    res = run_part([*cmd, "--jsonl", str(rows_file)], budget, ctx.log)
    rows = [dict(r, process=process) for r in read_rows(rows_file, part)]
    rows_file.unlink(missing_ok=True)
    for r in rows:
        ctx.add_row(r)
    return res, rows


def read_rows(path: Path, part: str) -> list[dict]:
    """The rows of ``part`` in the jsonl file ``path`` (none if it is missing; a line cut off by a kill skipped)."""
    out = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            r = json.loads(line)
        except json.JSONDecodeError:
            continue
        if r.get("part") == part:
            out.append(r)
    return out


def process_budget(budget: float, t0: float, weights, i: int) -> float:
    """Process ``i``'s (1-based) share of what is left of a part's ``budget`` since ``t0``, by ``weights``."""
    left = budget - (time.perf_counter() - t0)
    return left * weights[i - 1] / sum(weights[i - 1 :])


def process_of(name: str, processes) -> int:
    """The process (1-based) that runs ``name``: a form or model of one process only, not a baseline."""
    return next(i for i, names in enumerate(processes, 1) if name in names)


def merged(results: list, t0: float) -> dict:
    """One part's result from its processes' results."""
    return {
        "rc": max(r["rc"] or 0 for r in results),
        "timed_out": any(r["timed_out"] for r in results),
        "wall_s": time.perf_counter() - t0,
        "lines": [ln for r in results for ln in r["lines"]],
    }


def part_train(ctx) -> dict:
    """benchmarks/train_throughput.py once per entry of TRAIN_PROCESSES, each with its share of the budget; its
    rows carry the process's number (1, 2), so a ratio is read within one process."""
    s = SIZES[ctx.device]
    budget = ctx.budget("train")
    t0 = time.perf_counter()
    context = s["context"] if budget / len(TRAIN_PROCESSES) >= s["long_context_s"] else s["short_context"]
    ctx.train_context = context
    results, notes = [], []
    for i, models in enumerate(TRAIN_PROCESSES, 1):
        share = process_budget(budget, t0, [1] * len(TRAIN_PROCESSES), i)
        res, failed = train_process(ctx, i, models, context, share)
        results.append(res)
        if res["timed_out"]:
            notes.append(f"process {i} timed out")
        notes += [f"{r['model']}: {r.get('note')}" for r in failed[:3]]
    res = merged(results, t0)
    if res["timed_out"]:
        return dict(res, status="timed out", note=f"context {context}; " + "; ".join(notes))
    if notes or res["rc"] != 0:
        return dict(res, status="failed", note="; ".join(notes) or _last(res, f"exit status {res['rc']}"))
    return dict(res, status="ok", note=f"context {context}")


def train_process(ctx, process: int, models, context: int, budget: float):
    """One train_throughput.py process; a model it did not reach gets a "not run" row.  -> (run_part's result,
    this process's failed rows)."""
    s = SIZES[ctx.device]
    cmd = [
        sys.executable,
        "benchmarks/train_throughput.py",
        "--device",
        ctx.device,
        "--precision",
        "bf16-mixed",
        "--context",
        str(context),
        "--batch",
        str(s["batch"]),
        "--warmup",
        str(s["train_warmup"]),
        "--steps",
        str(s["train_steps"]),
        "--models",
        *models,
        "--override",
        f"size={s['size']}",
    ]
    res, rows = tagged_process(ctx, "train", process, cmd, budget)
    done = {r["model"] for r in rows}
    for m in models:
        if m not in done:
            row = {
                "part": "train",
                "process": process,
                "model": m,
                "context": context,
                "batch": s["batch"],
                "device": ctx.device,
                "precision": "bf16-mixed",
                "status": "not run",
                "note": "timed out" if res["timed_out"] else _last(res, f"exit status {res['rc']}"),
            }
            rows.append(row)
            ctx.add_row(row)
    failed = [
        r
        for r in rows
        if r["status"] in ("failed", "not run") or (r["status"] == "unavailable" and ctx.device == "cuda")
    ]
    return res, failed


def part_fsdp(ctx) -> dict:
    preset = ROOT / "conf" / "trainer" / "fsdp.yaml"
    run_dir = Path(tempfile.mkdtemp(prefix="gpu_check_fsdp_"))  # not under $OUT: the run tool keeps 8 files
    cmd = [
        sys.executable,
        "train.py",
        "model=linear_rope",
        "size=tiny",
        "trainer=fsdp",
        "trainer.devices=1",
        "trainer.max_steps=3",
        "trainer.val_check_interval=3",
        "logger=none",
        "trainer.enable_progress_bar=false",
        f"hydra.run.dir={run_dir}",
    ]
    ctx.fsdp = {"command": shlex.join(["python", *cmd[1:-1]])}
    if not preset.exists():
        return {
            "status": "missing",
            "wall_s": 0.0,
            "note": "conf/trainer/fsdp.yaml is missing (the trainer=fsdp preset): not run",
        }
    if ctx.device == "cpu":  # Lightning refuses strategy=fsdp without a GPU: "requires a GPU accelerator"
        return {
            "status": "unavailable",
            "wall_s": 0.0,
            "note": "on cpu: Lightning's FSDP strategy needs a GPU; not run",
        }
    res = run_part(cmd, ctx.budget("fsdp"), ctx.log)
    reached = any("max_steps=3` reached" in ln for ln in res["lines"])
    if res["timed_out"]:
        return dict(res, status="timed out", note="")
    if res["rc"] != 0 or not reached:
        return dict(res, status="failed", note=_last(res, f"exit status {res['rc']}"))
    return dict(res, status="ok", note="`max_steps=3` reached")


def _last(res: dict, default: str) -> str:
    """The last line of a part's output that says what went wrong (an error line if there is one)."""
    lines = [ln.strip() for ln in res.get("lines", []) if ln.strip()]
    errors = [ln for ln in lines if re.search(r"(Error|Exception|error:|Unavailable)", ln)]
    return ((errors or lines or [default])[-1])[:200]


# ------------------------------------------------------------------------------------------------------------
# the report
# ------------------------------------------------------------------------------------------------------------
def kernel_ms(rows, n, form, process=None) -> Optional[float]:
    """fwd+bwd ms of ``form`` at ``n`` (in ``process`` when given: the same process as the row it is set against)."""
    r = next(
        (
            r
            for r in rows
            if r["n"] == n and r["form"] == form and r["status"] == "ok" and process in (None, r.get("process"))
        ),
        None,
    )
    return r["fwd_bwd_ms"] if r else None


def goals(ctx) -> list[list[str]]:
    """[goal, measured, met] for the three GPU goals."""
    k, t = ctx.rows("kernels"), {(r.get("process"), r["model"]): r for r in ctx.rows("train")}
    stand_in = ctx.device != "cuda"
    out = []

    def verdict(ok: Optional[bool]) -> str:
        if ok is None:
            return "not measured"
        return ("yes" if ok else "no") + (" (CPU stand-in: not a GPU result)" if stand_in else "")

    fla = process_of(LINROPE_FLA, KERNEL_LABELS)
    a, b = kernel_ms(k, GOAL_N, LINROPE_FLA, fla), kernel_ms(k, GOAL_N, FLA_KERNEL, fla)
    out.append(
        [
            f"linrope on fla within 1.3× of fla chunk_simple_gla, fwd+bwd, bf16, N = {GOAL_N}",
            f"{a:.2f} / {b:.2f} ms = {a / b:.2f}×"
            if a and b
            else f"at N = {GOAL_N}: linrope on fla {_f(a)} ms, fla chunk_simple_gla {_f(b)} ms",
            verdict(a / b <= 1.3 if a and b else None),
        ]
    )
    for form in (LINROPE_FLA, LINROPE_CHUNK):
        process = process_of(form, KERNEL_LABELS)
        s, x = kernel_ms(k, GOAL_N, SDPA, process), kernel_ms(k, GOAL_N, form, process)  # sdpa of its process
        out.append(
            [
                f"{form} ≥ 5× faster than sdpa flash (causal), fwd+bwd, N = {GOAL_N}",
                f"{s:.2f} / {x:.2f} ms = {s / x:.2f}×"
                if s and x
                else f"at N = {GOAL_N}: sdpa flash {_f(s)} ms, {form} {_f(x)} ms",
                verdict(s / x >= 5 if s and x else None),
            ]
        )
    for m in (LINEAR_FLA, LINEAR_CHUNK):
        process = process_of(m, TRAIN_PROCESSES)
        sm = t.get((process, SOFTMAX), {}).get("tokens_per_s")  # the baseline measured in the same process
        lin = t.get((process, m), {}).get("tokens_per_s")
        at = t.get((process, m), {}).get("context", ctx.train_context)
        where = "" if at in (4096, None) else f" (measured at context {at}, not 4096)"
        measured = (
            f"{lin:.0f} vs {sm:.0f} tokens/s = {lin / sm:.2f}×"
            if lin and sm
            else f"{m} {_f(lin, 0)}, softmax_rope {_f(sm, 0)} tokens/s"
        )
        out.append(
            [
                f"training tokens/s at context 4096, {m} ≥ softmax_rope" + where,
                measured,
                verdict(lin >= sm if lin and sm else None),
            ]
        )
    return out


def report(ctx) -> str:
    s = SIZES[ctx.device]
    mode = "CUDA" if ctx.device == "cuda" else "CPU stand-in: the same code paths at tiny sizes"
    if ctx.finished is None:
        when = f"{time.perf_counter() - ctx.t0:.0f} s so far, still running or cut off (budget {ctx.total_s:.0f} s)"
    else:
        when = f"{ctx.finished:.0f} s in all (budget {ctx.total_s:.0f} s); exit status {ctx.exit_status()}"
    L = [f"# Device check ({mode})", "", f"`{ctx.command}`, {ctx.started:%Y-%m-%d %H:%M} UTC, {when}.", ""]
    L += ["## Environment", ""]
    keys = [
        "gpu",
        "machine",
        "python",
        "torch",
        "torch cuda",
        *DISTRIBUTIONS[1:],  # the rest after torch
        "bf16",
        "not importable",
        "wheels",
        "PYTHONPATH",
    ]
    L += table(
        ["what", "value"],
        [
            [k, ", ".join(ctx.env[k]) if isinstance(ctx.env.get(k), list) else ctx.env.get(k, "–")]
            for k in keys
            if k in ctx.env or k == "gpu"
        ],
    ) + [""]
    L += ["## Parts", ""]
    L += table(
        ["part", "status", "wall s", "budget s", "note"],
        [
            [p, r["status"], _f(r.get("wall_s"), 0), _f(r.get("budget_s"), 0), r.get("note", "")]
            for p, r in ctx.results.items()
        ],
    ) + [""]
    L += ['## CUDA tests (`pytest -m "gpu and not slow"`)', ""]
    if ctx.tests:
        L += [f"Files: {', '.join(ctx.tests['files'])}. Result: {ctx.tests['summary'] or '–'}.", ""]
        L += [f"- {ln}" for ln in ctx.tests["failures"]] + ([""] if ctx.tests["failures"] else [])
    else:
        L += ["Not run.", ""]
    L += [
        "## Kernel table",
        "",
        f"Forward+backward (fwd+bwd) and forward (fwd) of one attention call, B 1, H 8, d 64, bf16 inputs, causal, "
        f"on {ctx.device}; median of {s['repeats']} after {s['warmup']} warm-up (benchmarks/gpu_table.py). "
        f"Forms: **{SDPA}**: torch SDPA, FlashAttention backend only; **{FLA_KERNEL}**: fla's own kernel, "
        f"unnormalised linear attention without feature map, RoPE or decay (the speed bound); **{LINROPE_FLA}**: "
        f'`linear_attention(impl="fla")`, elu+1, RoPE in the numerator, normalised, on two fla calls; '
        f"**{LINROPE_CHUNK}**: the same on linrope's own chunked kernel. Peak MiB: allocated during one fwd+bwd "
        f"above what was allocated before it (CUDA only). First call s: the first fwd+bwd, Triton's compile and "
        f"autotuning included. Process 1 times sdpa flash and linrope chunk, process 2 sdpa flash and the fla forms "
        f"(a CUDA fault ends its process); each ratio is within one process.",
        "",
    ]
    k = ctx.rows("kernels")
    head = [
        "process",
        "N",
        "form",
        "fwd+bwd ms",
        "fwd ms",
        "peak MiB",
        "first call s",
        "÷ fla chunk_simple_gla",
        "sdpa flash ÷ form",
        "status",
    ]
    rows = []
    for r in k:
        p = r.get("process")
        ms, base, sd = r.get("fwd_bwd_ms"), kernel_ms(k, r["n"], FLA_KERNEL, p), kernel_ms(k, r["n"], SDPA, p)
        status = r["status"] + (f": {r['note']}" if r.get("note") else "")
        rows.append(
            [
                p or "–",
                r["n"],
                r["form"],
                _f(ms),
                _f(r.get("fwd_ms")),
                _f(r.get("peak_mib"), 0),
                _f(r.get("first_s"), 1),
                f"{ms / base:.2f}×" if ms and base else "–",
                f"{sd / ms:.2f}×" if ms and sd else "–",
                status,
            ]
        )
    L += (table(head, rows) if rows else ["Not run."]) + [""]
    L += [
        "## Training throughput",
        "",
        f"benchmarks/train_throughput.py --device {ctx.device}: `size={s['size']}`, bf16-mixed (autocast), batch "
        f"{s['batch']}, context {ctx.train_context or '–'}, AdamW + clipping as in training; median of "
        f"{s['train_steps']} timed steps after {s['train_warmup']} warm-up, the models of one process alternating "
        f"step by step; process 1 runs impl=chunk beside softmax_rope, process 2 impl=fla beside softmax_rope (a "
        f"CUDA fault ends its process). "
        f"Peak MiB: the model's weights and optimizer state plus the largest rise of allocated memory during one "
        f"of its steps (CUDA only).",
        "",
    ]
    rows = [
        [
            r.get("process", "–"),
            r["model"],
            r.get("size", "–"),
            r.get("context"),
            r.get("batch"),
            _f(r.get("ms_per_step"), 1),
            _f(r.get("tokens_per_s"), 0),
            _f(r.get("peak_mib"), 0),
            _f(r.get("first_s"), 1),
            r["status"] + (f": {r['note']}" if r.get("note") else ""),
        ]
        for r in ctx.rows("train")
    ]
    L += (
        table(
            [
                "process",
                "model",
                "size",
                "context",
                "batch",
                "ms/step",
                "tokens/s",
                "peak MiB",
                "first step s",
                "status",
            ],
            rows,
        )
        if rows
        else ["Not run."]
    ) + [""]
    L += ["## FSDP", ""]
    f = ctx.results.get("fsdp")
    L += (
        table(
            ["command", "status", "wall s", "note"],
            [[f"`{ctx.fsdp.get('command', '')}`", f["status"], _f(f.get("wall_s"), 0), f.get("note", "")]],
        )
        if f
        else ["Not run."]
    ) + [""]
    L += ["## GPU goals", ""] + table(["goal", "measured", "met"], goals(ctx)) + [""]
    return "\n".join(L)


class Context:
    def __init__(self, args):
        self.device = "cpu" if args.cpu else "cuda"
        self.out = args.out
        self.out.mkdir(parents=True, exist_ok=True)
        self.jsonl = self.out / "gpu_check.jsonl"
        self.jsonl.write_text("")
        self.md = self.out / "gpu_check.md"
        self.log = Log(self.out / "gpu_check.log")
        self.parts = [p for p in PARTS if p in args.parts]
        self.total_s = args.total_s or TOTAL_S[self.device]
        self.t0 = time.perf_counter()
        self.started = dt.datetime.now(dt.timezone.utc)
        self.command = (
            "bash benchmarks/gpu_check.sh"
            + (" --cpu" if args.cpu else "")
            + (f" --parts {','.join(self.parts)}" if self.parts != list(PARTS) else "")
        )
        self.env: dict = {}
        self.tests: dict = {}
        self.fsdp: dict = {}
        self.results: dict = {}
        self.train_context: Optional[int] = None
        self.finished: Optional[float] = None

    def budget(self, part: str) -> float:
        """What is left of the total, less the shares of the parts after this one, and at least this part's own
        share while that much is left (a total below the shares' sum starves the later parts, not the first)."""
        later = self.parts[self.parts.index(part) + 1 :]
        left = self.total_s - (time.perf_counter() - self.t0)
        shares = SHARES[self.device]
        return max(left - sum(shares[p] for p in later), min(shares[part], left), 5.0)

    def rows(self, part: str) -> list[dict]:
        return read_rows(self.jsonl, part)

    def add_row(self, row: dict) -> None:
        with open(self.jsonl, "a") as f:
            f.write(json.dumps(row) + "\n")

    def exit_status(self) -> int:
        """0 if every part passed; on the CPU stand-in a part may also be "unavailable" (FSDP needs a GPU)."""
        fine = ("ok",) if self.device == "cuda" else ("ok", "unavailable")
        return 0 if all(r["status"] in fine for r in self.results.values()) else 1

    def write(self) -> None:
        tmp = self.md.with_suffix(".md.tmp")
        tmp.write_text(report(self))
        tmp.replace(self.md)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__
    )
    p.add_argument("--cpu", action="store_true", help="the CPU stand-in: the same parts on the CPU, tiny sizes")
    p.add_argument(
        "--out",
        type=Path,
        default=Path(os.environ.get("OUT") or ROOT / "outputs" / "gpu_check"),
        help="where gpu_check.md, .log and .jsonl go (default: $OUT, else outputs/gpu_check)",
    )
    p.add_argument(
        "--parts",
        type=lambda s: [x for x in s.split(",") if x],
        default=list(PARTS),
        help=f"comma-separated subset of {','.join(PARTS)}",
    )
    p.add_argument(
        "--total-s",
        type=float,
        default=None,
        help=f"the whole check's budget in seconds (default {TOTAL_S['cuda']} on CUDA, {TOTAL_S['cpu']} with --cpu)",
    )
    p.add_argument("--probe-env", choices=("cuda", "cpu"), help=argparse.SUPPRESS)  # the env part's subprocess
    args = p.parse_args(argv)
    if args.probe_env:
        print("ENV " + json.dumps(probe_env(args.probe_env)), flush=True)
        return 0
    if os.environ.get("GPU_CHECK_CPU") == "1":
        args.cpu = True
    unknown = [x for x in args.parts if x not in PARTS]
    if unknown:
        p.error(f"--parts: unknown {', '.join(unknown)} (parts: {', '.join(PARTS)})")
    ctx = Context(args)
    ctx.log.line(
        f"# {ctx.command}: {ctx.device}, parts {', '.join(ctx.parts)}, budget {ctx.total_s:.0f} s, output {ctx.out}"
    )
    runners = {"env": part_env, "tests": part_tests, "kernels": part_kernels, "train": part_train, "fsdp": part_fsdp}
    for part in ctx.parts:
        ctx.log.line(f"\n## {part}")
        budget = ctx.budget(part)
        try:
            res = runners[part](ctx)
        except Exception as e:  # noqa: BLE001 - the check's own failure in one part is that part's row
            res = {"status": "failed", "note": f"gpu_check.py: {type(e).__name__}: {e}", "wall_s": 0.0}
        res.pop("lines", None)
        ctx.results[part] = dict(res, budget_s=budget)
        ctx.log.line(f"## {part}: {res['status']}" + (f" ({res['note']})" if res.get("note") else ""))
        ctx.write()
        if part == "env" and ctx.device == "cuda" and ctx.env.get("cuda") is False:
            ctx.log.line("no CUDA GPU here (torch.cuda.is_available() is False): run with --cpu for the stand-in")
            ctx.finished = time.perf_counter() - ctx.t0
            ctx.write()
            return 2
    ctx.finished = time.perf_counter() - ctx.t0
    ctx.write()
    ctx.log.line("\n## summary\n")
    for line in table(
        ["part", "status", "wall s", "note"],
        [[p, r["status"], _f(r.get("wall_s"), 0), r.get("note", "")] for p, r in ctx.results.items()],
    ):
        ctx.log.line(line)
    ctx.log.line("")
    for line in table(["goal", "measured", "met"], goals(ctx)):
        ctx.log.line(line)
    ctx.log.line(f"\n{ctx.md} written; exit status {ctx.exit_status()}")
    return ctx.exit_status()


if __name__ == "__main__":
    sys.exit(main())
