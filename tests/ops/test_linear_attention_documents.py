"""Packed documents in linear attention: the state resets at every boundary, in every form.

A packed row gives, at every position of every document, what that document gives run alone (its positions
counted from 0): float64, forward and backward (q, k, v), every feature map / placement, with and without a
decay and a denominator, lengths that are not multiples of the chunk, boundaries on and off chunk starts, a
document of one token, the chunk form walked in several blocks; buffers poisoned with NaN (``kernel_env``).
Bidirectional (``causal=False``: every key of the query's document, both sides; the forms but naive by two causal
passes, ``both_ways.py``) the same way.  Then the state in and out, the window, bfloat16 under autocast beyond one
chunk (both ways too), and the refusals."""

import contextlib
import itertools

import pytest
import torch

from linrope.ops import linear_attention
from linrope.ops.linear_attn import tables as tables_mod
from linrope.ops.linear_attn.common import LinearAttentionState
from linrope.ops.linear_attn.fla_backend import varlen
from tests.helpers import gen, rel

B, H, D, DV = 2, 2, 8, 6
DECAY = torch.tensor([0.93, 0.6], dtype=torch.float64)
C = 4  # chunk size: documents of 1, 3, 4, 5, … positions fall on and across chunk boundaries
# row 0: documents of 5, 1, 7, 3, 4, 16 and 1 positions: boundaries inside a chunk (5, 6), in the last chunk of
# a block (13; blocks of 16 under ``small_blocks``), at a block's start (16) and a chunk's (20), and in the last,
# short chunk (36); row 1: one document
DOCS = torch.tensor([[0] * 5 + [1] + [2] * 7 + [3] * 3 + [4] * 4 + [5] * 16 + [6], [7] * 37])
N = DOCS.shape[1]
FORMS = ("naive", "chunk", "recurrent")

pytestmark = pytest.mark.usefixtures("kernel_env")


@contextlib.contextmanager
def small_blocks(elements=512):
    """The chunk form walks causal sequences in blocks: make them a few chunks long, so a boundary falls in a
    later block and the state crosses blocks."""
    old = dict(tables_mod.BLOCK_ELEMENTS)
    tables_mod.BLOCK_ELEMENTS.update(cpu=elements, cuda=elements)
    try:
        yield
    finally:
        tables_mod.BLOCK_ELEMENTS.clear()
        tables_mod.BLOCK_ELEMENTS.update(old)


def spans(row):
    """[(start, end), …] of the documents of one row of ids."""
    ids = DOCS[row].tolist()
    starts = [0] + [t for t in range(1, len(ids)) if ids[t] != ids[t - 1]]
    return list(zip(starts, starts[1:] + [len(ids)]))


def leaves(g, n=N, dtype=torch.float64):
    return tuple(torch.randn(B, H, n, d, generator=g, dtype=dtype).requires_grad_() for d in (D, D, DV))


def separately(q, k, v, **kw):
    """Every document run alone by the naive form, positions from 0, put back in place: (B, H, N, d_v)."""
    rows = []
    for b in range(B):
        parts = [
            linear_attention(q[b : b + 1, :, s:e], k[b : b + 1, :, s:e], v[b : b + 1, :, s:e], impl="naive", **kw)
            for s, e in spans(b)
        ]
        rows.append(torch.cat(parts, dim=2))
    return torch.cat(rows, dim=0)


def with_grads(fn, q, k, v, w):
    out = fn()
    return (out, *torch.autograd.grad((out * w).sum(), (q, k, v)))


CASES = list(itertools.product(("elu", "cosine"), ("numerator", "both", "none"), (False, True), (True, False)))


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("impl", FORMS)
@pytest.mark.parametrize("feature_map,rope,decayed,normalize", CASES)
def test_packed_equals_each_document_alone(impl, feature_map, rope, decayed, normalize, causal):
    g = gen("documents", impl, feature_map, rope, decayed, normalize, causal)
    q, k, v = leaves(g)
    w = torch.randn(B, H, N, DV, generator=g, dtype=torch.float64)
    kw = dict(feature_map=feature_map, rope=rope, decay=DECAY if decayed else None, normalize=normalize, causal=causal)
    with small_blocks():
        packed = with_grads(
            lambda: linear_attention(q, k, v, impl=impl, chunk_size=C, documents=DOCS, **kw), q, k, v, w
        )
    alone = with_grads(lambda: separately(q, k, v, **kw), q, k, v, w)
    for name, a, b in zip(("out", "dq", "dk", "dv"), packed, alone):
        assert torch.isfinite(a).all(), name
        assert (a - b).abs().max().item() <= 1e-10, (name, (a - b).abs().max().item())
    # the same call without documents is another function: the test can tell
    leaky = linear_attention(q, k, v, impl="naive" if not causal else impl, chunk_size=C, **kw)  # recurrent: causal
    assert (leaky - alone[0]).abs().max().item() > 1e-3


