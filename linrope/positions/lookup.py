"""Plumbing shared by the table-based relative schemes (shaw, xl, deberta).

A relative scheme scores each query against a small table of per-distance rows
(``q @ table.T``: (…, N, R)) and then needs, for every (query i, key j), the row
``idx[i, j]`` of that table: a ``gather`` with an (N, N) index, never an
(N, N, d) tensor and never a loop over positions.  The value side (shaw) is the
transpose: ``scatter_add`` the probabilities into their rows, then ``@ table``.
"""
from __future__ import annotations

from typing import Tuple

import torch


def used_rows(idx: torch.Tensor) -> Tuple[torch.Tensor, int, int]:
    """Restrict a table-row index matrix to the rows it uses: (idx - lo, lo, hi + 1).

    A window of N positions uses at most 2N-1 distances, often far fewer rows
    than the table holds, so the per-row scores stay (…, N, ≤2N-1)."""
    lo, hi = int(idx.min()), int(idx.max())
    return idx - lo, lo, hi + 1


def gather_rows(per_row: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """per_row (…, N, R): query i against table row r; idx (N, M): row for (i, j) -> (…, N, M)."""
    return per_row.gather(-1, idx.expand(*per_row.shape[:-2], *idx.shape))


def scatter_rows(probs: torch.Tensor, idx: torch.Tensor, n_rows: int) -> torch.Tensor:
    """probs (…, N, M), idx (N, M) -> (…, N, n_rows): Σ_{j : idx[i, j] = r} probs[…, i, j]."""
    out = probs.new_zeros(*probs.shape[:-1], n_rows)
    return out.scatter_add(-1, idx.expand(probs.shape), probs)
