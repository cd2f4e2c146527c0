import os

import pytest
import torch

from tests.helpers import CONF, ROOT

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
torch.set_num_threads(min(2, os.cpu_count() or 1))


@pytest.fixture
def compose(tmp_path):
    """Compose the real training config with overrides, writing outputs under tmp_path, on the CPU
    (``trainer.accelerator=cpu``: the default trainer's ``auto`` would pick a GPU on a machine with one; a
    test's own ``trainer.accelerator=…`` comes later and wins)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    def _compose(*overrides):
        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            pinned = [f"paths.output_dir={tmp_path}", "trainer.accelerator=cpu"]
            cfg = hydra_compose(config_name="train", overrides=[*pinned, *overrides])
        return cfg

    yield _compose
    GlobalHydra.instance().clear()


@pytest.fixture
def small_corpus(tmp_path):
    """One file of about 300 KB of real Python source (some of the stdlib's), split by position."""
    from linrope.data.bytes import stdlib_dir

    out = tmp_path / "corpus.txt"
    src = sorted((stdlib_dir() / "json").glob("*.py")) + sorted((stdlib_dir() / "email").glob("*.py"))
    out.write_bytes(b"\n".join(f.read_bytes() for f in src))
    return out


@pytest.fixture
def kernel_env():
    """Every buffer the kernels preallocate starts as NaN: an element left unwritten fails the test.

    (These tensors are small: one thread avoids paying for OpenMP barriers when the 2 cores are shared.)"""
    from linrope.ops.linear_attn.buffers import poison_buffers

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with poison_buffers():
            yield
    finally:
        torch.set_num_threads(threads)
