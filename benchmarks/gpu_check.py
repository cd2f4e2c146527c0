"""The device check: one command that says what linrope does on a GPU, in one markdown file (issue 31).

Run it through ``bash benchmarks/gpu_check.sh`` (it installs ``.whl/``'s wheels and puts the repo first on
PYTHONPATH); ``--cpu`` runs the same parts on the CPU at tiny sizes.  The parts (``PARTS``: env, kernels, tests,
train, fsdp; what each runs and its share of the time: docs/benchmarks.md, "Device check") run in order, each a
subprocess with its own time budget, a failing one not stopping the others.  A part's budget is what is left of
``--total-s`` less the shares of the parts after it.  Rows go to ``gpu_check.jsonl`` as they are measured, every
output line to ``gpu_check.log``, and ``gpu_check.md`` is rewritten after every part, so a run killed from outside
keeps what it finished.  Exit status: 0 if every part passed, 1 if any failed, timed out or could not run, 2 if
there is no CUDA GPU and ``--cpu`` was not given.
"""

from __future__ import annotations

import argparse
import contextlib
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

from benchmarks import timing  # noqa: E402
from benchmarks.forms import REGISTRY  # noqa: E402
from benchmarks.kernel_time import PROFILE_S, PROFILE_TOP, profile_share  # noqa: E402
from benchmarks.timing import append_jsonl, status, table  # noqa: E402
from benchmarks.timing import fmt as _f  # noqa: E402

PARTS = ("env", "kernels", "tests", "train", "fsdp")  # kernels first: fla's compiled kernels serve the tests
SHARES = {  # seconds each part may use at least (its timeout when the parts before it used all of theirs)
    # fla compiles and autotunes each kernel set on its first call: 75-85 s on an H200 (2026-11-27)
    "cuda": {"env": 30, "kernels": 200, "tests": 60, "train": 180, "fsdp": 50},
    "cpu": {"env": 30, "kernels": 60, "tests": 60, "train": 60, "fsdp": 60},
}
TOTAL_S = {"cuda": 520, "cpu": 290}
# ``--triton`` (issue 50): the tests part runs every case of linrope's Triton kernels on the GPU (each dtype and map
# compiles and autotunes its own kernels), no FSDP part unless named: one command for a session's device time
TRITON_SHARES = {"cuda": {"tests": 120, "train": 170}, "cpu": {}}
TRITON_TESTS = ("gpu", ["tests/ops/test_triton_kernels.py"])  # (marker, files)
TRAIN_MODELS = (
    "linear_rope:model.attention.impl=chunk",
    "linear_rope:model.attention.impl=fla",
    "linear_rope:model.attention.impl=triton",
    "softmax_rope",
)
LINEAR_CHUNK, LINEAR_FLA, LINEAR_TRITON, SOFTMAX = TRAIN_MODELS
# one process per linear form, each beside the softmax baseline: a CUDA fault in one form's kernels ends its
# process's CUDA context (2026-11-27: fla's, on an H200), and would otherwise take the other form's rows with it
TRAIN_PROCESSES = ((LINEAR_CHUNK, SOFTMAX), (LINEAR_FLA, SOFTMAX))
# the kernel table likewise (registry keys): sdpa flash, the baseline of every ratio, in each process
KERNEL_PROCESSES = (("sdpa-flash", "chunk"), ("sdpa-flash", "fla-triton", "fla"))
KERNEL_SHARES = (1, 3)  # how the part's budget divides between them: fla compiles for 75-85 s per kernel set
# ``--triton`` (issue 50): linrope's own Triton kernels instead, the goal's form in one process beside sdpa flash and
# fla's chunk_simple_gla (the ratios its goals set), the other design and layout in a second beside sdpa flash (no
# GPU has run these kernels: a fault in one ends its process's CUDA context, and must not take the goal's rows);
# impl=triton's training beside softmax_rope
TRITON_KERNEL_PROCESSES = (("sdpa-flash", "fla-triton", "triton"), ("sdpa-flash", "triton-loop", "triton-bnhd"))
TRITON_KERNEL_SHARES = (4, 1)  # the first compiles fla's kernels (75-85 s) and linrope's, and is profiled
TRITON_TRAIN_PROCESSES = ((LINEAR_TRITON, SOFTMAX),)
KERNEL_FORMS = ("sdpa-flash", "fla-triton", "fla", "chunk", "triton", "triton-loop", "triton-bnhd")  # baselines first
SDPA, FLA_KERNEL, LINROPE_FLA, LINROPE_CHUNK, LINROPE_TRITON = (REGISTRY[k].label for k in KERNEL_FORMS[:5])
TRITON_GOAL_NS = (4096, 16384, 65536)  # issue 50: linrope triton within 1.2× of fla chunk_simple_gla at each
SIZES = {  # what each mode measures
    "cuda": {
        "lengths": [1024, 4096, 16384, 65536],  # B 1
        "shapes": [(4, 4096)],  # (B, N): the attention call of a size=base training step at context 4096 (batch 4)
        "profile": [16384, 65536],  # --triton: one fwd+bwd of each form under torch.profiler, time by kernel
        "warmup": 3,
        "repeats": 10,
        "size": "base",
        "contexts": [2048, 4096, 8192, 16384],
        "tokens": 16384,  # batch × context at every context: batch 8, 4, 2, 1
        "train_warmup": 2,
        "train_steps": 5,
        # issue 50: linear_rope's tokens/s at least this multiple of softmax_rope's at each context; peak memory at
        # the longest at most softmax_rope's
        "train_goals": {4096: 0.8, 8192: 1.0, 16384: 1.5},
    },
    "cpu": {
        "lengths": [256, 512],
        "shapes": [(2, 128)],
        "profile": [256],
        "warmup": 1,
        "repeats": 2,
        "size": "tiny",
        "contexts": [64, 128, 256],
        "tokens": 256,
        "train_warmup": 1,
        "train_steps": 2,
        "train_goals": {64: 0.8, 128: 1.0, 256: 1.5},  # the same code path, at the stand-in's contexts
    },
}
GOAL_N = 16384
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


