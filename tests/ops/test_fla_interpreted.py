"""impl="fla" through fla's real Triton kernels under Triton's interpreter, on the CPU (tests/ops/fla_interpreter.py).

The mapping is compared with the float64 naive form on the same (float32-rounded) inputs: outputs, final states
and the gradients of q, k, v and the initial state.  fla computes in float32 at most, so the tolerance is
float32's: FLOAT32_TOL relative (the norm of the difference over the norm of the reference); measured up to
3.2e-6 over the slow matrix.  float16 stands in for 16-bit (the interpreter's bfloat16 dot is wrong); float16
inputs are computed in float32 (fla_backend.kernel_dtype), which the long float16 runs check.

The shim patches Triton for the whole process, so it refuses to load (these tests skip, with the reason) where
CUDA is available, and where fla or triton 3.9.x is not installed (the ``interp`` extra, CPU torch only).  The
CUDA checks are in tests/ops/test_fla.py, which never loads it.
"""

import itertools

import pytest
import torch

import tests.ops.fla_interpreter as fla_interpreter
from linrope.ops import linear_attention
from linrope.ops.linear_attn.common import LinearAttentionState
from tests.helpers import gen, rel
from tests.ops.fla_cases import DECAY, inputs, results

FLOAT32_TOL = 2e-5  # relative, every output, state and gradient against float64 naive (seen: <= 3.2e-6)
FLOAT16_TOL = 5e-3  # relative, float16 inputs (seen: <= 1.2e-3, a few float16 roundings)


@pytest.fixture
def fla_cpu(monkeypatch):
    """fla's kernels under Triton's interpreter, every allocation NaN-poisoned; skipped with the shim's reason
    where it cannot or must not be loaded (fla_interpreter.refusal)."""
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


def compare(feature_map, rope, decayed, initial, n, dtype=torch.float32, tol=FLOAT32_TOL, normalize=True):
    key = ("fla", feature_map, rope, decayed, initial, n) + (() if normalize else ("nodenom",))
    decay = DECAY if decayed else None
    q, k, v, S0, z0 = inputs(key, feature_map=feature_map, rope=rope, decay=decay, n=n, initial=initial)
    if dtype != torch.float32:  # the reference sees exactly the rounded inputs
        q, k, v = (x.to(dtype).float() for x in (q, k, v))
    kw = dict(feature_map=feature_map, rope=rope, decay=decay, normalize=normalize)
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
# the shim's guard: never loaded where CUDA could run (its patches are process-wide)
# --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cuda", ["is_available", "is_initialized"])
def test_the_shim_refuses_to_load_where_cuda_is_available(monkeypatch, cuda):
    monkeypatch.setattr(fla_interpreter, "_STATE", {})  # as in a fresh process (no cached "loaded")
    monkeypatch.setattr(torch.cuda, cuda, lambda: True)
    before = fla_interpreter.patched()
    reason = fla_interpreter.load()
    assert reason and reason.startswith("CUDA is available: the interpreter shim patches Triton for the whole process")
    assert fla_interpreter.patched() == before


def test_the_shim_names_what_is_missing(monkeypatch):
    # what is installed is stubbed, so the messages are checked whether or not the interp extra is here
    installed = {"fla", "triton"}
    find = fla_interpreter.importlib.util.find_spec
    monkeypatch.setattr(fla_interpreter.importlib.util, "find_spec", lambda m: object() if m in installed else find(m))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(fla_interpreter, "triton_version", lambda: "3.5.1")
    assert fla_interpreter.refusal() == (
        "triton 3.5.1 installed; the interpreter shim needs triton 3.9.x (the interp extra)"
    )
    monkeypatch.setattr(fla_interpreter, "triton_version", lambda: "3.9.0")
    monkeypatch.setattr(torch, "__version__", "2.6.0")
    assert fla_interpreter.refusal() == "fla-core 0.6.0 needs torch >= 2.7 (here 2.6.0); use impl=chunk"
    installed.discard("fla")
    monkeypatch.setattr(fla_interpreter.importlib.util, "find_spec", lambda m: object() if m in installed else None)
    assert fla_interpreter.refusal() == "fla not installed (the interp extra, CPU torch: pip install -e '.[interp]')"


# --------------------------------------------------------------------------------------------------------
# default suite: the mapping through fla's kernels (interpreted), a handful of configurations
# --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "feature_map,rope,decayed,initial,n",
    [
        ("elu", "numerator", True, True, 100),
        ("cosine", "both", False, True, 130),
        ("elu", "none", True, False, 37),
        ("cosine", "numerator", True, False, 64),
    ],
)
def test_fla_mapping_matches_naive_float32(fla_cpu, feature_map, rope, decayed, initial, n):
    compare(feature_map, rope, decayed, initial, n)


