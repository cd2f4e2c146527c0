"""Test-only shim: fla's Triton kernels on this CPU, through Triton's interpreter (``TRITON_INTERPRET=1``).

fla's kernels are written for a GPU.  Under the interpreter they run, slowly, on numpy, after the changes that
live here and never in the package:

  (a) one autotune configuration per kernel (the first of each list): the interpreter would otherwise run
      and time every configuration of every kernel;
  (b) the counter of a ``for … in range(…)`` loop inside a kernel made a Triton tensor, as the compiler makes
      it: fla calls ``.to(tl.int64)`` on such counters, which a plain Python ``int`` (the interpreter's) lacks;
  (c) (only when triton was imported before the interpreter was switched on, as torch's ``has_triton()``
      does in a test process) triton's own ``@jit`` helpers interpreted when a kernel calls them.

``load()`` applies them and imports fla with its kernels interpreted, or returns the reason it cannot (a skip):
fla or triton not installed (the ``interp`` extra, for the CPU build of torch), a triton other than 3.9.x, torch
older than fla's floor, or CUDA available.  The patches are process-wide and cannot be undone for kernels already
decorated, so they are never applied in a process that can run CUDA: its CUDA tests would run interpreted kernels
(they check ``patched()`` is empty).  The interpreted tests are tests/ops/test_fla_interpreted.py, apart from the
CUDA ones (tests/ops/test_fla.py).  Checked with fla-core 0.6.0 and triton 3.9.0 (triton 3.5.1 fails differently).
Only float32 and float16 are meaningful here: under the interpreter fla's float64 results are garbage and
``tl.dot`` is wrong in bfloat16 (right in float16), so float16 stands in for 16-bit on this CPU.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import os
import sys
import warnings
from importlib import metadata
from typing import Optional

import torch

_STATE: dict = {}
TRITON_SERIES = "3.9."  # the triton this shim was checked with (its interpreter's internals are patched)


def _patch_autotune() -> None:
    """(a): every Autotuner keeps only its first configuration."""
    from triton.runtime import autotuner

    init = autotuner.Autotuner.__init__
    if getattr(init, "_linrope_one_config", False):
        return

    def one_config(self, fn, arg_names, configs, *args, **kwargs):
        kwargs.pop("prune_configs_by", None)  # nothing left to prune
        init(self, fn, arg_names, list(configs)[:1], *args, **kwargs)

    one_config._linrope_one_config = True
    autotuner.Autotuner.__init__ = one_config


def _is_range(it: ast.expr) -> bool:
    return isinstance(it, ast.Call) and (
        (isinstance(it.func, ast.Name) and it.func.id == "range")
        or (isinstance(it.func, ast.Attribute) and it.func.attr == "range")
    )


def _patch_counters() -> None:
    """(b): ``for i in range(…)`` / ``tl.range(…)`` gets ``i = i`` as its first statement, which the
    interpreter's own rewriting of assignments turns into ``i = to_tensor(i)``."""
    from triton.runtime import interpreter

    rewriter = interpreter.FunctionRewriter
    if getattr(rewriter, "_linrope_counters", False):
        return
    base = type(rewriter.ast_transformer)

    class Transformer(base):
        def visit_For(self, node: ast.For):
            if _is_range(node.iter) and isinstance(node.target, ast.Name):
                name = node.target.id
                node.body.insert(
                    0, ast.Assign(targets=[ast.Name(id=name, ctx=ast.Store())], value=ast.Name(id=name, ctx=ast.Load()))
                )
            return self.generic_visit(node)

    rewriter.ast_transformer = Transformer()
    rewriter._linrope_counters = True


def _patch_early_helpers() -> None:
    """(c): a ``@triton.jit`` helper decorated before the interpreter was switched on (``triton.language``'s
    own, such as ``tl.cdiv``, when something imported triton earlier in this process: torch's
    ``has_triton()`` does) is interpreted when a kernel calls it, instead of refusing to be called."""
    from triton.runtime import interpreter, jit

    if getattr(jit.JITFunction.__call__, "_linrope_interpreted", False):
        return

    def call(self, *args, **kwargs):
        interpreted = self.__dict__.get("_linrope_interpreted")
        if interpreted is None:
            interpreted = self.__dict__["_linrope_interpreted"] = interpreter.InterpretedFunction(self.fn)
        return interpreted(*args, **kwargs)

    call._linrope_interpreted = True
    jit.JITFunction.__call__ = call


