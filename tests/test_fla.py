"""impl="fla" (linrope's linear attention on fla's chunked Triton kernels) and impl="auto".

The mapping runs here, on the CPU, through fla's real Triton kernels under Triton's interpreter
(tests/fla_interpreter.py), and is compared with the float64 naive form on the same (float32-rounded) inputs:
outputs, final states and the gradients of q, k, v and the initial state.  fla computes in float32 at most,
so the tolerance is float32's: FLOAT32_TOL relative (the norm of the difference over the norm of the
reference); measured up to 3.2e-6 over the slow matrix.  float16 stands in for 16-bit (the interpreter's
bfloat16 dot is wrong).
A few configurations run in the default suite, the whole matrix in the slow suite; the CUDA checks are
marked ``gpu``.
"""
import itertools
import logging
import subprocess
import sys
import zlib

import pytest
import torch

import fla_interpreter
from linrope.errors import BackendUnavailable, LinropeError
from linrope.ops import IMPLS, linear_attention
from linrope.ops.linear_attn import backends, fla_backend
from linrope.ops.linear_attn.common import LinearAttentionState

FLOAT32_TOL = 2e-5   # relative, every output, state and gradient against float64 naive (seen: <= 3.2e-6)
FLOAT16_TOL = 5e-3   # relative, float16 inputs (seen: <= 1.2e-3, a few float16 roundings)
DECAY = torch.tensor([0.9, 0.99])


@pytest.fixture
def fla_cpu(monkeypatch):
    """fla's kernels under Triton's interpreter, every allocation NaN-poisoned; skipped (with the reason)
    only when fla or triton is not installed."""
    reason = fla_interpreter.load()
    if reason:
        pytest.skip(reason)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with fla_interpreter.nan_empty():
            yield
    finally:
        torch.set_num_threads(threads)


def gen(*key) -> torch.Generator:
    return torch.Generator().manual_seed(zlib.crc32(repr(key).encode()))


def rel(a, b) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-300)).item()


def inputs(key, *, feature_map, rope="numerator", decay=None, n, initial, B=2, H=2, d=8, dv=6):
    """q, k, v and, when ``initial``, the state (S0, z0) that 20 earlier random positions leave (a state
    that a real prefix could leave: an arbitrary z0 can put the denominator near zero)."""
    g = gen(*key)
    q, k, v = (torch.randn(B, H, n, w, generator=g) for w in (d, d, dv))
    if not initial:
        return q, k, v, None, None
    p = [torch.randn(B, H, 20, w, generator=g, dtype=torch.float64) for w in (d, d, dv)]
    _, (S0, z0) = linear_attention(*p, impl="naive", feature_map=feature_map, rope=rope, decay=decay,
                                   output_final_state=True)
    return q, k, v, S0.float(), z0.float()


def results(impl, dtype, q, k, v, S0, z0, weights=None, **kw):
    """(out, S, z) and the gradients of (q, k, v, S0, z0) of a fixed random weighting of all three."""
    leaves = [None if x is None else x.detach().to(dtype).requires_grad_() for x in (q, k, v, S0, z0)]
    state = None if S0 is None else LinearAttentionState(leaves[3], leaves[4])
    out, (S, z) = linear_attention(*leaves[:3], impl=impl, initial_state=state, output_final_state=True, **kw)
    g = gen("weights", tuple(out.shape))
    w = [torch.randn(t.shape, generator=g, dtype=torch.float64) for t in (out, S, z)]
    sum((t.double() * wt).sum() for t, wt in zip((out, S, z), w)).backward()
    return [out, S, z] + [x.grad for x in leaves if x is not None]


def compare(feature_map, rope, decayed, initial, n, dtype=torch.float32, tol=FLOAT32_TOL):
    key = ("fla", feature_map, rope, decayed, initial, n)
    decay = DECAY if decayed else None
    q, k, v, S0, z0 = inputs(key, feature_map=feature_map, rope=rope, decay=decay, n=n, initial=initial)
    if dtype != torch.float32:  # the reference sees exactly the rounded inputs
        q, k, v = (x.to(dtype).float() for x in (q, k, v))
    kw = dict(feature_map=feature_map, rope=rope, decay=decay)
    ref = results("naive", torch.float64, q, k, v, S0, z0, **kw)
    got = results("fla", dtype, q, k, v, S0, z0, **kw)
    assert got[0].dtype == dtype and got[1].dtype == torch.float32 and got[2].dtype == torch.float32
    names = ["out", "S", "z", "dq", "dk", "dv", "dS0", "dz0"]
    errors = {name: rel(a, b) for name, a, b in zip(names, got, ref)}
    assert all(torch.isfinite(t).all() for t in got)
    print(f"fla {key[1:]} {dtype}: largest relative error {max(errors.values()):.2e} ({max(errors, key=errors.get)})")
    assert max(errors.values()) < tol, errors
    return errors


