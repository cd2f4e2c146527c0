"""How tests/data/*.ckpt were made (with linrope at main 4955a32, before the one-model-spec refactor):
two real runs of train.py, tiny and 2 steps, then the logits of a fixed input computed from each by
``LanguageModel.from_checkpoint`` at that commit.  tests/test_old_checkpoints.py loads them with the
code of today and compares.  Run from the repository root: ``python tests/data/make_checkpoints.py``."""
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
OUT = Path(__file__).resolve().parent
SMALL = ["size=tiny", "context=32", "model.d_model=32", "model.n_heads=2", "model.n_layers=1", "model.d_ff=32",
         "logger=none", "trainer.enable_progress_bar=false", "data.max_bytes=200000", "data.val_windows=2",
         "data.test_windows=2", "data.batch_size=2", "data.eval_batch_size=2", "trainer.max_steps=2",
         "trainer.val_check_interval=2", "test=false"]
RUNS = {"linear_rope": ["model=linear_rope"],
        "softmax_t5": ["model=softmax_t5", "model.position.num_buckets=8", "model.position.max_distance=16"]}


def probe() -> torch.Tensor:
    """The fixed input: the bytes of a line of Python."""
    return torch.tensor([list(b"def f(x):\n    return x + 1\n")], dtype=torch.long)


def main() -> None:
    from linrope.lit import LanguageModel

    for name, overrides in RUNS.items():
        with tempfile.TemporaryDirectory() as tmp:
            run = Path(tmp) / "run"
            subprocess.run([sys.executable, str(ROOT / "train.py"), *overrides, *SMALL, f"hydra.run.dir={run}"],
                           check=True, cwd=tmp)
            ckpt = OUT / f"main_{name}.ckpt"
            shutil.copy(run / "checkpoints" / "last.ckpt", ckpt)
        module = LanguageModel.from_checkpoint(ckpt)
        with torch.no_grad():
            logits = module(probe())
        torch.save({"input": probe(), "logits": logits}, OUT / f"main_{name}.logits.pt")


if __name__ == "__main__":
    main()