@pytest.mark.parametrize(
    "feature_map,rope,decayed,initial,n",
    [("elu", "numerator", True, True, 100), ("cosine", "both", False, True, 130), ("elu", "none", True, False, 37)],
)
def test_fla_without_denominator_matches_naive_float32(fla_cpu, feature_map, rope, decayed, initial, n):
    """normalize=False: the numerator's fla call is the output; the state (z included) as with a denominator."""
    compare(feature_map, rope, decayed, initial, n, normalize=False)


def test_fla_without_denominator_and_state_makes_one_call(fla_cpu, monkeypatch):
    """Without a final state to carry, the denominator's call is not made: the numerator's is the output."""
    from linrope.ops.linear_attn import fla_backend

    calls, op = [], fla_backend.fla_chunk_fwd
    monkeypatch.setattr(fla_backend, "fla_chunk_fwd", lambda *a: (calls.append(a[2].shape[-1]), op(*a))[1])
    q, k, v, _, _ = inputs(("one call",), feature_map="elu", n=70, initial=False)
    out = linear_attention(q, k, v, impl="fla", decay=DECAY, normalize=False)
    ref = linear_attention(q.double(), k.double(), v.double(), impl="naive", decay=DECAY, normalize=False)
    assert calls == [v.shape[-1]] and rel(out, ref) < FLOAT32_TOL
    calls.clear()
    linear_attention(q, k, v, impl="fla", decay=DECAY, normalize=False, output_final_state=True)
    assert calls == [v.shape[-1], 2]  # z: the ones column, padded to an even width


@pytest.mark.slow  # the 64-wide padding makes every interpreted block larger
def test_fla_with_every_width_padded_to_64_matches_naive(fla_cpu, monkeypatch):
    """The Hopper guard's padding (every width to fla_backend.SAFE_WIDTH = 64: no 16-wide block): the zero columns
    change nothing, outputs, states and gradients."""
    from linrope.ops.linear_attn import fla_backend

    monkeypatch.setattr(fla_backend, "MIN_WIDTH", fla_backend.SAFE_WIDTH)
    compare("elu", "numerator", True, True, 70)


def test_fla_mapping_matches_naive_float16(fla_cpu):
    """16-bit inputs: odd widths padded (cosine's d+1, the ones column), states float32."""
    compare("cosine", "numerator", True, True, 100, dtype=torch.float16, tol=FLOAT16_TOL)


def long_float16(n, d, shift, backward):
    """elu+1 features at width d over n positions, float16 inputs (q, k shifted by ``shift``: larger features,
    the denominator grows faster), against float64 naive on the same rounded inputs -> relative errors."""
    g = gen("long float16", n, d, shift)
    q, k = (torch.randn(1, 1, n, d, generator=g).add(shift).half() for _ in range(2))
    v = torch.randn(1, 1, n, d, generator=g).half()
    leaves = [x.requires_grad_() for x in (q, k, v)]
    out = linear_attention(*leaves, impl="fla")
    ref_leaves = [x.detach().double().requires_grad_() for x in (q, k, v)]
    ref = linear_attention(*ref_leaves, impl="naive")
    assert out.dtype == torch.float16 and torch.isfinite(out).all(), (
        f"not finite from position {(~torch.isfinite(out)).any(-1).nonzero()[0, -1].item()}"
    )
    errors = {"out": rel(out, ref)}
    if backward:
        w = torch.randn(out.shape, generator=g, dtype=torch.float64)
        (out.double() * w).sum().backward()
        (ref * w).sum().backward()
        errors.update({name: rel(a.grad, b.grad) for name, a, b in zip(("dq", "dk", "dv"), leaves, ref_leaves)})
        assert all(torch.isfinite(x.grad).all() for x in leaves)
    print(f"fla float16 n={n} d={d} shift={shift}: relative errors {errors}")
    return errors


def test_fla_float16_past_float16s_range_is_finite_and_right(fla_cpu):
    """Shifted inputs (elu+1 features about 3 a dimension, q·k about 570 at d = 64) carry the denominator past
    float16's 65504 at about position 115: computed in float16 it was infinite; in float32 it is right."""
    errors = long_float16(256, 64, 2.0, backward=True)
    assert max(errors.values()) < FLOAT16_TOL, errors


