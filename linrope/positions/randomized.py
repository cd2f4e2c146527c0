"""Randomized positions (Ruoss et al. 2023): ``max_position`` (L), an option every scheme takes.

A forward of N tokens places them at ``sorted(torch.randperm(L)[:N])`` instead of ``0 … N-1``, drawn once per
forward by the input-role scheme (``PositionScheme.place``) and handed to the input scheme and every layer; the
span handed to the schemes (``open_memo``) is the host-known ``(0, L-1)``, so nothing is read back from the device.
N > L is ``SequenceTooLong`` (docs/schemes.md, "`randomized`").
"""

from __future__ import annotations

from typing import Annotated, List, Optional, Tuple

import torch
from pydantic import Field

from linrope.base.errors import SequenceTooLong

MaxPosition = Annotated[
    Optional[int],
    Field(ge=1, description="null: positions 0…N-1; else an ordered random subset of 0…max_position-1 every forward"),
]
RELEASE_MAX_POSITION = 2048  # the release's noise_max_length (experiments/example.py): conf/position/randomized.yaml
PAPER = (
    "Ruoss, Delétang, Genewein, Grau-Moya, Csordás, Bennani, Legg, Veness 2023, Randomized positional encodings "
    "boost length generalization of transformers"
)


def draw_positions(n: int, max_position: int, device=None, generator: Optional[torch.Generator] = None):
    """N distinct positions of ``0 … max_position-1``, uniformly without replacement, sorted: (N,) int64 on
    ``device``, from the torch RNG (``generator``, default the device's global one)."""
    if n > max_position:
        raise SequenceTooLong(
            f"randomized positions: {n} tokens cannot take distinct positions below max_position={max_position}; "
            f"raise model.position.max_position to at least {n}"
        )
    return torch.randperm(max_position, device=device, generator=generator)[:n].sort().values


def place_positions(
    n: int, max_position: int, device=None, *, offset: int = 0, continuing: bool = False
) -> Tuple[torch.Tensor, Tuple[int, int]]:
    """One forward's drawn positions and their span's host-known bound, ``(0, max_position-1)``."""
    if offset or continuing:
        raise ValueError(
            f"randomized positions (max_position={max_position}) are drawn for a whole sequence in one call; this "
            f"call continues one (offset={offset}{', carried states' if continuing else ''}), whose earlier "
            "positions were drawn in another: pass positions= explicitly (or generate by re-reading the sequence)"
        )
    return draw_positions(n, max_position, device), (0, max_position - 1)


def linear_problem(name: str, decays: bool, max_position: Optional[int]) -> Optional[str]:
    """Why linear attention cannot take ``name`` with randomized positions (None: it can)."""
    if max_position is None or not decays:
        return None
    return (
        f"attention=linear with position={name} and max_position={max_position} cannot work: the kernels' decay "
        "γ_h^(i-j) counts tokens, not positions, so it would not see the drawn positions; drop the decay or "
        "max_position"
    )


def table_problems(name: str, bounded: bool, max_position: Optional[int], max_len: int) -> List[str]:
    """A table of ``max_len`` rows cannot hold positions drawn up to ``max_position - 1``."""
    if max_position is None or not bounded or max_len >= max_position:
        return []
    return [
        f"model.position.max_position={max_position} draws positions up to {max_position - 1}, but the {name} "
        f"position table has model.max_len={max_len} rows; raise model.max_len to {max_position}"
    ]
