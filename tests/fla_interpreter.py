"""Test-only shim: fla's Triton kernels on this CPU, through Triton's interpreter (``TRITON_INTERPRET=1``).

fla's kernels are written for a GPU.  Under the interpreter they run, slowly, on numpy, after two changes that
live here and never in the package:

  (a) one autotune configuration per kernel (the first of each list): the interpreter would otherwise run
      and time every configuration of every kernel;
  (b) the counter of a ``for … in range(…)`` loop inside a kernel made a Triton tensor, as the compiler makes
      it: fla calls ``.to(tl.int64)`` on such counters, which a plain Python ``int`` (the interpreter's) lacks.

``load()`` applies both and imports fla with its kernels interpreted, or returns the reason it cannot
(fla or triton not installed, fla already imported uninterpreted).  Only float32 and float16 are meaningful
here: under the interpreter fla's float64 results are garbage and ``tl.dot`` is wrong in bfloat16.
"""
from __future__ import annotations

import ast
import importlib.util
import os
import sys
from typing import Optional

_STATE: dict = {}


def _need_version(name: str, want: str) -> Optional[str]:
    from importlib.metadata import PackageNotFoundError, version

    try:
        have = version(name)
    except PackageNotFoundError:
        return f"{name} is not installed (pip install -e '.[dev]')"
    if not have.startswith(want):
        return f"the interpreter shim is checked against {name} {want}*, found {have}"
    return None


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
        or (isinstance(it.func, ast.Attribute) and it.func.attr == "range"))


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
                node.body.insert(0, ast.Assign(targets=[ast.Name(id=name, ctx=ast.Store())],
                                               value=ast.Name(id=name, ctx=ast.Load())))
            return self.generic_visit(node)

    rewriter.ast_transformer = Transformer()
    rewriter._linrope_counters = True


def load() -> Optional[str]:
    """Import fla with its kernels interpreted.  Returns None when ready, else why not (for a skip)."""
    if "reason" in _STATE:
        return _STATE["reason"]
    reason = None
    for name, want in (("fla-core", "0.6."), ("triton", "3.9.")):
        if importlib.util.find_spec(name.split("-")[0]) is None or (reason := _need_version(name, want)):
            reason = reason or f"{name} is not installed (pip install -e '.[dev]')"
            break
    if reason is None and "fla" in sys.modules and not _STATE:
        reason = "fla was imported before the interpreter shim (its kernels are compiled, not interpreted)"
    if reason is None:
        os.environ["TRITON_INTERPRET"] = "1"  # read when fla's kernels are decorated, i.e. on import
        _patch_autotune()
        _patch_counters()
        import fla.ops.simple_gla  # noqa: F401  (decorates every kernel the mapping uses)
    _STATE["reason"] = reason
    return reason
