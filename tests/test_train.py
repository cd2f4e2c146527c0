"""The real Hydra configs compose, every model config trains (fast_dev_run), the LM learns,
and bad configs stop early with one line."""
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import CONF, ROOT

MODEL_CONFIGS = sorted(p.stem for p in (CONF / "model").glob("*.yaml"))
TINY = ["size=tiny", "logger=none", "trainer.enable_progress_bar=false", "data.max_bytes=400000",
        "data.val_windows=4", "data.test_windows=4", "data.batch_size=4", "data.eval_batch_size=4"]


def run_main(cfg):
    import train

    return train.main(cfg)


def test_model_configs_exist():
    assert {"linear_rope", "linear", "linear_cosine_rope", "softmax", "softmax_rope"} <= set(MODEL_CONFIGS)


@pytest.mark.parametrize("name", MODEL_CONFIGS)
def test_every_model_config_trains_fast_dev_run(compose, name):
    cfg = compose(f"model={name}", *TINY, "+trainer.fast_dev_run=2")
    assert cfg.model.name == name
    metric = run_main(cfg)
    # fast_dev_run runs one validation batch: val/bpb exists and is a sane number of bits
    assert metric is not None and 0.0 < metric < 12.0


def test_default_config_is_linear_rope(compose):
    cfg = compose()
    assert cfg.model.name == "linear_rope"
    assert cfg.model.attention.kind == "linear" and cfg.model.attention.placement == "numerator"
    assert cfg.model.position.name == "rope" and cfg.model.max_len == cfg.context == cfg.data.context


def test_lm_loss_falls(small_corpus):
    """A few dozen steps on a small corpus: the next-byte loss falls well below its start."""
    from linrope.data.bytes import RandomWindows, load_corpus
    from linrope.model import TransformerLM

    torch.manual_seed(0)
    data = load_corpus(str(small_corpus), context=64)["train"]
    ds = RandomWindows(data, 64, seed=0, length=16 * 40)
    for attention, position in [({"kind": "linear", "impl": "naive"}, {"name": "rope"}),
                                ({"kind": "softmax"}, {"name": "rope"})]:
        model = TransformerLM(dict(d_model=64, n_heads=4, n_layers=2, d_ff=128, max_len=64,
                                   attention=attention, position=position))
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        losses = []
        for step in range(40):
            batch = [ds[step * 16 + i] for i in range(16)]
            x, y = torch.stack([b[0] for b in batch]), torch.stack([b[1] for b in batch])
            loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        assert losses[0] > math.log(256) - 0.5  # starts near a uniform guess
        assert sum(losses[-5:]) / 5 < 0.7 * losses[0], (attention, losses)


def test_short_training_run_improves_val_bpb(compose, small_corpus):
    tiny_csv = [o if o != "logger=none" else "logger=csv" for o in TINY]
    cfg = compose("model=linear_rope", *tiny_csv, f"data.path={small_corpus}", "trainer.max_steps=30",
                  "trainer.val_check_interval=30", "optim.warmup_steps=5", "trainer.log_every_n_steps=5")
    best = run_main(cfg)
    assert best < 6.0  # well below 8 bits of a uniform guess after 30 steps
    ckpts = list(Path(cfg.paths.output_dir, "checkpoints").glob("*.ckpt"))
    assert any(p.name == "last.ckpt" for p in ckpts) and any(p.name.startswith("best") for p in ckpts)
    # the CSV log has the metrics a comparison needs
    import csv

    rows = list(csv.DictReader(open(Path(cfg.paths.output_dir, "csv", "metrics.csv"))))
    logged = {k for r in rows for k, v in r.items() if v not in ("", None)}
    assert {"train/loss", "val/loss", "val/bpb", "test/bpb", "train/tokens_per_sec", "train/peak_mem_mb"} <= logged
    assert any(k.startswith("lr") for k in logged)  # the learning-rate monitor
    assert all(float(r["train/peak_mem_mb"]) > 10 for r in rows if r.get("train/peak_mem_mb"))


@pytest.mark.parametrize("overrides,message", [
    (["model=linear", "position=alibi_nonexistent"], "position=alibi_nonexistent: no such option"),
    (["model=linear", "position=t5"], "attention=linear with position=t5 cannot work"),
    (["trainer.devices=4096"], "trainer.devices=4096 but only"),
    (["data.path=/nonexistent/corpus"], "data.path /nonexistent/corpus: does not exist"),
    (["model.n_heads=8", "model.d_model=40"], "even head dimension"),
    (["model.attention.chunk_size=0"], "model.attention.chunk_size=0: expected an integer >= 1"),
    (["model=softmax_learned", "context=128", "model.max_len=64"], "longer than the learned position table"),
])
def test_bad_config_fails_early_in_one_line(tmp_path, overrides, message):
    cmd = [sys.executable, str(ROOT / "train.py"), *overrides, "logger=none", f"hydra.run.dir={tmp_path}"]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert r.returncode != 0
    if message is not None:
        lines = [l for l in r.stderr.strip().splitlines() if l.startswith("linrope:")]
        assert len(lines) == 1 and message in lines[0], r.stderr[-2000:]
        assert "Traceback" not in r.stderr
        assert not (tmp_path / "checkpoints").exists()  # stopped before building anything
