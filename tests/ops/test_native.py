"""The native scans of the unrotated denominator (linrope.ops.linear_attn.native): the forward scan and its backward
against their formulas in float64, in float32 and float64, on NaN-poisoned outputs, with and without the states
in and out; the chunk form through them against the naive form and against the chunk form's torch ops, in several
blocks and as heads' tasks; without a compiler the torch ops run and the reason is one line.  The fused elu+1
features and their rotation, and their backward, against float64 formulas (within 2 ulp in float32, where torch's
elu + 1 loses up to 1e4 ulp below 0 to the cancellation of expm1(x) + 1), from float32, bfloat16 and strided inputs,
into strided gradients of another dtype."""

from __future__ import annotations

import shutil
import sys

import pytest
import torch
from torch.utils.cpp_extension import is_ninja_available

from linrope.ops import chunk_linear_attention, naive_linear_attention
from linrope.ops.linear_attn import heads, native, native_chunk
from linrope.ops.linear_attn import tables as tables_mod
from linrope.ops.linear_attn.buffers import poison_buffers
from linrope.ops.linear_attn.common import LinearAttentionState
from linrope.ops.linear_attn.features import rope_rotors, rotate_complex
from tests.helpers import gen, rel

COMPILER = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
needs_compiler = pytest.mark.skipif(
    COMPILER is None or not is_ninja_available(),
    reason="no C++ compiler or no ninja (`pip install ninja`): the native loops cannot be built here",
)


def formulas(qd, kd, z0, dden, dz):
    """The scans written out in float64: den, the final z, dqd, dkd and ∂L/∂z0."""
    qd, kd, z0, dden, dz = (t.double() for t in (qd, kd, z0, dden, dz))
    zc = kd.cumsum(2) + z0.unsqueeze(2)  # z after each position
    den = (qd * zc).sum(-1)
    dqd = dden.unsqueeze(-1) * zc
    y = dden.unsqueeze(-1) * qd
    dkd = y.flip(2).cumsum(2).flip(2) + dz.unsqueeze(2)
    return den, zc[:, :, -1], dqd, dkd, dkd[:, :, 0]


@needs_compiler
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("with_states", [False, True])
def test_the_scans_match_their_formulas(dtype, with_states):
    g = gen("native", str(dtype), with_states)
    B, H, n, d = 2, 3, 301, 17
    qd, kd = (torch.rand(B, H, n, d, generator=g, dtype=torch.float64).add_(0.1).to(dtype) for _ in range(2))
    dden = torch.randn(B, H, n, generator=g, dtype=torch.float64).to(dtype)
    z0 = torch.rand(B, H, d, generator=g, dtype=torch.float64).to(dtype) if with_states else None
    dz = torch.randn(B, H, d, generator=g, dtype=torch.float64).to(dtype) if with_states else None
    with poison_buffers():
        den, z = native.denominator(qd, kd, z0)
        dqd, dkd, dz0 = native.denominator_backward(qd, kd, dden, z0, dz)
    assert native.why_not() is None
    zeros = torch.zeros(B, H, d, dtype=dtype)
    want = formulas(qd, kd, zeros if z0 is None else z0, dden, zeros if dz is None else dz)
    tol = 1e-13 if dtype == torch.float64 else 2e-6
    for name, got, ref in zip(("den", "z", "dqd", "dkd", "dz0"), (den, z, dqd, dkd, dz0), want):
        assert got.dtype == dtype and got.shape == ref.shape, name
        assert not torch.isnan(got).any() and rel(got, ref) < tol, f"{name}: {rel(got, ref):.2e}"
    if z0 is not None:
        assert not torch.equal(z, z0)  # the caller's state is not the one the scan advanced


def _elu1(x: torch.Tensor) -> torch.Tensor:
    """elu(x) + 1 in float64 without the cancellation of expm1(x) + 1."""
    x = x.double()
    return torch.where(x > 0, x + 1, torch.exp(x))


