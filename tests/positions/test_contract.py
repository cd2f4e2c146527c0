"""The contract of every registered position scheme (tests/positions/contract.py says what each check asserts and
which trait it reads): parametrised over the registry, its schemes' ``variants``, their models with softmax and linear
attention (``tests.helpers.scheme_pairings``) and the presets that set position options beyond them, with no scheme
named here.  A scheme's own file keeps its paper's formula and its release's quirks."""

from __future__ import annotations

import copy
import functools
import importlib
import inspect
import pkgutil

import pytest
import yaml

import linrope.positions
from linrope.models.spec import pair_label
from linrope.positions import REGISTRY, SCHEME_MODULES, PositionScheme, option_errors
from tests.helpers import (
    CONF,
    compiled_vs_eager,
    model_config,
    no_graph_breaks,
    presets_setting_positions,
    run_main,
    scheme_pairings,
    tiny,
)
from tests.positions import contract as c

CASES = c.cases()
PAIRINGS = [pytest.param([f"attention={a}", f"position={p}"], id=pair_label(a, p)) for a, p in scheme_pairings()]
PRESETS = [pytest.param([f"model={p}"], id=p) for p in presets_setting_positions()]  # RoPE's scaling, …


# ---------------------------------------------------------------------------------------------------
# the registry (each test below runs on the cases contract.CONTRACT gives it)
# ---------------------------------------------------------------------------------------------------
def test_every_scheme_module_registers_its_scheme_and_nothing_else_is_registered():
    """Every PositionScheme subclass with a name of its own, in any module of linrope/positions, is in the registry
    (importing linrope.positions imports every module of the folder: no list to extend)."""
    found = {}
    for info in pkgutil.iter_modules(linrope.positions.__path__):
        module = importlib.import_module(f"linrope.positions.{info.name}")
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if (
                issubclass(cls, PositionScheme)
                and cls is not PositionScheme
                and cls.__module__ == module.__name__
                and "name" in vars(cls)
            ):
                found[cls.name] = cls
    assert found == REGISTRY
    assert set(SCHEME_MODULES) == {cls.__module__.rsplit(".", 1)[1] for cls in REGISTRY.values()}


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_scheme_has_its_config_file(name):
    """conf/position/<name>.yaml names the scheme and gives options it takes (``position=<name>``)."""
    text = yaml.safe_load((CONF / "position" / f"{name}.yaml").read_text())
    assert text["name"] == name
    assert option_errors(name, {k: v for k, v in text.items() if k != "name"}) == []


@pytest.mark.parametrize("name,opts", c.params(CASES))
def test_variants_are_options_the_scheme_takes(name, opts):
    assert option_errors(name, opts) == []


# ---------------------------------------------------------------------------------------------------
# pairings
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name,opts", c.selected("linear_pairing"))
def test_linear_attention_takes_it_or_refuses_it_in_one_line(name, opts):
    c.check_linear_pairing(name, opts)


@pytest.mark.parametrize("name,opts", c.selected("linear_pairing_at_randomized_positions"))
def test_randomized_positions_change_no_pairing(name, opts):
    c.check_linear_pairing_at_randomized_positions(name, opts)


@pytest.mark.parametrize("name,opts", c.selected("linear_refused_at_build"))
def test_a_linear_model_refused_at_build(name, opts):
    c.check_linear_refused_at_build(name, opts)


@pytest.mark.parametrize("name,opts,causal", c.selected("linear_lm_trains"))
def test_linear_lm_trains_with_every_scheme_it_takes(name, opts, causal):
    c.check_linear_lm_trains(name, opts, causal)


@pytest.mark.parametrize("name,opts", c.selected("causal_only"))
def test_a_causal_only_scheme_refuses_a_bidirectional_model_in_one_line(name, opts):
    c.check_causal_only(name, opts)


@pytest.mark.parametrize("name,opts", c.selected("head_dim_parity"))
def test_an_odd_head_dimension_is_refused_at_the_config_check_only_where_declared(name, opts):
    c.check_head_dim_parity(name, opts)


# ---------------------------------------------------------------------------------------------------
# positions
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name,opts,causal", c.selected("shift_invariance"))
def test_a_shift_invariant_scheme_ignores_a_shift(name, opts, causal):
    c.check_shift_invariance(name, opts, causal)


@pytest.mark.parametrize("name,opts,causal", c.selected("model_ignores_offset"))
def test_a_model_with_a_shift_invariant_scheme_ignores_its_offset(name, opts, causal):
    c.check_model_ignores_offset(name, opts, causal)


