"""The native chunk loop (linrope.ops.linear_attn.native_chunk): the chunk form's forward and backward walked in C++
per (batch row, head), against the naive form in float64 and against the chunk form's torch ops: float32 and float64,
a length that is no multiple of the chunk and spans several blocks, the initial state given and the final state
returned and their gradients, strided inputs, NaN-poisoned outputs, the heads' tasks on and off, under bfloat16
autocast, each direction on the states the other path saves; the cases it does not serve run the torch path, and
without the extension the torch path runs and the reason is one line.

Then the walk in bfloat16 (linrope.ops.linear_attn.native_bf16): forward and backward against the naive form in
float64 within the bounds the torch path's bfloat16 is held to (tests/ops/test_linear_attention_precision.py: 2e-2 for
the output, 1e-2 for gradients), at every width it serves, beyond one block and with a short last chunk, the initial
state given and the final state returned, poisoned outputs, the heads' tasks on and off, inside an autocast model,
and the same numbers (within those bounds) from the torch path it falls back to: switched off, on a CPU without
AVX-512 BF16 (one line saying so), or at a width it does not serve."""

from __future__ import annotations

import shutil

import pytest
import torch
from torch.utils.cpp_extension import is_ninja_available

from linrope.ops import chunk_linear_attention, naive_linear_attention
from linrope.ops.linear_attn import heads, native_bf16, native_chunk
from linrope.ops.linear_attn import tables as tables_mod
from linrope.ops.linear_attn.buffers import poison_buffers
from linrope.ops.linear_attn.chunk_kernel import Cfg
from linrope.ops.linear_attn.common import LinearAttentionState
from tests.helpers import gen, rel

COMPILER = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
needs_compiler = pytest.mark.skipif(
    COMPILER is None or not is_ninja_available(),
    reason="no C++ compiler or no ninja (`pip install ninja`): the native loops cannot be built here",
)


@pytest.fixture
def walks(monkeypatch):
    """Counts the native walks: calls of ``native_chunk.forward``, and of its ``backward`` (in ``back_walks``)."""
    calls, back = [], []
    forward, backward = native_chunk.forward, native_chunk.backward

    def counted(*a, **k):
        calls.append(a[0].shape)
        return forward(*a, **k)

    def counted_back(*a, **k):
        back.append(a[3].shape)
        return backward(*a, **k)

    monkeypatch.setattr(native_chunk, "forward", counted)
    monkeypatch.setattr(native_chunk, "backward", counted_back)
    monkeypatch.setattr(native_chunk, "back_walks", back, raising=False)
    return calls


def _inputs(key, B, H, N, D, DV, dtype, with_state):
    g = gen("native walk", *key)
    # q and k strided (a (B, N, H, d) layout seen as (B, H, N, d)), v contiguous
    q, k = (torch.randn(B, N, H, D, generator=g, dtype=torch.float64).transpose(1, 2) for _ in range(2))
    v = torch.randn(B, H, N, DV, generator=g, dtype=torch.float64)
    state = None
    if with_state:
        state = (torch.randn(B, H, D, DV, generator=g, dtype=torch.float64),
                 torch.rand(B, H, D, generator=g, dtype=torch.float64) + 0.5)  # fmt: skip
    w = [torch.randn(*s, generator=g, dtype=torch.float64) for s in ((B, H, N, DV), (B, H, D, DV), (B, H, D))]
    return [q.to(dtype), k.to(dtype), v.to(dtype)], None if state is None else [t.to(dtype) for t in state], w


def _run(fn, xs, state, w, **kw):
    """(out, S, z, ∂L/∂q, ∂L/∂k, ∂L/∂v[, ∂L/∂S0, ∂L/∂z0]) for a loss reaching the output and the final state."""
    leaves = [t.detach().clone().requires_grad_() for t in xs]
    init = None if state is None else LinearAttentionState(*(t.clone().requires_grad_() for t in state))
    out, fin = fn(*leaves, initial_state=init, output_final_state=True, rope="numerator", **kw)
    loss = (out.double() * w[0]).sum() + (fin.S.double() * w[1]).sum() + (fin.z.double() * w[2]).sum()
    return [out, fin.S, fin.z, *torch.autograd.grad(loss, leaves + ([] if init is None else list(init)))]


