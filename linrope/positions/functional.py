"""The pure functions position schemes share: distances, tables, buckets, slopes.

Every scheme module imports its helpers from here (and its interface from ``base``),
never from a sibling scheme.

Table-row lookups (shaw, xl, deberta): a relative scheme scores each query against a
small table of per-distance rows (``q @ table.T``: (…, N, R)) and then needs, for every
(query i, key j), the row ``idx[i, j]`` of that table: a ``gather`` with an (N, N)
index, never an (N, N, d) tensor and never a loop over positions.  The value side
(shaw) is the transpose: ``scatter_add`` the probabilities into their rows, then
``@ table``.
"""

from __future__ import annotations

import math
from typing import List, Tuple

import torch

from linrope.base.errors import SequenceTooLong


def relative_distance(positions: torch.Tensor) -> torch.Tensor:
    """(N, N) matrix of ``j - i`` (key position minus query position), as in T5's code; (B, N, N) for (B, N)."""
    return positions[..., None, :] - positions[..., :, None]


def position_span(positions: torch.Tensor) -> Tuple[int, int]:
    """(smallest, largest) position of a tensor of positions, read from the device in one go (a host sync:
    for positions a caller hands in; a model's own are known on the host, ``PositionScheme.span``).  An empty
    tensor spans nothing: (0, -1)."""
    if not positions.numel():
        return 0, -1
    first, last = torch.stack([positions.min(), positions.max()]).tolist()
    return int(first), int(last)


def check_table_positions(
    span: Tuple[int, int], max_len: int, table: str, remedy: str = "use a relative scheme for longer sequences"
) -> None:
    """One line if a position of ``span`` (smallest, largest; Python ints) falls outside a table of ``max_len``
    rows (learned, tupe, multiplicative)."""
    bottom, top = span
    if top < bottom:  # no positions
        return
    if top >= max_len or bottom < 0:
        raise SequenceTooLong(
            f"{table} position table has {max_len} rows (positions 0..{max_len - 1}) but position "
            f"{top if top >= max_len else bottom} was asked for; raise model max_len or {remedy}"
        )