@needs_compiler
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_fused_features_match_their_formulas(dtype):
    """f = elu(x) + 1 and r = f rotated, from a strided view and from bfloat16 inputs, on poisoned outputs; x spans
    [-95, 6] so the exponential is checked from 1 down past float's normal range."""
    g = gen("native features", str(dtype))
    B, H, N, d = 2, 3, 400, 16
    base = torch.rand(B, H, N + 20, d, generator=g, dtype=torch.float64).mul_(101).sub_(95).to(dtype)
    rot = rope_rotors(None, N, d, None, "cpu", dtype)
    for x in (base[:, :, 10 : N + 10], base[:, :, :N].to(torch.bfloat16)):
        with poison_buffers():
            f, r = native.elu_rope(x, rot, dtype)
        want = _elu1(x)
        ulp = torch.finfo(dtype).eps / 2
        err = (f.double() - want).abs()
        assert f.dtype == dtype and not torch.isnan(f).any()
        assert (err <= 2 * ulp * want + torch.finfo(dtype).tiny).all(), f"{(err / want).max():.2e}"
        assert rel(r, rotate_complex(want, rot.to(torch.complex128))) < 4 * ulp


@needs_compiler
@pytest.mark.parametrize("shared", [False, True])
def test_the_fused_features_backward(shared):
    """∂L/∂x = min(f, 1) ⊙ (R⁻¹ g_num + g_den) against autograd in float64, into a strided view and through a
    copy into bfloat16."""
    g = gen("native features backward", shared)
    B, H, N, d = 2, 2, 90, 8
    x = torch.randn(B, H, N, d, generator=g, dtype=torch.float64).mul_(3).requires_grad_()
    rot = rope_rotors(None, N, d, None, "cpu", torch.float64)
    g_num, g_den = (torch.randn(B, H, N, d, generator=g, dtype=torch.float64) for _ in range(2))
    f = _elu1(x)
    loss = (rotate_complex(f, rot) * g_num).sum() + (0 if shared else (f * g_den).sum())
    (want,) = torch.autograd.grad(loss, x)
    big = torch.full((B, H, N + 5, d), float("nan"), dtype=torch.float64)
    native.elu_rope_backward(f.detach(), g_num, None if shared else g_den, rot, big[:, :, 5:])
    assert rel(big[:, :, 5:], want) < 1e-14 and torch.isnan(big[:, :, :5]).all()  # only its view written
    low = torch.full((B, H, N, d), float("nan"), dtype=torch.bfloat16)
    native.elu_rope_backward(f.detach(), g_num, None if shared else g_den, rot, low)
    assert rel(low, want) < 1e-2


@pytest.fixture
def counted(monkeypatch):
    """Counts the calls of the native scans."""
    calls = {"forward": 0, "backward": 0, "features": 0, "features_backward": 0}
    fwd, bwd, feat, feat_bwd = (
        native.denominator,
        native.denominator_backward,
        native.elu_rope,
        native.elu_rope_backward,
    )

    def forward(*a):
        calls["forward"] += 1
        return fwd(*a)

    def backward(*a):
        calls["backward"] += 1
        return bwd(*a)

    def features(*a):
        calls["features"] += 1
        return feat(*a)

    def features_backward(*a):
        calls["features_backward"] += 1
        return feat_bwd(*a)

    monkeypatch.setattr(native, "denominator", forward)
    monkeypatch.setattr(native, "denominator_backward", backward)
    monkeypatch.setattr(native, "elu_rope", features)
    monkeypatch.setattr(native, "elu_rope_backward", features_backward)
    return calls


def _run(xs, state, w, **kw):
    leaves = [t.clone().requires_grad_() for t in xs]
    init = None if state is None else LinearAttentionState(*(t.clone().requires_grad_() for t in state))
    out, fin = kw.pop("fn")(*leaves, initial_state=init, output_final_state=True, causal=True, **kw)
    loss = (out * w[0]).sum() + (fin.S * w[1]).sum() + (fin.z * w[2]).sum()
    return [out, fin.S, fin.z, *torch.autograd.grad(loss, leaves + ([] if init is None else list(init)))]


