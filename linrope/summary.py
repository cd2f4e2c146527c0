"""The model summary printed when training starts, without Lightning's FLOPs column: FLOPs are counted
only from an example input, which a language model over variable lengths does not declare, so the
column and its total would read 0."""
from __future__ import annotations

import logging
from typing import Any, Dict, List, Tuple

from lightning.pytorch.callbacks import ModelSummary
from lightning.pytorch.utilities.model_summary.model_summary import get_formatted_model_size, get_human_readable_count

log = logging.getLogger("lightning.pytorch.callbacks.model_summary")  # shown where Lightning shows its own


class ParamSummary(ModelSummary):
    """Layers, parameters and size, as Lightning's summary prints them, minus FLOPs."""

    @staticmethod
    def summarize(summary_data: List[Tuple[str, List[str]]], total_parameters: int, trainable_parameters: int,
                  model_size: float, total_training_modes: Dict[str, int], total_flops: int = 0,
                  **summarize_kwargs: Any) -> None:
        cols = [(name, [str(v) for v in values]) for name, values in summary_data if name != "FLOPs"]
        widths = [max([len(name)] + [len(v) for v in values]) for name, values in cols]
        rows = [" | ".join(name.ljust(w) for (name, _), w in zip(cols, widths))]
        rows.append("-" * len(rows[0]))
        for i in range(len(cols[0][1]) if cols else 0):
            rows.append(" | ".join(values[i].ljust(w) for (_, values), w in zip(cols, widths)))
        rows.append(f"{get_human_readable_count(trainable_parameters)} trainable parameters of "
                    f"{get_human_readable_count(total_parameters)}, "
                    f"{get_formatted_model_size(model_size)} MB")
        log.info("\n" + "\n".join(rows))
