"""Length extrapolation: a model trained at context L₀, scored at other lengths L.

**Bytes: the same text at every length.**  The scored set is fixed before any length is chosen: every
target of the split (offsets 1 … n, n = the split's size − 1: only its first byte has nothing to be
predicted from) when ``scored_bytes`` is null (the default), else ``scored_bytes`` targets in segments
spread evenly over the split (never its first N bytes).  Each row says how many bytes (``scored``) and
documents (``documents``) it scored, and ``scored_hash`` (sha1 of the scored offsets and their bytes) shows
the sets match across rows.  Two protocols separate what a longer window changes:

* ``sliding`` — windows of exactly L bytes move by a stride S (default L/2): the first window scores all its
  targets, each later one only its last S, and the last window ends at the segment's end.  After the first
  window each scored byte sees at least L − S (and at most L − 1) bytes before it — the sliding-window
  evaluation of Press et al. 2022 (ALiBi).  A longer L brings both unseen distances and *more context*.
  About n · L / S tokens of forward passes (2n with the default stride, whatever L).
* ``windows`` — non-overlapping windows of L bytes: the byte at position p of its window sees the p bytes
  before it.  Its loss per position (``per_position``, buckets of ``position_bucket`` positions) separates
  the two effects: positions below L₀ are the training distribution; beyond it, a model that uses the extra
  context gets better and one hurt by unseen distances gets worse.  n tokens of forward passes.

**The context-limited control** (``window_control``): at each L > L₀, the ``windows`` protocol again with
every attention layer limited to the last L₀ keys (``linrope.models.attention.attention_window``): the same
model, seeing no more than it was trained on.  A model that beats its control beyond L₀ uses the longer
context; one that loses to it is hurt by the length itself.

Every bytes row also keeps its loss per document (``per_document``: the split's files, for intervals that
resample documents; linrope.evaluation.evaluate writes them beside the table).

**Tasks** (mqar, offset_copy, listops) are generated at each length: ``task_examples`` fixed
examples per length, loss and accuracy over their scored positions.

**RoPE rows**, each compared with the model as trained (ρ = L / L₀):

* ``none`` — as trained: the frequencies θ the model was trained with, positions 0 … L−1;
* ``pi`` — position interpolation by ρ *on top of* the trained frequencies: θ → θ / ρ.  For a
  PI-trained model (factor f) that is its own interpolation extended to f·ρ;
* ``ntk`` — NTK-aware base change by ρ on top of the trained base: base → base · ρ^(d/(d−2)),
  any trained PI division kept.  For an NTK-trained model that is its own factor extended to f·ρ;
* ``yarn`` — YaRN by ρ: NTK-by-parts (θ_t → (1 − γ_t) θ_t / ρ + γ_t θ_t, the ramp γ measured against L₀) and the
  temperature 0.1·ln ρ + 1 on q and k (softmax only).  For a YaRN-trained model its own factor extended to f·ρ,
  against its own original context and ramp;
* ``dynamic`` — dynamic NTK: each forward's base changed by N/L₀ (N its largest position + 1) when N > L₀.  Every
  window here is one forward at positions 0 … L−1, so N = L and the row turns at the ``ntk`` row's frequencies (a
  check of the per-forward path: the two differ only where a forward's length is not the row's, as in generation).
  For a model trained with ``scaling: dynamic`` the row is the model as trained.

In general, with the trained PI factor p, NTK factor k and YaRN factor y (1 when unused), a row multiplies one of
them by ρ and θ_t = yarn_y(base · k^(d/(d−2)))_t / p, the temperature 0.1·ln y + 1 (or the model's ``mscale``); a
dynamic model, or the ``dynamic`` row, further rescales θ per forward.  At or below L₀ the scaled rows repeat the
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
from linrope.data.bytes import LN2, SlidingWindows, default_stride, document_index
from linrope.data.tasks import IGNORE  # -100: positions that are not scored
from linrope.evaluation.tables import COLUMNS, KEY, format_row
from linrope.models.attention import attention_window
from linrope.ops.rope import ntk_base, partial_frequencies, rope_frequencies, yarn_mscale
from linrope.positions.rope import RoPE

# the settings of a table, declared once with their types and ranges (linrope.config.settings, which checks them
# before a run or an evaluation starts); conf/extrapolation/default.yaml gives their values
SETTINGS = EXTRAPOLATION_SETTINGS


# ---- RoPE rows -------------------------------------------------------------------------------------------------
def rope_schemes(model: torch.nn.Module) -> list:
    return list({id(m): m for m in model.modules() if isinstance(m, RoPE)}.values())


ROWS = ("pi", "ntk", "yarn", "dynamic")  # the RoPE rows beside the model as trained


def row_scaling(scheme, row: str, rho: float, train_context: int) -> dict:
    """What ``scheme`` turns with in ``row`` (none | pi | ntk | yarn | dynamic) at length factor ``rho``, composed
    with the scaling it was trained with: ``theta`` (float64), ``attention_scale`` and ``dynamic`` (the attributes
    of ``RoPE`` a row swaps).  YaRN and dynamic rows added to a model trained without them measure against
    ``train_context``."""
    if row not in (None, "none", *ROWS):
        raise ValueError(f"scalings: unknown RoPE row {row!r}; expected one of {', '.join(ROWS)}")
    trained = {"pi": 1.0, "ntk": 1.0, "yarn": 1.0}
    if scheme.scaling in trained:
        trained[scheme.scaling] = scheme.factor
    out = dict(theta=scheme.theta, attention_scale=scheme.attention_scale, dynamic=scheme.dynamic)
    if row in (None, "none"):
        return out
    if row == "dynamic":
        return {**out, "dynamic": scheme.dynamic or (1.0, int(train_context))}
    trained[row] *= rho
    p, k, y = trained["pi"], trained["ntk"], trained["yarn"]
    context = scheme.original_context if scheme.scaling == "yarn" else int(train_context)
    # partial rotary: the rotated dimensions' frequencies scaled, the rest left at θ = 0
    base = ntk_base(scheme.rotary_dims, scheme.base, k)
    theta = rope_frequencies(
        scheme.rotary_dims, base, scaling="yarn", factor=y, original_context=context, **scheme.yarn
    )
    theta = partial_frequencies(theta, scheme.head_dim)
    if row == "yarn":
        out["attention_scale"] = yarn_mscale(y) if scheme.mscale is None else scheme.mscale
    return {**out, "theta": (theta / p).to(scheme.theta.device)}


@contextlib.contextmanager
def rope_row(model: torch.nn.Module, row: str, rho: float, train_context: Optional[int] = None):
    """Every RoPE scheme of ``model`` at the scaling of ``row`` inside the block, restored after (``train_context``:
    L₀ of a yarn or dynamic row added to a model trained without; default each scheme's original context)."""
    schemes = rope_schemes(model) if row not in (None, "none") else []
    swapped = ("theta", "attention_scale", "dynamic")
    saved = [{a: getattr(s, a) for a in swapped} for s in schemes]
    try:
        for s in schemes:
            for a, v in row_scaling(s, row, rho, train_context or s.original_context).items():
                setattr(s, a, v)
        yield
    finally:
        for s, kept in zip(schemes, saved):
            for a, v in kept.items():
                setattr(s, a, v)


# ---- bytes: the same scored text at every length ---------------------------------------------------------------
class Segments(Dataset):
    """The windows of several stretches of a split, scored as one set: segment ``(start, size)`` holds the
    targets at offsets ``start + 1 … start + size`` of the split, scored by ``SlidingWindows`` (offsets are
    the split's)."""

    def __init__(self, data: np.ndarray, segments: Sequence[tuple], length: int, stride: int):
        self.parts = [(int(s), SlidingWindows(data[int(s) :], length, stride, int(n))) for s, n in segments]
        self.index = [(p, k) for p, (_, w) in enumerate(self.parts) for k in range(len(w))]

    def __len__(self):
        return len(self.index)

    def __getitem__(self, i):
        p, k = self.index[i]
        start, windows = self.parts[p]
        x, y, where = windows[k]
        return x, y, torch.where(where >= 0, where + start, where)


MAX_SEGMENTS = 16


def segments(split_bytes: int, scored_bytes: Optional[int], longest: int) -> List[tuple]:
    """The (start, size) stretches every length scores: the whole split (every target but the first byte's)
    when ``scored_bytes`` is None or covers it, else exactly ``scored_bytes`` targets in up to ``MAX_SEGMENTS``
    segments of at least ``longest`` (the longest length scored) bytes, spread evenly from the split's start to
    its end."""
    n = split_bytes - 1
    if scored_bytes is None or scored_bytes >= n:
        return [(0, n)]
    total = int(scored_bytes)
    k = max(1, min(MAX_SEGMENTS, total // max(int(longest), 1)))
    sizes = [total // k + (1 if i < total % k else 0) for i in range(k)]
    gaps = [((n - total) * i) // max(k - 1, 1) for i in range(k)]
    return [(gaps[i] + sum(sizes[:i]), sizes[i]) for i in range(k)]


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
    the scored offsets third) also the hash of the scored text, a check that no offset repeats, and each
    scored target's offset, loss (nats, float64) and position in its window (``per_target``)."""
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=False)
    loss_sum, correct, count, examples, seen, values, losses, places = 0.0, 0, 0, 0, [], [], [], []
    for batch in loader:
        if offsets:
            *batch, where = batch
        batch = [t.to(device) for t in batch]
        ctx = torch.autocast(device.type, dtype=autocast_dtype) if autocast_dtype else contextlib.nullcontext()
        with ctx:
            logits, y = module.outputs(batch)
        logits = logits.float()
        scored = y != IGNORE
        each = F.cross_entropy(logits, y, ignore_index=IGNORE, reduction="none")
        loss_sum += float(each.sum())
        correct += int((logits.argmax(-1)[scored] == y[scored]).sum())
        count += int(scored.sum())
        examples += batch[0].shape[0]
        if offsets:
            kept = scored.cpu()
            seen.append(where.flatten()[kept])
            values.append(y[scored].cpu())
            losses.append(each[scored].double().cpu())
            length = batch[0].shape[1]
            places.append(torch.arange(length).repeat(batch[0].shape[0])[kept])
    out = {"loss_sum": loss_sum, "correct": correct, "scored": count, "examples": examples}
    if offsets:
        seen_t, values_t = torch.cat(seen), torch.cat(values)
        if len(torch.unique(seen_t)) != len(seen_t):
            raise RuntimeError("sliding windows scored a byte twice")
        out["scored_hash"] = scored_hash(seen_t, values_t)
        out["per_target"] = (seen_t.numpy(), torch.cat(losses).numpy(), torch.cat(places).numpy())
    return out


def per_document(documents, offsets: np.ndarray, losses: np.ndarray) -> List[Dict[str, Any]]:
    """{document, bytes, nats} of each document with a scored target (``documents``: the split's
    (name, start, end) spans; a target belongs to the document holding its byte)."""
    which = document_index(documents, offsets)
    nbytes = np.bincount(which, minlength=len(documents))
    nats = np.bincount(which, weights=losses, minlength=len(documents))
    return [
        {"document": documents[i][0], "bytes": int(nbytes[i]), "nats": float(nats[i])}
        for i in range(len(documents))
        if nbytes[i]
    ]


def per_position(places: np.ndarray, losses: np.ndarray, bucket: int, length: int) -> List[Dict[str, Any]]:
    """{start, end, bytes, nats} per bucket of ``bucket`` positions within the windows (position p: the
    target predicted from the p bytes before it in its window)."""
    which = places // bucket
    k = -(-length // bucket)
    nbytes = np.bincount(which, minlength=k)
    nats = np.bincount(which, weights=losses, minlength=k)
    return [
        {"start": i * bucket, "end": min((i + 1) * bucket, length), "bytes": int(nbytes[i]), "nats": float(nats[i])}
        for i in range(k)
        if nbytes[i]
    ]


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
    """One row per (length, protocol, scaling, window): the columns of ``COLUMNS``; ``status`` is ``ok`` or
    ``n/a (why)``.  Bytes rows also carry ``per_document`` and (protocol ``windows``) ``per_position`` lists.
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
    lengths = [int(n) for n in lengths]
    device = torch.device(device or next(module.parameters()).device)
    module.eval()
    model = module.model
    schemes = rope_schemes(model)
    scalings = [s for s in scalings or [] if s not in (None, "none")] if schemes else []
    for s in scalings:
        if s not in ROWS:
            raise ValueError(f"scalings: unknown RoPE row {s!r}; expected one of {', '.join(ROWS)}")
    text = getattr(datamodule, "splits", {}).get(split) if getattr(module, "bytes_like", True) else None
    scored = None
    protocols = list(settings["protocols"]) if text is not None else ["windows"]
    if text is not None:
        parts = segments(len(text), scored_bytes, max(lengths))
        scored = dict(segments=parts, documents=_documents_of(datamodule, split, len(text)))
        if log and parts[0][1] < len(text) - 1:
            log(
                f"(scoring {sum(n for _, n in parts)} of the {split} split's {len(text) - 1} bytes: {len(parts)} segments)"
            )
    bucket = int(settings.get("position_bucket") or max(1, train_context // 4))
    rows: List[Dict[str, Any]] = []
    for length in lengths:
        rho = length / train_context
        controls = [train_context] if settings["window_control"] and text is not None and length > train_context else []
        variants = [(p, label, None) for p in protocols for label in ["none", *scalings]]
        variants += [("windows", "none", w) for w in controls]
        plain = {}
        for protocol, label, window in variants:
            step = None
            if text is not None:
                step = length if protocol == "windows" else int(stride or default_stride(length))
            row = {
                "length": length,
                "factor": round(rho, 4),
                "protocol": protocol if text is not None else None,
                "scaling": label,
                "window": window,
                "loss": None,
                "bpb": None,
                "acc": None,
                "examples": 0,
                "scored": 0,
                "documents": None,
                "stride": step,
                "scored_hash": None,
                "seconds": 0.0,
                "status": "ok",
            }
            same = plain.get(protocol)
            if label != "none" and rho <= 1 and same is not None:  # at or below the training length: as trained
                row.update({k: same[k] for k in SAME if k in same})
            else:
                t0 = time.perf_counter()
                limited = _window(model, window)
                _fill(
                    row,
                    module,
                    datamodule,
                    text,
                    scored,
                    split,
                    task_examples,
                    bucket,
                    dict(
                        batch_size=batch_for(length, model.cfg, batch_size, max_score_mb),
                        device=device,
                        autocast_dtype=autocast_dtype,
                    ),
                    _both(rope_row(model, label, rho, train_context), limited),
                )
                row["seconds"] = round(time.perf_counter() - t0, 2)
            if label == "none" and not window:
                plain[protocol] = row
            rows.append(row)
            if on_row:
                on_row(rows)
            if log:
                log(format_row(row))
    return rows


# what a scaled row at or below the training length repeats of the row as trained: its results, not its name
SAME = (*(c for c in COLUMNS if c not in KEY + ["factor", "stride", "seconds"]), "per_document", "per_position")


def _window(model, window: Optional[int]):
    """Every attention layer of ``model`` limited to the last ``window`` keys inside the block (None: as is)."""
    return attention_window(model, window) if window else contextlib.nullcontext()


@contextlib.contextmanager
def _both(first, second):
    with first, second:
        yield


def _documents_of(datamodule, split: str, n: int) -> list:
    """The split's documents (linrope.data.bytes.Corpus), or the split as one document when the data module
    does not list them."""
    documents = getattr(getattr(datamodule, "splits", None), "documents", None)
    return list(documents[split]) if documents else [(split, 0, n)]


def _fill(row, module, datamodule, text, scored, split, task_examples, bucket, kw, scaled) -> None:
    """Score one row in place; data that cannot be that long, or a position table that ends before it: n/a."""
    length = row["length"]
    try:
        if text is not None:
            dataset = Segments(text, scored["segments"], length, row["stride"])
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
        drawn_below = module.model.cfg.position.get("max_position")  # randomized positions: N distinct below it
        row["status"] = (
            f"n/a (positions drawn below max_position={drawn_below})"
            if drawn_below and length > drawn_below
            else f"n/a (position table has {module.model.cfg.max_len} rows)"
        )
        return
    loss = s["loss_sum"] / max(s["scored"], 1)
    row.update(loss=loss, examples=s["examples"], scored=s["scored"], scored_hash=s.get("scored_hash"))
    if getattr(module, "bytes_like", True):
        row["bpb"] = loss / LN2
    else:
        row["acc"] = s["correct"] / max(s["scored"], 1)
    if text is None:
        return
    where, losses, places = s["per_target"]
    row["per_document"] = per_document(scored["documents"], where, losses)
    row["documents"] = len(row["per_document"])
    if row["protocol"] == "windows":
        row["per_position"] = per_position(places, losses, bucket, length)