def patched() -> list:
    """The shim's patches present in this process (empty where it was never loaded); imports nothing."""
    found = []
    jit = sys.modules.get("triton.runtime.jit")
    if jit is not None and getattr(jit.JITFunction.__call__, "_linrope_interpreted", False):
        found.append("triton.runtime.jit.JITFunction.__call__")
    autotuner = sys.modules.get("triton.runtime.autotuner")
    if autotuner is not None and getattr(autotuner.Autotuner.__init__, "_linrope_one_config", False):
        found.append("triton.runtime.autotuner.Autotuner.__init__")
    interpreter = sys.modules.get("triton.runtime.interpreter")
    if interpreter is not None and getattr(interpreter.FunctionRewriter, "_linrope_counters", False):
        found.append("triton.runtime.interpreter.FunctionRewriter")
    return found


def triton_version() -> str:
    """The installed triton distribution's version, without importing it ("none" for another distribution)."""
    try:
        return metadata.version("triton")
    except metadata.PackageNotFoundError:  # a module named triton from another distribution (pytorch-triton)
        return "none"


def refusal() -> Optional[str]:
    """Why the shim must not, or cannot, be loaded in this process, or None.  Checked at every ``load()``."""
    if torch.cuda.is_available() or torch.cuda.is_initialized():
        return (
            "CUDA is available: the interpreter shim patches Triton for the whole process and would interpret "
            "the CUDA tests' kernels (run the interpreted tests with CUDA_VISIBLE_DEVICES='')"
        )
    missing = [m for m in ("fla", "triton") if importlib.util.find_spec(m) is None]
    if missing:
        return f"{' and '.join(missing)} not installed (the interp extra, CPU torch: pip install -e '.[interp]')"
    version = triton_version()
    if not version.startswith(TRITON_SERIES):
        return f"triton {version} installed; the interpreter shim needs triton {TRITON_SERIES}x (the interp extra)"
    from linrope.ops.linear_attn.fla_backend import torch_too_old

    return torch_too_old()


def load() -> Optional[str]:
    """Import fla with its kernels interpreted.  Returns None when ready, else why not (for a skip: see
    ``refusal``).  ``TRITON_INTERPRET`` is set while fla is imported (Triton reads it when a kernel is decorated)
    and restored after; a test that runs the kernels sets it again (linrope's ``impl=fla`` accepts CPU tensors
    only then)."""
    reason = refusal()
    if reason:
        return reason
    if _STATE.get("loaded"):
        return None
    if "fla" in sys.modules:  # (importing fla again after removing it from sys.modules does not help)
        raise RuntimeError(
            "fla was imported before tests/ops/fla_interpreter.py: its kernels are compiled, not interpreted"
        )
    before = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        _patch_autotune()
        _patch_counters()
        _patch_early_helpers()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # fla: "Triton is not supported on current platform, roll back to CPU"
            import fla.ops.simple_gla.chunk  # noqa: F401  (decorates every kernel the mapping uses)
    finally:
        if before is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = before
    _STATE["loaded"] = True
    return None


@contextlib.contextmanager
def nan_empty():
    """Every uninitialised float tensor (``torch.empty``, ``torch.empty_like``, ``Tensor.new_empty``: what fla
    allocates its outputs with) starts as NaN, so an element a kernel leaves unwritten shows in the result."""
    originals = {
        (torch, "empty"): torch.empty,
        (torch, "empty_like"): torch.empty_like,
        (torch.Tensor, "new_empty"): torch.Tensor.new_empty,
    }

    def poisoned(fn):
        def make(*args, **kwargs):
            out = fn(*args, **kwargs)
            return out.fill_(float("nan")) if out.is_floating_point() else out

        return make

    try:
        for (owner, name), fn in originals.items():
            setattr(owner, name, poisoned(fn))
        yield
    finally:
        for (owner, name), fn in originals.items():
            setattr(owner, name, fn)
