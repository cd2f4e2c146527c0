"""impl="fla" (linrope's linear attention on fla's chunked Triton kernels) and impl="auto": what the backend
refuses, what auto chooses, the kernel dtype, the packaging, and the CUDA checks (marked ``gpu``).

The mapping through fla's kernels themselves runs on the CPU under Triton's interpreter in
tests/ops/test_fla_interpreted.py.  This module never loads that shim (it patches Triton for the whole process): the
CUDA tests assert it is not loaded, and their bodies also run here on the meta device standing in for CUDA
(linrope's fla operators have fake kernels there), so a tensor left on the CPU beside device tensors fails here.
"""

import dataclasses
import logging
import os
import subprocess
import sys
from collections import namedtuple
from types import ModuleType, SimpleNamespace

import pytest
import torch

import tests.ops.fla_interpreter as fla_interpreter
from linrope.base.errors import BackendUnavailable, LinropeError
from linrope.ops import IMPLS, linear_attention
from linrope.ops.linear_attn import backends, fla_backend, triton_backend
from linrope.ops.linear_attn.common import Args
from tests.helpers import gen, rel
from tests.ops.fla_cases import DECAY, inputs, results


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


def test_fla_on_the_interpreter_needs_the_test_shim(monkeypatch):
    """Under TRITON_INTERPRET=1 without the shim fla's autotuners time their configurations on a device and fail
    with "0 active drivers": refused in one line instead (a fresh process, where the shim is not loaded)."""
    code = "from linrope.ops.linear_attn import fla_backend as f; f.INSTALLED = True; print(f.unavailable('cpu'))"
    env = dict(os.environ, TRITON_INTERPRET="1")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env).stdout
    assert out.strip() == (
        "fla's kernels autotune on a device: under TRITON_INTERPRET=1 on the CPU they run only with the test shim "
        "(tests/ops/fla_interpreter.py); use impl=chunk"
    )
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(fla_backend, "INSTALLED", True)
    monkeypatch.setattr(fla_backend, "_one_config", lambda: True)
    if fla_backend.torch_too_old() is None:
        assert fla_backend.unavailable("cpu") is None


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
    code = (
        "import sys, linrope.ops, linrope.models.attention; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('fla', 'triton')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_config_refuses_fla_on_cpu_and_accepts_auto(compose, monkeypatch):
    from linrope.base.errors import ConfigError
    from linrope.config.checks import validate

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(fla_backend, "INSTALLED", True)  # installed or not, a CPU run is refused for its device
    with pytest.raises(ConfigError, match=r"model.attention.impl=fla: fla's Triton kernels need a CUDA device"):
        validate(compose("model=linear_rope", "size=tiny", "model.attention.impl=fla"))
    validate(compose("model=linear_rope", "size=tiny", "model.attention.impl=auto"))


def test_fla_states_its_torch_floor(monkeypatch):
    """fla-core 0.6.0 needs torch >= 2.7 (its own metadata): older is refused in one line, before the device."""
    monkeypatch.setattr(fla_backend, "INSTALLED", True)
    for version in ("2.6.0+cu124", "2.4.1", "1.13.1"):
        monkeypatch.setattr(torch, "__version__", version)
        assert fla_backend.unavailable("cuda") == f"fla-core 0.6.0 needs torch >= 2.7 (here {version}); use impl=chunk"
    q = torch.randn(1, 2, 8, 4)
    with pytest.raises(BackendUnavailable, match=r"^impl=fla: fla-core 0.6.0 needs torch >= 2.7 \(here 1.13.1\)"):
        linear_attention(q, q, q, impl="fla")
    for version in ("2.7.0", "2.7.1+cu126", "2.13.0", "10.0.0a0"):
        monkeypatch.setattr(torch, "__version__", version)
        assert fla_backend.unavailable("cuda") is None


# --------------------------------------------------------------------------------------------------------
# what auto chooses, the default config, the kernel dtype
# --------------------------------------------------------------------------------------------------------
fla_torch = pytest.mark.skipif(
    fla_backend.torch_too_old() is not None,
    reason="impl=fla needs torch >= 2.7 (fla-core 0.6.0): refused on this torch",
)


def fake_q(device, dtype):
    """What the registry reads of q (its device and dtype): stands in for a CUDA tensor on a machine without."""
    return SimpleNamespace(device=torch.device(device), dtype=dtype)


@pytest.mark.parametrize(
    "device,dtype,installed,version,causal,verified,chosen",
    [
        ("cpu", torch.float32, True, "2.13.0", True, True, "chunk"),
        ("cpu", torch.float16, True, "2.13.0", True, True, "chunk"),
        ("cuda", torch.float32, True, "2.13.0", True, True, "fla"),
        ("cuda", torch.float16, True, "2.13.0", True, True, "fla"),  # fla computes it in float32 (kernel_dtype)
        ("cuda", torch.bfloat16, True, "2.13.0", True, True, "fla"),
        ("cuda", torch.bfloat16, True, "2.13.0", True, False, "chunk"),  # these versions failed or never ran
        ("cuda", torch.float64, True, "2.13.0", True, True, "chunk"),  # fla has no float64
        ("cuda", torch.float32, True, "2.13.0", False, True, "chunk"),  # fla is causal only
        ("cuda", torch.float32, False, "2.13.0", True, True, "chunk"),  # fla not installed
        ("cuda", torch.float32, True, "2.6.0", True, True, "chunk"),  # torch below fla's floor
    ],
)
def test_auto_resolves_to_fla_on_cuda_where_it_can_run_and_passed_the_device_check_else_chunk(
    monkeypatch, device, dtype, installed, version, causal, verified, chosen
):
    monkeypatch.setattr(backends, "_CHOSEN", {})
    monkeypatch.setattr(fla_backend, "INSTALLED", installed)
    monkeypatch.setattr(torch, "__version__", version)
    monkeypatch.setattr(fla_backend, "VERIFIED", frozenset({fla_backend.versions()} if verified else ()))
    assert backends.resolve("auto", fake_q(device, dtype), Args(causal=causal)) is backends.BACKENDS[chosen]


def test_auto_says_why_it_passes_over_fla_on_cuda(monkeypatch, caplog):
    """VERIFIED holds the versions whose training step passed on an H200 (fla-core 0.6.0, triton 3.6.0): with
    others auto on CUDA runs the chunk kernel and its one log line names the versions and where the evidence is."""
    monkeypatch.setattr(backends, "_CHOSEN", {})
    monkeypatch.setattr(fla_backend, "INSTALLED", True)
    assert fla_backend.VERIFIED == frozenset({("0.6.0", "3.6.0")})
    monkeypatch.setattr(fla_backend, "versions", lambda: ("0.6.0", "3.5.1"))
    with caplog.at_level(logging.INFO, logger="linrope.ops"):
        assert backends.resolve("auto", fake_q("cuda", torch.bfloat16), Args()) is backends.BACKENDS["chunk"]
    assert [r.getMessage() for r in caplog.records] == [
        "linear attention impl=auto: chunk (fla-core 0.6.0 with triton 3.5.1 has not passed the device check's "
        "training step on a GPU (docs/benchmarks.md); impl=fla runs it)"
    ]
    monkeypatch.setattr(backends, "_CHOSEN", {})
    monkeypatch.setattr(fla_backend, "versions", lambda: ("0.6.0", "3.6.0"))
    assert backends.resolve("auto", fake_q("cuda", torch.bfloat16), Args()) is backends.BACKENDS["fla"]
    assert backends.resolve("fla", fake_q("cuda", torch.bfloat16), Args()) is backends.BACKENDS["fla"]  # opt-in


@pytest.mark.parametrize(
    "dtype,installed,fla_verified,window,chosen",
    [
        (torch.bfloat16, True, True, None, "triton"),  # before fla, once its versions passed
        (torch.float16, True, False, None, "triton"),
        (torch.float64, True, True, None, "chunk"),  # neither takes float64
        (torch.float32, True, True, 8, "chunk"),  # neither takes a window
        (torch.bfloat16, False, True, None, "fla"),  # triton not installed (then neither is fla's: a stand-in)
    ],
)
def test_auto_takes_linropes_triton_kernels_first_once_their_versions_passed(
    monkeypatch, caplog, dtype, installed, fla_verified, window, chosen
):
    """``triton_backend.VERIFIED`` (empty: no GPU has run the kernels) lists the triton versions with which the
    device check met issue 50's goals; with this triton listed, auto on CUDA takes impl=triton where the registry
    accepts it, before fla, and says so once."""
    assert triton_backend.VERIFIED == frozenset()
    monkeypatch.setattr(backends, "_CHOSEN", {})
    monkeypatch.setattr(triton_backend, "VERIFIED", frozenset({triton_backend.triton_version()}))
    monkeypatch.setattr(triton_backend, "INSTALLED", installed)
    monkeypatch.setattr(fla_backend, "INSTALLED", True)
    monkeypatch.setattr(torch, "__version__", "2.13.0")
    monkeypatch.setattr(fla_backend, "VERIFIED", frozenset({fla_backend.versions()} if fla_verified else ()))
    with caplog.at_level(logging.INFO, logger="linrope.ops"):
        got = backends.resolve("auto", fake_q("cuda", dtype), Args(window=window, causal=window is None))
    assert got is backends.BACKENDS[chosen]
    if chosen == "triton":
        assert [r.getMessage() for r in caplog.records] == [
            "linear attention impl=auto: triton (CUDA, and these versions passed the device check)"
        ]


def test_auto_passes_over_the_triton_kernels_whose_versions_did_not_pass(monkeypatch):
    monkeypatch.setattr(backends, "_CHOSEN", {})
    monkeypatch.setattr(triton_backend, "INSTALLED", True)
    monkeypatch.setattr(triton_backend, "triton_version", lambda: "3.5.1")
    monkeypatch.setattr(triton_backend, "VERIFIED", frozenset({"3.6.0"}))
    assert triton_backend.unverified() == (
        "linrope's Triton kernels have not met the device check's goals with triton 3.5.1 (docs/benchmarks.md, "
        '"Issue 50"); impl=triton runs them'
    )
    monkeypatch.setattr(fla_backend, "INSTALLED", False)
    assert backends.resolve("auto", fake_q("cuda", torch.bfloat16), Args()) is backends.BACKENDS["chunk"]
    monkeypatch.setattr(triton_backend, "triton_version", lambda: "3.6.0")
    assert triton_backend.unverified() is None
    assert backends.resolve("auto", fake_q("cuda", torch.bfloat16), Args()) is backends.BACKENDS["triton"]


def test_the_linear_attention_configs_default_to_auto_and_compute_chunks_numbers_on_cpu(compose):
    """conf/attention's linear configs say impl=auto; on the CPU that is the chunk kernel, bit for bit."""
    from omegaconf import OmegaConf

    from linrope.models.model import TransformerLM

    for preset in ("linear_rope", "linear_cosine_rope"):
        cfg = compose(f"model={preset}", "size=tiny")
        assert cfg.model.attention.impl == "auto"
        model = OmegaConf.to_container(cfg.model, resolve=True)
        torch.manual_seed(0)
        auto = TransformerLM(model)
        chunk = TransformerLM(dict(model, attention=dict(model["attention"], impl="chunk")))
        chunk.load_state_dict(auto.state_dict())
        x = torch.randint(0, model["vocab_size"], (2, 40), generator=gen("configs", preset))
        with torch.no_grad():
            assert torch.equal(auto(x), chunk(x))
        assert {layer.attn.impl for layer in auto.blocks} == {"auto"}


@fla_torch
@pytest.mark.parametrize(
    "dtype,autocast,kernel",
    [
        (torch.float32, None, torch.float32),
        (torch.float16, None, torch.float32),  # float16 overflows in fla's outputs and states: float32
        (torch.bfloat16, None, torch.bfloat16),
        (torch.float32, torch.float16, torch.float32),
        (torch.float32, torch.bfloat16, torch.bfloat16),
    ],
)
def test_fla_computes_float16_in_float32(dtype, autocast, kernel):
    q = torch.zeros(1, 1, 2, 2, dtype=dtype)
    with torch.autocast("cpu", dtype=autocast, enabled=autocast is not None):
        assert fla_backend.kernel_dtype(q) == kernel
    assert fla_backend.kernel_dtype(q.to("meta")) == (torch.bfloat16 if dtype == torch.bfloat16 else torch.float32)


# --------------------------------------------------------------------------------------------------------
# CUDA (compiled Triton kernels): skipped without a GPU; each body also runs on the meta device standing in
# --------------------------------------------------------------------------------------------------------
needs_cuda = pytest.mark.skipif(
    not torch.cuda.is_available() or fla_backend.unavailable("cuda") is not None,
    reason="needs CUDA and the gpu extra (fla, triton; torch >= 2.7)",
)
CUDA_DTYPES = [(torch.float32, 5e-3), (torch.float16, 5e-3), (torch.bfloat16, 3e-2)]  # TF32 dots; bf16 kernels
CUDA_MAPS = [("elu", "numerator"), ("cosine", "both"), ("elu", "none")]


@pytest.fixture
def meta_for_cuda(monkeypatch):
    """The meta device standing in for CUDA: impl=fla takes meta tensors (its operators' fake kernels run: no
    Triton, no fla), every other check as on CUDA.  Any tensor left on the CPU among them fails."""
    fla = backends.BACKENDS["fla"]
    monkeypatch.setitem(
        backends.BACKENDS,
        "fla",
        dataclasses.replace(
            fla, unavailable=lambda device: None if torch.device(device).type == "meta" else fla.unavailable(device)
        ),
    )


def assert_compiled_kernels():
    """A CUDA test runs fla's compiled kernels: the interpreter shim was never loaded in this process."""
    assert fla_interpreter.patched() == [] and os.environ.get("TRITON_INTERPRET") != "1"


def cuda_matches_naive(device, dtype, tol, feature_map, rope, shape=(2, 4, 2048, 32), decayed=True):
    """fla against float64 naive on ``device`` at 2048 positions (float16: past float16's range in fla's
    outputs): outputs, states and every gradient.  On meta: devices, dtypes and shapes only.  ``shape``
    (B, H, n, d); ``decayed``: with a per-head decay and an initial state, else neither (training's path)."""
    B, H, n, d = shape
    decay = DECAY.repeat(H // 2) if decayed else None
    q, k, v, S0, z0 = inputs(
        ("cuda", feature_map, rope),
        feature_map=feature_map,
        rope=rope,
        decay=decay,
        n=n,
        initial=decayed,
        B=B,
        H=H,
        d=d,
        dv=d,
        device=device,
    )
    q, k, v = (x.to(dtype).float() for x in (q, k, v))  # the reference sees exactly the rounded inputs
    kw = dict(feature_map=feature_map, rope=rope, decay=None if decay is None else decay.to(device))
    ref = results("naive", torch.float64, q, k, v, S0, z0, **kw)
    got = results("fla", dtype, q, k, v, S0, z0, **kw)
    assert {t.device.type for t in got + ref} == {device}
    assert [t.dtype for t in got[:3]] == [dtype, torch.float32, torch.float32]
    assert [t.shape for t in got] == [t.shape for t in ref]
    if device == "meta":
        return None
    assert all(torch.isfinite(t).all() for t in got)
    errors = [rel(a, b) for a, b in zip(got, ref)]
    assert max(errors) < tol, errors
    return errors


def compiles_fullgraph(device, backend):
    q, k, v = (
        torch.randn(1, 2, 256, 32, generator=gen("compile", i)).to(device, torch.bfloat16).requires_grad_()
        for i in range(3)
    )
    torch._dynamo.reset()
    run = torch.compile(lambda q, k, v: linear_attention(q, k, v, impl="fla"), fullgraph=True, backend=backend)
    out = run(q, k, v)
    out.float().sum().backward()
    assert out.device.type == device and out.dtype == torch.bfloat16
    assert all(x.grad.device.type == device and x.grad.shape == x.shape for x in (q, k, v))
    return [x.grad for x in (q, k, v)]


@pytest.mark.gpu
@pytest.mark.slow  # each dtype, width and decay compiles and autotunes its own kernels: minutes on a fresh GPU
@needs_cuda
@pytest.mark.parametrize("dtype,tol", CUDA_DTYPES)
@pytest.mark.parametrize("feature_map,rope", CUDA_MAPS)
def test_fla_on_cuda_matches_naive(dtype, tol, feature_map, rope):
    assert_compiled_kernels()
    print(f"fla on cuda {feature_map} {rope} {dtype}: {cuda_matches_naive('cuda', dtype, tol, feature_map, rope)}")
    assert_compiled_kernels()


TRAINING_SHAPE = (4, 8, 4096, 64)  # benchmarks/train_throughput.py's size=base at context 4096, batch 4


@pytest.mark.gpu
@needs_cuda
def test_fla_on_cuda_matches_naive_at_the_training_shape():
    """bfloat16, elu+1, RoPE in the numerator, no decay or state, at the shape whose training step stopped with an
    illegal memory access on an H200 (docs/benchmarks.md, "The device check"): one call, against float64."""
    assert_compiled_kernels()
    errors = cuda_matches_naive("cuda", torch.bfloat16, 3e-2, "elu", "numerator", TRAINING_SHAPE, decayed=False)
    print(f"fla on cuda at {TRAINING_SHAPE}: {errors}")
    assert_compiled_kernels()


@fla_torch
def test_fla_on_cuda_matches_naive_at_the_training_shape_runs_on_meta(meta_for_cuda):
    cuda_matches_naive("meta", torch.bfloat16, 3e-2, "elu", "numerator", TRAINING_SHAPE, decayed=False)


@fla_torch
@pytest.mark.parametrize("dtype,tol", CUDA_DTYPES)
@pytest.mark.parametrize("feature_map,rope", CUDA_MAPS)
def test_fla_on_cuda_matches_naive_runs_on_meta(meta_for_cuda, dtype, tol, feature_map, rope):
    cuda_matches_naive("meta", dtype, tol, feature_map, rope)


@pytest.mark.gpu
@pytest.mark.slow  # inductor and fla's kernels at d = 32: their own compiles
@needs_cuda
def test_fla_on_cuda_compiles_fullgraph():
    assert_compiled_kernels()
    assert all(torch.isfinite(g).all() for g in compiles_fullgraph("cuda", "inductor"))
    assert_compiled_kernels()


@fla_torch
def test_fla_on_cuda_compiles_fullgraph_runs_on_meta(meta_for_cuda):
    compiles_fullgraph("meta", "aot_eager")


@fla_torch
def test_fla_hands_float16_inputs_to_fla_in_float32(meta_for_cuda, monkeypatch):
    """What the operator receives, per input dtype: float16 -> float32, bfloat16 stays (fla's kernel dtype); and
    widths padded to even (fla asserts even widths for 16-bit inputs), the padding sliced off the output."""
    seen, widths = [], []
    op = fla_backend.fla_chunk_fwd

    def spy(q, k, v, decay, h0, final):
        seen.append({x.dtype for x in (q, k, v)})
        widths.append((q.shape[-1], k.shape[-1], v.shape[-1]))
        return op(q, k, v, decay, h0, final)

    monkeypatch.setattr(fla_backend, "fla_chunk_fwd", spy)
    for dtype, kernel in (
        (torch.float16, torch.float32),
        (torch.bfloat16, torch.bfloat16),
        (torch.float32, torch.float32),
    ):
        seen.clear()
        q = torch.zeros(1, 2, 100, 8, device="meta", dtype=dtype)
        assert linear_attention(q, q, q, impl="fla", decay=DECAY.to("meta")).dtype == dtype
        assert seen == [{kernel}, {kernel}]  # the numerator's and the denominator's call
        assert widths[-2:] == [(8, 8, 8), (8, 8, 2)]  # d = 8 and the ones column, padded to an even width
    widths.clear()
    q, v = (torch.zeros(1, 2, 100, w, device="meta", dtype=torch.bfloat16) for w in (24, 40))
    assert linear_attention(q, q, v, impl="fla", feature_map="cosine").shape == v.shape  # padding sliced off
    assert widths == [(26, 26, 40), (26, 26, 2)]  # cosine's d+1 = 25 and the ones column: even widths
    widths.clear()
    monkeypatch.setattr(fla_backend, "hopper", lambda device: True)  # an H100 / H200: no width under 64
    assert linear_attention(q, q, v, impl="fla", feature_map="cosine").shape == v.shape
    assert widths == [(64, 64, 64), (64, 64, 64)]
    widths.clear()
    monkeypatch.setattr(fla_backend, "HOPPER_GUARD", False)  # benchmarks/fla_probe.py's as-is: fla unguarded
    assert linear_attention(q, q, v, impl="fla", feature_map="cosine").shape == v.shape
    assert widths == [(26, 26, 40), (26, 26, 2)]


def test_hopper_is_compute_capability_9(monkeypatch):
    """The guard's test of the device, without a GPU: capability 9.x is Hopper, 8.x and 10.x are not, a CPU never."""
    from linrope.ops.linear_attn import fla_backend

    props = namedtuple("props", "major")  # a stand-in dynamo can hold (it folds the real call to a constant)
    for major, expected in ((9, True), (8, False), (10, False)):
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device, m=major: props(m))
        assert fla_backend.hopper("cuda") is expected
        assert fla_backend.min_width(torch.device("cuda", 0)) == (64 if expected else 2)
    assert fla_backend.hopper("cpu") is False
    # inside torch.compile(fullgraph=True), as the fla form's padding asks it: no graph break, the answer a constant
    compiled = torch.compile(
        lambda x: x + fla_backend.min_width(torch.device("cuda", 0)), fullgraph=True, backend="eager"
    )
    assert compiled(torch.zeros(1)).item() == 2  # capability 10.x, the last one patched in


def test_safe_blocks_drops_16_and_32_wide_configurations_of_fla_autotuners(monkeypatch):
    """Every autotuner of an fla module keeps its configurations without a 16- or 32-wide block (BK, BV, BS…),
    or its widest when none is safe; other modules' autotuners and the chunk size are left alone."""
    autotuner = pytest.importorskip("triton.runtime.autotuner")
    import triton

    from linrope.ops.linear_attn import fla_backend

    def tuner(*blocks):
        t = object.__new__(autotuner.Autotuner)  # no kernel behind it: safe_blocks reads and writes .configs only
        t.configs = [triton.Config(dict(b)) for b in blocks]
        return t

    mixed = tuner({"BK": 32, "BV": 64}, {"BK": 64, "BV": 64, "BT": 64}, {"BK": 128, "BV": 16}, {"BK": 128, "BV": 64})
    unsafe = tuner({"BS": 16}, {"BS": 32})
    safe = tuner({"BK": 64, "BV": 128})
    mixed.cache = {("K", 64): mixed.configs[0], ("K", 128): mixed.configs[1]}  # choices made before the guard
    other = tuner({"BK": 16})
    fla_module, other_module = ModuleType("fla._guard_test"), ModuleType("elsewhere._guard_test")
    fla_module.mixed, fla_module.unsafe, fla_module.safe, other_module.other = mixed, unsafe, safe, other
    monkeypatch.setitem(sys.modules, fla_module.__name__, fla_module)
    monkeypatch.setitem(sys.modules, other_module.__name__, other_module)
    assert fla_backend.safe_blocks.__wrapped__() >= 2  # mixed and unsafe changed (and any real fla module's)
    assert [c.kwargs for c in mixed.configs] == [{"BK": 64, "BV": 64, "BT": 64}, {"BK": 128, "BV": 64}]
    assert list(mixed.cache) == [("K", 128)]  # the 32-wide choice forgotten, the safe one kept
    assert [c.kwargs for c in unsafe.configs] == [{"BS": 32}]
    assert [c.kwargs for c in safe.configs] == [{"BK": 64, "BV": 128}]
    assert [c.kwargs for c in other.configs] == [{"BK": 16}]


# --------------------------------------------------------------------------------------------------------
# benchmarks/kernel_time.py --device cuda, the kernel table: says it needs a GPU here (rows: tests/test_benchmarks.py)
# --------------------------------------------------------------------------------------------------------
def test_gpu_kernel_table_says_it_needs_a_gpu(capsys):
    from benchmarks import kernel_time

    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the table would be measured")
    assert kernel_time.main(["--device", "cuda", "--lengths", "2048"]) == 0
    assert capsys.readouterr().out.strip() == kernel_time.NEEDS_GPU