@needs_compiler
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("as_tasks", [False, True])
@pytest.mark.parametrize("with_state", [False, True])
def test_the_walk_matches_the_naive_form(monkeypatch, walks, dtype, as_tasks, with_state):
    """N = 300 (four chunks of 64 and one of 44) in blocks of one or two chunks, as one call or as the heads' tasks:
    the walks forward and backward run, write every output and gradient (poisoned), and the output, final state and
    gradients (of q, k, v and the initial state) agree with the naive form in float64 and with the chunk form's
    torch ops."""
    monkeypatch.setitem(tables_mod.BLOCK_ELEMENTS, "cpu", 2048)
    monkeypatch.setattr(heads, "ENABLED", as_tasks)
    monkeypatch.setattr(heads, "MIN_POSITIONS", 1)
    B, H, N, D, DV = 2, 3, 300, 16, 12
    xs, state, w = _inputs((str(dtype), as_tasks, with_state), B, H, N, D, DV, dtype, with_state)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with poison_buffers():
            got = _run(chunk_linear_attention, xs, state, w)
            assert walks and native_chunk.why_not() is None
            tasks = B * H if as_tasks else 1
            assert len(walks) == tasks and len(native_chunk.back_walks) == tasks  # per task, or one for the call
            monkeypatch.setattr(native_chunk, "ENABLED", False)
            torch_ops = _run(chunk_linear_attention, xs, state, w)
            assert len(walks) == tasks and len(native_chunk.back_walks) == tasks  # the torch path ran
    finally:
        torch.set_num_threads(threads)
    want = _run(
        naive_linear_attention, [x.double() for x in xs], None if state is None else [t.double() for t in state], w
    )
    tol, same = (1e-12, 1e-12) if dtype == torch.float64 else (2e-6, 2e-6)
    for i, (a, b, c) in enumerate(zip(got, torch_ops, want)):
        assert a.dtype == b.dtype and a.shape == c.shape, f"result {i}"
        assert not torch.isnan(a).any() and rel(a, c) < tol and rel(a, b) < same, f"result {i}: {rel(a, c):.2e}"


@needs_compiler
@pytest.mark.parametrize("native_forward", [False, True])
def test_each_direction_on_the_other_paths_states(monkeypatch, walks, native_forward):
    """The forward of one path, the backward of the other: the saved block states mean the same to both, so the
    gradients agree with those of the torch path alone."""
    monkeypatch.setitem(tables_mod.BLOCK_ELEMENTS, "cpu", 1024)
    xs, state, w = _inputs(("mixed", native_forward), 1, 2, 200, 8, 8, torch.float64, True)
    leaves = [t.clone().requires_grad_() for t in xs + state]
    with poison_buffers():
        monkeypatch.setattr(native_chunk, "ENABLED", native_forward)
        out, fin = chunk_linear_attention(*leaves[:3], initial_state=LinearAttentionState(*leaves[3:]),
                                          output_final_state=True, rope="numerator")  # fmt: skip
        monkeypatch.setattr(native_chunk, "ENABLED", not native_forward)
        loss = (out * w[0]).sum() + (fin.S * w[1]).sum() + (fin.z * w[2]).sum()
        mixed = torch.autograd.grad(loss, leaves)
    assert len(walks) == int(native_forward) and len(native_chunk.back_walks) == int(not native_forward)
    monkeypatch.setattr(native_chunk, "ENABLED", False)
    want = _run(chunk_linear_attention, xs, state, w)[3:]
    for i, (a, b) in enumerate(zip(mixed, want)):
        assert not torch.isnan(a).any() and rel(a, b) < 1e-12, f"gradient {i}: {rel(a, b):.2e}"


