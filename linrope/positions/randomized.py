"""Randomized positions (Ruoss et al. 2023, *Randomized Positional Encodings Boost Length Generalization of
Transformers*): an option every scheme takes, ``max_position`` (L).

Set, a forward of N tokens does not place them at ``0 … N-1`` but at an ordered random subset of
``0 … L-1``: N distinct positions drawn uniformly without replacement, sorted.  The base scheme then encodes
those positions exactly as it encodes any others (a table row, a sinusoid, a rotation, a distance).  A model
trained at N < L has then seen every position, and every distance, up to L-1, so a longer sequence (up to L)
at test brings none it has not seen.

How (docs/schemes.md, ``randomized``, has the sources and every difference from the release):

* drawn once per forward, by the model's input-role scheme (``PositionScheme.place``), and handed to the input
  scheme and every layer: one set of positions per forward, shared by the batch (the release draws one set
  per call, broadcast over the batch);
* drawn in training and in evaluation alike (the release applies the same draw whenever the model runs);
* with the torch RNG (``torch.randperm`` on the model's device): a seeded run draws the same positions;
* the span handed to the schemes (``open_memo``) is the bound ``(0, L-1)``, known on the host: nothing is read
  back from the device.

Refused, each in one line: N > L (no N distinct positions below L: ``SequenceTooLong``, which the extrapolation
reports as an n/a row); a call that continues a sequence (``offset`` or carried states: linear attention's
generation step), whose earlier positions were drawn in another call; a table of ``max_len`` rows shorter than
L (``learned``, ``tupe``, ``multiplicative`` with ``table: learned``); a decay γ_h^(i-j) under linear
attention (ALiBi, RoPE with ``decay``), which the kernels count in tokens, not in positions.
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
