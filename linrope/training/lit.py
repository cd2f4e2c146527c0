"""The LightningModule: next-token cross-entropy, AdamW with linear warm-up and cosine decay,
metrics train/loss, train/lr, val/loss, val/bpb (bits per byte), test/*, tokens per second."""

from __future__ import annotations

import math
import os
import resource
from typing import Any, Dict, Mapping, Optional

import lightning as L
import torch
import torch.nn.functional as F

from linrope.base.compiling import compile_unsupported
from linrope.base.errors import CheckpointError, ConfigError, NonFiniteLoss
from linrope.config.checks import plain
from linrope.data.bytes import LN2
from linrope.data.tasks import IGNORE  # -100: the target of positions that are not scored
from linrope.models.model import TransformerLM, weight_decay_split
from linrope.models.optim import REQUIRED as OPTIM_KEYS  # conf/optim/adamw.yaml
from linrope.models.spec import IDENTITY_KEY, check_identity, model_identity
from linrope.run.checkpoint import check_state_dict, load_checkpoint
from linrope.run.last_checkpoint import last_good_checkpoint
from linrope.run.provenance import CONFIG_KEY, PROVENANCE_KEY
from linrope.run.signals import destroy_process_group_at_exit


def step_seed(base: int, step: int, rank: int, micro: int = 0) -> int:
    """A seed for one training step of one process, and its ``micro``-th batch under gradient accumulation
    (splitmix64 of the four numbers; ``micro`` 0 as without accumulation)."""
    x = (int(base) * 0x9E3779B97F4A7C15 + int(step) * 0xBF58476D1CE4E5B9 + int(rank) * 0x94D049BB133111EB) % 2**64
    x = (x + int(micro) * 0xD6E8FEB86659FD93) % 2**64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) % 2**64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) % 2**64
    return (x ^ (x >> 31)) % 2**63


