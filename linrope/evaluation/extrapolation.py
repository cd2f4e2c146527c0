"""Length extrapolation: a model trained at context L₀, scored at other lengths L.  The protocols, their
costs and why each exists are in docs/methods.md ("Every length scores the same bytes, under two protocols",
"Length extrapolation on text"); the RoPE rows in docs/usage.md ("Tasks, extrapolation, sweeps and reports").

**Bytes: the same text at every length.**  The scored set is fixed before any length is chosen: every target of
the split (offsets 1 … n) when ``scored_bytes`` is null, else ``scored_bytes`` targets in segments spread evenly
over it (``linrope.data.windows.segments``).  ``scored``, ``documents`` and ``scored_hash`` (sha1 of the scored
offsets and their bytes) show the sets match across rows.  Protocol ``sliding``: windows of exactly L bytes
moved by a stride S (default L/2), each scoring its last S targets (the first: all), so each scored byte sees
at least L − S bytes before it (Press et al. 2022).  Protocol ``windows``: non-overlapping windows, the byte at
position p seeing the p before it; its loss per position (``per_position``) separates more context from unseen
distances.  The context-limited control (``window_control``): at L > L₀, ``windows`` again with every attention
layer limited to its last L₀ keys (``linrope.models.attention.attention_window``).  Every bytes row also keeps
its loss per document (``per_document``; linrope.evaluation.evaluate writes them beside the table).

**Text** (data=text, any tokenizer): ``windows`` and its control over the whole split, every token once
(``TextDataModule.length_dataset``); ``bpb`` is the scored tokens' nats over ln 2 · the bytes they stand for, so
models with different tokenizers compare; ``per_position`` buckets a target by its position in its document.
**Tasks** (mqar, offset_copy, listops) are generated at each length: ``task_examples`` examples, accuracy.

**RoPE rows** (ρ = L / L₀), each composed with the scaling the model was trained with: ``none`` as trained;
``pi`` θ → θ / ρ; ``ntk`` base → base · ρ^(d/(d−2)); ``yarn`` NTK-by-parts against L₀ (or the model's own
original context) and the temperature 0.1·ln ρ + 1 on q and k (softmax only); ``dynamic`` each forward's base
changed by N/L₀ when N > L₀ (one forward per window here: N = L, so it turns at the ``ntk`` row's frequencies).
In general, with the trained PI factor p, NTK factor k and YaRN factor y (1 when unused), a row multiplies one
of them by ρ and θ_t = yarn_y(base · k^(d/(d−2)))_t / p, the temperature 0.1·ln y + 1 (or the model's
``mscale``).  At or below L₀ the scaled rows repeat the model as trained.  A scheme whose table ends at
``max_len`` (learned, tupe, multiplicative with a table) reports ``n/a`` beyond it.  Softmax attention is
quadratic: the batch shrinks so that one batch's N×N scores stay under ``max_score_mb``.
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
from linrope.data.windows import segments  # which stretches every length scores (the one definition)
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
        self.parts = [
            (int(s), SlidingWindows(data[int(s) :], length, stride, int(n), offsets=True)) for s, n in segments
        ]
        self.index = [(p, k) for p, (_, w) in enumerate(self.parts) for k in range(len(w))]

    def __len__(self):
        return len(self.index)

    def __getitem__(self, i):
        p, k = self.index[i]
        start, windows = self.parts[p]
        x, y, where = windows[k]
        return x, y, torch.where(where >= 0, where + start, where)


def scored_hash(offsets: torch.Tensor, targets: torch.Tensor, wide: bool = False) -> str:
    """sha1 of the sorted scored offsets and the bytes (``wide``: token ids) at them: equal hashes, equal scored
    text."""
    order = torch.argsort(offsets)
    h = hashlib.sha1(offsets[order].numpy().astype("<i8").tobytes())
    h.update(targets[order].numpy().astype("<i4" if wide else np.uint8).tobytes())
    return h.hexdigest()[:16]


def document_positions(documents: torch.Tensor) -> torch.Tensor:
    """(B, N) position of each input in its document's stretch of the window: 0 where a row's document starts."""
    n = documents.shape[1]
    idx = torch.arange(n, device=documents.device).expand_as(documents)
    change = torch.ones_like(documents, dtype=torch.bool)
    change[:, 1:] = documents[:, 1:] != documents[:, :-1]
    return idx - torch.where(change, idx, torch.zeros_like(idx)).cummax(dim=1).values


# ---- scoring ---------------------------------------------------------------------------------------------------
def batch_for(length: int, model_cfg, max_batch: int, max_score_mb: float) -> int:
    """Largest batch (<= max_batch) whose softmax scores (H·N² floats, ×3 for the probabilities and
    the mask) fit in max_score_mb; linear attention keeps no N×N matrix."""
    if model_cfg.attention.get("kind") != "softmax":
        return max_batch
    per_example = 3 * 4 * model_cfg.n_heads * length * length
    return max(1, min(max_batch, int(max_score_mb * 2**20 // per_example)))


@torch.no_grad()
def score(module, dataset, *, batch_size: int, device, autocast_dtype=None, offsets: bool = False,
          token_bytes: Optional[torch.Tensor] = None) -> Dict[str, Any]:  # fmt: skip
    """Sum of cross-entropy, correct argmax predictions, scored targets; with ``offsets`` (items carry
    the scored offsets last) also the hash of the scored text, a check that no offset repeats, and each
    scored target's offset, loss (nats, float64) and position in its window (``per_target``).  With
    ``token_bytes`` (text: bytes per token id) also the bytes the scored targets stand for (``bytes``) and, per
    target, its bytes, its document (the batch's third tensor) and its position in that document."""
    out = {"loss_sum": 0.0, "correct": 0, "scored": 0, "examples": 0}
    if token_bytes is not None:
        token_bytes = token_bytes.to(device)
        out["bytes"] = 0
    kept = {k: [] for k in ("offsets", "values", "losses", "places", "bytes", "documents")}  # per target
    for batch in DataLoader(dataset, batch_size=batch_size, shuffle=False):
        if offsets:
            *batch, where = batch
        batch = [t.to(device) for t in batch]
        with torch.autocast(device.type, dtype=autocast_dtype) if autocast_dtype else contextlib.nullcontext():
            logits, y = module.outputs(batch)
        logits = logits.float()
        scored = y != IGNORE
        each = F.cross_entropy(logits, y, ignore_index=IGNORE, reduction="none")
        out["loss_sum"] += float(each.sum())
        out["correct"] += int((logits.argmax(-1)[scored] == y[scored]).sum())
        out["scored"] += int(scored.sum())
        out["examples"] += batch[0].shape[0]
        if token_bytes is not None:
            size = token_bytes[y[scored]]
            out["bytes"] += int(size.sum())
        if offsets:
            mask = scored.cpu()
            kept["offsets"].append(where.flatten()[mask])
            kept["values"].append(y[scored].cpu())
            kept["losses"].append(each[scored].double().cpu())
            if token_bytes is not None and len(batch) > 2:  # packed documents: positions count from each start
                kept["places"].append(document_positions(batch[2]).flatten().cpu()[mask])
                kept["documents"].append(batch[2].flatten().cpu()[mask])
            else:
                kept["places"].append(torch.arange(batch[0].shape[1]).repeat(batch[0].shape[0])[mask])
            if token_bytes is not None:
                kept["bytes"].append(size.cpu())
    if offsets:
        seen, values = torch.cat(kept.pop("offsets")), torch.cat(kept.pop("values"))
        if len(torch.unique(seen)) != len(seen):
            raise RuntimeError("the windows scored a target twice")
        out["scored_hash"] = scored_hash(seen, values, wide=token_bytes is not None)
        out["per_target"] = {
            "offsets": seen.numpy(),
            **{k: torch.cat(v).numpy() if v else None for k, v in kept.items()},
        }
    return out


def _binned(which: np.ndarray, losses: np.ndarray, sizes: Optional[np.ndarray] = None, k: int = 0) -> dict:
    """{bin: {bytes, nats}} of each bin of ``which`` that holds a target; with ``sizes`` (text: the bytes each target
    stands for) ``bytes`` sums them, and ``tokens`` counts the targets."""
    count = np.bincount(which, minlength=k)
    nbytes = count if sizes is None else np.bincount(which, weights=sizes, minlength=k)
    nats = np.bincount(which, weights=losses, minlength=k)
    out = {}
    for i in np.flatnonzero(count):
        out[int(i)] = {"bytes": int(nbytes[i]), "nats": float(nats[i])}
        if sizes is not None:
            out[int(i)]["tokens"] = int(count[i])
    return out


def per_document(documents, offsets: np.ndarray, losses: np.ndarray) -> List[Dict[str, Any]]:
    """{document, bytes, nats} of each document with a scored target (``documents``: the split's
    (name, start, end) spans; a target belongs to the document holding its byte)."""
    binned = _binned(document_index(documents, offsets), losses, k=len(documents))
    return [{"document": documents[i][0], **d} for i, d in binned.items()]


def per_position(places: np.ndarray, losses: np.ndarray, bucket: int, length: int,
                 sizes: Optional[np.ndarray] = None) -> List[Dict[str, Any]]:  # fmt: skip
    """{start, end, bytes, nats} per bucket of ``bucket`` positions within the windows (position p: the
    target predicted from the p bytes before it in its window); with ``sizes`` (text: the bytes each target
    stands for) also ``tokens``, and ``bytes`` sums the sizes."""
    binned = _binned(places // bucket, losses, sizes, -(-length // bucket))
    return [{"start": i * bucket, "end": min((i + 1) * bucket, length), **d} for i, d in binned.items()]


def per_text_document(documents: np.ndarray, losses: np.ndarray, sizes: np.ndarray) -> List[Dict[str, Any]]:
    """{document, bytes, nats, tokens} of each document of a text split with a scored target (``documents``: each
    target's document index in the split)."""
    index, which = np.unique(documents, return_inverse=True)
    return [{"document": int(index[i]), **d} for i, d in _binned(which, losses, sizes).items()]


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
    note=None,
) -> List[Dict[str, Any]]:
    """One row per (length, protocol, scaling, window): the columns of ``COLUMNS``; ``status`` is ``ok`` or
    ``n/a (why)``.  Bytes rows also carry ``per_document`` and (protocol ``windows``) ``per_position`` lists.
    ``settings``: every key of ``SETTINGS`` (conf/extrapolation/default.yaml); ``lengths``: default
    ``factors`` × ``train_context``.  ``log`` is called with each row as it is done (``format_row``),
    ``on_row`` with the list of the rows done so far (the caller writes them: nothing done is lost to a stop);
    ``note`` with the plan before the first row (rows, lengths, bytes scored) and the time left after each row."""
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
    scalings = [s for s in scalings or [] if s not in (None, "none")] if rope_schemes(model) else []
    for s in scalings:
        if s not in ROWS:
            raise ValueError(f"scalings: unknown RoPE row {s!r}; expected one of {', '.join(ROWS)}")
    text = getattr(datamodule, "splits", {}).get(split) if getattr(module, "bytes_like", True) else None
    tokens = getattr(datamodule, "token_bytes", None) if getattr(module, "task", None) == "text" else None
    scored = None
    protocols = list(settings["protocols"]) if text is not None else ["windows"]
    if text is not None:
        parts = segments(len(text), scored_bytes, max(lengths))
        scored = dict(segments=parts, documents=_documents_of(datamodule, split, len(text)))
        if log and parts[0][1] < len(text) - 1:
            log(
                f"(scoring {sum(n for _, n in parts)} of the {split} split's {len(text) - 1} bytes: "
                f"{len(parts)} segments)"
            )
    bucket = int(settings.get("position_bucket") or max(1, train_context // 4))
    windowed = bool(settings["window_control"] and (text is not None or tokens is not None))
    planned = {n: len(protocols) * (1 + len(scalings)) + (windowed and n > train_context) for n in lengths}
    # computed: every row beyond the training length; at or below it a scaled row repeats the row as trained
    todo = sum(rows if n > train_context else len(protocols) for n, rows in planned.items())
    if note:
        what = (
            f"{sum(n for _, n in scored['segments'])} bytes of the {split} split" if scored else "the task's examples"
        )
        note(
            f"plan: {sum(planned.values())} rows ({todo} computed) at lengths {', '.join(map(str, lengths))}, "
            f"each scoring {what}; the time left follows each row"
        )
    spent, done = 0.0, 0
    rows: List[Dict[str, Any]] = []
    for length in lengths:
        rho = length / train_context
        variants = [(p, label, None) for p in protocols for label in ["none", *scalings]]
        if windowed and length > train_context:  # the context-limited control
            variants.append(("windows", "none", train_context))
        plain = {}
        for protocol, label, window in variants:
            step = None
            if text is not None:
                step = length if protocol == "windows" else int(stride or default_stride(length))
            row = {
                **dict.fromkeys(COLUMNS),
                "length": length,
                "factor": round(rho, 4),
                "scaling": label,
                "protocol": protocol if text is not None or tokens is not None else None,
                "window": window,
                "examples": 0,
                "scored": 0,
                "stride": step,
                "seconds": 0.0,
                "status": "ok",
            }
            same = plain.get(protocol)
            if label != "none" and rho <= 1 and same is not None:  # at or below the training length: as trained
                row.update({k: same[k] for k in SAME if k in same})
            else:
                t0 = time.perf_counter()
                kw = dict(
                    batch_size=batch_for(length, model.cfg, batch_size, max_score_mb),
                    device=device,
                    autocast_dtype=autocast_dtype,
                    token_bytes=tokens,
                )
                limited = attention_window(model, window) if window else contextlib.nullcontext()
                scaled = (rope_row(model, label, rho, train_context), limited)
                _fill(row, module, datamodule, text, scored, split, task_examples, bucket, kw, scaled)
                row["seconds"] = round(time.perf_counter() - t0, 2)
                spent, done = spent + row["seconds"], done + 1
                if note:  # at the pace so far; rows at longer lengths may take longer
                    left = _left(spent / done * (todo - done))
                    note(f"row {done} of {todo} computed in {row['seconds']:.0f} s; about {left} left")
            if label == "none" and not window:
                plain[protocol] = row
            rows.append(row)
            if on_row:
                on_row(rows)
            if log:
                log(format_row(row))
    return rows


def _left(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


# what a scaled row at or below the training length repeats of the row as trained: its results, not its name
SAME = (*(c for c in COLUMNS if c not in KEY + ["factor", "stride", "seconds"]), "per_document", "per_position")


def _documents_of(datamodule, split: str, n: int) -> list:
    """The split's documents (linrope.data.bytes.Corpus), or the split as one document when the data module
    does not list them."""
    documents = getattr(getattr(datamodule, "splits", None), "documents", None)
    return list(documents[split]) if documents else [(split, 0, n)]


def _fill(row, module, datamodule, text, scored, split, task_examples, bucket, kw, scaled) -> None:
    """Score one row in place, inside the context managers ``scaled`` (its RoPE row and attention window); data
    that cannot be that long, or a position table that ends before it: n/a."""
    length = row["length"]
    tokens = kw.get("token_bytes")
    try:
        if text is not None:
            dataset = Segments(text, scored["segments"], length, row["stride"])
        elif tokens is not None:
            dataset = datamodule.length_dataset(split, length)
        else:
            dataset = datamodule.eval_dataset(split, context=length, max_windows=task_examples)
            if len(dataset) == 0:
                raise ValueError(f"the {split} split has no example of {length} tokens")
    except ValueError as e:
        row["status"] = f"n/a ({str(e).splitlines()[0][:120]})"
        return
    try:
        with scaled[0], scaled[1]:
            s = score(module, dataset, offsets=text is not None or tokens is not None, **kw)
    except SequenceTooLong:
        drawn_below = module.model.cfg.position.get("max_position")  # randomized positions: N distinct below it
        if drawn_below and length > drawn_below:
            row["status"] = f"n/a (positions drawn below max_position={drawn_below})"
        else:
            row["status"] = f"n/a (position table has {module.model.cfg.max_len} rows)"
        return
    loss = s["loss_sum"] / max(s["scored"], 1)
    row.update(loss=loss, examples=s["examples"], scored=s["scored"], scored_hash=s.get("scored_hash"))
    if tokens is not None:  # per token, and bits per byte of the text the tokens stand for
        row.update(bpb=s["loss_sum"] / (LN2 * max(s["bytes"], 1)), bytes=s["bytes"])
    elif getattr(module, "bytes_like", True):
        row.update(bpb=loss / LN2, bytes=s["scored"])
    else:
        row["acc"] = s["correct"] / max(s["scored"], 1)
    if text is None and tokens is None:
        return
    t = s["per_target"]
    if tokens is not None:
        if t["documents"] is not None:
            row["per_document"] = per_text_document(t["documents"], t["losses"], t["bytes"])
        row["per_position"] = per_position(t["places"], t["losses"], bucket, length, t["bytes"])
    else:
        row["per_document"] = per_document(scored["documents"], t["offsets"], t["losses"])
        if row["protocol"] == "windows":
            row["per_position"] = per_position(t["places"], t["losses"], bucket, length)
    if "per_document" in row:
        row["documents"] = len(row["per_document"])
