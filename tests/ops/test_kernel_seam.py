"""The kernel seam: one argument spec, a backend registry that words every refusal, the config's impl values
from the registry, generation through the registered step operator, and a forward that never waits for the
device (no host sync: what a CUDA step needs)."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from linrope.base.errors import BackendUnavailable
from linrope.models.attention import LinearAttention
from linrope.models.model import TransformerLM
from linrope.ops import BACKENDS, IMPLS, linear_attention
from linrope.ops.linear_attn import recurrent
from linrope.ops.linear_attn.common import Args

HOST_SYNCS = {
    torch.ops.aten._local_scalar_dense.default,
    torch.ops.aten.item.default,
    torch.ops.aten.is_nonzero.default,
}


class RecordSyncs(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in HOST_SYNCS:
            self.seen.append(str(func))
        return func(*args, **(kwargs or {}))


def tiny(position, **attention):
    return TransformerLM(
        dict(
            d_model=32,
            n_heads=2,
            n_layers=2,
            d_ff=64,
            max_len=64,
            attention={"kind": "linear", **attention},
            position={"name": position},
        )
    )


@pytest.mark.parametrize("position,attention", [("alibi", {}), ("rope", {}), ("rope", {"feature_map": "cosine"})])
@pytest.mark.filterwarnings("ignore")
def test_training_step_and_generation_never_read_a_tensor_on_the_host(position, attention):
    """On the meta device every value read (.item(), bool(), a data-dependent check) fails or is recorded: the
    forward, backward and a generation step of the linear presets read none (at main the decay check read
    one per layer and call)."""
    model = tiny(position, **attention).to("meta")
    idx = torch.zeros(2, 300, dtype=torch.long, device="meta")
    with RecordSyncs() as mode:
        model(idx).sum().backward()
        with torch.no_grad():
            _, states = model(idx[:, :5], return_states=True)
            model(idx[:, :1], offset=5, states=states, return_states=True)
    assert mode.seen == []


@pytest.mark.filterwarnings("ignore")
def test_softmax_alibi_bias_is_built_without_reading_the_device():
    """ALiBi's score bias used to size its table by ``int(dist.max())``: a host sync per layer and forward."""
    model = TransformerLM(
        dict(
            d_model=32,
            n_heads=2,
            n_layers=2,
            d_ff=64,
            max_len=64,
            attention={"kind": "softmax"},
            position={"name": "alibi"},
        )
    ).to("meta")
    idx = torch.zeros(2, 100, dtype=torch.long, device="meta")
    with RecordSyncs() as mode:
        model(idx).sum().backward()
    assert mode.seen == []


def test_registry_is_the_config_vocabulary_and_words_the_refusals():
    assert set(IMPLS) == set(BACKENDS) == {"naive", "chunk", "recurrent", "fla", "triton", "auto"}
    assert LinearAttention.rules()["impl"].expectation() == "one of " + ", ".join(sorted(BACKENDS))
    q = torch.randn(1, 2, 8, 4)
    for impl in ("recurrent", "fla", "triton"):
        assert BACKENDS[impl].causal_only
        with pytest.raises(ValueError, match=f"^impl={impl} is causal only"):
            linear_attention(q, q, q, impl=impl, causal=False)
    with pytest.raises(ValueError, match="^impl=chunk does not differentiate decay"):
        linear_attention(q, q, q, impl="chunk", decay=torch.tensor([0.9, 0.8], requires_grad=True))
    assert BACKENDS["fla"].grads == ("rope_theta",) and BACKENDS["chunk"].grads == ()
    linear_attention(q, q, q, impl="naive", decay=torch.tensor([0.9, 0.8], requires_grad=True))  # autograd
    refusal = BACKENDS["fla"].refusal(q.double(), Args())
    assert isinstance(refusal, ValueError) and "float32 at most" in str(refusal)


def test_decay_range_is_checked_once_per_call_at_the_entry(monkeypatch):
    calls = []
    from linrope.ops.linear_attn import common

    orig = common.check_decay_range
    monkeypatch.setattr(common, "check_decay_range", lambda d: (calls.append(1), orig(d))[1])
    q = torch.randn(1, 2, 70, 4)
    linear_attention(q, q, q, impl="chunk", chunk_size=8, decay=torch.tensor([0.9, 0.8]), output_final_state=True)
    assert len(calls) == 1
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        linear_attention(q, q, q, impl="chunk", decay=torch.tensor([0.9, 0.0]))


def test_generation_runs_the_registered_step_operator(monkeypatch):
    calls = []
    real = recurrent.recurrent_step_op
    monkeypatch.setattr(recurrent, "recurrent_step_op", lambda *a: (calls.append(1), real(*a))[1])
    model = tiny("rope").eval()
    model.generate(torch.zeros(1, 4, dtype=torch.long), 3)
    assert len(calls) == 3 * 2  # three steps, two layers; the prompt ran the chunk kernel


def test_fla_unavailable_comes_from_the_registry(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    q = torch.randn(1, 2, 8, 4)
    with pytest.raises(BackendUnavailable, match="^impl=fla: "):
        linear_attention(q, q, q, impl="fla")


def test_compiled_decay_check_is_traced_not_a_graph_break():
    """Under torch.compile the range check is ``torch._assert_async`` in the graph (fullgraph compiles); a bad
    decay still fails, at run time, with the same words."""
    fn = torch.compile(
        lambda q, d: linear_attention(q, q, q, decay=d, chunk_size=8), fullgraph=True, backend="aot_eager"
    )
    q = torch.randn(1, 2, 20, 4)
    good = torch.tensor([0.9, 0.8])
    assert torch.equal(fn(q, good), linear_attention(q, q, q, decay=good, chunk_size=8))
    with pytest.raises(RuntimeError, match=r"decay factors γ_h must lie in \(0, 1\]"):
        fn(q, torch.tensor([0.9, 1.5]))
