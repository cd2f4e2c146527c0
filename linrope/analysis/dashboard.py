"""wandb dashboards as code: a workspace and a report comparing the runs of one sweep.

    python -m linrope dashboard logs/pe_compare/multiruns/<time>             # saves both, prints their URLs
    python -m linrope dashboard logs/pe_compare/multiruns/<time> --dry-run   # writes the specs as JSON, no login
    python -m linrope dashboard --group pe_compare-<time> --project linrope  # without the sweep folder

The sweep folder tells the wandb project and group of its runs (``linrope.base.naming.wandb_group``), their
tasks and the lengths of their extrapolation table.  The sections and their panels (the same in the workspace and
the report): docs/usage.md, "Dashboards".

Needs the ``wandb-workspaces`` library (``pip install -e '.[dashboards]'``); without it ``--dry-run``
still writes the plain specification (``dashboard.json``)."""

from __future__ import annotations

import argparse
import importlib.util
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from omegaconf import OmegaConf

from linrope.analysis.cells import SCALINGS
from linrope.base.naming import LANGUAGE_TASKS, wandb_group
from linrope.base.nested import differing, flatten
from linrope.config.command_line import program
from linrope.run.resume_diff import HOUSEKEEPING

# Imported inside the functions that need them: wandb-workspaces (an optional extra; without it, one line that
# says how to install it), wandb and linrope.run.loggers (Lightning): --help and --dry-run stay fast (0.1 s, not ~5 s)

BYTES = "bytes"
GROUP_BY = ("model.attention.kind", "model.position.name", "model.name")
DEFAULT_FACTORS = (1, 2, 4, 8, 16)
STEP = "trainer/global_step"  # the x axis Lightning's WandbLogger logs with every metric


@dataclass
class Panel:
    kind: str  # line (metrics against step) | bar (final value per group) | media | table
    title: str
    metrics: List[str]  # the logged keys it shows (media: image keys; table: the table's key)


@dataclass
class Section:
    name: str
    about: str
    panels: List[Panel]


@dataclass
class Target:
    """Which runs a dashboard shows, and what they logged."""

    project: str
    group: str
    entity: Optional[str] = None
    tasks: List[str] = field(default_factory=lambda: [BYTES])
    lengths: List[int] = field(default_factory=list)  # extrapolation lengths ([] when not evaluated)
    scalings: List[str] = field(default_factory=list)  # none, pi, ntk, yarn, dynamic
    group_by: List[str] = field(default_factory=lambda: list(GROUP_BY))


def extrapolation_keys(target: Target, scaling: str) -> List[str]:
    """The keys a run's extrapolation table logs (linrope.evaluation.evaluate): bpb@N for language, acc@N for the
    synthetic tasks; both where the runs trained on both."""
    metrics = ["bpb"] * language(target) + ["acc"] * synthetic(target)
    return [f"extrapolation/{scaling}/{m}@{n}" for m in metrics for n in target.lengths]


def language(target: Target) -> bool:
    return any(t in LANGUAGE_TASKS for t in target.tasks)


def synthetic(target: Target) -> bool:
    return any(t not in LANGUAGE_TASKS for t in target.tasks)


def section(title: str, text: str, panels) -> Section:
    """A section from (kind, title, keys) rows."""
    return Section(title, text, [Panel(kind, name, keys) for kind, name, keys in panels])


COMPARISON = [("line", "val/bpb against step", ["val/bpb"]), ("bar", "test/bpb of the best checkpoint", ["test/bpb"])]
SPEED = [
    ("line", "tokens per second (training)", ["train/tokens_per_sec"]),
    ("bar", "tokens per second (final)", ["train/tokens_per_sec"]),
    ("line", "peak memory, MB", ["train/peak_mem_mb"]),
]
TASKS = [
    ("line", "val/acc against step", ["val/acc"]),
    ("bar", "test/acc of the best checkpoint", ["test/acc"]),
    ("line", "val/loss against step", ["val/loss"]),
]
TRAINING = [("line", "train/loss", ["train/loss"]), ("line", "learning rate", ["train/lr"])]


