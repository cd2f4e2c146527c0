"""The models under torch.compile: no graph break, the same training as eager, and the registered kernels
pass torch.library.opcheck (schema, fake tensors, autograd registration, AOT dispatch).

The compiled-vs-eager runs go through Dynamo and AOTAutograd with the ``aot_eager`` backend in the default
suite (where the linear path used to break and crash) and through Inductor, which has to build C++ on
2 cores, as slow tests; each runs in a fresh process, so that no compile cache hides a crash."""

import itertools
import json
import subprocess
import sys
import zlib

import pytest
import torch

from linrope.ops.linear_attn.chunk import chunk_bwd, chunk_fwd
from linrope.ops.linear_attn.recurrent import recurrent_step_op
from tests.helpers import CONF, ROOT

PRESETS = [
    "linear_rope",
    "linear_cosine_rope",
    "linear_rope_both",
    "linear_rope_norm",
    "linear_alibi",
    "softmax_rope",
    "softmax_cope",
    "softmax_kerple",
    "softmax_sandwich",
    "softmax_xpos",  # its scale tables: no graph break, no host sync (ζ_0 and the window's span are host floats)
    "softmax_rope_yarn",
]


def model_config(preset: str) -> dict:
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            cfg = compose(config_name="train", overrides=[f"model={preset}", "size=tiny", "model.n_layers=1"])
    finally:
        GlobalHydra.instance().clear()
    return OmegaConf.to_container(cfg.model, resolve=True)


# randomized positions (a draw per forward): graph breaks only, since eager and compiled runs draw differently
RANDOMIZED = ["softmax_randomized", "linear_randomized"]


@pytest.mark.parametrize("preset", PRESETS + RANDOMIZED)
def test_no_graph_breaks(preset):
    from linrope.models.model import TransformerLM

    torch._dynamo.reset()
    model = TransformerLM(model_config(preset))
    x = torch.randint(0, 256, (2, 48))
    explained = torch._dynamo.explain(model)(x)
    assert explained.graph_break_count == 0, [str(r.reason) for r in explained.break_reasons]
    assert explained.graph_count == 1