@pytest.mark.slow
def test_fla_float16_at_2k_positions_is_finite_and_right(fla_cpu):
    """Unit-normal inputs at d = 64: the denominator passes 65504 before position 1000 (float16 kernels gave
    infinite or zero rows from there); 2048 positions, forward and backward, within float16's tolerance."""
    errors = long_float16(2048, 64, 0.0, backward=True)
    assert max(errors.values()) < FLOAT16_TOL, errors


def test_fla_empty_sequence_passes_the_state_through(fla_cpu):
    q, k, v, S0, z0 = inputs(("empty",), feature_map="cosine", n=0, initial=True)
    out, st = linear_attention(
        q, k, v, impl="fla", feature_map="cosine", initial_state=LinearAttentionState(S0, z0), output_final_state=True
    )
    assert out.shape == v.shape and torch.equal(st.S, S0) and torch.equal(st.z, z0)
    _, st = linear_attention(q, k, v, impl="fla", feature_map="cosine", output_final_state=True)
    assert st.S.shape == S0.shape and not st.S.any() and not st.z.any()


def test_fla_is_one_graph_under_torch_compile(fla_cpu):
    """fla is reached through linrope's registered operators: fullgraph compiles, forward and backward agree."""
    q, k, v, S0, z0 = inputs(("compile",), feature_map="elu", decay=DECAY, n=70, initial=True)

    def run(q, k, v, S0, z0):
        out, st = linear_attention(
            q, k, v, impl="fla", decay=DECAY, initial_state=LinearAttentionState(S0, z0), output_final_state=True
        )
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
# slow suite: the whole float32 matrix
# --------------------------------------------------------------------------------------------------------
MATRIX = list(
    itertools.product(("elu", "cosine"), ("numerator", "both", "none"), (False, True), (False, True), (37, 100, 200))
)


@pytest.mark.slow
@pytest.mark.parametrize("feature_map,rope,decayed,initial,n", MATRIX)
def test_fla_mapping_matrix_float32(fla_cpu, feature_map, rope, decayed, initial, n):
    compare(feature_map, rope, decayed, initial, n)


@pytest.mark.slow  # about 15 s interpreted
def test_partial_rotary_goes_through_fla_as_through_naive(fla_cpu):
    """rope's rotary_fraction: the padded frequencies (θ = 0 beyond the first r/2 pairs) through fla's kernels
    agree with float64 naive (tests/positions/test_rope_partial.py checks naive against GPT-NeoX's formula)."""
    from linrope.ops.rope import partial_frequencies, rope_frequencies

    theta = partial_frequencies(rope_frequencies(4), 8)  # d = 8, r = 4: two of four pairs turned
    q, k, v, S0, z0 = inputs(("fla", "partial"), feature_map="elu", n=37, initial=True)
    kw = dict(feature_map="elu", rope="numerator", rope_theta=theta)
    ref = results("naive", torch.float64, q, k, v, S0, z0, **kw)
    got = results("fla", torch.float32, q, k, v, S0, z0, **kw)
    errors = [rel(a, b) for a, b in zip(got, ref)]
    assert all(torch.isfinite(t).all() for t in got) and max(errors) < FLOAT32_TOL, errors
    full = results("naive", torch.float64, q, k, v, S0, z0, feature_map="elu", rope="numerator")
    assert rel(full[0], ref[0]) > 1e-3  # the zero frequencies matter


# --------------------------------------------------------------------------------------------------------
# packed documents: fla's variable-length interface (cu_seqlens), against the naive form's reset
# --------------------------------------------------------------------------------------------------------
@pytest.mark.slow  # about 80 s under the interpreter (two fla calls forward and backward)
@pytest.mark.parametrize("rope,decayed", [("numerator", True), ("both", False)])
def test_fla_packed_documents_match_naive(fla_cpu, rope, decayed):
    """Rows flattened to one variable-length batch: outputs, the last documents' final states and every gradient
    (the initial state's, which only each row's first document reads) as the naive form with documents gives."""
    docs = torch.tensor([[0] * 5 + [1] + [2] * 7 + [3] * 3 + [4] * 4 + [5] * 16 + [6], [7] * 37])
    q, k, v, S0, z0 = inputs(("fla-documents", rope, decayed), feature_map="elu", rope=rope, n=37, initial=True)
    kw = dict(rope=rope, decay=DECAY if decayed else None, documents=docs)
    ref = results("naive", torch.float64, q, k, v, S0, z0, **kw)
    got = results("fla", torch.float32, q, k, v, S0, z0, **kw)
    errors = {name: rel(a, b) for name, a, b in zip(["out", "S", "z", "dq", "dk", "dv", "dS0", "dz0"], got, ref)}
    assert all(torch.isfinite(t).all() for t in got)
    assert max(errors.values()) < FLOAT32_TOL, errors
