"""``compile: true``: whether this installation of torch can compile the model here, said in one line.

torch.compile needs Dynamo (which supports only some Python versions per torch release) and a backend
that can build code for the device: Inductor writes C++ for the CPU (a C++ compiler must be on PATH) and
Triton kernels for CUDA (the ``triton`` package)."""

from __future__ import annotations

import os
import shutil
import sys
from typing import Optional

import torch
import torch._dynamo.eval_frame as eval_frame
from torch.utils._triton import has_triton


def compile_unsupported(device_type: Optional[str] = None) -> Optional[str]:
    """None if torch.compile can work for ``device_type`` (default: cuda when available, else cpu), else why not."""
    version = f"torch {torch.__version__} on Python {sys.version_info.major}.{sys.version_info.minor}"
    if not eval_frame.is_dynamo_supported():
        return f"torch.compile is not supported by {version} on {sys.platform}"
    device_type = device_type or ("cuda" if torch.cuda.is_available() else "cpu")
    if device_type == "cuda" and not has_triton():
        return f"torch.compile on CUDA needs the triton package, which {version} cannot import"
    cxx = os.environ.get("CXX")
    if not any(shutil.which(c) for c in (cxx, "g++", "c++", "clang++") if c):
        return "torch.compile on the CPU needs a C++ compiler (g++, clang++ or $CXX) on PATH; none was found"
    return None
