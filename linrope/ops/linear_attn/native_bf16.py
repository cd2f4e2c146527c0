"""The native chunk walk in bfloat16: inputs and outputs bfloat16, its products on the CPU's AVX-512 BF16 dot
products, everything else float32.

``native_chunk.py`` walks each (batch row, head) chunk by chunk; for bfloat16 inputs its ``forward``/``backward``
call this module's walks, which do every step of the float32 walk (``native_chunk``'s docstring) with three
changes:

  * the inputs (q, k, v, and in the backward g and o) are read as bfloat16 and widened to float32 per chunk; the
    features (elu+1, the rotation), the denominator, the division and the features' backward run in float32 (the
    float32 walk's own loops), and the outputs and gradients are rounded to bfloat16 once, when written;
  * every product (P = qn knᵀ, P v + qn S, S += knᵀ v and the backward's eight) takes bfloat16 operands and
    accumulates in float32: ``vdpbf16ps`` (``_mm512_dpbf16_ps``) multiplies 16 pairs of bfloat16 and adds each
    pair's two products to one float32 lane, so an operand's two neighbours along the inner dimension sit side by
    side in one 32-bit word.  The micro-kernel ``mm`` holds a 4 × 64 tile of the result in 16 registers and, per
    pair of the inner dimension, broadcasts one word of A per row and loads four vectors of B ("pairs": row p holds
    the n words (B[2p][c], B[2p+1][c])).  A is read through two strides, so a row-major operand (words along its
    rows) and a transposed one (``pack_rows`` of the matrix itself) cost the same; B needs the pair layout: a
    matrix whose inner dimension runs down its columns is packed by ``pack_rows`` (two rows interleaved), one
    whose inner dimension runs along its rows (kn in P = qn knᵀ, v, S, R in the backward) by a transpose of its
    words (``transpose_words``).  A product with a triangular operand (P v, dP kn, Pᵀ dnum, dPᵀ qn) or a masked
    result (qn knᵀ, dnum Vᵀ) skips, tile by tile, what the triangle makes zero (``Shape``): the same sums;
  * the states S, z, the state gradients R, r and the saved block states stay float32 (S and R are rounded to
    bfloat16 only as operands, as the torch path rounds them for Q·S_in).

MKL's own bfloat16 GEMM (``cblas_gemm_bf16bf16f32``) runs no faster than its ``sgemm_`` on this AMD CPU (its AVX2
path: docs/benchmarks.md, "seventh run"), and oneDNN, whose products use ``vdpbf16ps``, has no C API exported by
torch: hence these few kernels of our own, for the walk's fixed shapes (d, dv and C multiples of 16).

An extension of its own (``WALK``: csrc/chunk.cpp, whose loops and structs it uses, then csrc/chunk_bf16.cpp),
built on the first bfloat16 call: float32 never builds nor loads it, its own extension stays as it was, and a
compiler without these intrinsics loses the bfloat16 walk alone.  The functions using the instructions are compiled
for them alone (``target("avx512f,avx512bw,avx512bf16")``), so it loads on any x86-64 CPU; ``has_bf16()`` asks the
CPU at run time.  Where it lacks them, or the build fails (or the shape is not served), bfloat16 inputs take the
torch path, and ``why_not()`` says why (one line, printed once)."""

from __future__ import annotations

from typing import Optional

import torch

from .extensions import Extension


def _cpu(module) -> Optional[str]:
    return None if module.has_bf16() else "this CPU has no AVX-512 BF16"


# the float32 walk's loops and structs (chunk.cpp), then the bfloat16 walks
WALK = Extension(
    "linrope_native_bf16",
    ["chunk.cpp", "chunk_bf16.cpp"],
    ["has_bf16", "forward_bf16", "backward_bf16", "product_bf16"],
    what="native bfloat16 walk",
    fallback="bfloat16 inputs take the chunk kernel's torch ops",
    cflags=["-O3", "-fopenmp"],
    ldflags=["-fopenmp"],
    check=_cpu,
)


def serves(q: torch.Tensor, v: torch.Tensor, C: int) -> bool:
    """The bfloat16 walk serves these inputs: d, dv and the chunk C multiples of 16, its extension built and the CPU
    able to run it."""
    return q.shape[-1] % 16 == 0 and v.shape[-1] % 16 == 0 and C % 16 == 0 and WALK.get() is not None


def why_not() -> Optional[str]:
    """Why the bfloat16 walk does not run (None when it does, or has not been tried)."""
    return WALK.why


__all__ = ["WALK", "serves", "why_not"]
