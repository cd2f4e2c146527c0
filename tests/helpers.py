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


def tiny_lm(position: dict, kind: str = "softmax", *, n_layers=2, max_len=64, causal=True, **attention):
    """A small TransformerLM (vocabulary 32, width 32, 4 heads) with the position scheme ``position`` (its name and
    options) and ``kind`` attention: linear attention in the chunk form, chunks of 8, unless ``attention`` says
    otherwise."""
    from linrope.models.model import TransformerLM

    attention = {"kind": kind, **({"impl": "chunk", "chunk_size": 8} if kind == "linear" else {}), **attention}
    return TransformerLM(
        dict(vocab_size=32, d_model=32, n_layers=n_layers, n_heads=4, d_ff=64, max_len=max_len, causal=causal,
             attention=attention, position=position)
    )  # fmt: skip


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


# ---- the schemes of the registry, their variants, the models it pairs -----------------------------------------------
def scheme_cases() -> list:
    """``(name, options)`` of every registered scheme: its defaults, then each of its ``variants`` (the option sets
    under which its positions enter in another way)."""
    from linrope.positions import REGISTRY

    return [(name, dict(o)) for name, cls in sorted(REGISTRY.items()) for o in ({}, *cls.variants)]


def case_id(name: str, options: dict) -> str:
    """``deberta-k=4``: a scheme case as a test id."""
    return "-".join([name, *(f"{k}={v}" for k, v in options.items())])


def scheme_pairings() -> list:
    """``(attention, position)`` config options of every scheme's model: softmax attention with each scheme, linear
    attention with each scheme it takes inside attention (an absolute scheme acts at the input, before either
    attention: its softmax model checks it).  Read from the registry, no name written here."""
    from linrope.positions import REGISTRY

    softmax = [("softmax", name) for name in sorted(REGISTRY)]
    linear = [("linear", n) for n, cls in sorted(REGISTRY.items()) if cls.linear_ok and cls.kind != "absolute"]
    return softmax + linear


def preset_pairing(preset: str) -> tuple:
    """``(attention, position, model options)`` of ``conf/model/<preset>.yaml``: the config options it picks and what
    it sets under ``model`` besides its name."""
    import yaml

    text = yaml.safe_load((CONF / "model" / f"{preset}.yaml").read_text())
    picked = {k.split("/")[-1]: v for d in text.get("defaults", []) for k, v in d.items()}
    model = {k: v for k, v in (text.get("model") or {}).items() if k != "name"}
    return picked.get("attention"), picked.get("position"), model


def presets_beyond_pairings() -> list:
    """The presets that build more than a scheme's pairing with softmax or linear attention: another attention
    config (``linear_cosine``), a position config that is no scheme's own (``randomized``), or options under
    ``model`` (RoPE's scaling, a placement, no denominator)."""
    from linrope.positions import REGISTRY

    pairs = {
        (kind, n) for n, cls in REGISTRY.items() for kind in ("softmax", "linear") if kind == "softmax" or cls.linear_ok
    }
    out = []
    for path in sorted((CONF / "model").glob("*.yaml")):
        attention, position, options = preset_pairing(path.stem)
        if options or (attention, position) not in pairs:
            out.append(path.stem)
    return out


def presets_setting_positions() -> list:
    """The presets beyond the scheme pairings that set something of the position (its options, or a position config
    that is no scheme's own); the rest set only attention options (tests/test_compile.py, tests/ops)."""
    from linrope.positions import REGISTRY

    found = []
    for preset in presets_beyond_pairings():
        _, position, options = preset_pairing(preset)
        if position not in REGISTRY or "position" in options:
            found.append(preset)
    return found


# three AdamW steps, eager and compiled, in a fresh process (no compile cache hides a crash); the child writes losses
# and gradients as JSON
COMPILED_VS_EAGER = r"""
import json, sys, copy, torch
sys.path.insert(0, {root!r})
torch.manual_seed(0)
torch.set_num_threads(1)
from linrope.models.model import TransformerLM
cfg, backend = json.loads(sys.argv[1]), sys.argv[2]
eager = TransformerLM(cfg)
compiled = copy.deepcopy(eager)
compiled.compile(backend=backend, fullgraph=True)
result = {{}}
for name, model in (("eager", eager), ("compiled", compiled)):
    x = torch.randint(0, 256, (2, 40), generator=torch.Generator().manual_seed(1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses, grads = [], []
    for step in range(3):
        loss = torch.nn.functional.cross_entropy(model(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        losses.append(loss.item())
        grads.append({{n: p.grad.flatten().tolist() for n, p in model.named_parameters()}})
        opt.step()
    result[name] = {{"losses": losses, "grads": grads}}
print("RESULT" + json.dumps(result))
"""


def compiled_vs_eager(cfg: dict, backend: str, what: str = "") -> None:
    """The model ``cfg`` trained three steps compiled (``backend``: aot_eager, inductor) and eager, in a fresh process:
    the same losses and gradients, and the steps did train."""
    import json
    import subprocess
    import sys

    code = COMPILED_VS_EAGER.format(root=str(ROOT))
    proc = subprocess.run(
        [sys.executable, "-c", code, json.dumps(cfg), backend], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT"))
    res = json.loads(line[len("RESULT") :])
    eager, comp = res["eager"], res["compiled"]
    assert torch.allclose(torch.tensor(comp["losses"]), torch.tensor(eager["losses"]), rtol=1e-5, atol=1e-6), res
    assert eager["losses"][2] < eager["losses"][0]  # the steps did train (one batch, three times)
    for step, (ge, gc) in enumerate(zip(eager["grads"], comp["grads"])):
        assert ge.keys() == gc.keys()
        for name in ge:
            a, b = torch.tensor(gc[name]), torch.tensor(ge[name])
            assert torch.allclose(a, b, rtol=1e-4, atol=1e-6), (what, step, name, (a - b).abs().max().item())


def no_graph_breaks(cfg: dict) -> None:
    """Dynamo traces the model ``cfg``'s forward in one graph."""
    from linrope.models.model import TransformerLM

    torch._dynamo.reset()
    model = TransformerLM(cfg)
    explained = torch._dynamo.explain(model)(torch.randint(0, 256, (2, 48)))
    assert explained.graph_break_count == 0, [str(r.reason) for r in explained.break_reasons]
    assert explained.graph_count == 1
