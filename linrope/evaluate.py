"""Length extrapolation: a model trained at context L, evaluated at longer lengths.

For each length (factor × L): the loss over the scored positions of ``max_windows`` evaluation
windows (bits per byte for bytes, accuracy for the tasks), for the model as trained
(scaling ``none``) and, for RoPE models, with position interpolation (``pi``) and NTK-aware
scaling (``ntk``) at the matching factor (``RoPE.set_scaling`` on every layer; a model trained
with a scaling keeps its own factor times the length factor for that kind).  A scheme whose
table ends at ``max_len`` (learned, tupe, multiplicative with a table) reports ``n/a`` beyond it.
Softmax attention is quadratic: the batch shrinks so that one batch's N×N scores stay under
``max_score_mb``.

Two ways in:

* after testing, from train.py when ``extrapolation.enabled=true`` (``extrapolate_after_test``):
  ``extrapolation.csv`` and ``extrapolation.png`` in the run folder, and a wandb Table + image;
* standalone on a checkpoint: ``python -m linrope.evaluate ckpt=PATH lengths=[256,512,1024]``
  (``python -m linrope.evaluate --help``).
"""
from __future__ import annotations

import contextlib
import csv
import math
import sys
import warnings
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence

import torch
import torch.nn.functional as F

from linrope.data.tasks import IGNORE  # -100: positions that are not scored
from linrope.positions.learned import SequenceTooLong

LN2 = math.log(2.0)
COLUMNS = ["length", "factor", "scaling", "loss", "bpb", "acc", "examples", "scored", "status"]
DEFAULTS = dict(factors=[1, 2, 4, 8, 16], scalings=["pi", "ntk"], split="test", max_windows=8, batch_size=8,
                max_score_mb=1024)

USAGE = """\
usage: python -m linrope.evaluate ckpt=PATH [key=value ...]

Length extrapolation of a trained checkpoint: the loss (bits per byte for bytes, accuracy for the
tasks) at several lengths, for the model as trained and, for RoPE, with pi / ntk scaling at the
matching factor.  Prints a table; writes evaluate.csv and evaluate.png.

keys:
  ckpt=PATH            a Lightning checkpoint of linrope (required)
  lengths=[256,512]    lengths to evaluate (default: factors × the training context)
  factors=[1,2,4,8,16] multiples of the training context, when lengths is not given
  scalings=[pi,ntk]    RoPE scalings besides the model as trained ([] for none)
  split=test           evaluation split (val | test)
  max_windows=8        windows (examples) per length
  batch_size=8         at most; lowered so a batch's attention scores stay under max_score_mb
  max_score_mb=1024
  device=cpu|cuda      default: cuda when available
  out=DIR              where to write (default: <run folder>/evaluate)
  config=PATH          the run's .hydra/config.yaml (default: found from the checkpoint's run folder)
  train_context=N      the training context (default: data.context of the run's config, else model.max_len)
  data.KEY=VALUE       change the run's data config (e.g. data.path=... , data.max_bytes=...)

example:
  python -m linrope.evaluate ckpt=logs/train/runs/<time>/checkpoints/last.ckpt lengths=[256,512,1024,2048]
"""


# ---- the evaluation --------------------------------------------------------------------------------------------
def rope_schemes(model: torch.nn.Module) -> list:
    return [m for m in model.modules() if hasattr(m, "set_scaling")]


@contextlib.contextmanager
def rope_scaling(model: torch.nn.Module, scaling: Optional[str], factor: float):
    """Every RoPE scheme of ``model`` scaled (``scaling`` at ``factor``) inside the block, restored after."""
    schemes = rope_schemes(model)
    saved = [(s.scaling, s.factor) for s in schemes]
    try:
        for s in schemes:
            s.set_scaling(scaling, factor)
        yield
    finally:
        for s, (sc, f) in zip(schemes, saved):
            s.set_scaling(sc, f)


def too_long(error: BaseException) -> bool:
    """A position table that ends before the length asked (learned, tupe, multiplicative tables)."""
    return isinstance(error, SequenceTooLong)


