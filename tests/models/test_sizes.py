"""Research sizes (issue 35): size=125m and size=350m are GPT-2 small and medium, their parameter counts within 5%
of their names, counted on the meta device; model FLOPs per token (linrope.models.flops) against the formula
written out by hand; the start-up summary carries them."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from linrope.models.flops import flops_per_token, parameter_counts
from linrope.models.model import TransformerLM
from tests.helpers import model_config


@pytest.mark.parametrize("size,named", [("125m", 125e6), ("350m", 350e6)])
@pytest.mark.parametrize("preset", ["softmax_none", "softmax_learned", "linear_rope"])
def test_research_sizes_have_the_parameters_their_names_say(size, named, preset):
    cfg = model_config(f"model={preset}", f"size={size}")
    assert cfg["vocab_size"] == 50257 and cfg["tie_weights"]
    counts = parameter_counts(cfg)
    assert abs(counts.total - named) / named < 0.05, (size, preset, counts.total)
    # GPT-2's own counts: 124,439,808 (small) and 354,823,168 (medium) with its learned table and biased projections
    assert counts.embedding >= 50257 * cfg["d_model"]


def test_parameter_counts_match_a_real_model():
    cfg = model_config("model=softmax_learned", "size=tiny")
    torch.manual_seed(0)
    model = TransformerLM(cfg)
    counts = parameter_counts(cfg)
    assert counts.total == sum(p.numel() for p in model.parameters())
    table = sum(p.numel() for p in model.pos.parameters())  # the learned position table, at the input
    assert table == cfg["max_len"] * cfg["d_model"]
    assert counts.embedding == model.embed.weight.numel() + table
    assert counts.matmul == sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))


@pytest.mark.parametrize("kind", ["softmax", "linear"])
def test_flops_per_token_is_the_formula_written_out(kind):
    """6 FLOPs per matmul weight (the tied head counted: it multiplies) and 3 × the attention's own forward products:
    softmax 4·T·d per layer (q·k and a·v over T keys), linear 4·D'·(d_h + 1) per head (state update and read)."""
    preset = "softmax_none" if kind == "softmax" else "linear_rope"
    cfg = model_config(f"model={preset}", "size=small")
    L, d, H, ff, V = cfg["n_layers"], cfg["d_model"], cfg["n_heads"], cfg["d_ff"], cfg["vocab_size"]
    per_layer = 4 * d * d + 2 * d * ff  # q, k, v, out; up, down
    weights = 6 * (L * per_layer + V * d)
    for T in (64, 1024):
        attention = 3 * L * (4 * T * d if kind == "softmax" else H * 4 * (d // H) * (d // H + 1))
        assert flops_per_token(cfg, T) == {"weights": weights, "attention": attention, "total": weights + attention}
    window = model_config(f"model={preset}", "size=small", "+model.attention.window=32")
    if kind == "softmax":  # a window of 32 keys costs 32 keys at any context
        assert flops_per_token(window, 1024)["attention"] == 3 * L * 4 * 32 * d
    with pytest.raises(ValueError, match="context must be >= 1"):
        flops_per_token(cfg, 0)


def test_a_linear_model_costs_the_same_per_token_at_any_context_and_softmax_grows():
    lin, soft = model_config("model=linear_rope", "size=125m"), model_config("model=softmax_rope", "size=125m")
    assert flops_per_token(lin, 1024) == flops_per_token(lin, 16384)
    grow = flops_per_token(soft, 16384)["total"] / flops_per_token(soft, 1024)["total"]
    assert grow > 2, grow
    # at context 1024 GPT-2 small's attention is ~13% of its training FLOPs (PaLM's 6N + 12·L·d·T)
    f = flops_per_token(soft, 1024)
    assert math.isclose(f["attention"] / f["total"], 12 * 12 * 768 * 1024 / f["total"], rel_tol=1e-12)
    assert 0.1 < f["attention"] / f["total"] < 0.16


@pytest.mark.slow
@pytest.mark.parametrize("size", ["125m", "350m"])
def test_a_research_size_trains_on_the_cpu_and_logs_its_throughput(compose, size):
    """Two optimizer steps at context 64, batch 1 (the second is timed): the loss is finite and the CSV log has
    tokens/s and MFU (against the CPU's nominal peak)."""
    import csv
    from pathlib import Path

    from tests.helpers import run_main, tiny

    cfg = compose(
        *tiny(
            f"size={size}",
            "model=linear_rope",
            "logger=csv",
            "context=64",
            "data.batch_size=1",
            "data.eval_batch_size=1",
            "data.val_windows=1",
        ),  # fmt: skip
        "test=false",
        "trainer.max_steps=2",
        "trainer.val_check_interval=2",
        "trainer.log_every_n_steps=1",
        "+trainer.enable_checkpointing=false",
    )
    assert math.isfinite(run_main(cfg))
    rows = list(csv.DictReader(open(Path(cfg.paths.output_dir, "csv", "metrics.csv"))))
    timed = [r for r in rows if r.get("train/mfu")]
    assert timed and all(float(r["train/tokens_per_sec"]) > 0 and 0 < float(r["train/mfu"]) < 1 for r in timed)
