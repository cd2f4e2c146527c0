"""The extrapolation's ``yarn`` and ``dynamic`` rows (beside ``pi`` and ``ntk``): what each RoPE scheme turns with in
a row, composed with the scaling it was trained with, against formulas written out here in float64; a row equal to
the model built with that scaling; everything restored after the row."""

import math

import pytest
import torch

from linrope.evaluation.extrapolation import ROWS, rope_row, row_scaling
from linrope.models.model import TransformerLM
from linrope.ops.rope import yarn_ramp
from tests.helpers import gen

D, BASE, L0 = 16, 10000.0, 32  # head dimension, RoPE's base, the training context


def model(**position):
    torch.manual_seed(0)
    cfg = dict(vocab_size=32, d_model=32, n_layers=1, n_heads=2, d_ff=32, max_len=L0, attention={"kind": "softmax"})
    m = TransformerLM({**cfg, "position": {"name": "rope", **position}}).double().eval()
    with torch.no_grad():  # peaked attention: every frequency shows in the output
        m.blocks[0].attn.qkv.weight.mul_(25.0)
    return m


def theta(p=1.0, k=1.0, y=1.0, context=L0):
    """θ_t = yarn_y(base · k^(d/(d-2)))_t / p: NTK base change, YaRN's blend against ``context``, PI division."""
    b = BASE * k ** (D / (D - 2))
    ramp = yarn_ramp(D, b, context) if y != 1 else torch.ones(D // 2, dtype=torch.float64)
    out = [b ** (-2 * t / D) for t in range(D // 2)]
    return torch.tensor([(1 - g) * th / y + g * th for th, g in zip(out, ramp.tolist())], dtype=torch.float64) / p


def mscale(y):
    return 1.0 if y <= 1 else 0.1 * math.log(y) + 1


TRAINED = [(None, 1.0), ("pi", 2.0), ("ntk", 3.0), ("yarn", 2.5), ("dynamic", 2.0)]


@pytest.mark.parametrize("scaling,f0", TRAINED)
@pytest.mark.parametrize("row", ROWS)
def test_each_row_composes_with_the_trained_scaling(scaling, f0, row):
    rho = 4.0
    m = model(scaling=scaling, factor=f0)
    scheme = m.blocks[0].attn.pos
    p, k, y = (f0 if scaling == s else 1.0 for s in ("pi", "ntk", "yarn"))
    trained_dynamic = (f0, L0) if scaling == "dynamic" else None
    want = {
        "pi": (theta(p * rho, k, y), mscale(y), trained_dynamic),
        "ntk": (theta(p, k * rho, y), mscale(y), trained_dynamic),
        "yarn": (theta(p, k, y * rho), mscale(y * rho), trained_dynamic),
        "dynamic": (theta(p, k, y), mscale(y), trained_dynamic or (1.0, L0)),
    }[row]
    got = row_scaling(scheme, row, rho, L0)
    torch.testing.assert_close(got["theta"], want[0], rtol=1e-13, atol=0)
    assert got["attention_scale"] == pytest.approx(want[1], rel=1e-15) and got["dynamic"] == want[2]
    before = {a: getattr(scheme, a) for a in ("theta", "attention_scale", "dynamic")}
    with rope_row(m, row, rho, L0):
        assert scheme.attention_scale == got["attention_scale"] and torch.equal(scheme.theta, got["theta"])
    assert all(getattr(scheme, a) is v for a, v in before.items())  # restored


def test_the_yarn_and_dynamic_rows_of_a_plain_model_are_the_models_built_with_them():
    plain = model()
    x = torch.randint(0, 32, (2, 4 * L0), generator=gen("rows"))
    for row, built in (("yarn", dict(scaling="yarn", factor=4.0)), ("dynamic", dict(scaling="dynamic", factor=1.0))):
        other = model(**built)
        other.load_state_dict(plain.state_dict())
        with rope_row(plain, row, 4.0, L0):
            torch.testing.assert_close(plain(x), other(x), rtol=1e-10, atol=1e-10)
        assert (plain(x) - other(x)).abs().max() > 1e-4  # and the row was not the model as trained
    # every window of the table is one forward at positions 0 … L-1: the dynamic row turns as the ntk row
    with rope_row(plain, "dynamic", 4.0, L0):
        dynamic = plain(x)
    with rope_row(plain, "ntk", 4.0, L0):
        torch.testing.assert_close(plain(x), dynamic, rtol=1e-10, atol=1e-10)


def test_an_unknown_row_is_one_line():
    with pytest.raises(ValueError, match=r"^scalings: unknown RoPE row 'longrope'; expected one of pi, ntk, yarn, dyn"):
        row_scaling(model().blocks[0].attn.pos, "longrope", 2.0, L0)