# --------------------------------------------------------------------------------------------------------
# default suite: the mapping through fla's kernels (interpreted), a handful of configurations
# --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("feature_map,rope,decayed,initial,n", [
    ("elu", "numerator", True, True, 100),
    ("cosine", "both", False, True, 130),
    ("elu", "none", True, False, 37),
    ("cosine", "numerator", True, False, 64),
])
def test_fla_mapping_matches_naive_float32(fla_cpu, feature_map, rope, decayed, initial, n):
    compare(feature_map, rope, decayed, initial, n)


def test_fla_mapping_matches_naive_float16(fla_cpu):
    """16-bit inputs: kernels in float16, odd widths padded (cosine's d+1, the ones column), states float32."""
    compare("cosine", "numerator", True, True, 100, dtype=torch.float16, tol=FLOAT16_TOL)


def test_fla_empty_sequence_passes_the_state_through(fla_cpu):
    q, k, v, S0, z0 = inputs(("empty",), feature_map="cosine", n=0, initial=True)
    out, st = linear_attention(q, k, v, impl="fla", feature_map="cosine", initial_state=LinearAttentionState(S0, z0),
                               output_final_state=True)
    assert out.shape == v.shape and torch.equal(st.S, S0) and torch.equal(st.z, z0)
    _, st = linear_attention(q, k, v, impl="fla", feature_map="cosine", output_final_state=True)
    assert st.S.shape == S0.shape and not st.S.any() and not st.z.any()


def test_fla_is_one_graph_under_torch_compile(fla_cpu):
    """fla is reached through linrope's registered operators: fullgraph compiles, forward and backward agree."""
    q, k, v, S0, z0 = inputs(("compile",), feature_map="elu", decay=DECAY, n=70, initial=True)

    def run(q, k, v, S0, z0):
        out, st = linear_attention(q, k, v, impl="fla", decay=DECAY, initial_state=LinearAttentionState(S0, z0),
                                   output_final_state=True)
        return out, st.S, st.z

    torch._dynamo.reset()
    compiled = torch.compile(run, fullgraph=True, backend="aot_eager")
    grads = []
    for fn in (run, compiled):
        leaves = [x.detach().requires_grad_() for x in (q, k, v, S0, z0)]
        outs = fn(*leaves)
        sum(o.sum() for o in outs).backward()
        grads.append([*outs, *(x.grad for x in leaves)])
    for a, b in zip(*grads):
        assert torch.allclose(a, b, rtol=1e-6, atol=1e-6)


def test_fla_operator_registration(fla_cpu):
    """torch.library's own checks of linrope::fla_chunk_fwd: schema, fake (meta) shapes, autograd."""
    g = gen("opcheck")
    q, k = (torch.rand(1, 20, 2, 4, generator=g) for _ in range(2))
    v = torch.randn(1, 20, 2, 2, generator=g)
    h0 = torch.randn(1, 2, 4, 2, generator=g, requires_grad=True)
    q.requires_grad_()
    torch.library.opcheck(torch.ops.linrope.fla_chunk_fwd.default, (q, k, v, DECAY, h0, True))