@needs_compiler
def test_the_walk_under_bfloat16_autocast(walks):
    """float32 inputs under CPU autocast to bfloat16: the operator turns autocast off, so the walk runs and gives
    exactly the numbers it gives without autocast (and the fallback's within float32 rounding)."""
    xs, state, w = _inputs(("autocast",), 2, 2, 130, 8, 8, torch.float32, True)
    plain = _run(chunk_linear_attention, xs, state, w)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        cast = _run(chunk_linear_attention, xs, state, w)
    assert len(walks) == 2 and len(native_chunk.back_walks) == 2
    for i, (a, b) in enumerate(zip(cast, plain)):
        assert a.dtype == b.dtype and torch.equal(a, b), f"result {i}"


@needs_compiler
@pytest.mark.parametrize(
    "change",
    [dict(rope="both"), dict(rope="none"), dict(feature_map="cosine"), dict(causal=False), dict(normalize=False),
     dict(decay=True), dict(documents=True), dict(dtype=torch.float16), dict(dtype=torch.bfloat16)],
)  # fmt: skip
def test_what_the_walk_does_not_serve_runs_the_torch_path(walks, change):
    """One predicate: any other placement, feature map, a non-causal call, no normalising, a decay, packed
    documents, float16 inputs, or bfloat16 at a width the bfloat16 walk does not serve (d = 8; native_bf16.py) run
    the torch path (the walk is never called)."""
    change = dict(change)
    dtype = change.pop("dtype", torch.float32)
    g = gen("not served", repr(change))
    q, k, v = (torch.randn(1, 2, 70, 8, generator=g).to(dtype) for _ in range(3))
    if change.pop("decay", False):
        change["decay"] = torch.tensor([0.9, 0.99])
    if change.pop("documents", False):
        change["documents"] = torch.tensor([[0] * 30 + [1] * 40])
    out = chunk_linear_attention(q, k, v, **change)
    assert not walks and not native_chunk.back_walks and not torch.isnan(out).any()
    assert native_chunk.usable(q, k, v, Cfg("elu", "numerator", True, 1e-6, 64), None, None) == (dtype == torch.float32)


def test_without_the_extension_the_torch_path_runs(monkeypatch, walks):
    """A build that failed (or a torch without the BLAS symbols) leaves its reason in one line; the chunk form
    runs its torch ops, correctly."""
    why = "linrope: native chunk loop unavailable (no sgemm_); the chunk kernel uses torch ops"
    monkeypatch.setattr(native_chunk.WALK, "state", {"why": why})
    assert native_chunk.why_not() == why
    g = gen("native walk fallback")
    q, k, v = (torch.randn(1, 2, 75, 4, generator=g, dtype=torch.float64) for _ in range(3))
    got = chunk_linear_attention(q, k, v, rope="numerator")
    want = naive_linear_attention(q, k, v, rope="numerator")
    assert not walks and not native_chunk.back_walks and rel(got, want) < 1e-12


# ---- bfloat16 (native_bf16.py) ----------------------------------------------------------------------------------
OUT, GRAD = 2e-2, 1e-2  # the torch path's bfloat16 bounds against float64 (output; state and gradients)


@pytest.fixture
def bf16_cpu():
    """The extension built and the CPU able to run ``vdpbf16ps``; the test skips, saying which is missing."""
    if native_chunk.WALK.get() is None or native_bf16.WALK.get() is None:
        pytest.skip(f"the bfloat16 walk cannot run here: {native_chunk.why_not() or native_bf16.why_not()}")


def _check(got, want, what):
    names = ["out", "S", "z", "dq", "dk", "dv", "dS0", "dz0"]
    for i, (a, b) in enumerate(zip(got, want)):
        tol = OUT if i == 0 else GRAD
        assert a.shape == b.shape and not torch.isnan(a).any(), f"{what} {names[i]}"
        assert rel(a, b) < tol, f"{what} {names[i]}: {rel(a, b):.2e}"


