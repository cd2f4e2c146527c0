"""Every scheme added after the founding thirteen (issue 36) trains as its preset, at context 256 (beyond one
chunk of linear attention), in float32 and in bf16.

Fast: the preset's model (one layer), built from its composed config, takes 3 AdamW steps in plain torch, in float32 and
under CPU bf16 autocast; the loss is finite throughout and falls in float32.  Slow: the same 3 steps through
``train.py`` with Lightning's ``trainer.precision=32`` and ``bf16-mixed``, the checkpoint at step 3 with finite
float32 weights.  A new scheme's presets join ``LATER_PRESETS``."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from tests.helpers import CONF, model_config, tiny

# softmax_<scheme> (and linear_<scheme> where linear attention takes it) of each later scheme
LATER_PRESETS: list = [
    "softmax_randomized",
    "linear_randomized",
    "softmax_cope",
    "softmax_fire",
    "softmax_kerple",
    "softmax_kerple_power",
    "softmax_sandwich",
    "softmax_rope_partial",
    "linear_rope_partial",
    "softmax_xpos",
    "softmax_rope_yarn",
    "linear_rope_yarn",
]

CONTEXT = 256


def preset_model(preset: str) -> dict:
    return model_config(f"model={preset}", "size=tiny", "model.n_layers=1", f"context={CONTEXT}")


def test_every_later_preset_exists():
    missing = [p for p in LATER_PRESETS if not (CONF / "model" / f"{p}.yaml").is_file()]
    assert not missing, missing


@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16"])
@pytest.mark.parametrize("preset", LATER_PRESETS)
def test_preset_takes_three_steps(preset, bf16):
    from linrope.models.model import TransformerLM

    torch.manual_seed(0)
    model = TransformerLM(preset_model(preset))
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    x = torch.randint(0, 256, (1, CONTEXT + 1), generator=torch.Generator().manual_seed(1))
    losses = []
    for _ in range(3):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = model(x[:, :-1])
            loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), x[:, 1:].flatten())
        loss.backward()
        assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None), preset
        opt.step()
        losses.append(loss.item())
    assert all(math.isfinite(v) for v in losses), losses
    if not bf16:  # the same batch three times: float32 must learn it
        assert losses[-1] < losses[0], losses


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["32", "bf16-mixed"])
@pytest.mark.parametrize("preset", LATER_PRESETS)
def test_preset_trains_three_steps_through_train_py(compose, preset, precision):
    import train

    cfg = compose(
        *tiny(
            f"model={preset}", f"context={CONTEXT}", "data.batch_size=2", "data.eval_batch_size=2", "data.val_windows=2"
        ),
        "test=false",
        f"trainer.precision={precision}",
        "trainer.max_steps=3",
        "trainer.val_check_interval=3",
    )
    metric = train.main(cfg)
    assert metric is not None and math.isfinite(metric), metric
    ckpt = torch.load(Path(cfg.paths.output_dir) / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["global_step"] == 3
    weights = [v for v in ckpt["state_dict"].values() if v.is_floating_point()]
    assert weights and all(v.dtype == torch.float32 and torch.isfinite(v).all() for v in weights)
