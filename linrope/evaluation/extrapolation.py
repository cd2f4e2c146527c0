"""Length extrapolation: a model trained at context L₀, scored at other lengths L.

**Bytes: the same text at every length.**  The scored set is fixed before any length is chosen:
the targets at offsets 1 … n of the split (n = ``scored_bytes``, 131 072 by default, fewer only if
the split is shorter — then said once).  At length L, windows of exactly L bytes slide over those
n + 1 bytes with a stride S (default L/2): the first window scores all its targets, each later one
only its last S, and the last window ends at offset n.  So every length scores exactly the same
bytes, each once, and after the first window each scored byte sees at least L − S (and at most
L − 1) bytes before it — the sliding-window evaluation of Press et al. 2022 (ALiBi).  The cost is
about n · L / S tokens of forward passes per row (2n with the default stride, whatever L), plus
softmax's N² per window.  The CSV's ``scored`` and ``scored_hash`` (sha1 of the scored offsets and
their bytes) show the sets match across rows.

**Tasks** (mqar, offset_copy, listops) are generated at each length: ``task_examples`` fixed
examples per length, loss and accuracy over their scored positions.

**RoPE rows**, each compared with the model as trained (ρ = L / L₀):

* ``none`` — as trained: the frequencies θ the model was trained with, positions 0 … L−1;
* ``pi`` — position interpolation by ρ *on top of* the trained frequencies: θ → θ / ρ.  For a
  PI-trained model (factor f) that is its own interpolation extended to f·ρ;
* ``ntk`` — NTK-aware base change by ρ on top of the trained base: base → base · ρ^(d/(d−2)),
  any trained PI division kept.  For an NTK-trained model that is its own factor extended to f·ρ.

In general, with the trained PI factor p and NTK factor k (1 when unused), a row multiplies one of
them by ρ and θ_t = (base · k^(d/(d−2)))^(−2t/d) / p.  At or below L₀ the scaled rows repeat the
model as trained.  A scheme whose table ends at ``max_len`` (learned, tupe, multiplicative with a
table) reports ``n/a`` beyond it.  Softmax attention is quadratic: the batch shrinks so that one
batch's N×N scores stay under ``max_score_mb``.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

from linrope.base.errors import SequenceTooLong
from linrope.config.settings import EXTRAPOLATION_SETTINGS
from linrope.data.bytes import LN2
from linrope.data.tasks import IGNORE  # -100: positions that are not scored
from linrope.evaluation.tables import format_row
from linrope.ops.rope import rope_frequencies
from linrope.positions.rope import RoPE

# the settings of a table, declared once with their types and ranges (linrope.config.settings, which checks them
# before a run or an evaluation starts); conf/extrapolation/default.yaml gives their values
SETTINGS = EXTRAPOLATION_SETTINGS


# ---- RoPE rows -------------------------------------------------------------------------------------------------
def rope_schemes(model: torch.nn.Module) -> list:
    return list({id(m): m for m in model.modules() if isinstance(m, RoPE)}.values())


def row_theta(scheme, row: str, rho: float) -> torch.Tensor:
    """The float64 frequencies of ``row`` (none | pi | ntk) at length factor ``rho``, composed with the
    scaling ``scheme`` was trained with (its ``scaling`` and ``factor``)."""
    pi = scheme.factor if scheme.scaling == "pi" else 1.0
    ntk = scheme.factor if scheme.scaling == "ntk" else 1.0
    if row == "pi":
        pi *= rho
    elif row == "ntk":
        ntk *= rho
    elif row not in (None, "none"):
        raise ValueError(f"scalings: unknown RoPE row {row!r}; expected pi or ntk")
    return rope_frequencies(scheme.head_dim, scheme.base, scaling="ntk", factor=ntk) / pi


@contextlib.contextmanager
def rope_row(model: torch.nn.Module, row: str, rho: float):
    """Every RoPE scheme of ``model`` at the frequencies of ``row`` inside the block, restored after."""
    schemes = rope_schemes(model) if row not in (None, "none") else []
    saved = [s.theta for s in schemes]
    try:
        for s in schemes:
            s.theta = row_theta(s, row, rho).to(s.theta.device)
        yield
    finally:
        for s, theta in zip(schemes, saved):
            s.theta = theta


# ---- bytes: the same scored text at every length ---------------------------------------------------------------
def default_stride(length: int) -> int:
    return max(1, length // 2)


class SlidingWindows(Dataset):
    """Windows of ``length`` bytes over ``data[0 : n + 1]`` that score the targets at offsets 1 … n once each.

    Window k ends at e_k (inputs ``data[e_k − length : e_k]``): e_0 = length, e_k = min(e_{k−1} + stride, n);
    it scores the targets at offsets e_{k−1}+1 … e_k.  Item: (inputs, targets with ``IGNORE`` where not
    scored, the offset of each scored target or −1)."""

    def __init__(self, data: np.ndarray, length: int, stride: int, n: int):
        if not 1 <= stride <= length:
            raise ValueError(f"stride={stride}: must be between 1 and the length ({length})")
        if n < length:
            raise ValueError(f"the scored text ({n} bytes) is shorter than the length {length}")
        self.data, self.length = torch.from_numpy(np.asarray(data[: n + 1])), length
        self.ends = list(range(length, n, stride)) + [n]

    def __len__(self):
        return len(self.ends)

    def __getitem__(self, k):
        end = self.ends[k]
        start = end - self.length
        first = 1 if k == 0 else self.ends[k - 1] + 1  # first offset this window scores
        w = self.data[start : end + 1].long()
        offsets = torch.arange(start + 1, end + 1)
        scored = offsets >= first
        y = torch.where(scored, w[1:], torch.full_like(w[1:], IGNORE))
        return w[:-1], y, torch.where(scored, offsets, torch.full_like(offsets, -1))


def scored_hash(offsets: torch.Tensor, targets: torch.Tensor) -> str:
    """sha1 of the sorted scored offsets and the bytes at them: equal hashes, equal scored text."""
    order = torch.argsort(offsets)
    h = hashlib.sha1(offsets[order].numpy().astype("<i8").tobytes())
    h.update(targets[order].numpy().astype(np.uint8).tobytes())
    return h.hexdigest()[:16]


# ---- scoring ---------------------------------------------------------------------------------------------------
def batch_for(length: int, model_cfg, max_batch: int, max_score_mb: float) -> int:
    """Largest batch (<= max_batch) whose softmax scores (H·N² floats, ×3 for the probabilities and
    the mask) fit in max_score_mb; linear attention keeps no N×N matrix."""
    if model_cfg.attention.get("kind") != "softmax":
        return max_batch
    per_example = 3 * 4 * model_cfg.n_heads * length * length
    return max(1, min(max_batch, int(max_score_mb * 2**20 // per_example)))


@torch.no_grad()
def score(module, dataset, *, batch_size: int, device, autocast_dtype=None, offsets: bool = False) -> Dict[str, Any]:
    """Sum of cross-entropy, correct argmax predictions, scored targets; with ``offsets`` (items carry
    the scored offsets third) also the hash of the scored text and a check that no offset repeats."""
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=False)
    loss_sum, correct, count, examples, seen, values = 0.0, 0, 0, 0, [], []
    for batch in loader:
        if offsets:
            *batch, where = batch
        batch = [t.to(device) for t in batch]
        ctx = torch.autocast(device.type, dtype=autocast_dtype) if autocast_dtype else contextlib.nullcontext()
        with ctx:
            logits, y = module.outputs(batch)
        logits = logits.float()
        scored = y != IGNORE
        loss_sum += float(F.cross_entropy(logits, y, ignore_index=IGNORE, reduction="sum"))
        correct += int((logits.argmax(-1)[scored] == y[scored]).sum())
        count += int(scored.sum())
        examples += batch[0].shape[0]
        if offsets:
            seen.append(where.flatten()[scored.cpu()])
            values.append(y[scored].cpu())
    out = {"loss_sum": loss_sum, "correct": correct, "scored": count, "examples": examples}
    if offsets:
        seen_t, values_t = torch.cat(seen), torch.cat(values)
        if len(torch.unique(seen_t)) != len(seen_t):
            raise RuntimeError("sliding windows scored a byte twice")
        out["scored_hash"] = scored_hash(seen_t, values_t)
    return out


def length_table(
    module,
    datamodule,
    settings: Mapping[str, Any],
    *,
    train_context: int,
    lengths: Optional[Sequence[int]] = None,
    device=None,
    autocast_dtype=None,
    log=None,
    on_row=None,
) -> List[Dict[str, Any]]:
    """One row per (length, scaling): the columns of ``COLUMNS``; ``status`` is ``ok`` or ``n/a (why)``.
    ``settings``: every key of ``SETTINGS`` (conf/extrapolation/default.yaml); ``lengths``: default
    ``factors`` × ``train_context``.  ``log`` is called with each row as it is done (``format_row``),
    ``on_row`` with the list of the rows done so far (the caller writes them: nothing done is lost to a stop)."""
    missing = [k for k in SETTINGS if k not in settings]
    if missing:
        raise ValueError(f"length_table: settings without {', '.join(missing)} (see conf/extrapolation/default.yaml)")
    scalings, split, scored_bytes, stride, task_examples, batch_size, max_score_mb = (
        settings[k]
        for k in ("scalings", "split", "scored_bytes", "stride", "task_examples", "batch_size", "max_score_mb")
    )
    if lengths is None:
        lengths = [int(round(f * train_context)) for f in settings["factors"]]
    device = torch.device(device or next(module.parameters()).device)
    module.eval()
    model = module.model
    schemes = rope_schemes(model)
    scalings = [s for s in scalings or [] if s not in (None, "none")] if schemes else []
    for s in scalings:
        if s not in ("pi", "ntk"):
            raise ValueError(f"scalings: unknown RoPE row {s!r}; expected pi or ntk")
    text = getattr(datamodule, "splits", {}).get(split) if getattr(module, "bytes_like", True) else None
    n = None
    if text is not None:
        n = min(int(scored_bytes), len(text) - 1)
        if n < scored_bytes and log:
            log(
                f"(the {split} split has {len(text)} bytes: scoring its first {n} at every length, "
                f"not scored_bytes={scored_bytes})"
            )
    rows: List[Dict[str, Any]] = []
    for length in map(int, lengths):
        rho = length / train_context
        step = int(stride or default_stride(length)) if n is not None else None
        plain = None
        for label in ["none", *scalings]:
            row = {
                "length": length,
                "factor": round(rho, 4),
                "scaling": label,
                "loss": None,
                "bpb": None,
                "acc": None,
                "examples": 0,
                "scored": 0,
                "stride": step,
                "scored_hash": None,
                "seconds": 0.0,
                "status": "ok",
            }
            if label != "none" and rho <= 1 and plain is not None:
                row.update({k: plain[k] for k in ("loss", "bpb", "acc", "examples", "scored", "scored_hash", "status")})
            else:
                t0 = time.perf_counter()
                _fill(
                    row,
                    module,
                    datamodule,
                    text,
                    n,
                    split,
                    task_examples,
                    dict(
                        batch_size=batch_for(length, model.cfg, batch_size, max_score_mb),
                        device=device,
                        autocast_dtype=autocast_dtype,
                    ),
                    rope_row(model, label, rho),
                )
                row["seconds"] = round(time.perf_counter() - t0, 2)
            plain = row if label == "none" else plain
            rows.append(row)
            if on_row:
                on_row(rows)
            if log:
                log(format_row(row))
    return rows


def _fill(row, module, datamodule, text, n, split, task_examples, kw, scaled) -> None:
    """Score one row in place; data that cannot be that long, or a position table that ends before it: n/a."""
    length = row["length"]
    try:
        if text is not None:
            dataset = SlidingWindows(text, length, row["stride"], n)
        else:
            dataset = datamodule.eval_dataset(split, context=length, max_windows=task_examples)
            if len(dataset) == 0:
                raise ValueError(f"the {split} split has no example of {length} tokens")
    except ValueError as e:
        row["status"] = f"n/a ({str(e).splitlines()[0][:120]})"
        return
    try:
        with scaled:
            s = score(module, dataset, offsets=text is not None, **kw)
    except SequenceTooLong:
        row["status"] = f"n/a (position table has {module.model.cfg.max_len} rows)"
        return
    loss = s["loss_sum"] / max(s["scored"], 1)
    row.update(loss=loss, examples=s["examples"], scored=s["scored"], scored_hash=s.get("scored_hash"))
    if getattr(module, "bytes_like", True):
        row["bpb"] = loss / LN2
    else:
        row["acc"] = s["correct"] / max(s["scored"], 1)
