"""Packed documents: linear attention whose state resets at every document boundary.

A packed row holds several documents one after another; ``documents`` (B, N) gives each position's document
id, non-decreasing along a row (equal ids: one document).  With it every form computes, for query i of a
document that starts at s,

    o_i = Σ_{s≤j≤i} w^num_ij v_j / (Σ_{s≤j≤i} w^den_ij + eps)

exactly what the document gives when run alone: the state is zero where a document starts.  An initial state
(S0, z0) continues the row's first document; the final state is that of its last.  RoPE rotates by the
row's own positions: inside one document q_i·k_j depends on i - j only, so the rotation needs no reset.

How each form does it (docs/mathematics.md, "Packed documents"):

  * naive:     the N×N weights times ``same_document`` (B, 1, N, N);
  * recurrent: the state is multiplied by 0 at a position whose id differs from the previous one;
  * chunk:     every table of ``tables.Chunks`` carries the ids (``ChunkDocuments``): the intra-chunk mask
               by ids, a query reads the state entering its chunk only if no boundary lies before it in the
               chunk, a key enters its chunk's summary only if no boundary lies after it, and the state is
               carried across a chunk only if the chunk holds no boundary.  Only comparisons of ids: exact,
               no difference of prefix sums (which would cancel in float32);
  * window:    the (W, 2W) band of each block times the same mask;
  * fla:       the rows flattened into fla's variable-length batch, ``cu_seqlens`` at every document's start
               (``fla_backend.varlen``).

``causal=False``: every key of the query's document, on both sides: the naive form's mask without the triangle;
every other form two causal passes, forward and reversed (``both_ways.py``).

Every test below compares ids for equality, never their order, so a flipped row (the reverse scans of the
backward) is handled by the same code.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor


def check_documents(documents, q: Tensor, causal: bool) -> Optional[Tensor]:
    """``documents`` as a (B, N) integer tensor on q's device, or None; one line naming what is wrong."""
    if documents is None:
        return None
    if not torch.is_tensor(documents) or documents.dtype.is_floating_point or documents.dtype == torch.bool:
        raise ValueError(f"documents must be an integer tensor of document ids (B, N); got {documents!r:.60}")
    B, _, N, _ = q.shape
    if tuple(documents.shape) != (B, N):
        raise ValueError(f"documents must have shape (B, N) = {(B, N)}; got {tuple(documents.shape)}")
    documents = documents.to(device=q.device, dtype=torch.long)
    # the forms differ on a row whose ids go down (naive masks by equal ids, the others reset at every change):
    # refused, without waiting for a device (as common.check_decay_range)
    ok = (documents[:, 1:] >= documents[:, :-1]).all()
    if documents.device.type == "cpu" and not torch.compiler.is_compiling():
        if not bool(ok):
            raise ValueError(DECREASING)
    else:
        torch._assert_async(ok, DECREASING)
    return documents


DECREASING = "documents must be non-decreasing along each row (the ids of packed documents, one after another)"


def same_document(dq: Tensor, dk: Tensor) -> Tensor:
    """(B, n), (B, m) ids -> (B, 1, n, m) bool: query and key in one document."""
    return (dq[:, :, None] == dk[:, None, :]).unsqueeze(1)


def continues(documents: Tensor, prev: Optional[Tensor] = None) -> Tensor:
    """(B, N) bool: position t is in the document of position t-1 (position 0: of ``prev``, (B,), the id
    before the row; None: the row's first document continues whatever came before, the initial state)."""
    before = documents[:, :1] if prev is None else prev[:, None]
    return documents == torch.cat((before, documents[:, :-1]), dim=1)


class ChunkDocuments:
    """The ids of one block of the chunk form, cut into its chunks: the masks the chunk tables multiply by.

    ``ids`` (B, n) the block's ids, ``prev`` (B,) the id of the position before the block (the row's first
    id for the first block).  With C the chunk size and nc chunks (the last zero-padded, its ids padded with
    the last id):

        same[b, c, t, s]  = ids_t == ids_s                       (B, 1, nc, C, C)
        keep_q[b, c, t]   = ids_t == id before chunk c          (B, 1, nc, C, 1): reads the entering state
        keep_k[b, c, t]   = ids_t == id at chunk c's end         (B, 1, nc, C, 1): enters the chunk's summary
        carry[b, c]       = id at chunk c's end == id before c    (B, 1, nc): the state crosses chunk c
    """

    def __init__(self, ids: Tensor, prev: Optional[Tensor], n: int, C: int, nc: int, dtype):
        self.ids, self.prev = ids, (ids[:, 0] if prev is None else prev)
        pad = nc * C - n
        padded = torch.cat((ids, ids[:, -1:].expand(-1, pad)), dim=1) if pad else ids
        chunks = padded.reshape(ids.shape[0], nc, C)
        before = torch.cat((self.prev[:, None], chunks[:, :-1, -1]), dim=1)  # (B, nc)
        end = chunks[:, :, -1]
        self.same = (chunks[:, :, :, None] == chunks[:, :, None, :]).unsqueeze(1).to(dtype)
        self.keep_q = (chunks == before[:, :, None]).to(dtype)[:, None, :, :, None]
        self.keep_k = (chunks == end[:, :, None]).to(dtype)[:, None, :, :, None]
        self.carry = (end == before).to(dtype)[:, None]
        # cumulative counts of chunks that hold a boundary: chunks j…c-1 hold none iff two counts are equal
        self.cuts = (end != before).cumsum(1)  # (B, nc)

    def flipped(self, n: int, C: int, nc: int, dtype) -> "ChunkDocuments":
        """The ids of the block read backwards (the reverse prefix sums of the backward pass)."""
        return ChunkDocuments(self.ids.flip(1), None, n, C, nc, dtype)

    def first_continues(self) -> Tensor:
        """(B,) bool: the block's first position continues the document before it."""
        return self.ids[:, 0] == self.prev


__all__ = ["check_documents", "same_document", "continues", "ChunkDocuments"]