@pytest.mark.parametrize("impl", ("chunk", "recurrent"))
@pytest.mark.parametrize("feature_map,rope", [("elu", "numerator"), ("cosine", "both"), ("elu", "none")])
@pytest.mark.parametrize("decayed", [False, True])
def test_state_in_and_out_against_naive(impl, feature_map, rope, decayed):
    """An initial state continues the row's first document, the final state is the last document's: the chunk
    and recurrent forms agree with the naive form, outputs and every gradient (the state's too)."""
    g = gen("documents-state", impl, feature_map, rope, decayed)
    q, k, v = leaves(g)
    Dp = D + 1 if feature_map == "cosine" else D
    S0 = torch.randn(B, H, Dp, DV, generator=g, dtype=torch.float64).requires_grad_()
    z0 = (torch.rand(B, H, Dp, generator=g, dtype=torch.float64) + 0.5).requires_grad_()
    kw = dict(feature_map=feature_map, rope=rope, decay=DECAY if decayed else None, documents=DOCS, chunk_size=C)
    ws = [torch.randn(s, generator=g, dtype=torch.float64) for s in ((B, H, N, DV), (B, H, Dp, DV), (B, H, Dp))]

    def run(form):
        with small_blocks():
            o, st = linear_attention(
                q, k, v, impl=form, initial_state=LinearAttentionState(S0, z0), output_final_state=True, **kw
            )
        loss = (o * ws[0]).sum() + (st.S * ws[1]).sum() + (st.z * ws[2]).sum()
        return (o, st.S, st.z, *torch.autograd.grad(loss, (q, k, v, S0, z0)))

    for a, b in zip(run(impl), run("naive")):
        assert torch.isfinite(a).all() and (a - b).abs().max().item() <= 1e-10
    # and the naive form's meaning: row 0's first document alone with the state, its last alone for the state
    o, st = linear_attention(
        q, k, v, impl="naive", initial_state=LinearAttentionState(S0, z0), output_final_state=True, **kw
    )
    (s0, e0), (s1, e1) = spans(0)[0], spans(0)[-1]
    kw0 = dict(feature_map=feature_map, rope=rope, decay=kw["decay"])
    first = linear_attention(
        q[:1, :, s0:e0],
        k[:1, :, s0:e0],
        v[:1, :, s0:e0],
        impl="naive",
        initial_state=LinearAttentionState(S0[:1], z0[:1]),
        **kw0,
    )
    _, last = linear_attention(
        q[:1, :, s1:e1], k[:1, :, s1:e1], v[:1, :, s1:e1], impl="naive", output_final_state=True,
        positions=torch.arange(s1, e1), **kw0,
    )  # fmt: skip
    assert (o[:1, :, s0:e0] - first).abs().max().item() <= 1e-10
    assert (st.S[:1] - last.S).abs().max().item() <= 1e-10 and (st.z[:1] - last.z).abs().max().item() <= 1e-10


