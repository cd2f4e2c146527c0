"""impl="triton" (linrope's own Triton kernels, triton_kernels.py) under Triton's interpreter on the CPU.

Every case draws its own inputs and compares the outputs, final states and the gradients of q, k, v and the
initial state with the float64 naive form on the same (rounded) inputs, every buffer the kernels fill poisoned with
NaN first (``poison_buffers``: an element a kernel leaves unwritten shows).  Tolerances, relative (the norm of the
difference over the reference's): FLOAT32_TOL for float32 (the kernels sum in float32 and multiply exactly under the
interpreter; seen <= 3e-7), FLOAT16_TOL for float16 inputs (computed in float32, the output and gradients rounded to
float16, 2^-11 relative each; seen <= 3e-4) and FP16_DOT_TOL for float16 inputs multiplied in float16
(``FP16_DOTS``: the casts bfloat16 inputs take on a GPU, on a dtype the interpreter multiplies right; seen <= 6e-4).
bfloat16 is not tested here: the interpreter's bfloat16 ``tl.dot`` is wrong (tests/ops/fla_interpreter.py); the
device check tests it (benchmarks/gpu_check.py).

The interpreter is patched as for fla (tests/ops/fla_interpreter.py: one autotune configuration, loop counters as
tensors), process-wide, so these tests skip where CUDA is available, and where triton 3.9.x is not installed.  The
default suite runs a few small cases (N <= 130, d = 8); ``-m slow`` the grid.
"""

import dataclasses
import importlib
import importlib.util
import itertools
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import tests.ops.fla_interpreter as fla_interpreter
from linrope.base.errors import BackendUnavailable
from linrope.ops import linear_attention
from linrope.ops.linear_attn import triton_backend
from linrope.ops.linear_attn.backends import BACKENDS
from tests.helpers import gen, rel
from tests.ops.fla_cases import DECAY, inputs, results

FLOAT32_TOL = 2e-5
FLOAT16_TOL = 5e-3
FP16_DOT_TOL = 1e-2
NAMES = ["out", "S", "z", "dq", "dk", "dv", "dS0", "dz0"]
MODULE = "linrope.ops.linear_attn.triton_kernels"
ROOT = Path(__file__).resolve().parents[2]


def refusal():
    """Why the interpreter cannot or must not run these kernels here, or None."""
    if torch.cuda.is_available() or torch.cuda.is_initialized():
        return "CUDA is available: the interpreter's patches are process-wide (run with CUDA_VISIBLE_DEVICES='')"
    if importlib.util.find_spec("triton") is None:
        return "triton not installed (the interp extra, CPU torch: pip install -e '.[interp]')"
    version = fla_interpreter.triton_version()
    if not version.startswith(fla_interpreter.TRITON_SERIES):
        return f"triton {version} installed; the interpreter tests need triton {fla_interpreter.TRITON_SERIES}x"
    return None


@pytest.fixture
def interpreted(monkeypatch, kernel_env):
    """linrope's kernels interpreted (decorated with TRITON_INTERPRET=1), every buffer NaN-poisoned (``kernel_env``)."""
    reason = refusal()
    if reason:
        pytest.skip(reason)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    fla_interpreter._patch_autotune()
    fla_interpreter._patch_counters()
    fla_interpreter._patch_early_helpers()
    from triton.runtime.interpreter import InterpretedFunction

    module = sys.modules.get(MODULE)
    if module is not None and not isinstance(module._grad, InterpretedFunction):
        importlib.reload(module)  # decorated before the interpreter was switched on
    yield


@pytest.fixture(params=["split", "loop"])
def scan(request, monkeypatch):
    """Each way of summing the chunks' states (triton_backend.SCAN): the device check times both."""
    monkeypatch.setattr(triton_backend, "SCAN", request.param)
    return request.param


def packed(n: int, B: int = 2) -> torch.Tensor:
    """(B, n) ids of packed documents: starts inside a chunk, on a chunk's first position (64), at its last (127)."""
    ids = torch.zeros(B, n, dtype=torch.long)
    for b, starts in enumerate([(10, 64, 100), (63, 70, 127)][:B]):
        for s in starts:
            ids[b, s:] += s < n
    return ids


