"""A run stopped by SIGTERM (a scheduler's preemption) or SIGINT (Ctrl+C): every process ends the same step,
``last.ckpt`` is written, rank 0 says so in one line and the run exits with 128 + the signal's number.

``SignalStop`` (a callback linrope.training.builders.build_callbacks always adds) replaces Lightning's handlers while
training runs and stops through linrope.run.lightning_internals.stop_after_this_step; why, and why a flag every step
through gloo: docs/reliability.md, "Threat model: what linrope protects against, and what it does not" (its
"Preemption") and "Several processes (DDP)".  The other process-wide state of a run lives here too:
``destroy_process_group_at_exit`` (same section) and ``MatmulPrecision`` (``trainer.matmul_precision``: docs/usage.md,
"Trainers: CPU, GPUs, nodes")."""

from __future__ import annotations

import atexit
import datetime
import signal
import threading
from typing import Any, Dict, Optional

import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.exceptions import SIGTERMException

from linrope.run.last_checkpoint import LastCheckpoint
from linrope.run.lightning_internals import stop_after_this_step


class SignalStop(Callback):
    """See the module docstring.  ``stopped_by``: the signal that stopped the run (None while it runs)."""

    def __init__(self) -> None:
        self.stopped_by: Optional[str] = None
        self._signalled: Optional[str] = None
        self._previous: Dict[int, Any] = {}
        self._exchange: Optional[Any] = None  # under DDP: the group the flag travels in (None: the default)
        self._distributed = False

    def on_train_start(self, trainer, pl_module) -> None:
        self.stopped_by = self._signalled = None
        self._previous = {}
        self._distributed = (
            trainer.world_size > 1 and torch.distributed.is_available() and torch.distributed.is_initialized()
        )
        if self._distributed:  # every process calls this hook: a new group is made on all of them alike
            self._exchange = host_group()
        if threading.current_thread() is not threading.main_thread():
            return

        def note(signum, frame):
            name = signal.Signals(signum).name
            if name == "SIGINT" and self._signalled == "SIGINT":
                raise KeyboardInterrupt  # pressed twice: stop now
            self._signalled = self._signalled or name

        for signum in (signal.SIGTERM, signal.SIGINT):
            self._previous[signum] = signal.signal(signum, note)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        """If any process was signalled, every process stops after this step."""
        code = signal.Signals[self._signalled].value if self._signalled else 0
        if self._distributed:  # a CPU tensor between the hosts: nothing waits for the accelerator
            flag = torch.tensor([code])
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX, group=self._exchange)
            code = flag.tolist()[0]
        if code:
            self.stopped_by = signal.Signals(code).name
            stop_after_this_step(trainer)

    def _restore_handlers(self) -> None:
        if threading.current_thread() is threading.main_thread():
            for signum, handler in self._previous.items():
                signal.signal(signum, handler)
        self._previous = {}

    def on_train_end(self, trainer, pl_module) -> None:
        self._restore_handlers()

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        """Stopped by a signal: last.ckpt now, and the line linrope.run.exit.one_line_errors prints (rank 0)
        with the exit status, 128 + the signal's number, attached to the exception."""
        self._restore_handlers()
        if not isinstance(exception, SIGTERMException):
            return
        self.stopped_by = self.stopped_by or "SIGTERM"  # also Lightning's own handler, outside training
        last = next((cb for cb in trainer.checkpoint_callbacks if isinstance(cb, LastCheckpoint)), None)
        saved = last.save_on_stop(trainer) if last is not None else "no checkpoint was saved"
        message = f"stopped by {self.stopped_by} at step {trainer.global_step}: {saved}"
        exception.linrope_stop = (
            message if trainer.is_global_zero else None,
            128 + int(getattr(signal, self.stopped_by)),
        )


def host_group():
    """The process group the stop flag travels in as a CPU tensor: the default group when its backend is gloo
    (``gloo``, or ``cpu:gloo,cuda:nccl``), else a gloo group of every process, made once per fit (a
    collective: every process makes it at the same point).  NCCL would carry the flag on the GPU, and reading
    it back would wait for every kernel queued before it: a host sync every step."""
    if "gloo" in str(torch.distributed.get_backend()):
        return None
    return torch.distributed.new_group(backend="gloo")


def destroy_process_group_at_exit() -> None:
    """Destroy this process's process group at exit (registered once per process, however often called);
    ``linrope.training.lit.LanguageModel.setup`` calls it in every process of a run.  atexit handlers run while
    the interpreter is still whole."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        atexit.unregister(_destroy_process_group)
        atexit.register(_destroy_process_group)


EXIT_BARRIER_S = 30.0  # how long a rank waits at exit for the others before destroying its group anyway


def _destroy_process_group() -> None:
    """Meet the other ranks, then destroy the group.  Without the meeting, torch 2.4's gloo hung in
    ``destroy_process_group`` when the ranks reached it at different times (two of three tries of
    benchmarks/gloo_exit.py); ``monitored_barrier`` gives up after ``EXIT_BARRIER_S`` when a rank is gone."""
    dist = torch.distributed
    if not dist.is_initialized():
        return
    try:
        if dist.get_backend() == "gloo" and dist.get_world_size() > 1:
            dist.monitored_barrier(timeout=datetime.timedelta(seconds=EXIT_BARRIER_S))
    except Exception:  # noqa: BLE001 - a rank that is gone: destroy all the same
        pass
    finally:
        dist.destroy_process_group()


def apply_matmul_precision(precision: Optional[str]) -> None:
    """``torch.set_float32_matmul_precision(precision)`` (the values: linrope.config.settings.MATMUL_PRECISIONS);
    None: nothing.  linrope.training.builders.build_trainer calls it before fit."""
    if precision is not None:
        torch.set_float32_matmul_precision(str(precision))


class MatmulPrecision(Callback):
    """Applies ``precision`` in each process of the run, when the Trainer sets up (fit, validate, test)."""

    def __init__(self, precision: Optional[str]) -> None:
        self.precision = precision

    def setup(self, trainer, pl_module, stage: str) -> None:
        apply_matmul_precision(self.precision)