def sections(target: Target) -> List[Section]:
    """The dashboard's content as plain data; ``panel_metrics`` lists every key it names."""
    out: List[Section] = []
    if language(target):
        text = (
            "Bits per byte on the validation windows during training, and on the test windows for the best "
            "checkpoint (lower is better; mean over seeds, bars ±1 std)."
        )
        out.append(section("Comparison", text, COMPARISON))
    out.append(section("Speed and memory", "Training throughput and peak memory of each model.", SPEED))
    if target.lengths:
        panels = [("table", "extrapolation table", ["extrapolation/table"])]
        panels.append(("media", "extrapolation curves (per run)", ["extrapolation/plot"]))
        for scaling in ["none", *[s for s in target.scalings if s != "none"]]:
            name = f"{SCALINGS.get(scaling, scaling) if scaling != 'none' else 'as trained'}: by evaluation length"
            panels.append(("bar", name, extrapolation_keys(target, scaling)))
        lengths = ", ".join(map(str, target.lengths))
        text = f"The model trained at one context, evaluated at longer ones ({lengths}); RoPE models also with their scaling rows."
        out.append(section("Length extrapolation", text, panels))
    if synthetic(target):
        text = "Accuracy over the scored positions (mqar, offset_copy) or sequences (listops); higher is better."
        out.append(section("Synthetic tasks", text, TASKS))
    out.append(section("Training", "Training loss and learning rate.", TRAINING))
    return out


def panel_metrics(secs: Sequence[Section]) -> List[str]:
    return sorted({m for s in secs for p in s.panels for m in p.metrics})


def plain_spec(target: Target) -> Dict[str, Any]:
    return {
        "target": asdict(target),
        "runset": {"filter": {"group": target.group}, "group_by": target.group_by},
        "sections": [asdict(s) for s in sections(target)],
    }


# ---- wandb-workspaces ------------------------------------------------------------------------------------------
def _libs():
    try:
        import wandb_workspaces.reports.v2 as wr
        import wandb_workspaces.workspaces as ws
    except ImportError as e:
        raise SystemExit(
            f"linrope: the dashboard needs wandb-workspaces ({e}): pip install -e '.[dashboards]'"
        ) from None
    return ws, wr


def _panels(secs_panels: Sequence[Panel]) -> list:
    """wandb-workspaces panels; grouping and the seed band come from the run set's grouping."""
    _, wr = _libs()
    band = {"groupby_aggfunc": "mean", "groupby_rangefunc": "stddev"}
    make = {
        "line": lambda p: wr.LinePlot(title=p.title, x=STEP, y=list(p.metrics), smoothing_type="none", **band),
        "bar": lambda p: wr.BarPlot(title=p.title, metrics=list(p.metrics), orientation="v", **band),
        "media": lambda p: wr.MediaBrowser(title=p.title, media_keys=list(p.metrics)),
        "table": lambda p: wr.WeavePanelSummaryTable(table_name=p.metrics[0]),
    }
    return [make[p.kind](p) for p in secs_panels]


def build_workspace(target: Target):
    ws, wr = _libs()
    secs = [ws.Section(name=s.name, panels=_panels(s.panels), is_open=True) for s in sections(target)]
    return ws.Workspace(
        entity=target.entity or "<entity>",
        project=target.project,
        name=f"linrope: {target.group}",
        sections=secs,
        settings=ws.WorkspaceSettings(x_axis=STEP, max_runs=100),  # a sweep has dozens of runs (pe_compare: 48)
        runset_settings=ws.RunsetSettings(
            filters=[ws.Metric("Group") == target.group], groupby=[ws.Config(k) for k in target.group_by]
        ),
    )


