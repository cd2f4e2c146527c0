"""bf16-mixed training beyond one chunk (Lightning's autocast around the model, issue 24).

Before the operators declared what autocast does to them, ``trainer.precision=bf16-mixed`` crashed at step 1
for every linear preset as soon as the context exceeded one chunk (64 tokens): the chunk kernel's matmuls were
re-cast to bfloat16 by autocast while its float32 states met them.  size=tiny has context 64, so these tests
raise the context."""
import math
from pathlib import Path

import pytest
import torch

from conftest import CONF

FAST = ["logger=none", "trainer.enable_progress_bar=false", "data.max_bytes=400000", "data.val_windows=2",
        "data.test_windows=2", "data.batch_size=2", "data.eval_batch_size=2", "test=false"]
LINEAR_PRESETS = sorted(p.stem for p in (CONF / "model").glob("linear*.yaml"))


def train_bf16(compose, *overrides, steps: int = 3) -> float:
    import train

    cfg = compose(*FAST, "trainer.precision=bf16-mixed", f"trainer.max_steps={steps}",
                  f"trainer.val_check_interval={steps}", *overrides)
    metric = train.main(cfg)
    assert metric is not None and math.isfinite(metric), metric
    c = torch.load(Path(cfg.paths.output_dir) / "checkpoints" / "last.ckpt", weights_only=True)
    assert c["global_step"] == steps
    assert all(v.dtype == torch.float32 and torch.isfinite(v).all()
               for v in c["state_dict"].values() if v.is_floating_point())
    return metric


@pytest.mark.parametrize("preset", ["linear_rope", "linear_cosine_rope"])
def test_bf16_mixed_trains_a_linear_model_beyond_one_chunk(compose, preset):
    # context 160: two whole chunks and a partial one
    metric = train_bf16(compose, f"model={preset}", "size=tiny", "context=160")
    assert metric < 9  # bits per byte of a barely trained model: finite and below 8 + a margin


def test_bf16_mixed_trains_softmax_rope_beyond_one_chunk(compose):
    assert train_bf16(compose, "model=softmax_rope", "size=tiny", "context=160") < 9


@pytest.mark.slow
@pytest.mark.parametrize("preset", LINEAR_PRESETS)
def test_bf16_mixed_trains_every_linear_preset_at_size_small(compose, preset):
    assert train_bf16(compose, f"model={preset}", "size=small", steps=2) < 9
