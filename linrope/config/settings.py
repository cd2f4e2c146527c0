"""linrope's own settings, each declared once with its type and range (``linrope.base.options``): the top level of
``conf/train.yaml``, the length-extrapolation table's, the Trainer keys linrope reads or bounds, and the
last-checkpoint callback's interval.  No torch: this is read before any check that needs it."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Annotated, Any, List, Literal, Optional, Union

from pydantic import Field

from linrope.base.options import OneOf, Positive


@dataclass
class TrainSettings:
    """The top level of ``conf/train.yaml``: linrope's own settings and the sections of its config groups
    (each section is checked by its component)."""

    task_name: str
    tags: Any
    seed: int
    train: bool
    test: bool
    ckpt_path: Optional[str]
    compile: bool
    optimized_metric: str
    retain_freed_memory: bool
    plan: Any  # PlanSettings, checked as its own section
    context: Positive
    extrapolation: Any
    model: Any
    data: Any
    optim: Any
    trainer: Any
    callbacks: Any
    logger: Any
    paths: Any


@dataclass
class ExtrapolationSettings:
    """The settings of a length-extrapolation table (``linrope.evaluation.extrapolation.length_table``): under
    ``extrapolation.`` in train.py's config, at the top of ``python -m linrope evaluate``'s.  Their values
    (the defaults) and what each means: ``conf/extrapolation/default.yaml``."""

    split: Literal["val", "test"]
    scored_bytes: Annotated[Optional[int], Field(ge=1, description="null: the whole split")]
    stride: Annotated[Optional[int], Field(ge=1, description="null: half the length")]
    protocols: Annotated[List[Literal["sliding", "windows"]], Field(min_length=1)]
    window_control: bool
    position_bucket: Annotated[Optional[int], Field(ge=1, description="null: a quarter of the training context")]
    task_examples: Positive
    batch_size: Positive
    max_score_mb: Annotated[float, Field(gt=0)]
    factors: Annotated[List[Annotated[float, Field(gt=0)]], Field(min_length=1)]
    scalings: Annotated[
        List[Literal["pi", "ntk", "yarn", "dynamic", "none"]], Field(description="[] for the model as trained only")
    ]


EXTRAPOLATION_SETTINGS = tuple(f.name for f in fields(ExtrapolationSettings))


@dataclass
class TrainExtrapolation(ExtrapolationSettings):
    """train.py's ``extrapolation.`` section: the table's settings, and whether to make it after testing."""

    enabled: bool


@dataclass
class PlanSettings:
    """train.py's ``plan.`` section (linrope.training.plan; values and meaning: conf/train.yaml)."""

    tokens_per_parameter: Annotated[Optional[float], Field(gt=0, description="null: trainer.max_steps as given")]
    measure_steps: Annotated[int, Field(ge=0)]


# torch.set_float32_matmul_precision's settings: highest (PyTorch's default: float32 products in float32), high
# (TF32 on NVIDIA GPUs since Ampere), medium (bfloat16 products too); null leaves the process's setting alone
MATMUL_PRECISIONS = ("highest", "high", "medium")


@dataclass
class TrainerSettings:
    """The ``trainer.`` keys linrope reads itself (``matmul_precision``, kept from Lightning:
    ``LINROPE_TRAINER_KEYS``) or bounds; the Trainer's other keys are its constructor's
    (``linrope.config.checks.trainer_option_errors``)."""

    max_steps: Annotated[int, Field(ge=-1, description="-1: no limit")]
    max_epochs: Annotated[Optional[int], Field(ge=-1, description="-1: no limit")]
    num_nodes: Positive
    matmul_precision: Annotated[
        Optional[str],
        OneOf(lambda: (*MATMUL_PRECISIONS, None)),
        Field(description="float32 matmuls; high: TF32 on GPUs"),
    ]
    log_every_n_steps: Positive
    val_check_interval: Annotated[
        Optional[Union[Positive, Annotated[float, Field(gt=0, le=1)], str]],
        Field(description="steps between validations, a fraction of an epoch, or a duration DD:HH:MM:SS"),
    ]
    accumulate_grad_batches: Positive
    gradient_clip_val: Annotated[Optional[float], Field(ge=0)]


LINROPE_TRAINER_KEYS = ("matmul_precision",)  # linrope's, not Lightning's: build_trainer removes them


@dataclass
class LastCheckpointSettings:
    """``callbacks.last_checkpoint.``: how often ``linrope.run.last_checkpoint.LastCheckpoint`` writes."""

    every_n_train_steps: Annotated[Optional[int], Field(ge=1, description="null: only after validation and at the end")]