def batch_for(length: int, model_cfg, max_batch: int, max_score_mb: float) -> int:
    """Largest batch (<= max_batch) whose softmax scores (H·N² floats, ×3 for the probabilities and
    the mask) fit in max_score_mb; linear attention keeps no N×N matrix."""
    if model_cfg.attention.get("kind") != "softmax":
        return max_batch
    per_example = 3 * 4 * model_cfg.n_heads * length * length
    return max(1, min(max_batch, int(max_score_mb * 2**20 // per_example)))


@torch.no_grad()
def score(module, dataset, *, batch_size: int, device, autocast_dtype=None) -> Dict[str, float]:
    """Sum of cross-entropy, number of correct argmax predictions and of scored targets."""
    loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, shuffle=False)
    loss_sum, correct, count, examples = 0.0, 0, 0, 0
    for batch in loader:
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
    return {"loss_sum": loss_sum, "correct": correct, "scored": count, "examples": examples}


def length_table(module, datamodule, *, train_context: int, lengths: Sequence[int],
                 scalings: Iterable[str] = ("pi", "ntk"), split: str = "test", max_windows: int = 8,
                 batch_size: int = 8, max_score_mb: float = 1024, device=None, autocast_dtype=None,
                 log=None) -> List[Dict[str, Any]]:
    """One row per (length, scaling): the columns of ``COLUMNS``; ``status`` is ``ok`` or ``n/a (why)``."""
    device = torch.device(device or next(module.parameters()).device)
    module.eval()
    model = module.model
    bytes_like = getattr(module, "bytes_like", True)
    schemes = rope_schemes(model)
    base_scaling, base_factor = (schemes[0].scaling, schemes[0].factor) if schemes else (None, 1.0)
    scalings = [s for s in scalings if s not in (None, "none")] if schemes else []
    rows: List[Dict[str, Any]] = []
    for length in lengths:
        length = int(length)
        factor = length / train_context
        variants = [("none", base_scaling, base_factor)]
        variants += [(s, s, factor * (base_factor if s == base_scaling else 1.0)) for s in scalings]
        plain = None
        for label, scaling, f in variants:
            row = {"length": length, "factor": round(factor, 4), "scaling": label, "loss": None, "bpb": None,
                   "acc": None, "examples": 0, "scored": 0, "status": "ok"}
            if label != "none" and factor <= 1 and plain is not None:
                row.update({k: plain[k] for k in ("loss", "bpb", "acc", "examples", "scored", "status")})
                rows.append(row)  # no scaling at or below the training length: the model as trained
                continue
            s = None
            try:  # data that cannot be that long (a short split, a task's minimum) is n/a, not a crash
                dataset = datamodule.eval_dataset(split, context=length, max_windows=max_windows)
                if len(dataset) == 0:
                    raise ValueError(f"the {split} split has no window of {length} tokens")
            except ValueError as e:
                row["status"] = f"n/a ({str(e).splitlines()[0][:120]})"
            else:
                bs = batch_for(length, model.cfg, batch_size, max_score_mb)
                try:
                    with rope_scaling(model, scaling, f) if schemes else contextlib.nullcontext():
                        s = score(module, dataset, batch_size=bs, device=device, autocast_dtype=autocast_dtype)
                except ValueError as e:
                    if not too_long(e):
                        raise
                    row["status"] = f"n/a (position table has {model.cfg.max_len} rows)"
            if s is not None:
                loss = s["loss_sum"] / max(s["scored"], 1)
                row.update(loss=loss, examples=s["examples"], scored=s["scored"])
                if bytes_like:
                    row["bpb"] = loss / LN2
                else:
                    row["acc"] = s["correct"] / max(s["scored"], 1)
            if label == "none":
                plain = row
            rows.append(row)
            if log:
                log(format_row(row))
    return rows


# ---- output ----------------------------------------------------------------------------------------------------
def _fmt(v, digits=4):
    return "" if v is None else (f"{v:.{digits}f}" if isinstance(v, float) else str(v))


def format_row(row: Dict[str, Any]) -> str:
    metric = f"bpb {_fmt(row['bpb'])}" if row.get("bpb") is not None else f"acc {_fmt(row['acc'])}"
    if row["status"] != "ok":
        metric = row["status"]
    loss = _fmt(row["loss"]) or "-"
    return f"length {row['length']:>6}  ×{row['factor']:<6g} {row['scaling']:<5} loss {loss:>7}  {metric}"


def format_table(rows: List[Dict[str, Any]]) -> str:
    bytes_like = any(r.get("bpb") is not None for r in rows)
    head = ["length", "factor", "scaling", "loss", "bpb" if bytes_like else "acc", "examples", "status"]
    lines = [head]
    for r in rows:
        metric = r["bpb"] if bytes_like else r["acc"]
        ok = r["status"] == "ok"
        lines.append([str(r["length"]), f"{r['factor']:g}", r["scaling"], _fmt(r["loss"]) if ok else "n/a",
                      _fmt(metric) if ok else "n/a", str(r["examples"]), r["status"]])
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    out = ["  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in lines]
    out.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(out)


def write_csv(rows: List[Dict[str, Any]], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if r.get(k) is None else r[k]) for k in COLUMNS})
    return path


def read_csv(path: Path) -> List[Dict[str, Any]]:
    rows = []
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            row: Dict[str, Any] = dict(r)
            for k in ("length", "examples", "scored"):
                row[k] = int(r[k]) if r.get(k) else 0
            for k in ("factor", "loss", "bpb", "acc"):
                row[k] = float(r[k]) if r.get(k) not in (None, "") else None
            rows.append(row)
    return rows


def plot(rows: List[Dict[str, Any]], path: Path, *, train_context: Optional[int] = None, title: str = "") -> Path:
    """Loss (bits per byte for bytes) against length, one line per scaling; n/a points left out."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    bytes_like = any(r.get("bpb") is not None for r in rows)
    key = "bpb" if bytes_like else "loss"
    fig, ax = plt.subplots(figsize=(6, 4))
    for scaling in dict.fromkeys(r["scaling"] for r in rows):
        pts = [(r["length"], r[key]) for r in rows if r["scaling"] == scaling and r[key] is not None]
        if pts:
            ax.plot(*zip(*pts), marker="o", label="as trained" if scaling == "none" else scaling)
    if train_context:
        ax.axvline(train_context, color="grey", linestyle="--", linewidth=1, label="training context")
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.set_xlabel("evaluation length (tokens)")
    ax.set_ylabel("bits per byte" if bytes_like else "loss (scored positions)")
    ax.set_title(title or "length extrapolation")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


# ---- after testing (train.py) ----------------------------------------------------------------------------------
def extrapolate_after_test(cfg, trainer, module, datamodule, loggers: list) -> List[Dict[str, Any]]:
    """train.py's hook (``extrapolation.enabled``): the table for ``factors`` × the training context,
    written to the run folder and logged to wandb (Table + image) when wandb is a logger."""
    if not trainer.is_global_zero:
        return []
    ex = {**DEFAULTS, **dict(cfg.extrapolation)}
    train_context = int(datamodule.context)
    lengths = [int(round(f * train_context)) for f in ex["factors"]]
    device = trainer.strategy.root_device
    precision = str(trainer.precision)
    autocast = (torch.bfloat16 if "bf16" in precision else torch.float16 if "16" in precision else None) \
        if device.type == "cuda" else None
    was = next(module.parameters()).device
    module.to(device)
    try:
        rows = length_table(module, datamodule, train_context=train_context, lengths=lengths,
                            scalings=list(ex["scalings"] or []), split=ex["split"], max_windows=ex["max_windows"],
                            batch_size=ex["batch_size"], max_score_mb=ex["max_score_mb"], device=device,
                            autocast_dtype=autocast)
    finally:
        module.to(was)
    out = Path(cfg.paths.output_dir)
    csv_path = write_csv(rows, out / "extrapolation.csv")
    png = plot(rows, out / "extrapolation.png", train_context=train_context, title=f"{cfg.model.get('name', '')}")
    print("length extrapolation (" + str(csv_path) + "):\n" + format_table(rows))
    for lg in loggers:
        if type(lg).__name__ == "WandbLogger":
            try:
                lg.log_table(key="extrapolation/table", columns=COLUMNS, data=[[r[k] for k in COLUMNS] for r in rows])
                lg.log_image(key="extrapolation/plot", images=[str(png)])
                metric = "bpb" if getattr(module, "bytes_like", True) else "loss"
                lg.log_metrics({f"extrapolation/{r['scaling']}/{metric}@{r['length']}": r[metric]
                                for r in rows if r[metric] is not None})
            except Exception as e:  # noqa: BLE001 - the CSV and PNG are written; do not fail a finished run
                warnings.warn(f"could not log the extrapolation table to wandb: {e}")
    return rows


# ---- standalone ------------------------------------------------------------------------------------------------
class EvaluateError(Exception):
    pass


def parse_args(argv: Sequence[str]):
    from omegaconf import OmegaConf

    bad = [a for a in argv if "=" not in a]
    if bad:
        raise EvaluateError(f"expected key=value arguments, got {' '.join(bad)} (see --help)")
    args = OmegaConf.from_dotlist(list(argv))
    known = {"ckpt", "lengths", "factors", "scalings", "split", "max_windows", "batch_size", "max_score_mb",
             "device", "out", "config", "train_context", "data"}
    unknown = sorted(set(args.keys()) - known)
    if unknown:
        raise EvaluateError(f"unknown key(s) {', '.join(unknown)} (see --help)")
    if not args.get("ckpt"):
        raise EvaluateError("ckpt=PATH is required (see --help)")
    return args


def find_run_config(ckpt: Path) -> Optional[Path]:
    """<run>/.hydra/config.yaml for <run>/checkpoints/x.ckpt (or <run>/x.ckpt)."""
    for folder in (ckpt.parent, ckpt.parent.parent):
        if (folder / ".hydra" / "config.yaml").exists():
            return folder / ".hydra" / "config.yaml"
    return None


def build_datamodule_for(module, run_cfg, data_overrides, train_context: Optional[int]):
    """The run's data module (from its saved config, ``data.*`` overrides applied); without a config:
    bytes from the default corpus."""
    import hydra
    from omegaconf import OmegaConf

    if run_cfg is None:
        if module.task != "bytes":
            raise EvaluateError(f"the checkpoint was trained on task {module.task!r}: "
                                f"pass config=<run>/.hydra/config.yaml")
        from linrope.data.modules import ByteDataModule

        context = int(train_context or module.model.cfg.max_len)
        warnings.warn("no run config found next to the checkpoint: evaluating on the default byte corpus")
        opts = {k: v for k, v in (data_overrides or {}).items() if k != "_target_"}
        opts.setdefault("context", context)
        return ByteDataModule(**opts)
    cfg = run_cfg
    if data_overrides:
        cfg = OmegaConf.merge(cfg, {"data": data_overrides})
    data = OmegaConf.to_container(cfg.data, resolve=True)
    data.pop("task", None)
    return hydra.utils.instantiate(data, _convert_="all")


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or any(a in ("-h", "--help", "help") for a in argv):
        print(USAGE)
        return 0
    from omegaconf import OmegaConf

    from linrope.checkpoint import CheckpointError, load_model

    try:
        args = parse_args(argv)
        ckpt = Path(str(args.ckpt)).expanduser()
        if not ckpt.exists():
            raise EvaluateError(f"ckpt {ckpt}: does not exist")
        device = torch.device(args.get("device") or ("cuda" if torch.cuda.is_available() else "cpu"))
        module = load_model(str(ckpt), map_location=device)
        config_path = Path(str(args.config)) if args.get("config") else find_run_config(ckpt)
        if config_path is not None and not config_path.exists():
            raise EvaluateError(f"config {config_path}: does not exist")
        run_cfg = OmegaConf.load(config_path) if config_path else None
        train_context = args.get("train_context") or (run_cfg.data.context if run_cfg is not None else None)
        data_overrides = OmegaConf.to_container(args.data) if args.get("data") else {}
        datamodule = build_datamodule_for(module, run_cfg, data_overrides, train_context)
        train_context = int(train_context or datamodule.context)
        if args.get("lengths"):
            lengths = [int(n) for n in args.lengths]
        else:
            lengths = [int(round(f * train_context)) for f in (args.get("factors") or DEFAULTS["factors"])]
        scalings = list(args.scalings) if args.get("scalings") is not None else DEFAULTS["scalings"]
    except (EvaluateError, CheckpointError) as e:
        print(f"linrope.evaluate: {e}", file=sys.stderr)
        return 2
    print(f"checkpoint {ckpt} (task {module.task}, {module.model.cfg.attention.get('kind')} attention, position "
          f"{module.model.cfg.position.get('name')}), trained at {train_context} tokens; evaluating on {device}")
    rows = length_table(module, datamodule, train_context=train_context, lengths=lengths, scalings=scalings,
                        split=str(args.get("split") or DEFAULTS["split"]),
                        max_windows=int(args.get("max_windows") or DEFAULTS["max_windows"]),
                        batch_size=int(args.get("batch_size") or DEFAULTS["batch_size"]),
                        max_score_mb=float(args.get("max_score_mb") or DEFAULTS["max_score_mb"]), device=device,
                        log=print)
    print(format_table(rows))
    out = Path(str(args.out)) if args.get("out") else (ckpt.parent.parent if ckpt.parent.name == "checkpoints"
                                                        else ckpt.parent) / "evaluate"
    csv_path = write_csv(rows, out / "evaluate.csv")
    png = plot(rows, out / "evaluate.png", train_context=train_context,
               title=f"{module.hparams['model'].get('name', '')} ({ckpt.name})".strip())
    print(f"wrote {csv_path} and {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
