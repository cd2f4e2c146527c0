"""The optimiser's settings (conf/optim/adamw.yaml), declared once with their types and ranges.

``linrope.training.lit.LanguageModel.configure_optimizers`` reads them (AdamW, linear warm-up, cosine decay) and has
no defaults of its own: conf/optim/adamw.yaml gives their values; ``linrope.config.checks.validate`` checks them
here, before any data is read.  Light: no torch."""

from __future__ import annotations

from dataclasses import MISSING, dataclass, fields
from typing import Annotated, Any, List, Mapping, Optional, Tuple

from pydantic import Field

from linrope.base.options import declared
from linrope.base.options import option_errors as declared_errors

Beta = Annotated[float, Field(ge=0, lt=1)]


@dataclass
class AdamW:
    lr: Annotated[float, Field(gt=0)]
    betas: Tuple[Beta, Beta]
    weight_decay: Annotated[float, Field(ge=0)]
    warmup_steps: Annotated[int, Field(ge=0)]
    min_lr_ratio: Annotated[float, Field(ge=0, le=1)]
    schedule_steps: Annotated[Optional[int], Field(ge=1, description="null: trainer.max_steps")] = None


REQUIRED = tuple(f.name for f in fields(AdamW) if f.default is MISSING)  # what conf/optim/adamw.yaml must give


def option_errors(optim: Mapping[str, Any], where: str = "optim") -> List[str]:
    """One line per setting the optimiser does not take (naming the nearest it does) or whose value it
    refuses."""
    return declared_errors(declared(AdamW), optim, where)