@pytest.mark.parametrize("name,opts", c.selected("absolute_sees_offset"))
def test_an_absolute_scheme_sees_the_offset(name, opts):
    c.check_absolute_sees_offset(name, opts)


@pytest.mark.parametrize("name,opts", c.selected("attention_path"))
def test_sdpa_unless_a_value_term_needs_the_probabilities(name, opts):
    c.check_attention_path(name, opts)


@pytest.mark.parametrize("name,opts", c.selected("table_length"))
def test_a_table_of_max_len_rows_refuses_a_longer_window_in_one_line(name, opts):
    c.check_table_length(name, opts)


@pytest.mark.parametrize("name,opts,causal", c.selected("softmax_lm_trains"))
def test_softmax_lm_trains_with_every_scheme(name, opts, causal):
    c.check_softmax_lm_trains(name, opts, causal)


# ---------------------------------------------------------------------------------------------------
# sharing across layers
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name,opts", c.selected("share_option"))
def test_share_is_an_option_only_where_the_paper_shares(name, opts):
    c.check_share_option(name, opts)


@pytest.mark.parametrize("name,opts", c.selected("shared_counted_once"))
def test_shared_parameters_are_counted_once(name, opts):
    c.check_shared_counted_once(name, opts)


@pytest.mark.parametrize("name,opts", c.selected("every_layer_uses_the_shared_module"))
def test_every_layer_uses_the_one_shared_module(name, opts):
    c.check_every_layer_uses_the_shared_module(name, opts)


@pytest.mark.parametrize("name,opts", c.selected("sharing_is_tied_copies"))
def test_sharing_is_per_layer_copies_tied(name, opts):
    c.check_sharing_is_tied_copies(name, opts)


@pytest.mark.parametrize("name,opts", c.selected("position_terms_once_per_forward"))
def test_position_terms_are_computed_once_per_forward(name, opts):
    c.check_position_terms_once_per_forward(name, opts)


# ---------------------------------------------------------------------------------------------------
# every pairing and every preset that sets position options: three steps in float32 and bf16, torch.compile
# ---------------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def composed(overrides: tuple) -> dict:
    return model_config(*overrides, "size=tiny", "model.n_layers=1")


def model(overrides, *more):
    """The model config of ``overrides`` (one layer of size=tiny), composed once for the tests that share it."""
    return copy.deepcopy(composed((*overrides, *more)))


# float32's three steps (the loss falls) in the slow stage: the default suite takes a float32 forward and backward of
# every pairing above (the ``…_lm_trains`` checks); bfloat16 is where a scheme breaks (a table's cast, a float64
# constant), so its three steps stay in the default suite
@pytest.mark.parametrize("bf16", [pytest.param(False, marks=pytest.mark.slow), True], ids=["fp32", "bf16"])
@pytest.mark.parametrize("overrides", PAIRINGS + PRESETS)
def test_takes_three_steps_in_float32_and_bf16(overrides, bf16):
    c.check_three_steps(model(overrides, f"context={c.CONTEXT}"), bf16)


@pytest.mark.slow  # 1-7 s each (dynamo traces the model); the default run's model is traced in tests/test_compile.py
@pytest.mark.parametrize("overrides", PAIRINGS)
def test_no_graph_breaks(overrides):
    no_graph_breaks(model(overrides))


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("overrides", PAIRINGS)
def test_compiled_training_matches_eager(overrides, backend):
    compiled_vs_eager(model(overrides), backend, what=" ".join(overrides))


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["32", "bf16-mixed"])
@pytest.mark.parametrize("overrides", PAIRINGS + PRESETS)
def test_trains_three_steps_through_train_py(compose, overrides, precision):
    """Lightning's ``trainer.precision=32`` and ``bf16-mixed`` through ``train.py``: the checkpoint at step 3 with
    finite float32 weights."""
    import math
    from pathlib import Path

    import torch

    cfg = compose(
        *tiny(*overrides, f"context={c.CONTEXT}", "data.batch_size=2", "data.eval_batch_size=2", "data.val_windows=2"),
        "test=false",
        f"trainer.precision={precision}",
        "trainer.max_steps=3",
        "trainer.val_check_interval=3",
    )
    metric = run_main(cfg)
    assert metric is not None and math.isfinite(metric), metric
    ckpt = torch.load(Path(cfg.paths.output_dir) / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["global_step"] == 3
    weights = [v for v in ckpt["state_dict"].values() if v.is_floating_point()]
    assert weights and all(v.dtype == torch.float32 and torch.isfinite(v).all() for v in weights)