@needs_compiler
@pytest.mark.parametrize("as_tasks,rope", [(False, "numerator"), (True, "numerator"), (False, "both")])
def test_the_chunk_form_through_the_native_scans(monkeypatch, counted, as_tasks, rope):
    """RoPE in the numerator (or both), several blocks (and as tasks of the heads), the state in and out, float64:
    the native scans (numerator) and features serve every block and agree with the naive form and with the chunk
    form's torch ops."""
    monkeypatch.setitem(tables_mod.BLOCK_ELEMENTS, "cpu", 512)
    monkeypatch.setattr(native_chunk, "ENABLED", False)  # the torch path's scans (test_native_chunk.py: the walk)
    if as_tasks:
        monkeypatch.setattr(heads, "MIN_POSITIONS", 1)
    B, H, N, D, DV = 2, 3, 37, 8, 6
    g = gen("native chunk", as_tasks, rope)
    xs = [torch.randn(B, H, N, w, generator=g, dtype=torch.float64) for w in (D, D, DV)]
    state = LinearAttentionState(
        torch.randn(B, H, D, DV, generator=g, dtype=torch.float64),
        torch.rand(B, H, D, generator=g, dtype=torch.float64) + 0.5,
    )
    w = [torch.randn(*s, generator=g, dtype=torch.float64) for s in ((B, H, N, DV), (B, H, D, DV), (B, H, D))]
    kw = dict(feature_map="elu", rope=rope)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with poison_buffers():
            got = _run(xs, state, w, fn=lambda *a, **k: chunk_linear_attention(*a, chunk_size=4, **k), **kw)
            scans = rope == "numerator"  # "both" folds its denominator into the products
            assert (counted["forward"] > 1 and counted["backward"] > 1) == scans  # every block, forward and backward
            assert counted["features"] > 2 and counted["features_backward"] > 2
            monkeypatch.setattr(native, "ENABLED", False)
            calls = dict(counted)
            torch_ops = _run(xs, state, w, fn=lambda *a, **k: chunk_linear_attention(*a, chunk_size=4, **k), **kw)
            assert counted == calls  # the torch ops ran
    finally:
        torch.set_num_threads(threads)
    want = _run(xs, state, w, fn=naive_linear_attention, **kw)
    for i, (a, b, c) in enumerate(zip(got, torch_ops, want)):
        assert not torch.isnan(a).any() and rel(a, c) < 1e-10 and rel(a, b) < 1e-12, f"result {i}"


def test_without_a_compiler_the_torch_ops_run(monkeypatch, counted):
    """A build that failed leaves its reason in one line, and the chunk form runs its torch ops, correctly."""
    monkeypatch.setattr(native.SCANS, "state", {"why": "linrope: native scans unavailable (no compiler)"})
    assert native.why_not() == "linrope: native scans unavailable (no compiler)"
    g = gen("native fallback")
    q, k, v = (torch.randn(1, 2, 21, 4, generator=g, dtype=torch.float64) for _ in range(3))
    got = chunk_linear_attention(q, k, v, chunk_size=4, rope="numerator")
    want = naive_linear_attention(q, k, v, rope="numerator")
    assert set(counted.values()) == {0} and rel(got, want) < 1e-12


def test_a_build_folder_is_named_by_its_source_flags_and_torch(monkeypatch):
    """Two virtualenvs sharing ~/.cache/torch_extensions, two ninjas (a venv's pip ninja and the system's hash their
    logs differently) or two flag sets get build folders of their own (a shared one was rebuilt by each in turn);
    one source, flags, torch and ninja always get the same folder, and the native extensions are named so."""
    from linrope.ops.linear_attn import extensions

    name = extensions.build_name("x", "int f();", ["-O3"])
    assert name == extensions.build_name("x", "int f();", ["-O3"]) and name.startswith("x_")
    assert name != extensions.build_name("x", "int g();", ["-O3"])
    assert name != extensions.build_name("x", "int f();", ["-O2"])
    assert native.SCANS.name == extensions.build_name(
        "linrope_native_scans", native.SCANS.source, [*native.SCANS.cflags, "|", *native.SCANS.ldflags]
    )
    monkeypatch.setattr(extensions.shutil, "which", lambda program: f"/elsewhere/bin/{program}")
    assert name != extensions.build_name("x", "int f();", ["-O3"])  # another ninja
    monkeypatch.undo()
    monkeypatch.setattr(extensions, "installation", lambda: "/elsewhere/torch|2.13.0|3.11|/usr/bin/ninja")
    assert name != extensions.build_name("x", "int f();", ["-O3"])