@needs_compiler
@pytest.mark.usefixtures("bf16_cpu")
@pytest.mark.parametrize("m", [64, 44, 30, 1])
@pytest.mark.parametrize("n", [64, 48, 128])
def test_the_bfloat16_products_skip_only_zeros(m, n):
    """The bfloat16 micro-kernel's triangular shapes (csrc/chunk_bf16.cpp, ``Shape``) against float64 products of the
    same bfloat16 values, for row counts that leave 4-row tiles short: a lower-triangular A (pairs past a row tile's
    diagonal skipped), an upper-triangular one read transposed (pairs before it skipped), a product whose lower
    triangle alone is kept, and the full product (both layouts of A).  Float32 accumulation of the exact bfloat16
    products leaves ~1e-6; one skipped nonzero pair leaves far more."""
    product = native_bf16.WALK.get().product_bf16
    g = gen(f"bf16 products {m} {n}")
    K = 64
    a, b = torch.randn(m, K, generator=g).bfloat16().float(), torch.randn(K, n, generator=g).bfloat16().float()
    lower = torch.ones(m, K).tril().bool()
    full, tol = (a.double() @ b.double()), 1e-5
    for shape, x, transposed, want, keep in [
        (0, a, False, full, None),
        (0, a.t().contiguous(), True, full, None),
        (1, a * lower, False, (a * lower).double() @ b.double(), None),  # A_LOWER
        (2, (a * ~lower.tril(-1)).t().contiguous(), True, (a * ~lower.tril(-1)).double() @ b.double(), None),
        (3, a, False, full, torch.ones(m, n).tril().bool()),  # C_LOWER: j <= i kept
    ]:
        got = product(x, b, shape, transposed).double()
        if keep is not None:
            assert not torch.isnan(got[keep]).any(), f"shape {shape}: a kept entry unwritten"
            got, want = got[keep], want[keep]
        assert not torch.isnan(got).any() and rel(got, want) < tol, f"shape {shape}: {rel(got, want):.2e}"


@needs_compiler
@pytest.mark.usefixtures("bf16_cpu")
@pytest.mark.parametrize("d, dv", [(16, 16), (32, 64), (64, 64), (128, 128)])
@pytest.mark.parametrize("as_tasks", [False, True])
def test_the_bfloat16_walk_matches_the_naive_form(monkeypatch, walks, d, dv, as_tasks):
    """N = 300 (four chunks of 64 and one of 44) in blocks of one or two chunks, as one call or as the heads' tasks,
    the initial state given: the bfloat16 walks forward and backward run, write every output and gradient
    (poisoned) in bfloat16 (the states float32), and agree with the naive form in float64 and with the torch path."""
    monkeypatch.setitem(tables_mod.BLOCK_ELEMENTS, "cpu", 2 * 64 * d)
    monkeypatch.setattr(heads, "ENABLED", as_tasks)
    monkeypatch.setattr(heads, "MIN_POSITIONS", 1)
    B, H, N = 2, 3, 300
    xs, state, w = _inputs(("bf16", d, dv, as_tasks), B, H, N, d, dv, torch.bfloat16, True)
    state = [t.float() for t in state]  # the states are float32 (the operator's own dtype for bfloat16 inputs)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with poison_buffers():
            got = _run(chunk_linear_attention, xs, state, w)
            tasks = B * H if as_tasks else 1
            assert len(walks) == tasks and len(native_chunk.back_walks) == tasks
            monkeypatch.setattr(native_chunk, "ENABLED", False)
            torch_ops = _run(chunk_linear_attention, xs, state, w)
            assert len(walks) == tasks and len(native_chunk.back_walks) == tasks  # the torch path ran
    finally:
        torch.set_num_threads(threads)
    want = _run(naive_linear_attention, [x.double() for x in xs], [t.double() for t in state], w)
    assert [t.dtype for t in got[:6]] == [torch.bfloat16, torch.float32, torch.float32] + [torch.bfloat16] * 3
    _check(got, want, "walk ÷ float64")
    _check(got, torch_ops, "walk ÷ torch path")


