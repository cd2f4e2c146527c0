"""The compute plan (linrope.training.plan, experiment=scale): trainer.max_steps from tokens per parameter, the
timed steps leave the model and every random stream as they were, and the scale recipe composes."""

from __future__ import annotations

import math
import types

import pytest
import torch

from linrope.models.flops import parameter_counts
from linrope.models.model import TransformerLM
from linrope.training.plan import apply_plan, measure, tokens_per_step


def test_tokens_per_parameter_sets_the_steps(compose, capsys):
    cfg = compose("model=linear_rope", "size=tiny", "plan.tokens_per_parameter=2", "data.batch_size=3",
                  "+trainer.accumulate_grad_batches=2")  # fmt: skip
    module = types.SimpleNamespace(model=TransformerLM(dict(cfg.model)))
    plan = apply_plan(cfg, module)
    params = parameter_counts(dict(cfg.model)).total
    assert tokens_per_step(cfg) == 3 * 64 * 2
    assert cfg.trainer.max_steps == plan.steps == math.ceil(2 * params / (3 * 64 * 2))
    out = capsys.readouterr().out
    assert f"{plan.steps:,} steps x 384 tokens" in out and "2.0 per parameter" in out
    assert apply_plan(compose("model=linear_rope", "size=tiny"), module) is None  # nothing asked: nothing done


def test_the_timed_steps_leave_the_model_and_random_streams_alone(compose):
    cfg = compose("model=softmax_rope", "size=tiny", "data.batch_size=2", "context=32", "model.dropout=0.1")
    torch.manual_seed(0)
    model = TransformerLM(dict(cfg.model))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    seconds = measure(model, cfg, 2, torch.device("cpu"))
    assert seconds > 0 and torch.equal(torch.rand(3), expected)  # dropout's draws were put back
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())


def test_the_scale_recipe_plans_gpt2_small_at_twenty_tokens_per_parameter(compose, capsys):
    from linrope.config.checks import validate

    cfg = compose("experiment=scale", "model=linear_rope", "trainer=cpu", "plan.measure_steps=0")
    validate(cfg)
    assert cfg.context == 1024 and cfg.model.d_model == 768 and cfg.compile
    from linrope.models.spec import ModelConfig

    # without timed steps the plan reads the model's config only (counted on the meta device): no 124M model built
    module = types.SimpleNamespace(model=types.SimpleNamespace(cfg=ModelConfig.from_dict(dict(cfg.model))))
    plan = apply_plan(cfg, module)
    assert plan.steps == math.ceil(20 * parameter_counts(dict(cfg.model)).total / (32 * 1024))
    assert 70_000 < plan.steps < 80_000


def test_a_max_steps_given_wins_over_the_recipe_and_the_plan_says_which(compose, capsys):
    """experiment=scale sets the steps from the model's size; trainer.max_steps on the command line wins, and the
    plan says where its steps came from either way."""
    from linrope.models.spec import ModelConfig

    cfg = compose("experiment=scale", "model=linear_rope", "trainer=cpu", "size=tiny", "plan.measure_steps=0")
    module = types.SimpleNamespace(model=types.SimpleNamespace(cfg=ModelConfig.from_dict(dict(cfg.model))))
    recipe = math.ceil(20 * parameter_counts(dict(cfg.model)).total / (32 * cfg.context))
    assert apply_plan(cfg, module, overrides=["size=tiny"]).steps == recipe == cfg.trainer.max_steps
    assert f"plan: trainer.max_steps={recipe:,} from plan.tokens_per_parameter=20 (was 500);" in capsys.readouterr().out
    given = compose("experiment=scale", "model=linear_rope", "trainer=cpu", "size=tiny", "plan.measure_steps=0",
                    "trainer.max_steps=20")  # fmt: skip
    assert apply_plan(given, module, overrides=["trainer.max_steps=20"]).steps == 20 == given.trainer.max_steps
    out = capsys.readouterr().out
    assert f"plan: trainer.max_steps=20 as given (plan.tokens_per_parameter=20 would make it {recipe:,})" in out
    assert "20 steps x" in out


def test_a_refused_run_leaves_no_empty_folders_behind(tmp_path):
    """experiment=scale as README gives it, on a machine without a GPU: one line, and neither the run folder nor
    the logs/scale/runs folders Hydra made for it are left."""
    import os
    import subprocess
    import sys

    from tests.helpers import ROOT

    if torch.cuda.is_available():
        pytest.skip("the refusal needs a machine without CUDA")
    (tmp_path / "kept").mkdir()
    r = subprocess.run(
        [sys.executable, str(ROOT / "train.py"), "experiment=scale", "logger=none"],
        capture_output=True, text=True, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120,
    )  # fmt: skip
    assert r.returncode == 1 and r.stderr.strip().splitlines()[-1].startswith("linrope: trainer.accelerator=gpu")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept"]