def build_report(target: Target, *, offline: bool = True):
    """The report: a paragraph stating the comparison, then one panel grid per section over the sweep's runs.
    ``offline``: run sets without entity/project (wandb-workspaces looks a project up online; a saved report's
    run sets name the report's project)."""
    _, wr = _libs()
    where = dict(entity="", project="") if offline else dict(entity=target.entity or "", project=target.project)
    blocks: list = [
        wr.P(
            f"Runs of the wandb group {target.group} (project {target.project}): tasks "
            f"{', '.join(target.tasks)}, grouped by {' × '.join(target.group_by)}; lines and bars are "
            "the mean over seeds with ±1 standard deviation. Made by python -m linrope dashboard."
        )
    ]
    by = [f"config.{k}" for k in target.group_by]
    for s in sections(target):
        runset = wr.Runset(**where, name=target.group, filters=f"Group = '{target.group}'", groupby=by)
        blocks += [wr.H2(s.name), wr.P(s.about), wr.PanelGrid(runsets=[runset], panels=_panels(s.panels))]
    return wr.Report(
        project=target.project,
        entity=target.entity or "<entity>",
        title=f"linrope: {target.group}"[:128],
        description="Attention × position comparison: validation and test bits per byte, speed, "
        "length extrapolation and synthetic-task accuracy.",
        blocks=blocks,
    )


def dump(obj) -> Dict[str, Any]:
    """The JSON wandb stores for a workspace or report (their internal model), built without a login."""
    return obj._to_model().model_dump(by_alias=True, exclude_none=True, mode="json")


# ---- reading a sweep folder ------------------------------------------------------------------------------------
def target_from_sweep(folder: Path, project: Optional[str] = None, entity: Optional[str] = None) -> Target:
    configs = sorted(folder.glob("*/.hydra/config.yaml")) or sorted(folder.glob(".hydra/config.yaml"))
    if not configs:
        raise SystemExit(
            f"linrope: {folder}: no run configs (<job>/.hydra/config.yaml): pass a sweep folder "
            f"(logs/<task_name>/multiruns/<time>) or --group"
        )
    cfgs = [OmegaConf.load(p) for p in configs]
    first = cfgs[0]
    wandb_cfg = OmegaConf.select(first, "logger.wandb") or {}
    folder = folder.resolve()  # "." has no name, and the group is the sweep folder's
    if configs[0].parent.parent.resolve() != folder:  # a sweep folder: its jobs' configs
        sweep: Optional[Path] = folder
    else:  # one run's folder: a job of a sweep logged to the sweep's group
        sweep = folder.parent if (folder.parent / "multirun.yaml").is_file() else None
    group = wandb_cfg.get("group") or wandb_group(str(first.get("task_name", "train")), str(sweep) if sweep else None)
    tasks = sorted({str(OmegaConf.select(c, "data.task") or BYTES) for c in cfgs})
    lengths: set = set()
    scalings: set = set()
    for path, c in zip(configs, cfgs):
        ex = c.get("extrapolation") or {}
        if ex.get("enabled"):
            context = OmegaConf.select(c, "data.context") or OmegaConf.select(c, "context")
            if context is None:
                raise SystemExit(
                    f"linrope: {path}: extrapolation.enabled, but no data.context or context to tell its lengths "
                    "by; pass --group with --lengths instead of the folder"
                )
            context = int(context)
            lengths |= {int(round(f * context)) for f in ex.get("factors") or DEFAULT_FACTORS}
            if OmegaConf.select(c, "model.position.name") == "rope":
                scalings |= set(ex.get("scalings") or [])
    project = project or str(wandb_cfg.get("project") or "linrope")
    return Target(project, str(group), entity, tasks, sorted(lengths), sorted(scalings), varying(cfgs))


# what runs of one configuration differ in: where they write and log, their seed (the mean is over seeds)
NOT_GROUPED = (*HOUSEKEEPING, "seed", "data.seed", "callbacks.", "extrapolation.")


def varying(cfgs) -> List[str]:
    """GROUP_BY, then each other key in which the runs' configs differ (less NOT_GROUPED): the configurations a
    dashboard's line or bar averages over seeds (an optuna search's learning rates were one line "over seeds").  Runs
    whose component differs (its ``_target_``: another task's data module) are told apart by that key alone."""
    flat = [flatten(OmegaConf.to_container(c, resolve=False)) for c in cfgs]
    keys = sorted({k for other in flat[1:] for k, _, _ in differing(flat[0], other, skip=NOT_GROUPED)})
    other = tuple(k.removesuffix("_target_") for k in keys if k.endswith("._target_"))  # "data."
    keys = [k for k in keys if k.endswith("._target_") or not k.startswith(other)]
    return [*GROUP_BY, *(k for k in keys if k not in GROUP_BY)]


