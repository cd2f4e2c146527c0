"""Packed documents at the model (issue 35): ``TransformerLM(idx, documents=ids)`` gives, at every position of
every document, the logits that document gives run alone, for every position scheme with softmax attention and
every scheme linear attention takes in every form (float64, ≤ 1e-10); without ``documents`` the same batch
gives other logits (so the comparison can fail)."""

import pytest
import torch

from linrope.models.model import TransformerLM
from linrope.positions import REGISTRY
from tests.helpers import gen, scheme_cases

V, N = 32, 24
# row 0: documents of 5, 1, 11 and 7 tokens; row 1: one document
DOCS = torch.tensor([[3] * 5 + [4] + [6] * 11 + [9] * 7, [0] * N])
pytestmark = pytest.mark.usefixtures("kernel_env")  # NaN-poisoned kernel buffers, one thread (tests/conftest.py)
SPANS = {0: [(0, 5), (5, 6), (6, 17), (17, 24)], 1: [(0, N)]}

# every scheme with softmax attention, and its variants (the option sets under which its positions enter differently:
# a decay, a scaling, a learned gate, every block's input, per-layer copies, queries past FIRE's threshold, …)
SOFTMAX = [{"name": n, **o} for n, o in scheme_cases()]
LINEAR_SCHEMES = [{"name": n, **o} for n, o in scheme_cases() if REGISTRY[n].linear_ok]
LINEAR_VARIANTS = [{}, {"feature_map": "cosine", "placement": "both"}, {"normalize": False}]


def build(attention, position, **model):
    torch.manual_seed(0)
    cfg = dict(vocab_size=V, d_model=32, n_layers=2, n_heads=4, d_ff=64, max_len=32)
    return TransformerLM({**cfg, "attention": attention, "position": position, **model}).double().eval()


def compare(m):
    """(largest |packed - alone|, smallest largest |leaky - alone| over the later documents of row 0)."""
    idx = torch.randint(0, V, (2, N), generator=gen("packed", repr(m.cfg)))
    with torch.no_grad():
        packed = m(idx, documents=DOCS)
        leaky = m(idx)
        alone = torch.cat([torch.cat([m(idx[b : b + 1, s:e]) for s, e in SPANS[b]], dim=1) for b in (0, 1)])
    leak = min((leaky[0, s:e] - alone[0, s:e]).abs().max().item() for s, e in SPANS[0][1:])
    return (packed - alone).abs().max().item(), leak


def check(m):
    err, leak = compare(m)
    assert err <= 1e-10, err
    assert leak > 1e-6, leak  # without documents every later document sees the earlier ones


@pytest.mark.parametrize("position", SOFTMAX, ids=lambda p: "-".join(map(str, p.values())))
def test_softmax_packed_equals_alone(position):
    check(build({"kind": "softmax"}, position))


@pytest.mark.parametrize("impl", ["naive", "chunk", "recurrent"])
@pytest.mark.parametrize("variant", LINEAR_VARIANTS, ids=lambda v: "-".join(map(str, v.values())) or "default")
@pytest.mark.parametrize("position", LINEAR_SCHEMES, ids=lambda p: "-".join(map(str, p.values())))
def test_linear_packed_equals_alone(position, variant, impl):
    check(build({"kind": "linear", "impl": impl, "chunk_size": 4, **variant}, position))


@pytest.mark.parametrize("kind", ["softmax", "linear"])
def test_short_convolution_and_window(kind):
    """The short convolution's taps stop at a boundary; the context-limited window keeps the documents apart."""
    extra = {"impl": "chunk", "chunk_size": 4} if kind == "linear" else {}
    check(build({"kind": kind, **extra}, {"name": "rope"}, short_conv=4))
    check(build({"kind": kind, "window": 4, **extra}, {"name": "rope"}))


def test_encoder_softmax_packed_equals_alone():
    """Non-causal softmax attention: block-diagonal, every document sees all of itself and nothing else."""
    check(build({"kind": "softmax"}, {"name": "t5"}, causal=False))


def test_without_documents_bit_identical_and_refusals():
    m = build({"kind": "linear", "impl": "chunk"}, {"name": "rope"})
    idx = torch.randint(0, V, (2, N), generator=gen("packed-none"))
    with torch.no_grad():
        assert torch.equal(m(idx), m(idx, documents=None))
        one = torch.zeros_like(idx)  # one document per row: what no documents mean
        assert (m(idx, documents=one) - m(idx)).abs().max().item() <= 1e-12
    with pytest.raises(ValueError, match="must not decrease"):
        m(idx, documents=DOCS.flip(1))
    with pytest.raises(ValueError, match="tokens' shape"):
        m(idx, documents=DOCS[:, :-1])
    with pytest.raises(ValueError, match="carry no state"):
        m(idx, documents=DOCS, return_states=True)
    with pytest.raises(ValueError, match="integer tensor"):
        m(idx, documents=DOCS.double())


def test_randomized_positions_refuse_packed_documents_in_one_line():
    m = build({"kind": "softmax"}, {"name": "rope", "max_position": 64})
    idx = torch.randint(0, V, (2, N), generator=gen("packed", "randomized"))
    with pytest.raises(ValueError, match=r"^documents: packed documents count positions from each document's start"):
        m(idx, documents=DOCS)
