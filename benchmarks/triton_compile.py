"""Compile linrope's Triton kernels for a GPU on any machine, no GPU needed: does each compile, and its registers,
spills and shared memory.

Triton's CPU interpreter (the tests) runs the kernels' Python, not their compile: a global a kernel reads must be a
``tl.constexpr`` only once compiled, and register pressure shows only in the compiled code.  This script runs
``impl="triton"``'s forward and backward operators (triton_backend.py) on small CPU tensors with every kernel launch
recorded instead of run, then compiles each launch as Triton's launcher would (the same constexprs, each num_warps an
autotuned kernel may take; arguments typed and specialised the way Triton does: a tensor is a 16-byte-aligned
pointer of its dtype, an int 1 a constant, an int divisible by 16 marked so) for ``--arch`` (90: Hopper, the device
check's H100/H200) and reads the cubin's resource usage with the cuobjdump that ships with Triton.  Spilled
registers live in local memory (the ``stack`` column): slow, and in the sequential state kernels paid at every chunk.

One row per variant, kernel launch and configuration.  Variants (``--variants``; every one by default): the training
path (bf16, elu+1, RoPE in the numerator, normalised), and variants that set the other compile-time options
(placement both and none, cosine, decay, packed documents, initial and final state, normalize=False; float32 and
float16 inputs).  Exit status 1 if a kernel does not compile.  Registers and spills are proxies, not times: the
device check times the kernels.

Usage:  python benchmarks/triton_compile.py                       # every variant, sm_90
        python benchmarks/triton_compile.py --variants training --arch 80
        python benchmarks/triton_compile.py --variants training --warps _state_fwd=8 _state_bwd=8
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from unittest import mock

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.timing import table  # noqa: E402

# variant: (dtype, feature map, placement, decay, packed documents, initial and final state, normalize)
VARIANTS = {
    "training": (torch.bfloat16, "elu", "numerator", False, False, False, True),
    "both, decay": (torch.bfloat16, "elu", "both", True, False, False, True),
    "cosine, documents": (torch.bfloat16, "cosine", "both", False, True, False, True),
    "none, state, unnormalised": (torch.bfloat16, "elu", "none", False, False, True, False),
    "cosine numerator, decay, state": (torch.bfloat16, "cosine", "numerator", True, False, True, True),
    "float32": (torch.float32, "elu", "numerator", True, False, True, True),
    "float16": (torch.float16, "cosine", "both", False, False, False, True),
}
SCANS = ("split", "loop")  # triton_backend.SCAN: the device check times both
DTYPE = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.int64: "i64", torch.int32: "i32"}


class Recorder:
    """Stands in for the kernels module: ``rec._state_fwd[grid](*args, **kw)`` records the launch."""

    def __init__(self):
        self.launches: list[tuple[str, tuple, tuple, dict]] = []

    def __getattr__(self, name):
        recorder = self

        class Launch:
            def __getitem__(self, grid):
                return lambda *args, **kw: recorder.launches.append((name, tuple(grid), args, kw))

        return Launch()


@contextmanager
def recorded():
    """Inside the block the Triton backend's launches are recorded, not run."""
    from linrope.ops.linear_attn import triton_backend

    rec = Recorder()
    with mock.patch.object(triton_backend, "_kernels", lambda: rec):
        yield rec