def compare(
    feature_map, rope, decayed, initial, n, dtype=torch.float32, tol=FLOAT32_TOL, normalize=True, docs=False, **shape
):
    key = ("triton", feature_map, rope, decayed, initial, n, str(dtype), normalize, docs, tuple(shape.items()))
    decay = DECAY if decayed else None
    q, k, v, S0, z0 = inputs(key, feature_map=feature_map, rope=rope, decay=decay, n=n, initial=initial, **shape)
    if dtype != torch.float32:  # the reference sees exactly the rounded inputs and state
        q, k, v = (x.to(dtype).float() for x in (q, k, v))
        S0, z0 = (None if x is None else x.to(dtype).float() for x in (S0, z0))
    kw = dict(feature_map=feature_map, rope=rope, decay=decay, normalize=normalize)
    if docs:
        kw["documents"] = packed(n, shape.get("B", 2)).to(q.device)
    ref = results("naive", torch.float64, q, k, v, S0, z0, **kw)
    got = results("triton", dtype, q, k, v, S0, z0, **kw)
    assert got[0].dtype == dtype and got[1].dtype == torch.float32 and got[2].dtype == torch.float32
    assert all(torch.isfinite(t).all() for t in got)
    errors = {name: rel(a, b) for name, a, b in zip(NAMES, got, ref)}
    print(f"triton {key[1:]}: largest relative error {max(errors.values()):.2e} ({max(errors, key=errors.get)})")
    assert max(errors.values()) < tol, errors
    return errors


# feature map, placement, decay, initial state, N (none a multiple of 64 but one), dtype, normalize
CASES = [
    ("elu", "numerator", True, True, 130, torch.float32, True),
    ("cosine", "both", True, True, 100, torch.float32, True),
    ("elu", "none", False, False, 70, torch.float32, False),
    ("cosine", "numerator", False, True, 64, torch.float16, True),
]


@pytest.mark.parametrize("feature_map, rope, decayed, initial, n, dtype, normalize", CASES)
def test_matches_naive(interpreted, scan, feature_map, rope, decayed, initial, n, dtype, normalize):
    tol = FLOAT32_TOL if dtype == torch.float32 else FLOAT16_TOL
    compare(feature_map, rope, decayed, initial, n, dtype, tol, normalize)


@pytest.mark.parametrize("feature_map, rope, normalize", [("elu", "numerator", True), ("cosine", "both", False)])
def test_packed_documents_match_naive(interpreted, scan, feature_map, rope, normalize):
    """The state resets where a document starts (inside a chunk, at a chunk's first and last position); the initial
    state reaches the row's first document, the final state is the last document's."""
    compare(feature_map, rope, True, True, 130, normalize=normalize, docs=True)


@pytest.mark.parametrize("which", ["S", "z"])
def test_a_loss_on_one_final_state(interpreted, scan, which):
    """A loss that reads the final S but not z (or z alone): autograd hands the backward None for the other, whose
    gradient then starts at zero (and still decays into the initial state's)."""
    from linrope.ops.linear_attn.common import LinearAttentionState

    q, k, v, S0, z0 = inputs(("triton one state", which), feature_map="cosine", decay=DECAY, n=100, initial=True)
    grads = []
    for impl, dtype in (("naive", torch.float64), ("triton", torch.float32)):
        leaves = [x.detach().to(dtype).requires_grad_() for x in (q, k, v, S0, z0)]
        state = LinearAttentionState(leaves[3], leaves[4])
        out, (S, z) = linear_attention(
            *leaves[:3], impl=impl, feature_map="cosine", decay=DECAY, initial_state=state, output_final_state=True
        )
        final = S if which == "S" else z
        w = torch.randn(final.shape, generator=gen("one state weights"), dtype=torch.float64)
        ((final.double() * w).sum() + out.double().sum()).backward()
        grads.append([x.grad for x in leaves])
    assert max(rel(a, b) for a, b in zip(*grads)) < FLOAT32_TOL