def test_the_native_sources_include_torch_api_not_torch_extension():
    """torch/extension.h (the whole C++ frontend) was 21 s of a 23 s build: the sources include csrc/torch_api.h."""
    from linrope.ops.linear_attn import native_bf16, native_chunk

    for ext in (native.SCANS, native_chunk.WALK, native_bf16.WALK):
        assert "#include <torch/extension.h>" not in ext.source and "#include <torch/csrc/utils/pybind.h>" in ext.source


def test_an_extension_asked_again_in_one_process_is_loaded_once(monkeypatch):
    """torch's ``load_inline`` called twice with one name compiles it again under ``<name>_v1`` (25 s, and the next
    process recompiles the first): an emptied ``state`` checks again the module already loaded, and a second
    ``Extension`` of the same source shares it."""
    from torch.utils import cpp_extension

    from linrope.ops.linear_attn import extensions

    loads = []
    monkeypatch.setattr(extensions, "_LOADED", {})
    monkeypatch.setattr(cpp_extension, "load_inline", lambda name, **kw: loads.append(name) or object())
    monkeypatch.setattr(extensions, "built", lambda name: True)
    checked = []
    ext = extensions.Extension("x", [], ["f"], what="x", fallback="y", cflags=["-O3"], check=checked.append)
    first = ext.get()
    ext.state.clear()
    assert ext.get() is first and len(checked) == 2
    twin = extensions.Extension("x", [], ["f"], what="x", fallback="y", cflags=["-O3"])
    assert twin.get() is first and loads == [ext.name]


def _vm_flags(address: int) -> list:
    """VmFlags of the mapping holding ``address`` in /proc/self/smaps."""
    flags, inside = [], False
    for line in open("/proc/self/smaps"):
        head = line.split()[0] if line.strip() else ""
        if "-" in head and not head.endswith(":"):
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo <= address < hi
        elif inside and head == "VmFlags:":
            flags = line.split()[1:]
    return flags


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise and /proc/self/smaps are Linux's")
def test_a_large_cpu_buffer_is_advised_huge_pages_and_a_small_one_is_not(monkeypatch):
    """buffers.alloc advises huge pages (MADV_HUGEPAGE: VmFlags "hg") on the whole 2 MiB pages of a buffer of
    HUGE_FROM bytes or more, before anything writes it; small buffers are left alone.

    "Left alone" is about the calls alloc makes, not the mapping's flags: where glibc's allocator has raised its
    mmap threshold (after freeing a large block) a large buffer comes from the heap, its advice stays on that part
    of the heap after it is freed, and a later small buffer may land there."""
    from linrope.ops.linear_attn import buffers

    assert buffers._MADVISE is not None, "libc's madvise not found on Linux"
    calls = []

    def recorded(start, length, advice):
        calls.append((start, length, advice))
        return madvise(start, length, advice)

    madvise = buffers._MADVISE
    monkeypatch.setattr(buffers, "_MADVISE", recorded)
    big = buffers.alloc((buffers.HUGE_FROM // 4 + 1,), dtype=torch.float32, device="cpu")
    start = -(-big.data_ptr() // buffers.HUGE) * buffers.HUGE
    end = (big.data_ptr() + big.numel() * 4) // buffers.HUGE * buffers.HUGE
    assert calls == [(start, end - start, 14)], calls
    assert "hg" in _vm_flags(start + 4096), _vm_flags(start + 4096)
    buffers.alloc((1024,), dtype=torch.float32, device="cpu")  # small
    buffers.alloc((buffers.HUGE_FROM // 4 - 1,), dtype=torch.float32, device="cpu")  # one float short of HUGE_FROM
    assert len(calls) == 1, calls