def launches(
    variant: tuple, B: int = 1, H: int = 8, N: int = 1024, d: int = 64
) -> list[tuple[str, tuple, tuple, dict]]:
    """Every kernel launch of one forward and one backward of ``variant`` on CPU tensors (B, H, N, d), with each way
    of summing the states (``triton_backend.SCAN``; a kernel both launch, once)."""
    from linrope.ops.linear_attn import triton_backend as tb
    from linrope.ops.linear_attn.features import feature_width

    dtype, fmap, rope, decay, docs, state, normalize = variant
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, N, d, generator=g).to(dtype) for _ in range(3))
    positions = torch.arange(N)
    theta = torch.tensor(10000.0) if rope != "none" else None
    gamma = torch.full((H,), 0.99) if decay else None
    ids = torch.arange(N).div(N // 4, rounding_mode="floor").expand(B, N).contiguous() if docs else None
    DF = feature_width(fmap, d)
    S0, z0 = (torch.zeros(B, H, DF, d), torch.zeros(B, H, DF)) if state else (None, None)
    out, seen = [], set()
    for scan in SCANS:
        with recorded() as rec, mock.patch.object(tb, "SCAN", scan):
            o, den, _, _ = tb.triton_fwd(
                q, k, v, S0, z0, positions, theta, gamma, fmap, rope, 1e-6, normalize, state, ids
            )
            g_S, g_z = (torch.zeros(B, H, DF, d), torch.zeros(B, H, DF)) if state else (None, None)
            tb.triton_bwd(torch.randn_like(v), g_S, g_z, q, k, v, S0, z0, positions, theta, gamma, o, den, fmap, rope,
                          normalize, state, ids)  # fmt: skip
        for launch in rec.launches:
            key = (launch[0], tuple(sorted((k, repr(v)) for k, v in launch[3].items())))  # the kernel, its constexprs
            if key not in seen:
                seen.add(key)
                out.append(launch)
    return out


def signature(fn, args: tuple, kw: dict) -> tuple[dict, dict, dict]:
    """(signature, constexprs, attrs) of ``fn`` called with ``args`` and ``kw``, specialised as Triton's launcher
    specialises them."""
    sig, const, attrs = {}, {}, {}
    values = dict(zip(fn.arg_names, args), **kw)
    for i, (name, param) in enumerate(zip(fn.arg_names, fn.params)):
        value = values[name]
        if param.is_constexpr or value is None:  # an absent tensor (None) is a constant too
            sig[name], const[name] = "constexpr", value
        elif isinstance(value, torch.Tensor):
            sig[name] = "*" + DTYPE[value.dtype]
            attrs[(i,)] = [["tt.divisibility", 16]]  # torch's allocations are 16-byte aligned at least
        elif isinstance(value, bool):
            sig[name] = "i1"
        elif isinstance(value, int):
            if value == 1:
                sig[name], const[name] = "constexpr", 1
            else:
                sig[name] = "i32" if -(2**31) <= value < 2**31 else "i64"
                if value % 16 == 0:
                    attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(value, float):
            sig[name] = "fp32"
        else:
            raise TypeError(f"{fn.__name__}: argument {name}={value!r} of an unexpected type")
    return sig, const, attrs


def usage(cubin: bytes) -> dict:
    """Registers, stack (spill) bytes and static shared memory of a cubin, from cuobjdump --dump-resource-usage."""
    import triton

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
    try:
        text = subprocess.run([str(tool), "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
    finally:
        os.unlink(f.name)
    found = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", text)
    if not found:
        raise RuntimeError(f"cuobjdump printed no resource usage: {text.strip()[:200]!r}")
    regs, stack, shared, local = map(int, found.groups())
    return {"registers": regs, "stack": stack, "shared": shared, "local": local}


def jit_kernels():
    """triton_kernels.py decorated for compiling, loaded apart from the module linrope imports (which the tests
    decorate for the interpreter)."""
    import linrope.ops.linear_attn as package

    path = Path(package.__file__).parent / "triton_kernels.py"
    spec = importlib.util.spec_from_file_location("triton_kernels_compiled", path)
    module = importlib.util.module_from_spec(spec)
    with mock.patch.dict(os.environ, {"TRITON_INTERPRET": "0"}):
        spec.loader.exec_module(module)
    return module


def configurations(fn, kw: dict, warps=None) -> list[tuple[object, dict, dict]]:
    """(the JITFunction, its launch's keywords, compile options) per configuration a launch of ``fn`` may take: each
    of an autotuned kernel's, else the launch's own (``warps``: num_warps by kernel name, instead of either)."""
    from triton.runtime.autotuner import Autotuner

    kw = dict(kw)
    options = {"num_warps": kw.pop("num_warps", 4), "num_stages": kw.pop("num_stages", 3)}
    configs = [(fn, kw, options)]
    if isinstance(fn, Autotuner):
        configs = [
            (fn.fn, dict(kw, **c.kwargs), {"num_warps": c.num_warps, "num_stages": c.num_stages or 3})
            for c in fn.configs
        ]
    name = getattr(fn, "__name__", None) or fn.fn.__name__
    over = (warps or {}).get(name)
    if over is not None:  # one configuration, the count asked for
        configs = [(configs[0][0], configs[0][1], dict(configs[0][2], num_warps=over))]
    return configs


def compile_one(fn, args: tuple, kw: dict, options: dict, arch: int) -> dict:
    """Compile ``fn`` called with ``args`` and ``kw`` for sm_``arch``: its resource usage (or the error's first
    line)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    sig, const, attrs = signature(fn, args, kw)
    t0 = time.perf_counter()
    try:
        compiled = triton.compile(ASTSource(fn, sig, const, attrs), target=GPUTarget("cuda", arch, 32), options=options)
    except Exception as e:  # noqa: BLE001 - a kernel that does not compile is its row
        root = e
        while root.__cause__ is not None:  # Triton's CompilationError wraps what the kernel's code raised
            root = root.__cause__
        lines = [ln.strip() for ln in str(root).splitlines() if ln.strip() not in ("", "^")]
        why = next((ln for ln in lines if re.match(r"\w+Error\b", ln)), (lines or [""])[-1])  # e.g. NameError(...)
        return dict(options, status=f"failed: {type(root).__name__}: {why[:300]}")
    used = dict(usage(compiled.asm["cubin"]), shared=compiled.metadata.shared)  # dynamic: cuobjdump sees the static
    return dict(options, **used, status="ok", compile_s=time.perf_counter() - t0)


def run(variants: list[str], arch: int, emit=print, warps=None) -> list[dict]:
    """Every launch of every variant compiled: one row each, handed to ``emit`` as it is done."""
    rows, kernels = [], jit_kernels()
    for variant in variants:
        for name, grid, args, kw in launches(VARIANTS[variant]):
            for fn, fn_kw, options in configurations(getattr(kernels, name), kw, warps):
                row = dict(variant=variant, kernel=name, grid=grid, **compile_one(fn, args, fn_kw, options, arch))
                rows.append(row)
                emit(row)
    return rows


def row_cells(r: dict) -> list:
    used = [r.get("registers", "–"), r.get("stack", "–"), r.get("shared", "–")]
    return [r["variant"], r["kernel"], r["num_warps"], *used, r["status"]]


def fla_reference(arch: int) -> list[dict]:
    """fla's state kernel (``chunk_fwd_kernel_h``, the sequential pass its ``chunk_simple_gla`` runs) compiled the
    same way, for scale: no gate, no initial or final state, K = V = 64, BK = BV = 64 (the Hopper guard's width),
    bf16, the 4 and 8 warps of fla's autotune list; [] without fla."""
    try:
        from fla.ops.common.chunk_h import chunk_fwd_kernel_h
    except ImportError:
        return []
    fn = chunk_fwd_kernel_h
    while hasattr(fn, "fn") and not hasattr(fn, "params"):  # through fla's heuristics and autotune decorators
        fn = fn.fn
    flags = "USE_G USE_G_GAMMA USE_GK USE_GV USE_INITIAL_STATE STORE_FINAL_STATE IS_VARLEN STATE_V_FIRST".split()
    absent = ("g", "g_gamma", "gk", "gv", "h0", "ht", "cu_seqlens", "split_offsets")
    kw = dict(H=8, K=64, V=64, BT=64, BS=64, BK=64, BV=64, **dict.fromkeys(flags, False), **dict.fromkeys(absent))
    k = torch.empty(1, 1024, 8, 64, dtype=torch.bfloat16)
    args = (k, k, torch.empty(1, 16, 8, 64, 64, dtype=torch.bfloat16))
    rows = []
    for w in (4, 8):
        got = compile_one(fn, args, dict(kw, T=1024), {"num_warps": w, "num_stages": 3}, arch)
        rows.append(dict(variant="fla (reference)", kernel="chunk_fwd_kernel_h", **got))
    return rows


HEAD = ["variant", "kernel", "num_warps", "registers", "stack (spill) bytes", "shared bytes", "status"]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS), metavar="VARIANT",
                   help=f"which variants ({'; '.join(VARIANTS)})")  # fmt: skip
    p.add_argument("--arch", type=int, default=90, help="compute capability × 10 (90: H100/H200, 80: A100)")
    p.add_argument(
        "--warps", nargs="+", default=[], metavar="KERNEL=N", help="one num_warps for a kernel, e.g. _grad=4"
    )
    args = p.parse_args(argv)
    try:
        warps = {k: int(n) for k, _, n in (w.partition("=") for w in args.warps)}
    except ValueError:
        p.error(f"--warps: {' '.join(args.warps)}: expected KERNEL=N, e.g. _state_fwd=8")
    try:
        import triton
    except ImportError:
        p.error("triton is not installed (pip install triton, or the interp extra on a CPU build of torch)")
    unknown = [k for k in warps if not hasattr(getattr(jit_kernels(), k, None), "arg_names")]  # a kernel, tuned or not
    if unknown:
        p.error(f"--warps: {unknown[0]} is not a kernel of linrope/ops/linear_attn/triton_kernels.py")
    print(f"Triton {triton.__version__}, sm_{args.arch}; B 1, H 8, N 1024, d 64 (bhnd); one forward and backward each")
    print("\n".join(table(HEAD, [])[:2]), flush=True)
    emit = lambda r: print(table(HEAD, [row_cells(r)])[-1], flush=True)  # noqa: E731
    rows = run(args.variants, args.arch, emit=emit, warps=warps)
    for row in fla_reference(args.arch):  # not counted below: fla's, for scale
        emit(row)
    failed = [r for r in rows if r["status"] != "ok"]
    spilled = sorted({(r["variant"], r["kernel"]) for r in rows if r.get("stack")})
    print(f"\n{len(rows)} compiles (each launch in each configuration), {len(failed)} failed; spilling: {len(spilled)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