@needs_compiler
@pytest.mark.usefixtures("bf16_cpu")
def test_the_bfloat16_walk_inside_an_autocast_model(walks):
    """float32 activations through autocast Linears (bfloat16 q, k, v), 200 positions: the walk runs both ways,
    and the output and the float32 gradients of the activations and weights match the same model in float64."""
    g = gen("bf16 autocast model")
    x = torch.randn(2, 200, 64, generator=g)
    lin = torch.nn.Linear(64, 3 * 64)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(lin.weight.shape, generator=g) / 8)
    w = torch.randn(2, 2, 200, 32, generator=g, dtype=torch.float64)

    def model(x, weight, bias, autocast):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            q, k, v = torch.nn.functional.linear(x, weight, bias).view(2, 200, 3, 2, 32).permute(2, 0, 3, 1, 4)
            assert q.dtype == (torch.bfloat16 if autocast else x.dtype)
            out = chunk_linear_attention(q, k, v, rope="numerator")
        return out

    leaves = [t.detach().clone().requires_grad_() for t in (x, lin.weight, lin.bias)]
    out = model(*leaves, autocast=True)
    (out.double() * w).sum().backward()
    assert out.dtype == torch.bfloat16 and len(walks) == 1 and len(native_chunk.back_walks) == 1
    ref_leaves = [t.detach().double().requires_grad_() for t in (x, lin.weight, lin.bias)]
    ref = model(*ref_leaves, autocast=False)
    (ref * w).sum().backward()
    assert rel(out, ref) < OUT, rel(out, ref)
    for a, b in zip(leaves, ref_leaves):
        assert a.grad.dtype == torch.float32 and rel(a.grad, b.grad) < GRAD, rel(a.grad, b.grad)


@needs_compiler
@pytest.mark.usefixtures("bf16_cpu")
def test_without_avx512_bf16_bfloat16_takes_the_torch_path(monkeypatch, walks, capsys):
    """A CPU whose check says no: one line says why (once), bfloat16 runs the torch path, and its numbers are those
    of the walk within the bounds."""
    xs, state, w = _inputs(("bf16 no cpu",), 1, 2, 150, 32, 32, torch.bfloat16, True)
    state = [t.float() for t in state]
    native = _run(chunk_linear_attention, xs, state, w)
    assert len(walks) == 1

    monkeypatch.setattr(native_bf16.WALK, "state", {})
    monkeypatch.setattr(native_bf16.WALK, "check", lambda module: "this CPU has no AVX-512 BF16")
    assert not native_bf16.serves(xs[0], xs[2], 64) and not native_bf16.serves(xs[0], xs[2], 64)
    line = native_bf16.why_not()
    assert capsys.readouterr().err == line + "\n" and "AVX-512 BF16" in line
    fallback = _run(chunk_linear_attention, xs, state, w)
    assert len(walks) == 1 and len(native_chunk.back_walks) == 1  # the torch path ran
    _check(fallback, native, "torch path ÷ walk")


@needs_compiler
@pytest.mark.usefixtures("bf16_cpu")
@pytest.mark.parametrize("d, dv, N", [(8, 16, 100), (16, 24, 100), (16, 16, 40)])
def test_widths_the_bfloat16_walk_does_not_serve(walks, d, dv, N):
    """d or dv not a multiple of 16, or a single chunk of 40 positions: the torch path."""
    q, k = (torch.randn(1, 2, N, d, generator=gen("bf16 widths", d, dv, N, i)).bfloat16() for i in range(2))
    v = torch.randn(1, 2, N, dv, generator=gen("bf16 widths v", d, dv, N)).bfloat16()
    out = chunk_linear_attention(q, k, v, rope="numerator")
    assert not walks and not torch.isnan(out).any()
    assert not native_chunk.usable(q, k, v, Cfg("elu", "numerator", True, 1e-6, 64), None, None)
