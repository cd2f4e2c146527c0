"""What tests in more than one folder share (tests/README.md): where the checkout is, the overrides of a tiny
training run, train.py's main run in-process, seeded generators and the relative error, and the dotted name by
which Hydra finds a test-only class.  Fixtures are in tests/conftest.py; a helper that the tests of one folder
share is in that folder, in a module not named test_* (tests/evaluation/helpers.py, tests/ops/fla_cases.py).
A test module never imports another test module nor conftest."""

from __future__ import annotations

import math
import zlib
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"

# A training run in seconds: the tiny model on 400 KB of the byte corpus, small evaluations, nothing logged.
TINY = (
    "size=tiny",
    "logger=none",
    "trainer.enable_progress_bar=false",
    "data.max_bytes=400000",
    "data.val_windows=4",
    "data.test_windows=4",
    "data.batch_size=4",
    "data.eval_batch_size=4",
)


def override_key(override: str) -> str:
    """``data.batch_size`` for ``data.batch_size=4``, ``+callbacks.x._target_=…`` and ``~logger``."""
    return override.split("=", 1)[0].lstrip("+~")


def tiny(*overrides: str) -> list:
    """TINY with ``overrides``: one that sets a key TINY sets takes its place (a key given once, as a user would
    type it), the others follow in their order."""
    given = {override_key(o): o for o in overrides}
    base = [given.get(override_key(o), o) for o in TINY]
    return base + [o for o in overrides if o not in base]


def run_main(cfg):
    """train.py's ``main`` on a composed config (the ``compose`` fixture), in this process: its test metric."""
    import train

    return train.main(cfg)


def gen(*key) -> torch.Generator:
    """A CPU generator seeded from ``key``: each case draws its own inputs, the same on every run."""
    return torch.Generator().manual_seed(zlib.crc32(repr(key).encode()))


def rel(a, b) -> float:
    """|a - b| / |b| (Frobenius norms) in float64: a low-precision result is measured without rounding the
    measurement, and a reference that is exactly zero gives 0 for a zero result and a huge value otherwise
    (not NaN, which fails every comparison).  A NaN in ``a`` gives NaN.  Reads the value to the host: not for
    tensors on the meta device."""
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-300)).item()


def target(obj) -> str:
    """The ``_target_`` of a test-only class or function: its module as this process imported it (pytest names
    test modules after their folder: tests.run.test_reliability), so Hydra finds this very object."""
    return f"{obj.__module__}.{obj.__qualname__}"


def model_config(*overrides: str) -> dict:
    """The ``model`` section of train.py's config composed with ``overrides``, resolved to a plain dict."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            cfg = compose(config_name="train", overrides=list(overrides))
    finally:
        GlobalHydra.instance().clear()
    return OmegaConf.to_container(cfg.model, resolve=True)


def scalar_softmax(att, x, causal: bool, bias):
    """softmax_j(q_i·k_j / √d + bias(h, i, j)) v_j of the softmax layer ``att`` on ``x`` (its own projections), one
    scalar at a time in Python floats: the reference of a score-bias scheme's formula."""
    q, k, v = (t.detach() for t in att.split(x))
    ql, kl, vl = q.tolist(), k.tolist(), v.tolist()
    o = torch.zeros_like(v)
    n, d = x.shape[1], q.shape[-1]
    for b in range(x.shape[0]):
        for h in range(q.shape[1]):
            for i in range(n):
                keys = [j for j in range(n) if j <= i or not causal]
                s = [sum(a * c for a, c in zip(ql[b][h][i], kl[b][h][j])) / math.sqrt(d) + bias(h, i, j) for j in keys]
                top = max(s)
                w = [math.exp(t - top) for t in s]
                for t in range(v.shape[-1]):
                    o[b, h, i, t] = sum(wj * vl[b][h][j][t] for j, wj in zip(keys, w)) / sum(w)
    return att.merge(o)