# --------------------------------------------------------------------------------------------------------
# refusals, auto, packaging
# --------------------------------------------------------------------------------------------------------
def test_fla_without_cuda_is_refused_in_one_line(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    q = torch.randn(1, 2, 8, 4)
    monkeypatch.setattr(fla_backend, "INSTALLED", True)  # the device is checked before fla is imported
    with pytest.raises(BackendUnavailable, match="need a CUDA device") as e:
        linear_attention(q, q, q, impl="fla")
    assert isinstance(e.value, LinropeError) and "\n" not in str(e.value)
    monkeypatch.setattr(fla_backend, "INSTALLED", False)
    with pytest.raises(BackendUnavailable, match=r"pip install 'linrope\[gpu\]'"):
        linear_attention(q, q, q, impl="fla")


def test_fla_refuses_non_causal_and_float64():
    q = torch.randn(1, 2, 8, 4)
    with pytest.raises(ValueError, match="causal only"):
        linear_attention(q, q, q, impl="fla", causal=False)
    with pytest.raises(ValueError, match="float32 at most"):
        linear_attention(q.double(), q.double(), q.double(), impl="fla")


def test_auto_on_cpu_is_the_chunk_kernel_and_says_so_once(caplog, monkeypatch):
    monkeypatch.setattr(backends, "_CHOSEN", {})
    g = gen("auto")
    q, k, v = (torch.randn(1, 2, 80, 8, generator=g) for _ in range(3))
    with caplog.at_level(logging.INFO, logger="linrope.ops"):
        first = linear_attention(q, k, v, impl="auto", decay=DECAY)
        second = linear_attention(q, k, v, impl="auto", decay=DECAY)
    lines = [r.getMessage() for r in caplog.records if "impl=auto" in r.getMessage()]
    assert lines == ["linear attention impl=auto: chunk (fla needs CUDA, these tensors are on cpu)"]
    assert torch.equal(first, linear_attention(q, k, v, impl="chunk", decay=DECAY)) and torch.equal(first, second)
    assert {"fla", "auto"} <= set(IMPLS)


def test_import_linrope_ops_imports_neither_fla_nor_triton():
    code = ("import sys, linrope.ops, linrope.attention; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('fla', 'triton')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_config_refuses_fla_on_cpu_and_accepts_auto(compose, monkeypatch):
    from linrope.config import validate
    from linrope.errors import ConfigError

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(fla_backend, "INSTALLED", True)  # installed or not, a CPU run is refused for its device
    with pytest.raises(ConfigError, match=r"model.attention.impl=fla: fla's Triton kernels need a CUDA device"):
        validate(compose("model=linear_rope", "size=tiny", "model.attention.impl=fla"))
    validate(compose("model=linear_rope", "size=tiny", "model.attention.impl=auto"))


# --------------------------------------------------------------------------------------------------------
# slow suite: the whole float32 matrix
# --------------------------------------------------------------------------------------------------------
MATRIX = list(itertools.product(("elu", "cosine"), ("numerator", "both", "none"), (False, True), (False, True),
                                (37, 100, 200)))


@pytest.mark.slow
@pytest.mark.parametrize("feature_map,rope,decayed,initial,n", MATRIX)
def test_fla_mapping_matrix_float32(fla_cpu, feature_map, rope, decayed, initial, n):
    compare(feature_map, rope, decayed, initial, n)


# --------------------------------------------------------------------------------------------------------
# CUDA (compiled Triton kernels): skipped without a GPU
# --------------------------------------------------------------------------------------------------------
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available() or not fla_backend.INSTALLED,
                                reason="needs CUDA and the gpu extra (fla, triton)")


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 5e-3), (torch.bfloat16, 3e-2)])  # TF32 dots; bf16
@pytest.mark.parametrize("feature_map,rope", [("elu", "numerator"), ("cosine", "both"), ("elu", "none")])
def test_fla_on_cuda_matches_naive(dtype, tol, feature_map, rope):
    g = gen("cuda", feature_map, rope)
    B, H, n, d = 2, 4, 1000, 32
    q, k, v = (torch.randn(B, H, n, d, generator=g).to(dtype).cuda() for _ in range(3))
    kw = dict(feature_map=feature_map, rope=rope, decay=DECAY.repeat(2).cuda())
    _, (S0, z0) = linear_attention(*(torch.randn(B, H, 50, d, generator=g, dtype=torch.float64).cuda() for _ in range(3)),
                                   impl="naive", output_final_state=True, **kw)
    S0, z0 = S0.float(), z0.float()
    ref = results("naive", torch.float64, q.float(), k.float(), v.float(), S0, z0, **kw)
    got = results("fla", dtype, q, k, v, S0, z0, **kw)
    errors = [rel(a, b) for a, b in zip(got, ref)]
    assert max(errors) < tol, errors


@pytest.mark.gpu
@needs_cuda
def test_fla_on_cuda_compiles_fullgraph():
    q, k, v = (torch.randn(1, 2, 256, 32, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    run = torch.compile(lambda q, k, v: linear_attention(q, k, v, impl="fla"), fullgraph=True)
    run(q, k, v).float().sum().backward()
    assert all(torch.isfinite(x.grad).all() for x in (q, k, v))


# --------------------------------------------------------------------------------------------------------
# benchmarks/gpu_table.py: says it needs a GPU here (its rows: tests/test_benchmarks.py)
# --------------------------------------------------------------------------------------------------------
def test_gpu_table_says_it_needs_a_gpu(capsys):
    from benchmarks import gpu_table

    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the table would be measured")
    assert gpu_table.main(["--lengths", "2048"]) == 0
    assert capsys.readouterr().out.strip() == gpu_table.NEEDS_GPU
