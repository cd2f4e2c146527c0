"""The optimiser's settings (conf/optim/adamw.yaml): which it takes and their allowed values.

``linrope.training.lit.LanguageModel.configure_optimizers`` reads them (AdamW, linear warm-up, cosine decay) and has
no defaults of its own; ``linrope.config.checks.validate`` checks them here, before any data is read.  Light: no
torch."""
from __future__ import annotations

from typing import Any, List, Mapping

from linrope.base.errors import UnknownOption
from linrope.base.options import Rule, value_errors

REQUIRED = ("lr", "betas", "weight_decay", "warmup_steps", "min_lr_ratio")  # conf/optim/adamw.yaml
RULES = {"lr": Rule("number", above=0), "weight_decay": Rule("number", low=0), "warmup_steps": Rule("int", low=0),
         "min_lr_ratio": Rule("number", low=0, high=1),
         "schedule_steps": Rule("int", low=1, null=True, note="null: trainer.max_steps")}
SETTINGS = (*REQUIRED, "schedule_steps")


def option_errors(optim: Mapping[str, Any], where: str = "optim") -> List[str]:
    """One line per setting the optimiser does not take (naming the nearest it does) or whose value it
    refuses."""
    unknown = [str(UnknownOption(f"{where}.{k}", SETTINGS)) for k in optim if k not in SETTINGS]
    if unknown:
        return unknown
    errors = value_errors(optim, RULES, where)
    betas = optim.get("betas")
    if betas is not None and not (isinstance(betas, (list, tuple)) and len(betas) == 2 and all(
            isinstance(b, (int, float)) and not isinstance(b, bool) and 0 <= b < 1 for b in betas)):
        errors.append(f"{where}.betas={list(betas) if isinstance(betas, (list, tuple)) else betas}: "
                      f"expected two numbers in [0, 1)")
    return errors
