"""Where a module moved when linrope's folders became its layers: old dotted name → new.

Run folders saved before the move name classes by their old paths (``callbacks.*._target_:
linrope.movement.PositionMovement``).  ``install()`` (called by ``import linrope``) lets such a path import:
``import linrope.movement`` gives the module ``linrope.training.movement`` itself, so a saved ``_target_`` still
resolves, and ``current_name`` maps an old dotted name to the new one where saved configs are compared (a resume,
a study's job identity, a report's grouping of runs: ``linrope.base.nested.flatten``).  ``linrope.config`` and
``linrope.training`` were modules and are now packages of the same name: their old attribute paths are mapped by
``current_name`` alone.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

MOVED = {
    "linrope.after_training": "linrope.training.after_training",
    "linrope.atomic": "linrope.base.atomic",
    "linrope.attention": "linrope.models.attention",
    "linrope.caveats": "linrope.analysis.caveats",
    "linrope.checkpoint": "linrope.run.checkpoint",
    "linrope.command_line": "linrope.config.command_line",
    "linrope.compiling": "linrope.base.compiling",
    "linrope.errors": "linrope.base.errors",
    "linrope.extrapolation": "linrope.evaluation.extrapolation",
    "linrope.figures": "linrope.analysis.figures",
    "linrope.lit": "linrope.training.lit",
    "linrope.memory": "linrope.base.memory",
    "linrope.model": "linrope.models.model",
    "linrope.movement": "linrope.training.movement",
    "linrope.naming": "linrope.base.naming",
    "linrope.optim": "linrope.models.optim",
    "linrope.plots": "linrope.base.plots",
    "linrope.provenance": "linrope.run.provenance",
    "linrope.report_files": "linrope.analysis.report_files",
    "linrope.report_provenance": "linrope.analysis.report_provenance",
    "linrope.resume_diff": "linrope.run.resume_diff",
    "linrope.rope": "linrope.ops.rope",
    "linrope.runs": "linrope.analysis.runs",
    "linrope.schema": "linrope.base.options",
    "linrope.spec": "linrope.models.spec",
    "linrope.stats": "linrope.analysis.stats",
    "linrope.study_jobs": "linrope.studies.study_jobs",
    "linrope.tables": "linrope.evaluation.tables",
}
# modules that became packages of the same name: their old attributes live in one module of the package
BECAME_PACKAGES = {"linrope.config": "linrope.config.checks", "linrope.training": "linrope.training.builders"}


def current_name(dotted: str) -> str:
    """The dotted name today of a module or attribute path saved before the move (unchanged when it did not move)."""
    for old, new in MOVED.items():
        if dotted == old or dotted.startswith(old + "."):
            return new + dotted[len(old) :]
    for old, new in BECAME_PACKAGES.items():
        rest = dotted[len(old) + 1 :] if dotted.startswith(old + ".") else ""
        if rest and importlib.util.find_spec(f"{old}.{rest.split('.')[0]}") is None:  # not a module of the package
            return f"{new}.{rest}"
    return dotted


class _Alias(importlib.abc.Loader):
    def __init__(self, new: str):
        self.new = new

    def create_module(self, spec):
        return importlib.import_module(self.new)  # the moved module itself: one module object, two names

    def exec_module(self, module) -> None:
        pass


class _MovedFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        new = MOVED.get(fullname)
        return importlib.util.spec_from_loader(fullname, _Alias(new)) if new else None


def install() -> None:
    if not any(isinstance(f, _MovedFinder) for f in sys.meta_path):
        sys.meta_path.append(_MovedFinder())  # last: a name that exists today is always found first