def test_unnormalised_with_an_initial_state_and_a_loss_on_the_output(interpreted, scan):
    """normalize=False: z0 reaches the final z alone, so a loss on the output gives it no gradient (zeros, as the
    chunk form); the other gradients as naive's."""
    from linrope.ops.linear_attn.common import LinearAttentionState

    q, k, v, S0, z0 = inputs(("triton unnormalised",), feature_map="elu", decay=DECAY, n=100, initial=True)
    grads = []
    for impl, dtype in (("naive", torch.float64), ("triton", torch.float32)):
        leaves = [x.detach().to(dtype).requires_grad_() for x in (q, k, v, S0, z0)]
        state = LinearAttentionState(leaves[3], leaves[4])
        out = linear_attention(*leaves[:3], impl=impl, decay=DECAY, normalize=False, initial_state=state)
        (
            out.double() * torch.randn(out.shape, generator=gen("unnormalised weights"), dtype=torch.float64)
        ).sum().backward()
        grads.append([x.grad for x in leaves])
    (*ref, ref_z0), (*got, got_z0) = grads
    assert ref_z0 is None and (got_z0 is None or not got_z0.any())
    assert max(rel(a, b) for a, b in zip(got, ref)) < FLOAT32_TOL


@pytest.mark.parametrize("feature_map, rope, docs", [("cosine", "both", False), ("elu", "numerator", True)])
def test_split_scan_carries_between_steps_and_blocks(interpreted, monkeypatch, feature_map, rope, docs):
    """_scan with 2 slots a step and 32 entries a program (at the defaults, 16 and 256, a test's few chunks and
    narrow heads fit in one of each): the carry from step to step, state entries split between programs, H's and
    z's entries in one block (cosine, d = 8: H 72 entries, z 9)."""
    monkeypatch.setattr(triton_backend, "SCAN", "split")
    monkeypatch.setattr(triton_backend, "SCAN_U", 2)
    monkeypatch.setattr(triton_backend, "SCAN_BW", 32)
    compare(feature_map, rope, True, True, 330, docs=docs)


def test_float16_products_match_naive(interpreted, monkeypatch):
    """float16 operands in the chunk products: the casts a bfloat16 input takes on a GPU, where the interpreter can
    check them."""
    monkeypatch.setattr(triton_backend, "FP16_DOTS", True)
    compare("elu", "numerator", True, True, 100, torch.float16, FP16_DOT_TOL)


def test_fla_layout_is_read_in_place(interpreted):
    """(B, N, H, d) tensors handed in transposed: the same result as contiguous ones, the output and the gradients in
    the inputs' layout (no copy on the way in or out)."""
    g = gen("triton layout")
    q, k, v = (torch.randn(2, 70, 2, w, generator=g) for w in (8, 8, 6))  # (B, N, H, d)
    views = [x.transpose(1, 2).requires_grad_() for x in (q.clone(), k.clone(), v.clone())]
    dense = [x.transpose(1, 2).contiguous().requires_grad_() for x in (q, k, v)]
    w = torch.randn(2, 2, 70, 6, generator=g)
    outs = []
    for leaves in (views, dense):
        out = linear_attention(*leaves, impl="triton", decay=DECAY)
        (out * w).sum().backward()
        outs.append([out] + [x.grad for x in leaves])
    assert outs[0][0].transpose(1, 2).is_contiguous() and outs[0][1].transpose(1, 2).is_contiguous()
    for a, b in zip(*outs):
        assert rel(a, b) < 1e-6


def test_autocast_does_not_reach_inside(interpreted):
    """Under CPU autocast (bfloat16) the inputs' dtype decides: float16 in, float16 out, the same values as without
    (CPU autocast to float16 inputs of bfloat16 is not testable here: the interpreter's bfloat16 products are wrong)."""
    g = gen("triton autocast")
    q, k, v = (torch.randn(1, 2, 40, 8, generator=g).half() for _ in range(3))
    plain = linear_attention(q, k, v, impl="triton")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        auto = linear_attention(q, k, v, impl="triton")
    assert auto.dtype == torch.float16 and torch.equal(auto, plain)