@pytest.mark.parametrize("window", [3, 6])
@pytest.mark.parametrize("decayed", [False, True])
def test_window_with_documents(window, decayed):
    """The context-limited control: keys of the last ``window`` positions and of the query's own document."""
    g = gen("documents-window", window, decayed)
    q, k, v = leaves(g)
    w = torch.randn(B, H, N, DV, generator=g, dtype=torch.float64)
    kw = dict(decay=DECAY if decayed else None, window=window)
    outs = [
        with_grads(lambda i=i: linear_attention(q, k, v, impl=i, documents=DOCS, chunk_size=C, **kw), q, k, v, w)
        for i in ("chunk", "naive")
    ]
    alone = with_grads(lambda: separately(q, k, v, **kw), q, k, v, w)
    for a, b, c in zip(*outs, alone):
        assert torch.isfinite(a).all() and (a - c).abs().max().item() <= 1e-10 and (b - c).abs().max().item() <= 1e-10


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("rope", ["numerator", "both"])
def test_bfloat16_autocast_beyond_one_chunk(rope, causal):
    """Under bf16 autocast, documents longer than a chunk (64): the packed row matches each document alone in
    float64 as closely as the form does without documents (issue 24's bound for autocast-bf16), and a
    document's outputs do not move when another document's inputs change."""
    n, docs = 300, torch.tensor([[0] * 70 + [1] * 150 + [2] * 80, [5] * 130 + [6] * 170])
    g = gen("documents-bf16", rope)
    x = torch.randn(B, n, H * D, generator=g)
    lin = torch.nn.Linear(H * D, 3 * H * D, bias=False)

    def run(x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            q, k, v = lin(x).reshape(B, n, 3, H, D).permute(2, 0, 3, 1, 4)
            return linear_attention(q, k, v, rope=rope, documents=docs, causal=causal), (q, k, v)

    out, (q, k, v) = run(x)
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
    cuts = {0: [(0, 70), (70, 220), (220, 300)], 1: [(0, 130), (130, 300)]}
    ref = torch.cat(
        [
            torch.cat(
                [linear_attention(*(t[b : b + 1, :, s:e].double() for t in (q, k, v)), impl="naive", rope=rope,
                                  causal=causal) for s, e in cuts[b]],
                dim=2,
            )
            for b in range(B)
        ]
    )  # fmt: skip
    assert rel(out, ref) < 1.5e-2
    x2 = x.clone()
    x2[0, 100:] += 1.0  # documents 1 and 2 of row 0 change; document 0 must not
    x2[1, :130] += 1.0  # document 5 of row 1 changes; document 6 must not
    out2, _ = run(x2)
    assert torch.equal(out2[0, :, :70], out[0, :, :70]) and torch.equal(out2[1, :, 130:], out[1, :, 130:])
    assert not torch.equal(out2[0, :, 220:], out[0, :, 220:])


def test_refusals():
    q = k = v = torch.randn(B, H, N, D)
    with pytest.raises(ValueError, match="documents must have shape"):
        linear_attention(q, k, v, documents=DOCS[:, :-1])
    with pytest.raises(ValueError, match="integer tensor"):
        linear_attention(q, k, v, documents=DOCS.float())
    # ids that go down: naive (equal ids) and the state resets of the others would give two answers
    down = DOCS.clone()
    down[0, -1] = down[0, 0]
    for impl in ("naive", "chunk", "recurrent"):
        with pytest.raises(ValueError, match="^documents must be non-decreasing along each row"):
            linear_attention(q, k, v, impl=impl, documents=down)


def test_fla_variable_length_layout():
    """What impl=fla hands fla's variable-length kernels (tests/ops/test_fla_interpreted.py runs them): every
    document's offset in the flattened rows, a row's start always one, and each row's first and last document."""
    cu, first, last = varlen(DOCS)
    assert cu.tolist() == [0, 5, 6, 13, 16, 20, 36, 37, 74] and first.tolist() == [0, 7] and last.tolist() == [6, 7]
    cu, first, last = varlen(torch.tensor([[2, 2, 2], [2, 2, 3]]))  # the same id in two rows: two documents
    assert cu.tolist() == [0, 3, 5, 6] and first.tolist() == [0, 1] and last.tolist() == [0, 2]


def test_an_empty_row_with_documents_passes_the_state_through():
    """N = 0 with documents and an initial state: every form returns the state unchanged (naive failed to broadcast
    its test of the row's first and last ids, of which there are none)."""
    g = torch.Generator().manual_seed(3)
    q = torch.randn(B, H, 0, D, generator=g)
    state = LinearAttentionState(torch.randn(B, H, D, D, generator=g), torch.rand(B, H, D, generator=g))
    for impl in FORMS:
        out, (S, z) = linear_attention(
            q, q, q, impl=impl, documents=torch.zeros(B, 0, dtype=torch.long), initial_state=state,
            output_final_state=True,
        )  # fmt: skip
        assert out.shape == q.shape and torch.equal(S, state.S) and torch.equal(z, state.z), impl