def peak_memory_mb(device: torch.device) -> float:
    """Peak memory so far: the CUDA allocator's peak on a GPU, the process's resident high-water mark on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def warmup_cosine(step: int, *, warmup_steps: int, total_steps: int, min_lr_ratio: float) -> float:
    """Multiplier of the peak learning rate: linear warm-up, then cosine decay to min_lr_ratio."""
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    if total_steps <= warmup_steps:
        return 1.0
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def text_sums(logits: torch.Tensor, targets: torch.Tensor, token_bytes: torch.Tensor):
    """(nats, tokens, bytes) of the scored targets (``targets != IGNORE``): the summed cross-entropy, how many
    targets, and the bytes of text they stand for (``token_bytes[target]``: linrope.data.tokenizer, the
    end-of-document token counted one byte).  Bits per byte = nats / (ln 2 · bytes), over a whole split."""
    scored = targets != IGNORE
    nats = F.cross_entropy(logits, targets, ignore_index=IGNORE, reduction="sum")
    return nats, scored.sum(), token_bytes.to(targets.device)[targets[scored]].sum()


def query_order_hits(pred: torch.Tensor, targets: torch.Tensor, orders: int):
    """(hits (P,), counts (P,)) of the k-th scored position of each row, k = 1 … ``orders``: ``pred`` and
    ``targets`` (B, N), ``IGNORE`` where nothing is scored; the k-th scored position of a row is where the running
    count of its scored positions reaches k (a row's positions beyond the ``orders``-th are not counted)."""
    scored = targets != IGNORE
    order = scored.long().cumsum(1) * scored  # k at a row's k-th scored position, 0 where nothing is scored
    at = order.unsqueeze(-1) == torch.arange(1, orders + 1, device=targets.device)  # (B, N, P)
    hit = at & ((pred == targets) & scored).unsqueeze(-1)
    return hit.sum((0, 1)).float(), at.sum((0, 1))


class LanguageModel(L.LightningModule):
    provenance: Optional[Dict[str, Any]] = (
        None  # linrope.run.provenance of the run (linrope.training.builders.log_config)
    )
    run_config: Optional[Dict[str, Any]] = None  # the run's whole resolved config (what a resume compares against)

    def __init__(self, model: Dict[str, Any], optim: Optional[Dict[str, Any]] = None, compile: bool = False):
        super().__init__()
        self.save_hyperparameters(logger=False)  # train.py logs the whole config once (training.log_config)
        self.model = TransformerLM(model)
        self.compile_model = bool(compile)  # torch.compile the model in configure_model (conf/train.yaml)
        reason = compile_unsupported() if self.compile_model else None
        if reason:
            raise ConfigError(f"compile=true: {reason}; run with compile=false")
        self.optim = dict(optim or {})
        self._bad_step: Optional[torch.Tensor] = None  # the first step whose loss was not finite (-1: none yet)
        self._bad_loss: Optional[torch.Tensor] = None
        self._text_sums: Dict[str, list] = {}  # data=text: {stage: [nats, tokens, bytes]} of the epoch (_eval_text)

    def setup(self, stage: str) -> None:
        """In every process of the run, after Lightning has set up its process group (if any)."""
        destroy_process_group_at_exit()  # gloo: Lightning leaves it alive (linrope.run.signals)

    def configure_model(self):
        """``compile: true``: compile the model's forward in place (``nn.Module.compile``: parameter names and
        checkpoints stay those of the eager model)."""
        if self.compile_model and not getattr(self, "_compiled", False):
            self.model.compile()
            self._compiled = True

    def forward(self, idx, **kwargs):
        return self.model(idx, **kwargs)

    @property
    def task(self) -> str:
        """The data's task (``model.task``, set by linrope.training.builders.build_module; bytes if absent)."""
        return self.hparams["model"].get("task", "bytes")

    @property
    def bytes_like(self) -> bool:
        """Next-byte prediction, where bits per byte mean something."""
        return self.task == "bytes" and not self.model.cfg.n_classes

    def outputs(self, batch):
        """(logits, targets) ready for cross-entropy: a classifier's pooled logits (B, C) and labels
        (B,) — the batch is (tokens, labels[, mask of real tokens]) — or a language model's logits
        (B·N, V) and targets (B·N,), ``IGNORE`` (-100) where nothing is scored; a language model's batch
        (tokens, targets, documents) packs documents (``TransformerLM.forward``'s ``documents``: none sees
        another).  To pack without resets, the common shortcut, a data module yields (tokens, targets)."""
        if self.model.cfg.n_classes:
            x, y, *mask = batch
            return self.model(x, mask=mask[0] if mask else None).float(), y
        x, y = batch[0], batch[1]
        documents = batch[2] if len(batch) > 2 else None
        return self.model(x, documents=documents).flatten(0, 1).float(), y.flatten()

    def loss(self, batch) -> torch.Tensor:
        logits, y = self.outputs(batch)
        return F.cross_entropy(logits, y, ignore_index=IGNORE)

    # ---- training --------------------------------------------------------------------------------
    def training_step(self, batch, batch_idx):
        loss = self.loss(batch)
        # train/loss is the global batch's loss: the mean over processes (what one process with the same
        # global batch logs), and every process sees a non-finite value at once and stops together
        trainer = self.trainer
        logged = loss.detach()
        if trainer.world_size > 1:
            logged = trainer.strategy.reduce(logged.clone(), reduce_op="mean")  # all_reduce works in place
        self._note_non_finite(logged)
        self.log("train/loss", logged, prog_bar=True)
        if trainer.optimizers:  # the rate of this step (every parameter group has it)
            self.log("train/lr", float(trainer.optimizers[0].param_groups[0]["lr"]))
        return loss

    # ---- a non-finite loss: noted on the device every step, read at the boundaries ---------------------------
    def _note_non_finite(self, logged: torch.Tensor) -> None:
        """Keep, on the device, the first step whose loss was not finite and that loss: no value is read back
        here (a host sync every step; docs/reliability.md#numerics-and-stops)."""
        bad = ~torch.isfinite(logged)
        if self._bad_step is None or self._bad_step.device != logged.device:
            self._bad_step = torch.full((), -1, dtype=torch.long, device=logged.device)
            self._bad_loss = torch.zeros((), dtype=logged.dtype, device=logged.device)
        first = bad & (self._bad_step < 0)
        self._bad_step = torch.where(first, self.global_step, self._bad_step)
        self._bad_loss = torch.where(first, logged, self._bad_loss)

    def raise_if_loss_was_not_finite(self) -> None:
        """The one read of the note (before validation, before a checkpoint is written, at the end of
        training): a step's loss was not finite, so training stops, naming that step and the last good
        checkpoint.  Every process reads the same note (the loss is the mean over processes) at the same
        boundary, so every process stops there."""
        if self._bad_step is None:
            return
        step = int(self._bad_step)
        if step < 0:
            return
        self._bad_step = None  # said once
        last = last_good_checkpoint(self.trainer)
        raise NonFiniteLoss(
            f"loss is {self._bad_loss.item()} at step {step}: training stopped; "
            + (f"the last good checkpoint is {last}" if last else "no checkpoint was written yet")
        )

    def on_validation_start(self):
        self.raise_if_loss_was_not_finite()

    def on_train_end(self):
        self.raise_if_loss_was_not_finite()

    def on_train_batch_start(self, batch, batch_idx):
        """The global random state at each batch is a function of (seed, step, rank, the batch's place in the
        step under gradient accumulation): dropout draws the same masks whether or not the run was resumed in
        between (a resume starts on a step's first batch), and each batch of a step its own."""
        step = self.global_step
        micro = getattr(self, "_micro", -1) + 1 if getattr(self, "_micro_step", None) == step else 0
        self._micro_step, self._micro = step, micro
        torch.manual_seed(step_seed(getattr(self, "_base_seed", 0), step, self.global_rank, micro))

    def on_fit_start(self):
        seed = os.environ.get("PL_GLOBAL_SEED")  # set by lightning.seed_everything
        self._base_seed = int(seed) if seed is not None and seed.lstrip("-").isdigit() else torch.initial_seed()

    def on_load_checkpoint(self, checkpoint):
        """Before Lightning loads the weights (resuming, testing, load_from_checkpoint): parameters that do
        not fit this model's config are named in one CheckpointMismatch line.  Under FSDP the strategy has
        loaded them already (strictly, into the sharded model) and taken ``state_dict`` out of the dict: only
        the model's identity is left to check (linrope.config.checks checked the file before the run started)."""
        if "state_dict" in checkpoint:
            check_state_dict(
                self.state_dict(),
                checkpoint["state_dict"] or {},
                found_cfg=(checkpoint.get("hyper_parameters") or {}).get("model"),
                expected_cfg=self.hparams.get("model"),
            )
        check_identity(checkpoint, self.hparams.get("model"))

    def on_save_checkpoint(self, checkpoint):
        """The model's identity (attention kind, feature map, placement, position scheme and options) goes
        into every checkpoint, so that loading it into another model is refused (linrope.models.spec).  No checkpoint
        is written after a step whose loss was not finite (``raise_if_loss_was_not_finite``)."""
        self.raise_if_loss_was_not_finite()
        checkpoint[IDENTITY_KEY] = model_identity(self.hparams.get("model"))
        if self.provenance is not None:  # and the run's provenance and config (linrope.run.provenance)
            checkpoint[PROVENANCE_KEY], checkpoint[CONFIG_KEY] = self.provenance, self.run_config

    def on_train_batch_end(self, outputs, batch, batch_idx):
        # tokens per second and MFU: linrope.training.throughput.Throughput
        if batch_idx % max(self.trainer.log_every_n_steps, 1) == 0:
            self.log("train/peak_mem_mb", peak_memory_mb(self.device))

    # ---- evaluation ------------------------------------------------------------------------------
    def _eval(self, batch, stage: str):
        """bytes: loss and bits per byte; the tasks: loss and accuracy over the scored positions
        (every answer of the epoch counts alike); a task whose data module declares ``query_orders`` (mqar: the
        queries of an example, in order of appearance) also the accuracy of each example's k-th query,
        ``<stage>/acc_q1`` … ``acc_q<P>``, each weighed by its scored k-th queries (docs/methods.md, "The recall
        probe": the last query can be answered by elimination, the first only by the lookup)."""
        logits, y = self.outputs(batch)
        if self.task == "text":
            return self._eval_text(logits, y, stage)
        loss = F.cross_entropy(logits, y, ignore_index=IGNORE)
        scored = y != IGNORE
        n = max(int(scored.sum()), 1)  # each batch weighs its scored targets: the epoch's value is per target
        if self.bytes_like:
            self.log(f"{stage}/loss", loss, prog_bar=stage == "val", sync_dist=True, batch_size=n)
            self.log(f"{stage}/bpb", loss / LN2, prog_bar=stage == "val", sync_dist=True, batch_size=n)
            return loss
        acc = (logits.argmax(-1)[scored] == y[scored]).float().sum() / n
        self.log(f"{stage}/loss", loss, prog_bar=stage == "val", sync_dist=True, batch_size=n)
        self.log(f"{stage}/acc", acc, prog_bar=stage == "val", sync_dist=True, batch_size=n)
        orders = getattr(getattr(self.trainer, "datamodule", None), "query_orders", None)
        if orders and not self.model.cfg.n_classes:
            hits, counts = query_order_hits(logits.argmax(-1).view_as(batch[1]), batch[1], int(orders))
            for k, (hit, count) in enumerate(zip(hits, counts.tolist()), 1):  # one read of the counts
                self.log(f"{stage}/acc_q{k}", hit / max(count, 1), sync_dist=True, batch_size=count)
        return loss

    def _eval_text(self, logits, y, stage: str):
        """data=text: the nats, tokens and bytes of the scored targets, summed in float64 over the epoch (Lightning's
        own sums are float32, inexact past 2^24 tokens) and logged at its end (``_log_text``)."""
        table = getattr(getattr(self.trainer, "datamodule", None), "token_bytes", None)
        if table is None:
            raise ConfigError("task text: the data module gives no token_bytes (linrope.data.text.TextDataModule)")
        nats, tokens, nbytes = text_sums(logits, y, table)
        sums = self._text_sums.setdefault(stage, [0.0, 0, 0])
        sums[0] += float(nats)  # one read per evaluation batch, as the other tasks
        sums[1] += int(tokens)
        sums[2] += int(nbytes)
        return nats / max(int(tokens), 1)

    def _log_text(self, stage: str):
        """``loss`` per scored token; ``bpb`` = the nats of the scored targets / (ln 2 · the bytes they stand for);
        ``tokens`` and ``bytes`` scored: the epoch's sums over every process (docs/methods.md, "Text data and
        metrics across tokenizers")."""
        sums = self._text_sums.pop(stage, None)
        if sums is None:
            return
        total = torch.tensor(sums, dtype=torch.float64, device=self.device)
        if self.trainer.world_size > 1:
            total = self.trainer.strategy.reduce(total, reduce_op="sum")
        nats, tokens, nbytes = total.tolist()
        values = {
            "loss": nats / max(tokens, 1),
            "bpb": nats / (LN2 * max(nbytes, 1)),
            "tokens": tokens,
            "bytes": nbytes,
        }
        for key, value in values.items():  # float64 tensors: Lightning keeps their precision
            self.log(
                f"{stage}/{key}",
                torch.tensor(value, dtype=torch.float64),
                prog_bar=stage == "val" and key in ("loss", "bpb"),
            )

    def on_validation_epoch_end(self):
        if self.task == "text":
            self._log_text("val")

    def validation_step(self, batch, batch_idx):
        return self._eval(batch, "val")

    def test_step(self, batch, batch_idx):
        return self._eval(batch, "test")

    def on_test_epoch_end(self):
        """How much text the test scored (bytes, documents), beside its score, when the data says."""
        datamodule = getattr(self.trainer, "datamodule", None)
        if self.task == "text":
            self._log_text("test")
        if self.task == "text" and hasattr(datamodule, "scored_text"):  # tokens and bytes: summed by _eval_text
            self.log("test/documents", float(datamodule.scored_text("test")["documents"]), rank_zero_only=True)
        if self.bytes_like and hasattr(datamodule, "scored_text"):
            for key, value in datamodule.scored_text("test").items():
                self.log(f"test/{key}", float(value), sync_dist=False, rank_zero_only=True)

    # ---- optimisation ----------------------------------------------------------------------------
    def configure_optimizers(self):
        """AdamW with linear warm-up and cosine decay, every setting from ``optim`` (conf/optim/, the only
        place they are written).  Matrices are decayed; embeddings, position tables, norms, biases and score-bias
        tables not (``linrope.models.model.weight_decay_split``)."""
        o = self.optim
        missing = [k for k in OPTIM_KEYS if k not in o]
        if missing:
            raise ConfigError(f"optim: no {', '.join(missing)} (the settings of conf/optim/adamw.yaml)")
        params = dict(self.model.named_parameters())
        decay, no_decay = ([params[n] for n in names] for names in weight_decay_split(self.model))
        opt = torch.optim.AdamW(
            [{"params": decay, "weight_decay": o["weight_decay"]}, {"params": no_decay, "weight_decay": 0.0}],
            lr=o["lr"],
            betas=tuple(o["betas"]),
        )
        total = o.get("schedule_steps") or self._trainer_max_steps()
        if total is None or total <= 0:
            raise ConfigError("optim.schedule_steps: the cosine schedule needs a length; set it, or trainer.max_steps")
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt,
            lambda s: warmup_cosine(
                s, warmup_steps=o["warmup_steps"], total_steps=total, min_lr_ratio=o["min_lr_ratio"]
            ),
        )
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step", "name": "lr"}}

    def _trainer_max_steps(self) -> Optional[int]:
        try:
            return self.trainer.max_steps
        except RuntimeError:  # Lightning's getter when no Trainer is attached (optim.schedule_steps is then needed)
            return None

    # ---- loading ---------------------------------------------------------------------------------
    @classmethod
    def from_checkpoint(
        cls,
        path,
        expected_model_cfg: Optional[Mapping] = None,
        *,
        map_location: Any = "cpu",
        checkpoint: Optional[Mapping[str, Any]] = None,
    ) -> "LanguageModel":
        """The model of a checkpoint, in eval mode, loaded with ``weights_only=True`` (or ``checkpoint``, the
        dict a caller already loaded from ``path`` that way: the file is read once).

        Built from the checkpoint's own model config, overridden (nested) by ``expected_model_cfg`` when
        given — e.g. a RoPE scaling for evaluation, or the config a caller expects the checkpoint to have.
        A model config linrope does not build (an odd RoPE head, a pairing that cannot work) is one
        ``CheckpointError`` line; parameters that do not fit, or another model's identity, one
        ``CheckpointMismatch`` line."""
        ckpt = load_checkpoint(path, map_location=map_location) if checkpoint is None else checkpoint
        if not isinstance(ckpt, Mapping) or "state_dict" not in ckpt:
            raise CheckpointError(f"checkpoint {path}: has no state_dict (not a Lightning checkpoint)")
        hp = ckpt.get("hyper_parameters") or {}
        found_cfg = dict(hp.get("model") or {})
        model_cfg = found_cfg if expected_model_cfg is None else merge_config(found_cfg, plain(expected_model_cfg))
        if not model_cfg:
            raise CheckpointError(f"checkpoint {path}: has no model config (hyper_parameters.model) and none was given")
        try:
            module = cls(model=model_cfg, optim=hp.get("optim"))  # the model checks its config (linrope.models.spec)
        except ConfigError as e:
            first = str(e).splitlines()[0]
            raise CheckpointError(f"checkpoint {path}: its model config is not one linrope builds: {first}") from None
        check_state_dict(
            module.state_dict(),
            ckpt["state_dict"],
            where=f"checkpoint {path}",
            found_cfg=found_cfg,
            expected_cfg=model_cfg,
        )
        check_identity(ckpt, model_cfg, where=f"checkpoint {path}")
        module.load_state_dict(ckpt["state_dict"])
        if map_location is not None and not callable(map_location) and not isinstance(map_location, dict):
            module.to(map_location)
        return module.eval()


def merge_config(base: Mapping, over: Mapping) -> Dict[str, Any]:
    """``over`` onto ``base``, nested; a sub-config whose ``name``/``kind`` changes is replaced whole."""
    out = dict(base)
    for k, v in over.items():
        old = out.get(k)
        if (
            isinstance(v, Mapping)
            and isinstance(old, Mapping)
            and all(v.get(t, old.get(t)) == old.get(t) for t in ("name", "kind"))
        ):
            out[k] = merge_config(old, v)
        else:
            out[k] = dict(v) if isinstance(v, Mapping) else v
    return out
