"""Length extrapolation of a trained checkpoint: ``python -m linrope evaluate ckpt=PATH lengths=[256,512,1024]``.

A Hydra entry point (``conf/evaluate.yaml``; ``--help`` lists every key).  What is measured and how is in
``linrope.evaluation.extrapolation``.  Writes ``evaluate.csv`` and ``evaluate.png`` to ``out`` (default
``<run folder>/evaluate``, also Hydra's output folder: nothing lands in the current directory), and ends with
the command to run next (``next_command``).  Nothing read from disk runs code: the checkpoint is loaded with
``weights_only=True``, and the data module rebuilt from its saved data hyper-parameters (or ``config=PATH``)
through ``linrope.data.rebuild``, a fixed table, never a ``_target_``.  train.py calls
``extrapolate_after_test`` after testing when ``extrapolation.enabled=true``.
"""

from __future__ import annotations

import contextlib
import shlex
import signal
import sys
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Dict, List, Optional

import hydra
import torch
from omegaconf import DictConfig, OmegaConf
from pydantic import Field

from linrope.base.errors import ConfigError, LinropeError
from linrope.base.naming import LANGUAGE_TASKS
from linrope.base.options import declared, option_errors
from linrope.base.plots import plot_length_table
from linrope.base.stopping import Stopped, signals_to, stopped
from linrope.config.command_line import CONF_DIR, check_command_line
from linrope.config.settings import ExtrapolationSettings
from linrope.data.rebuild import build_data_module
from linrope.evaluation.extrapolation import SETTINGS, length_table
from linrope.evaluation.passkey import checked_device
from linrope.evaluation.tables import COLUMNS, HEADER, format_table, row_name, write_csv, write_details
from linrope.run.checkpoint import load_checkpoint
from linrope.run.folder import run_folder
from linrope.run.provenance import PROVENANCE_KEY
from linrope.run.provenance import collect as current_provenance
from linrope.run.resume_diff import describe_checkpoint
from linrope.training.lit import LanguageModel


class EvaluateError(ConfigError):
    """A bad argument of ``python -m linrope evaluate`` (one line)."""


@dataclass
class EvaluateSettings(ExtrapolationSettings):
    """The keys of ``conf/evaluate.yaml`` (their values and meaning there): the extrapolation table's settings
    and these."""

    ckpt: Optional[str]
    lengths: Any  # a list of integers >= 1: checked in ``evaluate``, which says more
    device: Optional[str]
    out: str
    config: Optional[str]
    train_context: Annotated[Optional[int], Field(ge=1)]
    data: Any  # changes to the saved data config: checked with it (linrope.data.rebuild)


def table_files(stem: str) -> tuple:
    """The files ``write_table`` writes for ``stem``: the table, its plot, the loss per document and per position."""
    return f"{stem}.csv", f"{stem}.png", f"{stem}_documents.csv", f"{stem}_positions.csv"


def plot_title(model_cfg, train_context: int, suffix: str = "") -> str:
    name = model_cfg.get("name") or f"{model_cfg['attention'].get('kind')} / {model_cfg['position'].get('name')}"
    return f"length extrapolation: {name}{suffix}, trained at {train_context}"


def write_table(
    module,
    datamodule,
    settings,
    out: Path,
    stem: str,
    *,
    train_context: int,
    lengths=None,
    title_suffix: str = "",
    kept: Optional[list] = None,
    **score,
) -> tuple:
    """The table of one model (``length_table``) written as ``<out>/<stem>.csv`` (bytes: with each row's loss per
    document and per position in ``<stem>_documents.csv`` and ``<stem>_positions.csv``) and plotted as
    ``<out>/<stem>.png``: train.py's hook and the standalone command both go through here.  The CSV is
    written again, atomically, as each row finishes: a stop keeps every row done (the plot is drawn at the end);
    ``kept``, a list, holds the rows written so far."""
    csv_path, png_path, documents_path, positions_path = (out / name for name in table_files(stem))
    kept = [] if kept is None else kept

    def written(done):
        with _signals_held():  # the files and the count of rows they hold change together
            write_all(done)
            kept[:] = done

    def write_all(done):
        write_csv(done, csv_path)
        if any(r.get("per_document") for r in done):  # bytes: each row's loss per document and per position
            write_details(done, documents_path, "documents")
            write_details(done, positions_path, "positions")

    settings = {k: settings[k] for k in SETTINGS}
    rows = length_table(
        module, datamodule, settings, train_context=train_context, lengths=lengths, on_row=written, **score
    )
    write_all(rows)  # also a table of no row
    title = plot_title(module.hparams["model"], train_context, title_suffix)
    png = plot_length_table(rows, png_path, train_context=train_context, title=title, name=row_name)
    return rows, csv_path, png


