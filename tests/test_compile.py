"""The models under torch.compile: no graph break, the same training as eager, and the registered kernels
pass torch.library.opcheck (schema, fake tensors, autograd registration, AOT dispatch).

The compiled-vs-eager runs go through Dynamo and AOTAutograd with the ``aot_eager`` backend in the default
suite (where the linear path used to break and crash) and through Inductor, which has to build C++ on
2 cores, as slow tests; each runs in a fresh process, so that no compile cache hides a crash."""

import itertools
import zlib

import pytest
import torch
import yaml

from linrope.ops.linear_attn.chunk import chunk_bwd, chunk_fwd
from linrope.ops.linear_attn.recurrent import recurrent_step_op
from tests.helpers import CONF, compiled_vs_eager, no_graph_breaks, preset_pairing, presets_beyond_pairings
from tests.helpers import model_config as composed

# every scheme's model with softmax and linear attention is the contract suite's (tests/positions/test_contract.py);
# here the presets beyond them: attention forms (cosine features, placements, no denominator) and position options
FORMS = presets_beyond_pairings()
DEFAULT = next(d["model"] for d in yaml.safe_load((CONF / "train.yaml").read_text())["defaults"] if "model" in d)


def model_config(preset: str) -> dict:
    return composed(f"model={preset}", "size=tiny", "model.n_layers=1")


def draws_positions(preset: str) -> bool:
    """Randomized positions (a draw per forward): graph breaks only, since eager and compiled runs draw differently."""
    _, position, options = preset_pairing(preset)
    given = yaml.safe_load((CONF / "position" / f"{position}.yaml").read_text())
    return bool({**given, **options.get("position", {})}.get("max_position"))


@pytest.mark.parametrize("preset", FORMS)
def test_no_graph_breaks(preset):
    no_graph_breaks(model_config(preset))


@pytest.mark.parametrize("preset", [DEFAULT])
def test_compiled_training_matches_eager_aot(preset):
    """The default run's model (every other: the contract suite's and the inductor test below, slow)."""
    compiled_vs_eager(model_config(preset), "aot_eager", what=preset)


@pytest.mark.slow
@pytest.mark.parametrize("preset", [p for p in FORMS if not draws_positions(p)])
def test_compiled_training_matches_eager_inductor(preset):
    compiled_vs_eager(model_config(preset), "inductor", what=preset)


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