# ---- command line ----------------------------------------------------------------------------------------------
def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog=program("python -m linrope dashboard"),
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n\n".join(__doc__.split("\n\n")[1:]),
    )
    p.add_argument(
        "sweep", nargs="?", type=Path, help="a sweep folder (logs/<task_name>/multiruns/<time>) or a run folder"
    )
    p.add_argument("--group", help="the wandb group instead of a folder (e.g. pe_compare-2026-01-01_12-00-00)")
    p.add_argument("--project", help="wandb project (default: logger.wandb.project of the runs, else linrope)")
    p.add_argument("--entity", help="wandb entity (default: your default entity when saving)")
    p.add_argument("--tasks", nargs="+", help="with --group: the tasks the runs trained on (default: bytes)")
    lengths = "with --group: extrapolation lengths the runs evaluated (default: none)"
    p.add_argument("--lengths", nargs="*", type=int, default=None, help=lengths)
    p.add_argument(
        "--group-by",
        nargs="+",
        help=f"config keys runs are grouped by (default: {' '.join(GROUP_BY)}, then every key other than the seed "
        "in which the folder's runs differ: a sweep of learning rates is not one mean over seeds)",
    )
    p.add_argument("--dry-run", action="store_true", help="write the specs as JSON (no login, nothing saved)")
    p.add_argument("--out", type=Path, help="where --dry-run writes (default: <sweep>/dashboard, else ./dashboard)")
    args = p.parse_args(argv)
    if (args.sweep is None) == (args.group is None):
        p.error("give a sweep folder or --group (one of the two)")
    return args


def target_from_args(args: argparse.Namespace) -> Target:
    if args.sweep is not None:
        target = target_from_sweep(args.sweep, args.project, args.entity)
    else:
        scalings = ["pi", "ntk", "yarn", "dynamic"] if args.lengths else []
        tasks, lengths = list(args.tasks or [BYTES]), sorted(args.lengths or [])
        target = Target(args.project or "linrope", args.group, args.entity, tasks, lengths, scalings)
    if args.group_by:
        target.group_by = list(args.group_by)
    return target


def write_specs(target: Target, out: Path) -> List[Path]:
    """dashboard.json (plain data), and with wandb-workspaces workspace.json and report.json."""
    from linrope.base.errors import LinropeError
    from linrope.base.writable import writable_folder

    try:
        out = writable_folder(out, "--out", out)  # a file there, or no write permission: one line
    except LinropeError as e:
        raise SystemExit(f"linrope: {e}") from None
    written = [out / "dashboard.json"]
    written[0].write_text(json.dumps(plain_spec(target), indent=1))
    if importlib.util.find_spec("wandb_workspaces") is None:
        print("wandb-workspaces is not installed (pip install -e '.[dashboards]'): wrote the plain spec only")
        return written
    for name, obj in (("workspace.json", build_workspace(target)), ("report.json", build_report(target))):
        (out / name).write_text(json.dumps(dump(obj), indent=1))
        written.append(out / name)
    return written


def save(target: Target) -> List[str]:
    """Save the workspace and the report to wandb (needs a login); their URLs."""
    from linrope.run.loggers import wandb_logged_in

    if not wandb_logged_in():
        raise SystemExit(
            "linrope: saving a dashboard needs a wandb login (`wandb login`); --dry-run writes the specs without one"
        )
    import wandb

    target.entity = target.entity or wandb.Api().default_entity
    workspace = build_workspace(target).save()
    report = build_report(target, offline=False).save()
    return [workspace.url, report.url]


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    target = target_from_args(args)
    if args.dry_run:
        out = args.out or ((args.sweep / "dashboard") if args.sweep is not None else Path("dashboard"))
        for path in write_specs(target, out):
            print(path)
        return 0
    for url in save(target):
        print(url)
    return 0