# ---- after testing (train.py) ----------------------------------------------------------------------------------
def extrapolate_after_test(cfg, trainer, module, datamodule, loggers: list) -> List[Dict[str, Any]]:
    """train.py's hook (``extrapolation.enabled``): the table for ``factors`` × the training context,
    written to the run folder and logged to wandb (Table + image) when wandb is a logger.  Nothing when
    ``extrapolation.enabled`` is false."""
    ex = cfg.get("extrapolation")
    if not ex or not ex.get("enabled") or not trainer.is_global_zero:
        return []
    device = trainer.strategy.root_device
    precision = str(trainer.precision)
    autocast = torch.bfloat16 if "bf16" in precision else torch.float16 if "16" in precision else None
    autocast = autocast if device.type == "cuda" else None
    was = next(module.parameters()).device
    module.to(device)
    try:
        rows, csv_path, png = write_table(
            module,
            datamodule,
            cfg.extrapolation,
            Path(cfg.paths.output_dir),
            "extrapolation",
            train_context=int(datamodule.context),
            device=device,
            autocast_dtype=autocast,
        )
    finally:
        module.to(was)
    print(f"length extrapolation ({csv_path}):\n{format_table(rows)}")
    _log_to_wandb(rows, png, loggers, "acc" if any(r.get("acc") is not None for r in rows) else "bpb")
    return rows


def _log_to_wandb(rows, png: Path, loggers: list, metric: str) -> None:
    try:
        from lightning.pytorch.loggers import WandbLogger
    except ImportError:  # pragma: no cover - lightning is a dependency
        return
    for lg in loggers:
        if isinstance(lg, WandbLogger):
            try:
                lg.log_table(key="extrapolation/table", columns=COLUMNS, data=[[r[k] for k in COLUMNS] for r in rows])
                lg.log_image(key="extrapolation/plot", images=[str(png)])
                done = [r for r in rows if r[metric] is not None]
                lg.log_metrics({f"extrapolation/{r['scaling']}/{metric}@{r['length']}": r[metric] for r in done})
            except Exception as e:  # noqa: BLE001 - the CSV and PNG are written; do not fail a finished run
                warnings.warn(f"could not log the extrapolation table to wandb: {e}")


# ---- standalone ------------------------------------------------------------------------------------------------
def output_dir(ckpt: Optional[str]) -> str:
    """``<run>/evaluate`` for ``<run>/checkpoints/x.ckpt`` (or ``<folder>/evaluate`` for ``<folder>/x.ckpt``).
    Without a checkpoint file (missing: the run stops with one line) a folder under the system's temporary
    directory, so that Hydra creates nothing where the command was typed."""
    if not ckpt or not Path(str(ckpt)).expanduser().is_file():
        return str(Path(tempfile.gettempdir()) / "linrope-evaluate")
    return str(run_folder(ckpt) / "evaluate")


OmegaConf.register_new_resolver("linrope.evaluate_dir", output_dir, replace=True)