class Log:
    def __init__(self, path: Path):
        self.f = open(path, "a", buffering=1)

    def line(self, text: str) -> None:
        print(text, flush=True)
        self.f.write(text + "\n")


def run_part(cmd: list[str], budget_s: float, log: Log, env: Optional[dict] = None) -> dict:
    """Run ``cmd`` (its own process group, its output teed to the log) for at most ``budget_s``:
    {rc, timed_out, wall_s, lines}."""
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
            lines.append(raw.rstrip("\n"))
            log.line(lines[-1])

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    timed_out = False
    try:
        proc.wait(timeout=max(budget_s, 1))
    except subprocess.TimeoutExpired:
        timed_out = True
        for sig in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError):  # gone already: the wait below returns at once
                os.killpg(proc.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
                break
    reader.join(timeout=10)
    wall = time.perf_counter() - t0
    if timed_out:
        log.line(f"# timed out after {wall:.0f} s (budget {budget_s:.0f} s): killed")
    return {"rc": proc.returncode, "timed_out": timed_out, "wall_s": wall, "lines": lines}


def _last(res: dict, default: str) -> str:
    """The last line of a part's output that says what went wrong (an error line if there is one)."""
    lines = [ln.strip() for ln in res.get("lines", []) if ln.strip()]
    errors = [ln for ln in lines if re.search(r"(Error|Exception|error:|Unavailable)", ln)]
    return ((errors or lines or [default])[-1])[:200]


# ------------------------------------------------------------------------------------------------------------
# the parts
# ------------------------------------------------------------------------------------------------------------
def probe_env(device: str) -> dict:
    """What the device has: versions (from the installed metadata) and what does not import."""
    import importlib
    import platform

    from linrope.run.provenance import machine_line, version_of

    env: dict = {"python": platform.python_version(), **{d: version_of(d) or "not installed" for d in DISTRIBUTIONS}}
    missing = []
    mods = ["torch", "hydra", "omegaconf", "einops", "numpy", "yaml", "pytest", "linrope.ops"]
    for mod in mods + (["triton", "fla.ops.simple_gla"] if device == "cuda" else []):  # imported, not merely found
        try:
            importlib.import_module(mod)
        except Exception as e:  # noqa: BLE001 - any import failure is reported
            missing.append(f"{mod} ({type(e).__name__}: {(str(e).splitlines() or [''])[0][:120]})")
    env["not importable"] = missing or ["none"]
    import torch

    env.update({"cuda": torch.cuda.is_available(), "torch cuda": torch.version.cuda, "machine": machine_line()})
    if env["cuda"]:
        p, count = torch.cuda.get_device_properties(0), torch.cuda.device_count()
        env["gpu"] = f"{p.name}, {p.total_memory / 2**30:.0f} GiB, sm_{p.major}{p.minor}, {count} device(s)"
        env["bf16"] = torch.cuda.is_bf16_supported()
    return env


def part_env(ctx) -> dict:
    res = run_part([sys.executable, "benchmarks/gpu_check.py", "--probe-env", ctx.device], ctx.budget("env"), ctx.log)
    found = [ln for ln in res["lines"] if ln.startswith("ENV ")]
    if found:
        ctx.env.update(json.loads(found[-1][4:]))
    if os.environ.get("GPU_CHECK_WHEELS"):
        ctx.env["wheels"] = os.environ["GPU_CHECK_WHEELS"]
    ctx.env["PYTHONPATH"] = os.environ.get("PYTHONPATH", "")
    if not found:
        return dict(res, status="failed", note=_last(res, "no environment printed"))
    if ctx.device == "cuda" and not ctx.env.get("cuda"):
        return dict(res, status="failed", note="torch.cuda.is_available() is False")
    missing = [m for m in ctx.env.get("not importable") or [] if m != "none"]
    bad = [m for m in missing if ctx.device == "cuda" or not m.startswith(("fla", "triton"))]  # fla: CUDA only
    needed = ("torch", "lightning", "hydra-core", "omegaconf")
    bad += [f"{n} not installed" for n in needed if ctx.env.get(n) == "not installed"]
    if bad:
        return dict(res, status="failed", note="not importable: " + "; ".join(bad))
    return dict(res, status="ok", note="")


def part_tests(ctx) -> dict:
    if ctx.triton:
        files = TRITON_TESTS[1]
    else:
        tests = (ROOT / "tests").rglob("test_*.py")
        files = sorted(str(p.relative_to(ROOT)) for p in tests if "mark.gpu" in p.read_text(errors="replace"))
    if not files:
        return {"status": "failed", "note": "no test file carries the gpu marker", "wall_s": 0.0}
    cmd = [sys.executable, "-m", "pytest", "-m", ctx.tests_marker, "-q", "-rfEs", "-p", "no:cacheprovider", *files]
    # each launch waits for its kernel: a fault is raised at the kernel that made it (fla's training step faulted
    # on an H200, reported at later calls: docs/benchmarks.md), at no cost to what the tests check
    res = run_part(cmd, ctx.budget("tests"), ctx.log, env={"CUDA_LAUNCH_BLOCKING": "1"})
    said = re.compile(r"\b(passed|failed|skipped|deselected|error|no tests ran)\b")
    summary = next((ln.strip("= ") for ln in reversed(res["lines"]) if said.search(ln)), "")
    failures = [ln for ln in res["lines"] if ln.startswith(("FAILED", "ERROR"))][:20]
    ctx.tests = {"summary": summary, "files": files, "failures": failures}
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


def processes(ctx, part: str, entries, weights, command, missing) -> tuple[dict, list[dict], list[dict]]:
    """One benchmark process per entry (``command(entry, its budget)``, which writes its rows to a jsonl file),
    each with its ``weights`` share of what is left of the part's budget; its rows carry the process's number
    (1, 2, …), so that a ratio is read within one process, and go to the check's jsonl with a "not run" row for
    each ``missing(entry, rows, result)`` it did not reach.  -> (the part's result, the rows, each process's)."""
    budget, t0 = ctx.budget(part), time.perf_counter()
    results, rows = [], []
    for i, entry in enumerate(entries, 1):
        share = (budget - (time.perf_counter() - t0)) * weights[i - 1] / sum(weights[i - 1 :])
        rows_file = ctx.out / f"{part}_process{i}.jsonl.tmp"
        rows_file.unlink(missing_ok=True)
        res = run_part([*command(entry, share), "--jsonl", str(rows_file)], share, ctx.log)
        got = [dict(r, process=i) for r in read_rows(rows_file, part)]
        for r in read_rows(rows_file, part, detail=True):  # e.g. the kernel table's profile: kept, not counted
            ctx.add_row(dict(r, process=i))
        rows_file.unlink(missing_ok=True)
        got += [dict(r, part=part, process=i, device=ctx.device, status="not run") for r in missing(entry, got, res)]
        for r in got:
            ctx.add_row(r)
        results.append(res)
        rows += got
    # the first process that did not exit 0 (a signal's negative status too: max() hid it behind another's 0)
    rc, timed_out = next((r["rc"] for r in results if r["rc"]), 0), any(r["timed_out"] for r in results)
    merged = {"rc": rc, "timed_out": timed_out, "wall_s": time.perf_counter() - t0}
    return dict(merged, lines=[ln for r in results for ln in r["lines"]]), rows, results


def read_rows(path: Path, part: str, detail: bool = False) -> list[dict]:
    """The rows of ``part`` in the jsonl file ``path`` (none if it is missing; a line cut off by a kill skipped);
    ``detail``: those of its details instead (part "kernels:profile" for "kernels")."""
    out = []
    for line in path.read_text().splitlines() if path.exists() else []:
        with contextlib.suppress(json.JSONDecodeError):
            out.append(json.loads(line))
    if detail:
        return [r for r in out if str(r.get("part", "")).startswith(part + ":")]
    return [r for r in out if r.get("part") == part]


def process_of(name: str, processes) -> Optional[int]:
    """The process (1-based) that runs ``name``: a form or model of one process only, not a baseline (None: no
    process of this run has it)."""
    return next((i for i, names in enumerate(processes, 1) if name in names), None)


def labels(processes) -> tuple:
    """The rows' form labels of each kernel process."""
    return tuple(tuple(REGISTRY[k].label for k in keys) for keys in processes)


def part_kernels(ctx) -> dict:
    """benchmarks/kernel_time.py once per entry of KERNEL_PROCESSES (sdpa flash and linrope chunk; then sdpa flash
    and the fla forms)."""
    s = SIZES[ctx.device]
    shapes = [(1, n) for n in s["lengths"]] + s["shapes"]

    def command(keys, share):
        cmd = [sys.executable, "benchmarks/kernel_time.py", "--device", ctx.device, "--dtype", "bf16", "--lengths"]
        cmd += [
            *map(str, s["lengths"]),
            "--shapes",
            *(f"{b}x{n}" for b, n in s["shapes"]),
            "--forms",
            *keys,
            "--ratios",
            *[f"{keys[0]}/{k}" for k in keys[1:]],
        ]
        cmd += ["--warmup", str(s["warmup"]), "--repeats", str(s["repeats"]), "--max-run-s", "inf", "--peak-size", "0"]
        profiled = ctx.triton and "triton" in keys  # where the time of linrope's kernels goes, beside fla's
        if profiled:
            cmd += ["--profile", *map(str, s["profile"])]
        return cmd + ["--budget-s", f"{max(share - 15 - PROFILE_S * profiled, 5):.0f}"]  # less the profile's

    def missing(keys, rows, res):  # the process died or was killed before these rows: say so, in the rows
        done, labels = {(r.get("batch", 1), r["n"], r["form"]) for r in rows}, [REGISTRY[k].label for k in keys]
        note = "the table's process " + ("timed out" if res["timed_out"] else f"exited {res['rc']}")
        return [dict(batch=b, n=n, form=f, note=note) for b, n in shapes for f in labels if (b, n, f) not in done]

    shares = (TRITON_KERNEL_SHARES if ctx.triton else KERNEL_SHARES)[: len(ctx.kernel_processes)]
    res, rows, _ = processes(ctx, "kernels", ctx.kernel_processes, shares, command, missing)
    failed = [r for r in rows if r["status"] == "failed" or (r["status"] == "unavailable" and ctx.device == "cuda")]
    if res["timed_out"]:
        return dict(res, status="timed out", note=f"{sum(r['status'] == 'not run' for r in rows)} rows not run")
    if failed or res["rc"] != 0:
        what = "; ".join(f"{r['form']} at {r.get('batch', 1)}×{r['n']}: {r.get('note')}" for r in failed[:3])
        return dict(res, status="failed", note=what or _last(res, f"exit status {res['rc']}"))
    return dict(res, status="ok", note=f"{len(rows)} rows")


def part_train(ctx) -> dict:
    """benchmarks/train_throughput.py once per entry of TRAIN_PROCESSES, each with an equal share of the budget:
    every context of the sweep at a fixed batch × context."""
    s = SIZES[ctx.device]

    def command(models, share):
        cmd = [sys.executable, "benchmarks/train_throughput.py", "--device", ctx.device, "--precision", "bf16-mixed"]
        cmd += ["--context", *map(str, s["contexts"]), "--tokens", str(s["tokens"])]
        cmd += ["--warmup", str(s["train_warmup"]), "--steps", str(s["train_steps"])]
        return cmd + ["--models", *models, "--override", f"size={s['size']}"]

    def missing(models, rows, res):  # the contexts the process did not reach, or the models it did not finish there
        note = "timed out" if res["timed_out"] else _last(res, f"exit status {res['rc']}")
        done = {(r["model"], r["context"]) for r in rows}
        return [
            dict(model=m, context=c, batch=s["tokens"] // c, precision="bf16-mixed", note=note)
            for c in s["contexts"]
            for m in models
            if (m, c) not in done
        ]

    res, rows, each = processes(ctx, "train", ctx.train_processes, [1] * len(ctx.train_processes), command, missing)
    bad = ("failed", "not run") + (("unavailable",) if ctx.device == "cuda" else ())
    notes = []
    for i, one in enumerate(each, 1):
        notes += [f"process {i} timed out"] * one["timed_out"]
        notes += [f"{r['model']}: {r.get('note')}" for r in rows if r["process"] == i and r["status"] in bad][:3]
    contexts = f"contexts {', '.join(map(str, s['contexts']))}"
    if res["timed_out"]:
        return dict(res, status="timed out", note=f"{contexts}; " + "; ".join(notes))
    if notes or res["rc"] != 0:
        return dict(res, status="failed", note="; ".join(notes) or _last(res, f"exit status {res['rc']}"))
    return dict(res, status="ok", note=contexts)


def part_fsdp(ctx) -> dict:
    run_dir = Path(tempfile.mkdtemp(prefix="gpu_check_fsdp_"))  # not under $OUT: the run tool keeps 8 files
    cmd = [sys.executable, "train.py", "model=linear_rope", "size=tiny", "trainer=fsdp", "trainer.devices=1"]
    cmd += ["trainer.max_steps=3", "trainer.val_check_interval=3", "logger=none", "trainer.enable_progress_bar=false"]
    ctx.fsdp = {"command": shlex.join(["python", *cmd[1:]])}
    if not (ROOT / "conf" / "trainer" / "fsdp.yaml").exists():
        note = "conf/trainer/fsdp.yaml is missing (the trainer=fsdp preset): not run"
        return {"status": "missing", "wall_s": 0.0, "note": note}
    if ctx.device == "cpu":  # Lightning refuses strategy=fsdp without a GPU: "requires a GPU accelerator"
        return {
            "status": "unavailable",
            "wall_s": 0.0,
            "note": "on cpu: Lightning's FSDP strategy needs a GPU; not run",
        }
    res = run_part(cmd + [f"hydra.run.dir={run_dir}"], ctx.budget("fsdp"), ctx.log)
    if res["timed_out"]:
        return dict(res, status="timed out", note="")
    if res["rc"] != 0 or not any("max_steps=3` reached" in ln for ln in res["lines"]):
        return dict(res, status="failed", note=_last(res, f"exit status {res['rc']}"))
    return dict(res, status="ok", note="`max_steps=3` reached")


# ------------------------------------------------------------------------------------------------------------
# the report
# ------------------------------------------------------------------------------------------------------------
def kernel_ms(rows, n, form, process=None, batch=1) -> Optional[float]:
    """fwd+bwd ms of ``form`` at ``batch`` × ``n`` (in ``process`` when given: the same process as the row it is set
    against)."""
    ok = (r for r in rows if (r.get("batch", 1), r["n"], r["form"]) == (batch, n, form) and r["status"] == "ok")
    return next((r["fwd_bwd_ms"] for r in ok if process in (None, r.get("process"))), None)


def train_rows(ctx) -> dict:
    """The training rows by (process, model, context), in the order measured."""
    return {(r.get("process"), r["model"], r.get("context")): r for r in ctx.rows("train")}


def goals(ctx) -> list[list[str]]:
    """[goal, measured, met] for each GPU goal."""
    k, t = ctx.rows("kernels"), train_rows(ctx)

    def verdict(ok: Optional[bool]) -> str:
        if ok is None:
            return "not measured"
        return ("yes" if ok else "no") + (" (CPU stand-in: not a GPU result)" if ctx.device != "cuda" else "")

    def quotient(a, b, unit, what):  # "a / b unit = q×", or what was measured of the two
        return f"{a:.2f} / {b:.2f} {unit} = {a / b:.2f}×" if a and b else what

    kernel_labels = labels(ctx.kernel_processes)
    fla = process_of(LINROPE_FLA, kernel_labels)
    a, b = kernel_ms(k, GOAL_N, LINROPE_FLA, fla), kernel_ms(k, GOAL_N, FLA_KERNEL, fla)
    measured = quotient(a, b, "ms", f"at N = {GOAL_N}: linrope on fla {_f(a)} ms, fla chunk_simple_gla {_f(b)} ms")
    goal = f"linrope on fla within 1.3× of fla chunk_simple_gla, fwd+bwd, bf16, N = {GOAL_N}"
    out = [[goal, measured, verdict(a / b <= 1.3 if a and b else None)]]
    tri = process_of(LINROPE_TRITON, kernel_labels)  # issue 50's goals (measured with --triton)
    for n in TRITON_GOAL_NS:
        a, b = kernel_ms(k, n, LINROPE_TRITON, tri), kernel_ms(k, n, FLA_KERNEL, tri)
        measured = quotient(a, b, "ms", f"at N = {n}: linrope triton {_f(a)} ms, fla chunk_simple_gla {_f(b)} ms")
        goal = f"linrope triton within 1.2× of fla chunk_simple_gla, fwd+bwd, bf16, N = {n}"
        out.append([goal, measured, verdict(a / b <= 1.2 if a and b else None)])
    for n, factor in ((GOAL_N, 2.5), (65536, 20)):
        s, x = kernel_ms(k, n, SDPA, tri), kernel_ms(k, n, LINROPE_TRITON, tri)
        measured = quotient(s, x, "ms", f"at N = {n}: sdpa flash {_f(s)} ms, linrope triton {_f(x)} ms")
        goal = f"linrope triton ≥ {factor}× faster than sdpa flash (causal), fwd+bwd, N = {n}"
        out.append([goal, measured, verdict(s / x >= factor if s and x else None)])
    for form in (LINROPE_FLA, LINROPE_CHUNK):
        process = process_of(form, kernel_labels)
        s, x = kernel_ms(k, GOAL_N, SDPA, process), kernel_ms(k, GOAL_N, form, process)  # sdpa of its process
        measured = quotient(s, x, "ms", f"at N = {GOAL_N}: sdpa flash {_f(s)} ms, {form} {_f(x)} ms")
        goal = f"{form} ≥ 5× faster than sdpa flash (causal), fwd+bwd, N = {GOAL_N}"
        out.append([goal, measured, verdict(s / x >= 5 if s and x else None)])
    train_goals = SIZES[ctx.device]["train_goals"]
    longest = max(train_goals)
    for m in (m for models in ctx.train_processes for m in models if m != SOFTMAX):  # this run's linear forms
        process = process_of(m, ctx.train_processes)
        for context, factor in train_goals.items():
            # the baseline measured in the same process at the same context
            lin, sm = (t.get((process, x, context), {}).get("tokens_per_s") for x in (m, SOFTMAX))
            measured = f"{m} {_f(lin, 0)}, softmax_rope {_f(sm, 0)} tokens/s"
            if lin and sm:
                measured = f"{lin:.0f} vs {sm:.0f} tokens/s = {lin / sm:.2f}×"
            goal = f"training tokens/s at context {context}, {m} ≥ {factor:g}× softmax_rope's"
            out.append([goal, measured, verdict(lin >= factor * sm if lin and sm else None)])
        lin, sm = (t.get((process, x, longest), {}).get("peak_mib") for x in (m, SOFTMAX))
        measured = f"{_f(lin, 0)} vs {_f(sm, 0)} MiB" + (f" = {lin / sm:.2f}×" if lin and sm else "")
        goal = f"training peak memory at context {longest}, {m} ≤ softmax_rope's"
        out.append([goal, measured, verdict(lin <= sm if lin and sm else None)])
    return out


def report(ctx) -> str:
    s = SIZES[ctx.device]
    mode = "CUDA" if ctx.device == "cuda" else "CPU stand-in: the same code paths at tiny sizes"
    if ctx.finished is None:
        when = f"{time.perf_counter() - ctx.t0:.0f} s so far, still running or cut off (budget {ctx.total_s:.0f} s)"
    else:
        when = f"{ctx.finished:.0f} s in all (budget {ctx.total_s:.0f} s); exit status {ctx.exit_status()}"
    L = [f"# Device check ({mode})", "", f"`{ctx.command}`, {ctx.started:%Y-%m-%d %H:%M} UTC, {when}.", ""]
    keys = ["gpu", "machine", "python", "torch", "torch cuda", *DISTRIBUTIONS[1:]]
    keys += ["bf16", "not importable", "wheels", "PYTHONPATH"]
    listed = lambda v: ", ".join(v) if isinstance(v, list) else v  # noqa: E731
    env = [[k, listed(ctx.env.get(k, "–"))] for k in keys if k in ctx.env or k == "gpu"]
    L += ["## Environment", ""] + table(["what", "value"], env) + ["", "## Parts", ""]
    done = ctx.results.items()
    parts = [[p, r["status"], _f(r.get("wall_s"), 0), _f(r.get("budget_s"), 0), r.get("note", "")] for p, r in done]
    L += table(["part", "status", "wall s", "budget s", "note"], parts) + [""]
    L += [f'## CUDA tests (`pytest -m "{ctx.tests_marker}"`)', ""]
    if ctx.tests:
        L += [f"Files: {', '.join(ctx.tests['files'])}. Result: {ctx.tests['summary'] or '–'}.", ""]
        L += [f"- {ln}" for ln in ctx.tests["failures"]] + ([""] if ctx.tests["failures"] else [])
    else:
        L += ["Not run.", ""]
    forms = "; ".join(f"**{REGISTRY[k].label}**: {REGISTRY[k].what}" for k in KERNEL_FORMS)
    each = "; ".join(f"process {i} times {', '.join(one)}" for i, one in enumerate(labels(ctx.kernel_processes), 1))
    L += [
        "## Kernel table",
        "",
        f"Forward+backward (fwd+bwd) and forward (fwd) of one attention call, B 1 (and B×N {', '.join(f'{b}×{n}' for b, n in s['shapes'])}: "
        f"a `size={s['size']}` training step's call), H 8, d 64, bf16 inputs, causal, on {ctx.device}; the backward "
        "is fwd+bwd less fwd (the forward timed under no_grad, so it slightly overstates the backward); median of "
        f"{s['repeats']} after {s['warmup']} warm-up (benchmarks/kernel_time.py). Forms: {forms}. Peak MiB: "
        "allocated during one fwd+bwd above what was allocated before it (CUDA only). First call s: the first "
        f"fwd+bwd, Triton's compile and autotuning included. {each}; a CUDA fault ends its process; each ratio is "
        "within one process.",
        "",
    ]
    k, rows = ctx.rows("kernels"), []
    for r in k:
        p = r.get("process")
        b, ms, fwd = r.get("batch", 1), r.get("fwd_bwd_ms"), r.get("fwd_ms")
        base, sd = (kernel_ms(k, r["n"], x, p, b) for x in (FLA_KERNEL, SDPA))
        cells = [
            _f(ms),
            _f(fwd),
            _f(ms - fwd if ms and fwd else None),
            _f(r.get("peak_mib"), 0),
            _f(r.get("first_s"), 1),
        ]
        cells += [f"{ms / base:.2f}×" if ms and base else "–", f"{sd / ms:.2f}×" if ms and sd else "–"]
        rows.append([p or "–", b, r["n"], r["form"], *cells, status(r)])
    head = ["process", "B", "N", "form", "fwd+bwd ms", "fwd ms", "bwd ms", "peak MiB", "first call s"]
    head += ["÷ fla chunk_simple_gla"]
    L += (table(head + ["sdpa flash ÷ form", "status"], rows) if rows else ["Not run."]) + [""]
    prof = ctx.rows("kernels:profile")
    if prof:
        what = "device time of each kernel" if ctx.device == "cuda" else "CPU time of each operator (the stand-in)"
        L += [
            "### Where the time goes",
            "",
            f"One more fwd+bwd of each form at N = {', '.join(map(str, s['profile']))} (B 1), warm, under "
            f"torch.profiler: the {what}, its own, summed by name; the largest {PROFILE_TOP}, then the rest, each "
            "with its share of the pass (benchmarks/kernel_time.py --profile).",
            "",
        ]
        cells = [[r.get("process", "–"), r["n"], r["form"], r["kernel"], r["calls"], _f(r.get("ms"), 3),
                  profile_share(r)] for r in prof]  # fmt: skip
        L += table(["process", "N", "form", "kernel", "calls", "ms", "share"], cells) + [""]
    L += [
        "## Training throughput",
        "",
        f"benchmarks/train_throughput.py --device {ctx.device}: `size={s['size']}`, bf16-mixed (autocast), contexts "
        f"{', '.join(map(str, s['contexts']))} at batch × context = {s['tokens']}, AdamW + clipping as in training; "
        f"median of {s['train_steps']} timed steps after {s['train_warmup']} warm-up, the models of one process "
        "alternating step by step; process 1 runs impl=chunk beside softmax_rope, process 2 impl=fla beside "
        "softmax_rope (with `--triton`: impl=triton beside softmax_rope, one process) (a CUDA fault ends its "
        "process). Peak MiB: the model's weights and optimizer state plus the largest rise of allocated memory during "
        "one of its steps (CUDA only); the ratios are to the softmax_rope of the same process and context.",
        "",
    ]
    rows, train = [], train_rows(ctx)
    for (process, _, context), r in train.items():
        first = [process or "–", r["model"], r.get("size", "–"), context, r.get("batch")]
        cells = [_f(r.get(k), d) for k, d in (("ms_per_step", 1), ("tokens_per_s", 0), ("peak_mib", 0), ("first_s", 1))]
        sm = train.get((process, SOFTMAX, context), {})  # the baseline of its process and context
        for key in ("tokens_per_s", "peak_mib"):
            mine, theirs = r.get(key), sm.get(key)
            cells.append(f"{mine / theirs:.2f}×" if mine and theirs and r is not sm else "–")
        rows.append(first + cells + [status(r)])
    head = ["process", "model", "size", "context", "batch", "ms/step", "tokens/s", "peak MiB", "first step s"]
    head += ["tokens/s ÷ softmax_rope's", "peak ÷ softmax_rope's", "status"]
    L += (table(head, rows) if rows else ["Not run."]) + ["", "## FSDP", ""]
    f = ctx.results.get("fsdp")
    fsdp = [[f"`{ctx.fsdp.get('command', '')}`", f["status"], _f(f.get("wall_s"), 0), f.get("note", "")]] if f else []
    L += (table(["command", "status", "wall s", "note"], fsdp) if f else ["Not run."]) + [""]
    return "\n".join(L + ["## GPU goals", ""] + table(["goal", "measured", "met"], goals(ctx)) + [""])


class Context:
    def __init__(self, args):
        self.device = "cpu" if args.cpu else "cuda"
        self.out = args.out
        self.out.mkdir(parents=True, exist_ok=True)
        self.jsonl = self.out / "gpu_check.jsonl"
        self.jsonl.write_text("")
        self.md = self.out / "gpu_check.md"
        self.log = Log(self.out / "gpu_check.log")
        triton = getattr(args, "triton", False)  # linrope's Triton kernels alone (issue 50)
        default = [p for p in PARTS if not (triton and p == "fsdp")]
        self.parts = [p for p in PARTS if p in (args.parts or default)]
        self.shares = dict(SHARES[self.device], **(TRITON_SHARES[self.device] if triton else {}))
        self.tests_marker = TRITON_TESTS[0] if triton else "gpu and not slow"
        self.total_s = args.total_s or TOTAL_S[self.device]
        self.t0 = time.perf_counter()
        self.started = dt.datetime.now(dt.timezone.utc)
        self.command = "bash benchmarks/gpu_check.sh" + (" --cpu" if args.cpu else "")
        self.command += f" --parts {','.join(self.parts)}" if self.parts != default else ""
        self.env, self.tests, self.fsdp, self.results = {}, {}, {}, {}
        self.triton = triton
        self.kernel_processes = TRITON_KERNEL_PROCESSES if triton else KERNEL_PROCESSES
        self.train_processes = TRITON_TRAIN_PROCESSES if triton else TRAIN_PROCESSES
        self.command += " --triton" if triton else ""
        self.finished: Optional[float] = None

    def budget(self, part: str) -> float:
        """What is left of the total, less the shares of the parts after this one, and at least this part's own
        share while that much is left (a total below the shares' sum starves the later parts, not the first)."""
        later = self.parts[self.parts.index(part) + 1 :]
        left = self.total_s - (time.perf_counter() - self.t0)
        shares = self.shares
        return max(left - sum(shares[p] for p in later), min(shares[part], left), 5.0)

    def rows(self, part: str) -> list[dict]:
        return read_rows(self.jsonl, part)

    def add_row(self, row: dict) -> None:
        append_jsonl(self.jsonl, row)

    def exit_status(self) -> int:
        """0 if every part passed; on the CPU stand-in a part may also be "unavailable" (FSDP needs a GPU)."""
        fine = ("ok",) if self.device == "cuda" else ("ok", "unavailable")
        return 0 if all(r["status"] in fine for r in self.results.values()) else 1

    def write(self) -> None:
        tmp = self.md.with_suffix(".md.tmp")
        tmp.write_text(report(self))
        tmp.replace(self.md)


def main(argv=None) -> int:
    p = timing.parser(__doc__, threads=False)
    p.add_argument("--cpu", action="store_true", help="the CPU stand-in: the same parts on the CPU, tiny sizes")
    out = Path(os.environ.get("OUT") or ROOT / "outputs" / "gpu_check")
    p.add_argument("--out", type=Path, default=out, help="for gpu_check.md, .log and .jsonl ($OUT, outputs/gpu_check)")
    parts = lambda s: [x for x in s.split(",") if x]  # noqa: E731
    p.add_argument(
        "--parts",
        type=parts,
        default=None,
        help=f"a comma-separated subset of {','.join(PARTS)} (--triton: all but fsdp)",
    )
    budget = f"{TOTAL_S['cuda']} on CUDA, {TOTAL_S['cpu']} with --cpu"
    triton = "issue 50: linrope's Triton kernels (impl=triton) instead: every case of their CUDA tests, the kernel "
    triton += "table and training"
    p.add_argument("--triton", action="store_true", help=triton)
    p.add_argument("--total-s", type=float, default=None, help=f"the whole check's budget in s ({budget})")
    p.add_argument("--probe-env", choices=("cuda", "cpu"), help=argparse.SUPPRESS)  # the env part's subprocess
    args = p.parse_args(argv)
    if args.probe_env:
        print("ENV " + json.dumps(probe_env(args.probe_env)), flush=True)
        return 0
    args.cpu = args.cpu or os.environ.get("GPU_CHECK_CPU") == "1"
    unknown = [x for x in args.parts or [] if x not in PARTS]
    if unknown:
        p.error(f"--parts: unknown {', '.join(unknown)} (parts: {', '.join(PARTS)})")
    ctx = Context(args)
    where = f"{ctx.device}, parts {', '.join(ctx.parts)}, budget {ctx.total_s:.0f} s, output {ctx.out}"
    ctx.log.line(f"# {ctx.command}: {where}")
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
    parts = [[p, r["status"], _f(r.get("wall_s"), 0), r.get("note", "")] for p, r in ctx.results.items()]
    summary = table(["part", "status", "wall s", "note"], parts) + [""] + table(["goal", "measured", "met"], goals(ctx))
    for line in ["\n## summary\n", *summary, f"\n{ctx.md} written; exit status {ctx.exit_status()}"]:
        ctx.log.line(line)
    return ctx.exit_status()


if __name__ == "__main__":
    sys.exit(main())
