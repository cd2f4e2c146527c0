"""The suite's fixtures, and what makes it the same suite however it was started (tests/README.md): from any
folder, in the background or not, from any shell's environment."""

import os
import signal
import threading

import pytest
import torch

from tests.helpers import CONF, ROOT

# ---- the launch --------------------------------------------------------------------------------------------------
# Variables of the caller's environment that change what linrope, Lightning, Hydra or wandb do, removed for the
# tests and the processes they start: a test that needs one sets it (monkeypatch.setenv).
#   WANDB_*: a login, a project, a folder, a mode (the suite logs offline, silently, below);
#   SLURM_*, TORCHELASTIC_*, RANK, LOCAL_RANK, …: the suite started inside a job or by torchrun would make each
#   run one process of several; PL_GLOBAL_SEED, PL_SEED_WORKERS: Lightning's seed from an earlier process;
#   HYDRA_FULL_ERROR: full tracebacks where the tests expect linrope's one line; TRITON_INTERPRET, LINROPE_*:
#   switches that tests set themselves.
LAUNCH_PREFIXES = ("WANDB_", "SLURM_", "TORCHELASTIC_", "LINROPE_")
LAUNCH_VARIABLES = {
    "RANK",
    "LOCAL_RANK",
    "GROUP_RANK",
    "NODE_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "PL_GLOBAL_SEED",
    "PL_SEED_WORKERS",
    "HYDRA_FULL_ERROR",
    "TRITON_INTERPRET",
}
for _name in [n for n in os.environ if n.startswith(LAUNCH_PREFIXES) or n in LAUNCH_VARIABLES]:
    del os.environ[_name]
os.environ.update(WANDB_MODE="offline", WANDB_SILENT="true")
# the processes the tests start import this checkout, from whatever folder and whatever the caller's PYTHONPATH
# (another checkout there, or an installed linrope, would be tested instead)
os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
torch.set_num_threads(min(2, os.cpu_count() or 1))


def terminal_signals():
    """SIGINT and SIGTERM as Python has them in a terminal (KeyboardInterrupt; the default end), also when the suite
    was started with them ignored (``nohup pytest &``, a script's background job: SIGINT ignored); the processes
    the tests start inherit them."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


terminal_signals()  # for the session: module- and session-scoped fixtures start processes too


@pytest.fixture(autouse=True)
def _terminal_signals():
    """Each test starts with them again: a handler an earlier test left behind does not reach it."""
    terminal_signals()
    yield


# ---- fixtures -------------------------------------------------------------------------------------------------
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
