"""The native chunk walk in bfloat16 (linrope.ops.linear_attn.native_bf16): forward and backward against the naive
form in float64 within the bounds the torch path's bfloat16 is held to (tests/ops/test_linear_attention_precision.py:
2e-2 for the output, 1e-2 for gradients), at every width it serves, beyond one block and with a short last chunk,
the initial state given and the final state returned, poisoned outputs, the heads' tasks on and off, inside an
autocast model, and the same numbers (within those bounds) from the torch path it falls back to: switched off, on a
CPU without AVX-512 BF16 (one line saying so), or at a width it does not serve."""

from __future__ import annotations

import pytest
import torch

from linrope.ops import chunk_linear_attention, naive_linear_attention
from linrope.ops.linear_attn import heads, native_bf16, native_chunk
from linrope.ops.linear_attn import tables as tables_mod
from linrope.ops.linear_attn.buffers import poison_buffers
from linrope.ops.linear_attn.chunk_kernel import Cfg
from tests.helpers import gen, rel
from tests.ops.test_native_chunk import _inputs, _run, needs_compiler, walks  # noqa: F401 - walks: a fixture

OUT, GRAD = 2e-2, 1e-2  # the torch path's bfloat16 bounds against float64 (output; state and gradients)


@pytest.fixture
def bf16_cpu():
    """The extension built and the CPU able to run ``vdpbf16ps``; the test skips, saying which is missing."""
    if native_chunk._load() is None or native_bf16.extension(native_chunk.SOURCE) is None:
        pytest.skip(f"the bfloat16 walk cannot run here: {native_chunk.why_not() or native_bf16.why_not()}")


def _check(got, want, what):
    names = ["out", "S", "z", "dq", "dk", "dv", "dS0", "dz0"]
    for i, (a, b) in enumerate(zip(got, want)):
        tol = OUT if i == 0 else GRAD
        assert a.shape == b.shape and not torch.isnan(a).any(), f"{what} {names[i]}"
        assert rel(a, b) < tol, f"{what} {names[i]}: {rel(a, b):.2e}"


@needs_compiler
@pytest.mark.usefixtures("bf16_cpu")
@pytest.mark.parametrize("d, dv", [(16, 16), (32, 64), (64, 64), (128, 128)])
@pytest.mark.parametrize("as_tasks", [False, True])
def test_the_bfloat16_walk_matches_the_naive_form(monkeypatch, walks, d, dv, as_tasks):  # noqa: F811
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
def test_the_bfloat16_walk_inside_an_autocast_model(walks):  # noqa: F811
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
def test_without_avx512_bf16_bfloat16_takes_the_torch_path(monkeypatch, walks, capsys):  # noqa: F811
    """A CPU whose check says no: one line says why (once), bfloat16 runs the torch path, and its numbers are those
    of the walk within the bounds."""
    xs, state, w = _inputs(("bf16 no cpu",), 1, 2, 150, 32, 32, torch.bfloat16, True)
    state = [t.float() for t in state]
    native = _run(chunk_linear_attention, xs, state, w)
    assert len(walks) == 1

    monkeypatch.setattr(native_bf16, "_state", {})
    monkeypatch.setattr(native_bf16, "_supported", lambda ext: False)
    base = native_chunk.SOURCE
    assert not native_bf16.serves(base, xs[0], xs[2], 64) and not native_bf16.serves(base, xs[0], xs[2], 64)
    line = native_bf16.why_not()
    assert capsys.readouterr().err == line + "\n" and "AVX-512 BF16" in line
    fallback = _run(chunk_linear_attention, xs, state, w)
    assert len(walks) == 1 and len(native_chunk.back_walks) == 1  # the torch path ran
    _check(fallback, native, "torch path ÷ walk")


@needs_compiler
@pytest.mark.usefixtures("bf16_cpu")
@pytest.mark.parametrize("d, dv, N", [(8, 16, 100), (16, 24, 100), (16, 16, 40)])
def test_widths_the_bfloat16_walk_does_not_serve(walks, d, dv, N):  # noqa: F811
    """d or dv not a multiple of 16, or a single chunk of 40 positions: the torch path."""
    q, k = (torch.randn(1, 2, N, d, generator=gen("bf16 widths", d, dv, N, i)).bfloat16() for i in range(2))
    v = torch.randn(1, 2, N, dv, generator=gen("bf16 widths v", d, dv, N)).bfloat16()
    out = chunk_linear_attention(q, k, v, rope="numerator")
    assert not walks and not torch.isnan(out).any()
    assert not native_chunk.usable(q, k, v, Cfg("elu", "numerator", True, 1e-6, 64), None, None)