def sinusoidal_table(positions: torch.Tensor, dim: int, base: float = 10000.0) -> torch.Tensor:
    """p_{i,2t} = sin(i / base^(2t/D)), p_{i,2t+1} = cos(i / base^(2t/D)); (N, D) float32, computed in float64
    ((B, N, D) for (B, N) positions)."""
    t = torch.arange(0, dim, 2, dtype=torch.float64, device=positions.device)
    angles = positions.to(torch.float64)[..., None] / base ** (t / dim)
    table = torch.zeros(*positions.shape, dim, dtype=torch.float64, device=positions.device)
    table[..., 0::2] = angles.sin()
    table[..., 1::2] = angles.cos()[..., : dim // 2]
    return table.float()


def t5_bucket_problem(*, bidirectional: bool, num_buckets: int, max_distance: int) -> str:
    """One line if T5's buckets are not defined for these options ("" if they are): each half (bidirectional) or the
    one side needs an exact bucket, and ``max_distance`` beyond the exact ones (else the log-spaced buckets divide by
    log(<= 1): negative buckets that wrap to the table's last rows, or a division by zero)."""
    side = num_buckets // 2 if bidirectional else num_buckets
    exact = side // 2
    how = "bidirectional, so each direction has num_buckets/2" if bidirectional else "one-sided"
    if exact < 1:
        return f"num_buckets={num_buckets} is too few ({how}): at least {4 if bidirectional else 2}"
    if max_distance <= exact:
        return (
            f"max_distance={max_distance} must exceed the {exact} exact buckets ({how}: num_buckets={num_buckets}); "
            "the log-spaced buckets run from there to max_distance"
        )
    return ""


def t5_bucket(
    relative_position: torch.Tensor, *, bidirectional: bool = True, num_buckets: int = 32, max_distance: int = 128
) -> torch.Tensor:
    """T5's bucket of ``relative_position = j - i`` (key minus query), an integer tensor of any shape.

    Bidirectional: keys ahead (j > i) use buckets num_buckets/2 …; one-sided: keys ahead fall in bucket 0.
    Within a half of nb buckets: distances < nb/2 exact, then log-spaced up to max_distance, clipped at nb-1.
    The log is taken in float32, as the published implementation does (the published mapping depends on it)."""
    problem = t5_bucket_problem(bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance)
    if problem:
        raise ValueError(problem)
    n = -relative_position.long()  # how far the key is behind the query
    ret = torch.zeros_like(n)
    if bidirectional:
        num_buckets //= 2
        ret = ret + (n < 0).long() * num_buckets
        n = n.abs()
    else:
        n = n.clamp_min(0)
    max_exact = num_buckets // 2
    # float32, in the published order of operations (n = 0 never reaches this branch; clamped for the log)
    log_part = (
        torch.log(n.clamp_min(1).float() / max_exact) / math.log(max_distance / max_exact) * (num_buckets - max_exact)
    )
    large = (max_exact + log_part.long()).clamp_max(num_buckets - 1)
    return ret + torch.where(n < max_exact, n, large)


def _geometric(n: int) -> List[float]:
    start = 2.0 ** (-8.0 / n)
    return [start ** (h + 1) for h in range(n)]


def alibi_slopes(n_heads: int) -> torch.Tensor:
    """Head slopes m_h (float64, (H,)): 2^(-8/H), 2^(-16/H), … for H a power of two; otherwise the
    slopes of the closest power of two below, c, then every other slope of 2c (the paper's rule)."""
    if n_heads < 1:
        raise ValueError(f"alibi needs at least one head; got {n_heads}")
    if n_heads & (n_heads - 1) == 0:
        return torch.tensor(_geometric(n_heads), dtype=torch.float64)
    c = 2 ** int(math.floor(math.log2(n_heads)))
    return torch.tensor(_geometric(c) + _geometric(2 * c)[0::2][: n_heads - c], dtype=torch.float64)


# the per-head decays a scheme may add (RoPE's ``decay`` option): γ_h, and the rate -log γ_h of the score bias
DECAYS = ("retnet", "alibi")


def decay_gamma_rate(kind: str, n_heads: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """(γ_h, -log γ_h), float64 (H,) each: ``retnet`` γ_h = 1 - 2^(-5-h) (Sun et al. 2023, RetNet's retention,
    h = 0 … H-1), exact in float64, its rate -log1p(-2^(-5-h)); ``alibi`` the rate m_h of ALiBi's slopes and
    γ_h = exp(-m_h), as linear attention takes ALiBi."""
    if kind == "retnet":
        step = torch.tensor([2.0 ** (-5 - h) for h in range(n_heads)], dtype=torch.float64)
        return 1.0 - step, -torch.log1p(-step)
    if kind == "alibi":
        rate = alibi_slopes(n_heads)
        return torch.exp(-rate), rate
    raise ValueError(f"unknown decay {kind!r}; expected one of {', '.join(DECAYS)}")


def distance_bias(rates: torch.Tensor, positions: torch.Tensor, dtype) -> torch.Tensor:
    """(1, H, N, N) score bias -rate_h·|i - j|: float64 products (exact distances) rounded once to ``dtype``; head
    by head, so the float64 temporary is one (N, N), and nothing is read back to size a table (no host sync).
    ALiBi's bias (rates m_h), and RoPE's with a decay (rates -log γ_h: the decay's weight γ_h^(i-j) moved onto the
    scores as its log)."""
    dist = relative_distance(positions).abs()
    n = dist.shape[0]
    bias = torch.empty(1, rates.shape[0], n, n, dtype=dtype, device=dist.device)
    for h in range(rates.shape[0]):
        bias[0, h].copy_(-(dist * rates[h]))
    return bias


def used_rows(idx: torch.Tensor, lo: int, hi: int) -> Tuple[torch.Tensor, int, int]:
    """Restrict a table-row index matrix to the rows ``lo … hi - 1`` it uses: (idx - lo, lo, hi).

    A window of N positions uses at most 2N-1 distances, often far fewer rows than the table holds, so the
    per-row scores stay (…, N, ≤2N-1).  ``lo`` and ``hi`` come from the span of the positions (Python ints:
    the extreme distances are ±(last - first)), never from reading ``idx`` (a host sync per layer)."""
    return idx - lo, lo, hi


def clipped_rows(span: Tuple[int, int], low: int, high: int) -> Tuple[int, int]:
    """The rows ``lo … hi - 1`` of a table indexed by ``clip(i - j, low, high) - low`` that positions of
    ``span`` use: i - j runs over ±(last - first)."""
    far = max(span[1] - span[0], 0)
    return min(max(-far, low), high) - low, min(max(far, low), high) - low + 1


def gather_rows(per_row: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """per_row (…, N, R): query i against table row r; idx (N, M): row for (i, j) -> (…, N, M)."""
    return per_row.gather(-1, idx.expand(*per_row.shape[:-2], *idx.shape))


def scatter_rows(probs: torch.Tensor, idx: torch.Tensor, n_rows: int) -> torch.Tensor:
    """probs (…, N, M), idx (N, M) -> (…, N, n_rows): Σ_{j : idx[i, j] = r} probs[…, i, j]."""
    out = probs.new_zeros(*probs.shape[:-1], n_rows)
    return out.scatter_add(-1, idx.expand(probs.shape), probs)