def test_refusals_are_one_line(monkeypatch):
    """Each refusal in one line, with or without triton installed (README's test command runs before any extra):
    the arguments' refusals with the availability check set aside, then the availability's own line."""
    q = torch.randn(1, 2, 8, 4)
    cases = [
        (dict(causal=False), "impl=triton is causal only"),
        (dict(window=2), "impl=triton takes no window"),
        (dict(decay=torch.full((2,), 0.9, requires_grad=True)), "impl=triton does not differentiate decay"),
    ]
    with monkeypatch.context() as m:
        m.setitem(BACKENDS, "triton", dataclasses.replace(BACKENDS["triton"], unavailable=lambda device: None))
        for kw, message in cases:
            with pytest.raises(ValueError, match=message) as err:
                linear_attention(q, q, q, impl="triton", **kw)
            assert "\n" not in str(err.value)
        with pytest.raises(ValueError, match="computes in float32 at most"):
            linear_attention(q.double(), q.double(), q.double(), impl="triton")
        with pytest.raises(ValueError, match="head widths up to 256"):
            big = torch.randn(1, 1, 2, 258)
            linear_attention(big, big, big, impl="triton")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    unavailable = "need a CUDA device \\(here: cpu\\)" if triton_backend.INSTALLED else "triton is not installed"
    with pytest.raises(BackendUnavailable, match=unavailable) as err:
        linear_attention(q, q, q, impl="triton")
    assert "\n" not in str(err.value)


def test_empty_sequence_keeps_the_state(interpreted):
    q = torch.randn(1, 2, 0, 4)
    S0, z0 = torch.randn(1, 2, 4, 4), torch.rand(1, 2, 4)
    from linrope.ops.linear_attn.common import LinearAttentionState

    out, (S, z) = linear_attention(
        q, q, q, impl="triton", initial_state=LinearAttentionState(S0, z0), output_final_state=True
    )
    assert out.shape == q.shape and torch.equal(S, S0) and torch.equal(z, z0)


def test_both_placement_clamps_a_cancelling_denominator(interpreted, scan):
    """Placement "both": rows whose rotated denominator cancels to 2δ = 0.004 are clamped to DEN_FLOOR and pass no
    gradient through it, as in the float64 naive form (common.guard_denominator).  q = 0 (φ = 1), d = 2: key 0 at position 0
    and key 65 (φ = -cos(355) + δ) at position 355, the other keys φ ≈ 1e-13; rows 65..69 sit at position 355 and see
    key 0 turned by 355 rad (cos ≈ -1) in chunk 0's state: their denominators cancel across the chunk boundary, so the
    state gradient's share of ∂L/∂den (key 0's gradient) is tested beside the chunk's own."""
    n, c, delta = 70, torch.cos(torch.tensor(355.0, dtype=torch.float64)), 2e-3
    k = torch.full((1, 1, n, 2), -30.0, dtype=torch.float64)
    k[..., 0, :], k[..., 65, :] = 0.0, torch.log(delta - c)
    positions = torch.where(torch.arange(n) < 65, 0, 355)
    v = torch.randn(1, 1, n, 2, generator=gen("triton cancelling"), dtype=torch.float64)
    q = torch.zeros_like(k)
    kw = dict(feature_map="elu", rope="both", positions=positions)
    ref = results("naive", torch.float64, q, k, v, None, None, **kw)
    # the precondition: the rotated denominators (the numerator with one value column of ones) of rows 65.. are
    # 2δ, under the floor, the others near 2
    den = linear_attention(q, k, torch.ones_like(v[..., :1]), impl="naive", normalize=False, **kw)[0, 0, :, 0]
    assert (den[65:] - 2 * delta).abs().max() < 1e-5 and den[:65].min() > 1.9
    got = results("triton", torch.float32, q.float(), k.float(), v.float(), None, None, **kw)
    assert all(torch.isfinite(t).all() for t in got)
    errors = {name: rel(a, b) for name, a, b in zip(NAMES, got, ref)}
    # the final z = Σ φ_r(k) cancels too (entries ~2δ from terms ~1): float32's rounding relative to 2δ, seen 4e-5
    assert errors.pop("z") < 1e-3 and max(errors.values()) < FLOAT32_TOL, errors


