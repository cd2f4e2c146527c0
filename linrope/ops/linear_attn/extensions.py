"""The native kernels' C++ (the files in ``csrc/``) and their build: one mechanism for the three extensions.

``source(*files)`` joins csrc's files into the one string ``torch.utils.cpp_extension.load_inline`` compiles, a
local ``#include "x.h"`` replaced by x.h's text (so each file also compiles on its own with ``-I csrc``).
``Extension`` builds such a source on first use (about 10 s; then cached by torch under ~/.cache/torch_extensions) in
a folder named by a hash of the source, the flags and the torch installation, so that checkouts of other sources (a
benchmark's ``--compare``, another worktree) never load each other's, and environments sharing the cache (two
virtualenvs, or PATH with a venv's ninja and without) never rebuild each other's: torch rebuilds a folder whose
include paths changed, and one ninja a folder another ninja built.  Where the compiler, ninja or a symbol is
missing, or ``check`` finds the module unfit, ``get()`` is None and ``why`` says so in one line, printed once: the
caller runs its torch ops."""

from __future__ import annotations

import hashlib
import inspect
import re
import shutil
import sys
import threading
from pathlib import Path
from typing import Callable, Optional, Sequence

CSRC = Path(__file__).with_name("csrc")
# build name -> the module loaded in this process: torch's ``load_inline`` called again with a name it has loaded
# compiles the same source anew under a bumped name (``<name>_v1``, 25 s), and the next process, finding that build's
# object in the folder, compiles the unbumped one again
_LOADED: dict = {}
_LOCAL_INCLUDE = re.compile(r'^#include "(\w+\.h)"\n', re.M)


def source(*files: str) -> str:
    """csrc's ``files``, in order, as one string, each local ``#include "x.h"`` replaced by x.h's text."""
    return "".join(_LOCAL_INCLUDE.sub(lambda m: (CSRC / m[1]).read_text(), (CSRC / f).read_text()) for f in files)


def installation() -> str:
    """The torch a build compiles against and links to (its folder and version), Python's version, and the ninja
    torch runs (the first on PATH: ninja 1.11 and 1.12+ hash their logs' commands differently, so each rebuilds what
    the other built, as a virtualenv's pip ninja and the system's do when PATH has the venv or not)."""
    import torch

    python = f"{sys.version_info[0]}.{sys.version_info[1]}"
    return f"{Path(torch.__file__).parent}|{torch.__version__}|{python}|{shutil.which('ninja')}"


def build_name(stem: str, source: str, flags: Sequence[str]) -> str:
    """The build folder's name: ``stem`` and a hash of the source, the flags and ``installation()``."""
    key = "\0".join([source, *flags, installation()])
    return f"{stem}_{hashlib.sha1(key.encode()).hexdigest()[:10]}"


def built(name: str) -> bool:
    """torch's cache holds a build of the extension ``name``."""
    try:
        from torch.utils.cpp_extension import _get_build_directory  # private: the notice is all that rests on it

        return any(Path(_get_build_directory(name, False)).glob("*.so"))
    except Exception:  # noqa: BLE001
        return False


class Extension:
    """One native module, compiled from ``files`` on the first ``get()``.

    ``what`` names it in the lines said ("native scans"), ``fallback`` says what runs instead, ``check(module)``
    returns a reason the module cannot serve (None when it can).  ``state`` holds "module" once built, or "why";
    emptied, the next ``get()`` checks again the module this process has loaded."""

    def __init__(
        self,
        stem: str,
        files: Sequence[str],
        functions: Sequence[str],
        *,
        what: str,
        fallback: str,
        cflags: Sequence[str],
        ldflags: Sequence[str] = (),
        check: Optional[Callable[[object], Optional[str]]] = None,
    ):
        self.source = source(*files)
        self.functions, self.cflags, self.ldflags = list(functions), list(cflags), list(ldflags)
        self.name = build_name(stem, self.source, [*self.cflags, "|", *self.ldflags])
        self.what, self.fallback, self.check = what, fallback, check
        self.state: dict = {}
        self._lock = threading.Lock()  # the heads' tasks (heads.py) ask at once

    def get(self):
        """The compiled module, or None (``why`` says why)."""
        with self._lock:
            if not self.state:
                try:
                    from torch.utils.cpp_extension import load_inline

                    module = _LOADED.get(self.name)
                    if module is None:
                        # the sources include what they use of torch (csrc/torch_api.h): torch's own
                        # torch/extension.h, where torch can be told to leave it out, made a build 23 s, not 10 s
                        light = "no_implicit_headers" in inspect.signature(load_inline).parameters
                        if not built(self.name):
                            print(
                                f"linrope: building {self.name}, the {self.what} (once: torch caches it)",
                                file=sys.stderr,
                            )
                        module = _LOADED[self.name] = load_inline(
                            self.name,
                            cpp_sources=self.source,
                            functions=self.functions,
                            extra_cflags=self.cflags,
                            extra_ldflags=self.ldflags,
                            with_pytorch_error_handling=False,  # its wrapper's header costs 4 s a build
                            **({"no_implicit_headers": True} if light else {}),
                        )
                    reason = self.check(module) if self.check else None
                except Exception as e:  # noqa: BLE001 - no compiler, no ninja, a failed build: the torch ops run
                    module, reason = None, (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
                if reason is None:
                    self.state["module"] = module
                else:
                    self.state["why"] = f"linrope: {self.what} unavailable ({reason}); {self.fallback}"
                    print(self.state["why"], file=sys.stderr)
            return self.state.get("module")

    @property
    def why(self) -> Optional[str]:
        """Why the module does not run (None when it does, or has not been tried)."""
        return self.state.get("why")


__all__ = ["CSRC", "Extension", "build_name", "built", "installation", "source"]