# three AdamW steps, eager and compiled, in a fresh process; the child writes losses and gradients as JSON
CHILD = r"""
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


def compiled_vs_eager(preset: str, backend: str):
    code = CHILD.format(root=str(ROOT))
    proc = subprocess.run(
        [sys.executable, "-c", code, json.dumps(model_config(preset)), backend],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
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
            assert torch.allclose(a, b, rtol=1e-4, atol=1e-6), (preset, step, name, (a - b).abs().max().item())


@pytest.mark.parametrize(
    "preset",
    [
        "linear_rope",
        pytest.param("linear_alibi", marks=pytest.mark.slow),
        pytest.param("softmax_cope", marks=pytest.mark.slow),
    ],
)
def test_compiled_training_matches_eager_aot(preset):
    compiled_vs_eager(preset, "aot_eager")


@pytest.mark.slow
@pytest.mark.parametrize("preset", PRESETS)
def test_compiled_training_matches_eager_inductor(preset):
    compiled_vs_eager(preset, "inductor")


# ------------------------------------------------------------------------------------------------------
# opcheck: every registered op, over the configurations that change its outputs' shapes
# ------------------------------------------------------------------------------------------------------
def _gen(*key):
    return torch.Generator().manual_seed(zlib.crc32(repr(key).encode()))


def _fwd_args(feature_map, rope, causal, decayed, with_state, n=40, chunk_size=16):
    g = _gen(feature_map, rope, causal, decayed, with_state)
    B, H, d, dv = 2, 2, 8, 6
    q, k, v = (torch.randn(B, H, n, w, generator=g, dtype=torch.float64).requires_grad_() for w in (d, d, dv))
    D = d + 1 if feature_map == "cosine" else d
    S0 = torch.randn(B, H, D, dv, generator=g, dtype=torch.float64).requires_grad_() if with_state else None
    z0 = (torch.rand(B, H, D, generator=g, dtype=torch.float64) + 1).requires_grad_() if with_state else None
    decay = torch.tensor([0.9, 0.7], dtype=torch.float64) if decayed else None
    return (q, k, v, S0, z0, None, None, decay, feature_map, rope, causal, 1e-6, chunk_size)


CONFIGS = [
    c
    for c in itertools.product(
        ("elu", "cosine"), ("numerator", "both", "none"), (True, False), (False, True), (False, True)
    )
    if c[2] or not c[4]
]


# a few configurations in the default suite (each opcheck traces the op several times), the rest as slow tests
FAST = [
    ("elu", "numerator", True, True, True),
    ("cosine", "both", False, True, False),
    ("elu", "none", True, False, False),
]


@pytest.mark.parametrize(
    "config", [*FAST, *(pytest.param(c, marks=pytest.mark.slow) for c in CONFIGS if c not in FAST)], ids=str
)
def test_opcheck_chunk_fwd(config, monkeypatch):
    from linrope.ops.linear_attn import tables

    monkeypatch.setitem(tables.BLOCK_ELEMENTS, "cpu", 2 * 2 * 8 * 16)  # several blocks: saved states exist
    torch.library.opcheck(chunk_fwd, _fwd_args(*config))


def test_opcheck_chunk_bwd():
    args = [a.detach() if torch.is_tensor(a) else a for a in _fwd_args("elu", "numerator", True, True, True)]
    out, denom, S, z, saved_S, saved_z = chunk_fwd(*args)
    g = _gen("bwd")
    grads = [torch.randn(t.shape, generator=g, dtype=t.dtype) for t in (out, S, z)]
    torch.library.opcheck(
        chunk_bwd, (*grads, *args[:8], out, denom, saved_S, saved_z, *args[8:], True, True, True, True, True)
    )


@pytest.mark.parametrize("config", [("elu", "numerator", True, True, True), ("cosine", "none", False, True, False)])
def test_opcheck_chunk_without_denominator(config, monkeypatch):
    """normalize=False (the trailing argument): no denominator is returned (a placeholder), the backward
    passes ∂L/∂num = g; forward and backward operators checked."""
    from linrope.ops.linear_attn import tables

    monkeypatch.setitem(tables.BLOCK_ELEMENTS, "cpu", 2 * 2 * 8 * 16)
    args = (*_fwd_args(*config), False)
    torch.library.opcheck(chunk_fwd, args)
    plain = [a.detach() if torch.is_tensor(a) else a for a in args]
    out, denom, S, z, saved_S, saved_z = chunk_fwd(*plain)
    assert denom.shape == (0,)
    g = _gen("bwd", config)
    grads = [torch.randn(t.shape, generator=g, dtype=t.dtype) if t.numel() else None for t in (out, S, z)]
    flags = (True, True, True, config[4], config[4])
    torch.library.opcheck(chunk_bwd, (*grads, *plain[:8], out, denom, saved_S, saved_z, *plain[8:13], *flags, False))


@pytest.mark.parametrize("rope", ["numerator", "both"])
def test_opcheck_recurrent_step(rope):
    g = _gen("step", rope)
    B, H, d, dv = 2, 2, 8, 6
    q, k = (torch.randn(B, H, d, generator=g, dtype=torch.float64).requires_grad_() for _ in range(2))
    v = torch.randn(B, H, dv, generator=g, dtype=torch.float64).requires_grad_()
    S = torch.randn(B, H, d, dv, generator=g, dtype=torch.float64).requires_grad_()
    z = (torch.rand(B, H, d, generator=g, dtype=torch.float64) + 1).requires_grad_()
    torch.library.opcheck(
        recurrent_step_op, (q, k, v, S, z, torch.tensor(7), None, torch.tensor([0.9, 0.8]), "elu", rope, 1e-6)
    )
    if rope == "numerator":  # without a denominator (the trailing normalize)
        args = (q, k, v, S, z, torch.tensor(7), None, torch.tensor([0.9, 0.8]), "elu", rope, 1e-6, False)
        torch.library.opcheck(recurrent_step_op, args)


def test_compile_true_where_torch_cannot_compile_is_one_line(monkeypatch, compose):
    from linrope.base import compiling
    from linrope.config.checks import ConfigError, validate
    from linrope.training.builders import build_module

    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setattr(compiling.shutil, "which", lambda name: None)  # no C++ compiler on PATH
    with pytest.raises(ConfigError, match=r"compile=true: .*C\+\+ compiler.*compile=false") as err:
        build_module(compose("size=tiny", "compile=true"))
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="^compile=maybe: expected true or false$"):
        validate(compose("size=tiny", "compile=maybe"))  # the config check, before anything is built
    assert not build_module(compose("size=tiny")).compile_model  # the default: eager


def test_configure_model_compiles_in_place(compose):
    from linrope.training.builders import build_module

    module = build_module(compose("size=tiny", "compile=true"))
    keys = list(module.state_dict())
    assert module.model._compiled_call_impl is None
    module.configure_model()
    assert module.model._compiled_call_impl is not None  # nn.Module.compile: the forward is compiled
    assert list(module.state_dict()) == keys  # checkpoints keep the eager model's parameter names