@pytest.mark.slow
@pytest.mark.parametrize("feature_map, rope", list(itertools.product(("elu", "cosine"), ("numerator", "both", "none"))))
@pytest.mark.parametrize("decayed_initial", [False, True])
@pytest.mark.parametrize("n", [1, 193])
def test_grid_matches_naive(interpreted, scan, feature_map, rope, decayed_initial, n):
    # one position and no state: o = v·s/(s + eps), whose gradient in q is eps-small (8e-8 against dv's 19) and
    # cancels to float32's rounding in every form (the chunk form's dq is off by 130% too): no relative comparison
    compare(feature_map, rope, decayed_initial, decayed_initial or n == 1, n)
    compare(feature_map, rope, not decayed_initial, decayed_initial, n, normalize=False)
    if n > 1:
        compare(feature_map, rope, decayed_initial, decayed_initial, n, docs=True)


@pytest.mark.slow
@pytest.mark.parametrize("feature_map, rope", list(itertools.product(("elu", "cosine"), ("numerator", "none"))))
def test_grid_float16_matches_naive(interpreted, feature_map, rope):
    # (placement "both" with a float16-rounded state: its denominator cancels, and the chunk form is off by 3e-2 too)
    compare(feature_map, rope, True, True, 150, torch.float16, FLOAT16_TOL)


@pytest.mark.slow
def test_long_float16_does_not_overflow(interpreted):
    """The denominator grows like 86·t (elu+1, d = 64): past float16's 65504 within a thousand positions.  It is
    float32 inside the kernels; d = 64, N = 1100 here."""
    g = gen("triton long float16")
    q, k, v = (torch.randn(1, 1, 1100, 64, generator=g) for _ in range(3))
    q, k, v = (x.half().float() for x in (q, k, v))
    ref = linear_attention(q.double(), k.double(), v.double(), impl="naive")
    got = linear_attention(q.half(), k.half(), v.half(), impl="triton")
    assert torch.isfinite(got).all() and rel(got, ref) < FLOAT16_TOL


@pytest.mark.slow
def test_opcheck(interpreted):
    """The operators' fake implementations and autograd registration agree with the kernels (torch.library)."""
    g = gen("triton opcheck")
    q, k, v = (torch.randn(1, 2, 70, 8, generator=g).requires_grad_() for _ in range(3))
    S0, z0 = torch.randn(1, 2, 8, 8, requires_grad=True), torch.rand(1, 2, 8, requires_grad=True)
    args = (q, k, v, S0, z0, None, None, DECAY, "elu", "numerator", 1e-6, True, True)
    torch.library.opcheck(torch.ops.linrope.triton_fwd.default, args, test_utils=("test_schema", "test_faketensor"))


@pytest.mark.slow
def test_compiles_without_graph_breaks(interpreted):
    g = gen("triton compile")
    q, k, v = (torch.randn(1, 2, 70, 8, generator=g).requires_grad_() for _ in range(3))

    def f(q, k, v):
        return linear_attention(q, k, v, impl="triton", decay=DECAY).sum()

    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    assert rel(compiled(q, k, v), f(q, k, v)) < 1e-6


SLOW = pytest.mark.slow  # each dtype and map compiles its own five kernels: the device check's tests part has 60 s


