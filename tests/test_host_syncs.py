"""No host syncs in a training step, for every preset of conf/model/ (issue 31).

A value read back from the device (``.item()``, ``bool(t)``, ``int(t)``, ``.tolist()``, ``torch.nonzero``,
``torch.unique``, a shape that depends on values) makes the host wait for the device: it blocks CUDA graphs and
makes shapes data-dependent under torch.compile.  The whole step runs on the meta device (no values at all)
under a dispatch mode that notes every such read, answers it with a stand-in so the step goes on, and
counts it: forward, loss, the LightningModule's ``training_step`` and batch hooks (with a stand-in Trainer:
its logging is Lightning's), backward, the AdamW step and the schedule.  The optimizer's own step counter
lives on the CPU (not a device read); only reads of device (here: meta) tensors count."""

from __future__ import annotations

import types

import pytest
import torch
from omegaconf import OmegaConf
from torch.utils._python_dispatch import TorchDispatchMode

from tests.helpers import CONF

aten = torch.ops.aten
PRESETS = sorted(p.stem for p in (CONF / "model").glob("*.yaml"))

# reads of a value: the host waits for the device
SCALAR_READS = {aten._local_scalar_dense.default, aten.item.default, aten.is_nonzero.default, aten.equal.default}
# outputs whose shape depends on the values
DATA_SHAPED = {
    aten.nonzero.default,
    aten.unique_dim.default,
    aten._unique.default,
    aten._unique2.default,
    aten.unique_consecutive.default,
    aten.unique_dim_consecutive.default,
    aten.masked_select.default,
    aten.repeat_interleave.Tensor,
    aten.bincount.default,
}


def _stand_in_scalar(t: torch.Tensor):
    return True if t.dtype == torch.bool else 0.0 if t.is_floating_point() else 0