def saved_data(cfg: DictConfig, ckpt: Path, checkpoint: Dict[str, Any]):
    """(data section, where it came from): ``config=PATH``'s ``data``, else the checkpoint's own data
    hyper-parameters, else the ``.hydra/config.yaml`` of the checkpoint's run folder, else none."""
    config = cfg.get("config")
    if not config:
        if checkpoint.get("datamodule_hyper_parameters"):
            return dict(checkpoint["datamodule_hyper_parameters"]), f"checkpoint {ckpt}"
        found = [f / ".hydra" / "config.yaml" for f in (ckpt.parent, ckpt.parent.parent)]
        config = next((str(p) for p in found if p.is_file()), None)
        if config is None:
            return None, None
    path = Path(str(config)).expanduser()
    if not path.is_file():
        raise EvaluateError(f"config={config}: no such file")
    try:
        saved = OmegaConf.load(path)
        data = OmegaConf.to_container(saved.data, resolve=True) if "data" in saved else None
    except Exception as e:  # noqa: BLE001 - YAML and interpolation errors: one line
        raise EvaluateError(f"config {path}: cannot be read ({str(e).strip().splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise EvaluateError(f"config {path}: has no data section")
    return data, f"config {path}"


def build_data(cfg: DictConfig, ckpt: Path, checkpoint: Dict[str, Any], task: str):
    data, where = saved_data(cfg, ckpt, checkpoint)
    overrides = {k: v for k, v in OmegaConf.to_container(cfg.data or {}, resolve=True).items() if v is not None}
    record = ((checkpoint.get(PROVENANCE_KEY) or {}).get("data") or {}) if task == "text" else {}
    if record and data is not None:
        data = dict(data)  # the run's own files by their absolute paths, not those of the folder run from
        tok, corpus = record.get("tokenizer") or {}, record.get("corpus") or {}
        shards = Path(str(corpus.get("shards")))
        for key, value in (("tokenizer", tok.get("path")), ("path", corpus.get("path")),
                           ("shards_dir", str(shards.parent) if shards.is_dir() else None)):  # fmt: skip
            if value and key not in overrides and not _same_file(data.get(key), value):
                data[key] = value
    datamodule = _build(data, overrides, task, where, cfg, checkpoint)
    if record:
        from linrope.data.record import check_corpus, check_tokenizer

        tok = record.get("tokenizer") or {}
        check_tokenizer(tok, datamodule.tokenizer, "evaluate", "pass data.tokenizer= naming the run's file")
        if not cfg.get("config") and not {"path", "hf_dataset"} & set(overrides):  # another corpus, when asked
            check_corpus(record.get("corpus"), datamodule.record["corpus"], "evaluate",
                         "pass data.path= to evaluate on another corpus")  # fmt: skip
    return datamodule


def _same_file(typed, path: str) -> bool:
    """``typed`` (relative to the folder run from) names the file ``path``, or ``path`` is gone: keep what was typed
    (a tokenizer's name as typed is part of its shards' key: the same name finds the same shards)."""
    if not Path(path).exists():
        return True
    return typed is not None and Path(str(typed)).expanduser().resolve() == Path(path).resolve()


def _build(data, overrides, task: str, where, cfg: DictConfig, checkpoint: Dict[str, Any]):
    if data is None:
        if task != "bytes":
            raise EvaluateError(
                f"the checkpoint was trained on task {task!r} and holds no data config: "
                f"pass config=<run>/.hydra/config.yaml"
            )
        warnings.warn("no data config in the checkpoint or next to it: evaluating on the default byte corpus")
        context = cfg.train_context or (checkpoint.get("hyper_parameters") or {}).get("model", {}).get("max_len")
        data, where = {"context": int(context or 256)}, "the default byte corpus"
    return build_data_module({**data, **overrides}, task, where=where)


def evaluate(cfg: DictConfig) -> List[Dict[str, Any]]:
    """The whole standalone evaluation for one composed ``conf/evaluate.yaml``."""
    if not cfg.ckpt:
        raise EvaluateError("ckpt=PATH is required (see --help)")
    problems = option_errors(declared(EvaluateSettings), cfg)
    if cfg.lengths is not None and not OmegaConf.is_list(cfg.lengths):
        problems.append(f"lengths={cfg.lengths}: expected a list of integers >= 1 (lengths=[{cfg.lengths}])")
    elif cfg.lengths is not None and not all(isinstance(n, int) and n >= 1 for n in cfg.lengths):
        problems.append(f"lengths={list(cfg.lengths)}: expected integers >= 1")
    elif cfg.lengths is not None and len(cfg.lengths) == 0:
        problems.append(
            "lengths=[]: no length to evaluate; give at least one (lengths=[256,512]), or leave lengths "
            "out for factors × the training context"
        )
    if problems:
        raise EvaluateError("; ".join(problems))  # before the checkpoint is read
    # an earlier evaluation's files are never written over (a row less would replace them)
    for name in table_files("evaluate"):
        if (Path(str(cfg.out)) / name).exists():
            raise EvaluateError(
                f"{Path(str(cfg.out)) / name} exists (an earlier evaluation): pass out=<another folder>"
            )
    ckpt = Path(str(cfg.ckpt)).expanduser()
    device = torch.device(checked_device(cfg.device))
    checkpoint = load_checkpoint(ckpt, map_location="cpu")  # weights_only=True; one line if missing or broken
    module = LanguageModel.from_checkpoint(ckpt, map_location=device, checkpoint=checkpoint)
    print(describe_checkpoint(checkpoint, ckpt, CONF_DIR, current_provenance()))  # its commit, step, today's defaults
    datamodule = build_data(cfg, ckpt, checkpoint, module.task)
    train_context = int(cfg.train_context or datamodule.context)
    lengths = [int(n) for n in cfg.lengths] if cfg.lengths else None
    m = module.model.cfg
    print(
        f"checkpoint {ckpt} (task {module.task}, {m.attention.get('kind')} attention, position "
        f"{m.position.get('name')}), trained at {train_context} tokens; evaluating on {device}\n{HEADER}"
    )
    kept: List[Dict[str, Any]] = []
    with _stop_says_what_is_kept(Path(str(cfg.out)) / "evaluate.csv", kept):
        rows, csv_path, png = write_table(
            module,
            datamodule,
            cfg,
            Path(str(cfg.out)),
            "evaluate",
            train_context=train_context,
            lengths=lengths,
            kept=kept,
            title_suffix=f" ({ckpt.name})",
            device=device,
            log=lambda line: print(line, flush=True),
            note=lambda line: print(line, file=sys.stderr, flush=True),  # the plan and the time left: stderr
        )
    # every file it names was written by this evaluation: none of them existed before it (refused above)
    written = [str(path) for path in (Path(str(cfg.out)) / name for name in table_files("evaluate")) if path.exists()]
    listed = " and ".join(written) if len(written) < 3 else ", ".join(written[:-1]) + " and " + written[-1]
    print(f"wrote {listed}" + ("" if png else " (no row to plot)"))
    print(next_command(ckpt, module.task), flush=True)
    return rows


def next_command(ckpt: Path, task: str) -> str:
    """The one line evaluate ends with: what to run next on this checkpoint, its path filled in (as train.py's
    ``where_next``): the pass-key probe for a model of text (bytes, text), else the report of its run folder."""
    from linrope.training.after_training import ckpt_arg, shown_path

    if task in LANGUAGE_TASKS:
        what = f"passkey {ckpt_arg(shown_path(ckpt))}    # retrieval of a key hidden at 1-16x the training context"
    else:
        what = f"report {shlex.quote(shown_path(run_folder(ckpt)))}    # the run's tables and figures: report.md"
    return f"next: python -m linrope {what}"


@contextlib.contextmanager
def _signals_held():
    """SIGTERM and SIGINT wait: caught during the block, raised again at its end.  (Blocking them with
    pthread_sigmask is not enough: the kernel may hand a process signal to another thread — torch's workers —
    and Python then runs the handler in the main thread at once.)"""
    caught: list = []
    try:
        with signals_to(lambda signum, _frame: caught.append(signum)):
            yield
    finally:
        for s in dict.fromkeys(caught):
            signal.raise_signal(s)


@contextlib.contextmanager
def _stop_says_what_is_kept(csv_path: Path, kept: list):
    """SIGTERM / SIGINT while the rows are scored: one line naming the rows kept in ``csv_path`` (each row is
    written as it finishes), exit status 128 + the signal."""
    try:
        with signals_to(stopped):
            yield
    except Stopped as e:
        where = f"the {len(kept)} rows done are in {csv_path}" if kept else "no row was done"
        print(f"linrope evaluate: stopped by {signal.Signals(e.signum).name}: {where}", file=sys.stderr, flush=True)
        raise SystemExit(128 + e.signum) from None


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="evaluate")
def main(cfg: DictConfig) -> None:
    try:
        evaluate(cfg)
    except LinropeError as e:
        print(f"linrope evaluate: {e}", file=sys.stderr)
        raise SystemExit(2) from None


def run() -> None:
    """The ``linrope-evaluate`` command (and ``python -m linrope evaluate``): the command line checked, then Hydra."""
    check_command_line(config_name="evaluate", prefix="linrope evaluate")
    main()