@pytest.mark.gpu
@pytest.mark.parametrize(
    "scan, dtype, tol, feature_map, rope",
    [
        ("split", torch.bfloat16, 3e-2, "elu", "numerator"),  # the training path
        ("loop", torch.bfloat16, 3e-2, "elu", "numerator"),  # the other way of summing the states
        pytest.param("split", torch.float16, FLOAT16_TOL, "elu", "numerator", marks=SLOW),
        pytest.param("split", torch.float32, 1e-4, "elu", "numerator", marks=SLOW),
        pytest.param("split", torch.bfloat16, 3e-2, "cosine", "both", marks=SLOW),
        pytest.param("split", torch.float32, 1e-4, "cosine", "both", marks=SLOW),
    ],
)
def test_cuda_matches_naive(monkeypatch, scan, dtype, tol, feature_map, rope):
    """On a GPU (the device check's tests part): compiled kernels, d = d_v = 64, N = 1000, decay and an initial
    state, against float64 naive on the rounded inputs.  bfloat16: its products' operands are rounded to 8 bits
    (2^-9 relative each); float32: exact float32 products ("ieee"), float32 sums in another order.  Each way of
    summing the states (``SCAN``) on the training path, the default for the others (the part has 120 s)."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    assert not fla_interpreter.patched(), "the interpreter's patches are in this process: kernels would be interpreted"
    monkeypatch.setattr(triton_backend, "SCAN", scan)
    compare(feature_map, rope, True, True, 1000, dtype, tol, B=1, H=2, d=64, dv=64, device="cuda")


@pytest.mark.slow
@pytest.mark.parametrize("rope", ["numerator", "both"])
def test_wide_heads_match_naive(interpreted, scan, rope):
    """d = 66 (128-wide tiles, masked) and d_v = 72: two value blocks in the sequential kernels, one in the others."""
    compare("cosine", rope, True, True, 70, B=1, H=2, d=66, dv=72)


# ---- compiled for a GPU (no GPU needed): benchmarks/triton_compile.py ----
def compiled_rows(variants):
    """Every launch of ``variants`` compiled for sm_90 (Hopper, the device check's GPU) in a process of its own (the
    interpreter's patches here are process-wide and break compiling): [variant, kernel, …, status] per launch; skips
    without triton."""
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton not installed (the interp extra, CPU torch: pip install -e '.[interp]')")
    cmd = [sys.executable, "benchmarks/triton_compile.py", "--arch", "90", "--variants", *variants]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    rows = [[c.strip() for c in ln.strip("|").split("|")] for ln in res.stdout.splitlines() if ln.startswith("| ")]
    return res.returncode, [r for r in rows[1:] if r[0] in variants]


@pytest.mark.parametrize(
    "variants",
    [
        ["training", "cosine, documents"],
        pytest.param(
            ["both, decay", "none, state, unnormalised", "cosine numerator, decay, state", "float32", "float16"],
            marks=SLOW,
        ),
    ],
)
def test_every_kernel_compiles_for_hopper(variants):
    """The interpreter runs a kernel's Python; only a compile shows what a GPU refuses (a global read as a plain
    float, a product Triton cannot lower: both were found this way).  Each recorded launch of a forward and backward
    compiles for sm_90, the constexprs and num_warps as the backend launches them."""
    rc, rows = compiled_rows(variants)
    tuned = ("_state_fwd", "_out_fwd", "_state_bwd", "_grad", "_chunk_state", "_chunk_dstate")
    assert {r[1] for r in rows} == {*tuned, "_dden", "_scan"}  # both ways of summing the states (SCAN)
    assert {r[0] for r in rows} == set(variants)
    assert [(r[0], r[1], r[-1]) for r in rows if r[-1] != "ok"] == [] and rc == 0
    assert all(int(r[3]) > 0 for r in rows)  # registers
    compiled = {(r[1], r[2]) for r in rows}  # each num_warps the autotuner may pick, compiled
    assert compiled >= {(k, w) for k in tuned for w in ("4", "8")}


def test_the_interpreter_runs_the_kernels_without_the_test_shim():
    """``TRITON_INTERPRET=1`` alone (a user's CPU run, the device check's stand-in): the autotuned kernels keep one
    configuration there (the interpreter has no device to time), in a process without this file's patches."""
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton not installed (the interp extra, CPU torch: pip install -e '.[interp]')")
    code = (
        "import torch\n"
        "from linrope.ops import linear_attention\n"
        "q, k, v = (torch.randn(1, 2, 130, 16, requires_grad=True) for _ in range(3))\n"
        "o = linear_attention(q, k, v, impl='triton', rope='numerator', positions=torch.arange(130))\n"
        "o.sum().backward()\n"
        "assert torch.isfinite(o).all() and torch.isfinite(q.grad).all()\n"
    )
    env = {**os.environ, "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]


def test_the_compile_check_refuses_a_kernel_name_it_does_not_have(capsys):
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton not installed (the interp extra, CPU torch: pip install -e '.[interp]')")
    from benchmarks import triton_compile

    with pytest.raises(SystemExit):
        triton_compile.main(["--warps", "_grd=8"])
    assert "--warps: _grd is not a kernel of linrope/ops/linear_attn/triton_kernels.py" in capsys.readouterr().err