class CountHostSyncs(TorchDispatchMode):
    """Notes every read of a device tensor's values (``seen``: one op name per read) and lets the step go on."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        if (func in SCALAR_READS or func in DATA_SHAPED) and any(t.device.type != "cpu" for t in tensors):
            self.seen.append(str(func.overloadpacket.__name__))
            if func in SCALAR_READS:
                return True if func in (aten.is_nonzero.default, aten.equal.default) else _stand_in_scalar(tensors[0])
            x = tensors[0]  # a stand-in of the largest size the values could give
            if func is aten.nonzero.default:
                return x.new_empty((x.numel(), x.dim()), dtype=torch.long)
            if func in (
                aten._unique2.default,
                aten.unique_consecutive.default,
                aten.unique_dim.default,
                aten._unique.default,
            ):
                flat = x.flatten()
                return (
                    flat,
                    torch.empty(x.shape, dtype=torch.long, device=x.device),
                    flat.new_empty(flat.shape, dtype=torch.long),
                )
        if func is aten._to_copy.default and tensors[0].device.type != "cpu" and kwargs.get("device") == cpu:
            self.seen.append("to_cpu")  # .cpu(), .tolist(), .numpy() of a device tensor
            return torch.zeros(tensors[0].shape, dtype=kwargs.get("dtype") or tensors[0].dtype)
        if func is aten.copy_.default and args[0].device.type == "cpu" and args[1].device.type != "cpu":
            self.seen.append("copy_to_cpu")
            return args[0]
        return func(*args, **kwargs)


cpu = torch.device("cpu")


def module_and_batch(compose, preset):
    """The preset's LightningModule (linrope.training.builders.build_module) on the meta device, its optimiser and
    schedule (configure_optimizers), a stand-in Trainer and a batch of the configured shape."""
    from linrope.training.builders import build_module

    cfg = compose(f"model={preset}", "size=tiny", "optim.schedule_steps=100")  # the preset, every option
    module = build_module(cfg).to("meta")
    sched_cfg = module.configure_optimizers()
    opt, sched = sched_cfg["optimizer"], sched_cfg["lr_scheduler"]["scheduler"]
    module.trainer = types.SimpleNamespace(
        world_size=1, optimizers=[opt], log_every_n_steps=1, global_step=3, global_rank=0
    )
    logged = []
    module.log = lambda name, value, **kw: logged.append((name, value))  # Lightning's logging needs a Trainer
    b, n = int(cfg.data.batch_size), int(OmegaConf.select(cfg, "data.context"))
    x = torch.zeros(b, n, dtype=torch.long, device="meta")
    return module, opt, sched, (x, x.clone()), logged


def one_training_step(module, opt, sched, batch):
    module.on_train_batch_start(batch, 3)
    loss = module.training_step(batch, 3)
    loss.backward()
    opt.step()
    sched.step()
    opt.zero_grad(set_to_none=True)
    module.on_train_batch_end(loss, batch, 3)
    return loss


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("preset", PRESETS)
def test_a_training_step_reads_nothing_back_from_the_device(compose, preset):
    module, opt, sched, batch, logged = module_and_batch(compose, preset)
    with CountHostSyncs() as mode:
        one_training_step(module, opt, sched, batch)
    assert mode.seen == [], f"{preset}: {len(mode.seen)} host syncs per training step: {mode.seen}"
    assert [name for name, _ in logged][:2] == ["train/loss", "train/lr"]  # the step did run its logging
    assert all(p.grad is None for p in module.parameters())  # and its optimiser step (zero_grad after it)


def test_the_counter_sees_what_a_step_must_not_do():
    """The counter is not blind: a value read and a data-dependent shape of a meta tensor are counted."""
    t = torch.ones(3, device="meta")
    with CountHostSyncs() as mode:
        float(t.sum())
        bool(t.sum() > 0)
        torch.nonzero(t)
        torch.unique(t)
        t.tolist()
        torch.ones(3).sum().item()  # a CPU tensor: no device to wait for
    assert mode.seen == ["_local_scalar_dense", "_local_scalar_dense", "nonzero", "_unique2", "to_cpu"]


@pytest.mark.parametrize("method", ["rk4", "euler", "midpoint"])
@pytest.mark.parametrize("step", [1.0, 2.0, 0.7])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_floater_fixed_grid_is_torchdiffeq_bit_for_bit(method, step, dtype):
    """FLOATER's own fixed-grid solve (no host reads) gives torchdiffeq's odeint, values and gradients
    torch.equal, for grids on and off the positions (step 1, 2, 0.7: linear interpolation in between)."""
    from torchdiffeq import odeint

    from linrope.positions.floater import fixed_grid

    g = torch.Generator().manual_seed(int(step * 10) + len(method))
    w = torch.randn(9, 8, generator=g, dtype=dtype, requires_grad=True)
    y0 = torch.randn(8, generator=g, dtype=dtype, requires_grad=True)

    def h(t, p):
        return torch.tanh(p @ w[:-1] + t * w[-1])

    t = torch.arange(30).to(dtype) * 0.1
    results = []
    for solve in (
        lambda: fixed_grid(h, y0, t, 0.1, method, step * 0.1),
        lambda: odeint(h, y0, t, method=method, options=dict(step_size=step * 0.1)),
    ):
        out = solve()
        results.append((out, *torch.autograd.grad((out * torch.linspace(-1, 1, 8, dtype=dtype)).sum(), (w, y0))))
    assert all(torch.equal(a, b) for a, b in zip(*results))


@pytest.mark.filterwarnings("ignore")
def test_table_range_is_checked_from_the_shapes():
    """On the meta device no position can be read, and a learned table still refuses a window past max_len in
    its one line: the check runs on the span the model knows (offset, length), not on tensor values."""
    from linrope.base.errors import SequenceTooLong
    from linrope.models.model import TransformerLM

    m = TransformerLM(
        dict(
            vocab_size=32,
            d_model=16,
            n_layers=1,
            n_heads=2,
            d_ff=32,
            max_len=8,
            attention={"kind": "softmax"},
            position={"name": "learned"},
        )
    ).to("meta")
    x = torch.zeros(1, 8, dtype=torch.long, device="meta")
    with CountHostSyncs() as mode:
        m(x)  # exactly max_len: fine
        with pytest.raises(SequenceTooLong, match=r"^learned position table has 8 rows .* position 8 was asked"):
            m(x, offset=1)
    assert mode.seen == []


def test_a_non_finite_loss_is_noted_on_the_device_and_read_at_a_boundary(compose):
    """training_step reads nothing back: a NaN at step 4 is noted, the steps after it do not overwrite the note,
    and the read at the next boundary (here: a checkpoint about to be written) names step 4."""
    from linrope.base.errors import NonFiniteLoss
    from linrope.training.builders import build_module

    module = build_module(compose("size=tiny", "optim.schedule_steps=10"))
    module.log = lambda *a, **k: None
    x = torch.randint(0, 256, (2, 16))
    for step in range(7):
        module.trainer = types.SimpleNamespace(world_size=1, optimizers=[], global_step=step, checkpoint_callbacks=[])
        loss = module.training_step((x, x), step)
        if step in (4, 5):
            module._note_non_finite(loss.detach() * (float("nan") if step == 4 else float("inf")))
        module.raise_if_loss_was_not_finite() if step < 4 else None
    with pytest.raises(NonFiniteLoss, match=r"^loss is nan at step 4: training stopped; no checkpoint was written"):
        module.on_save_checkpoint({})
    module.raise_if_loss_was_not_finite()  # said once


def test_the_stop_flag_travels_through_gloo_beside_nccl(monkeypatch, tmp_path):
    """Under nccl the stop flag gets a gloo group of its own (a CPU tensor: the accelerator is not waited
    for); under gloo the run's own group carries it."""
    import torch.distributed as dist

    from linrope.run import signals

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        assert signals.host_group() is None  # gloo: the default group
        monkeypatch.setattr(dist, "get_backend", lambda group=None: "nccl")
        group = signals.host_group()
        monkeypatch.undo()
        assert group is not None and dist.get_backend(group) == "gloo"
        stop = signals.SignalStop()
        trainer = types.SimpleNamespace(world_size=2)  # as DDP would say
        monkeypatch.setattr(signals, "host_group", lambda: group)
        asked = []
        monkeypatch.setattr(signals, "stop_after_this_step", asked.append)
        stop.on_train_start(trainer, None)
        try:
            stop.on_train_batch_end(trainer, None, None, None, 0)
            assert asked == []
            stop._signalled = "SIGTERM"
            stop.on_train_batch_end(trainer, None, None, None, 1)
            assert asked == [trainer] and stop.stopped_by == "SIGTERM"
        finally:
            stop.on_train_end(trainer, None)
    finally:
        dist.destroy_process_group()
