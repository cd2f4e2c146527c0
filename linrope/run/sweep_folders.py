"""The folder of each job of a sweep (``python train.py -m …``), named by what distinguishes the job (docs/usage.md,
"Sweeps on a machine or a cluster"): ``logs/<task_name>/multiruns/<time>/<name>/``, as ``linrope study`` names its
job folders (``linrope.base.naming.job_names``).

``conf/hydra/default.yaml`` sets ``hydra.sweep.subdir: ${linrope.job_folder:}``; Hydra resolves it in the process
that runs the job, from the job's own config, which holds only the job's overrides: the values that differ between
jobs come from the sweep's ``multirun.yaml`` (written before its first job starts), expanded as ``linrope sweeps``
expands them (``expand``).  A job not found so (a sweeper that chooses its jobs as it goes, such as optuna's) is
named ``<job number>-<its values of the sweeper's params>``.  Light: Hydra and omegaconf only."""

from __future__ import annotations

from pathlib import Path
from typing import Any, List, Mapping, Optional, Sequence

from omegaconf import OmegaConf

from linrope.base.naming import NAME_MAX, job_names, job_part, safe_name

RESOLVER = "linrope.job_folder"
BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"


def _split(params: Mapping[str, Any], overrides: Sequence[str], cli_wins: bool) -> List[List[str]]:
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    parsed = parser.parse_overrides(list(overrides))
    cli_keys = {o.get_key_element() for o in parsed} if cli_wins else set()
    from_config = [f"{k}={v}" for k, v in params.items() if k not in cli_keys]
    batches = BasicSweeper.split_arguments(parser.parse_overrides(from_config) + parsed, None)
    return [list(job) for batch in batches for job in batch]


def expand(params: Mapping[str, Any], overrides: Sequence[str]) -> List[List[str]]:
    """The jobs of a sweep as linrope lists them (``linrope sweeps``, ``linrope study``): the config's
    ``hydra.sweeper.params`` whose keys the command line leaves alone, then the command line's overrides."""
    return _split(params, overrides, cli_wins=True)


def _same(a: Sequence[str], b: Sequence[str]) -> bool:
    return sorted(a) == sorted(b)


def _from_the_sweep(sweep_dir: Path, num: int, job: List[str]) -> Optional[str]:
    """The job's name among the jobs of the sweep that ``<sweep_dir>/multirun.yaml`` describes, None when that
    sweep did not launch this job as job ``num``."""
    master = OmegaConf.load(sweep_dir / "multirun.yaml")
    if str(OmegaConf.select(master, "hydra.sweeper._target_")) != BASIC_SWEEPER:
        return None
    params = OmegaConf.select(master, "hydra.sweeper.params")
    params = OmegaConf.to_container(params) if params else {}
    overrides = [str(o) for o in OmegaConf.select(master, "hydra.overrides.task") or []]
    launched = _split(params, overrides, cli_wins=False)  # Hydra's order: the order of job numbers
    if num >= len(launched) or launched[num] != job:
        return None
    ours = expand(params, overrides)  # linrope's order, which the names follow
    earlier = sum(_same(launched[i], job) for i in range(num))  # the same job asked twice: the k-th is the k-th
    found = [i for i, j in enumerate(ours) if _same(j, job)]
    return job_names(ours)[found[earlier]] if earlier < len(found) else None


def numbered(num: int, job: Sequence[str], swept: Sequence[str]) -> str:
    """``<num>-<values of the swept keys>``: the name of a job that no list of the sweep's jobs holds."""
    values = {k: v for k, _, v in (o.lstrip("+~").partition("=") for o in job)}
    parts = [job_part(k, values[k]) for k in swept if k in values]
    return safe_name("-".join([str(num), *parts]))[:NAME_MAX]


def job_folder(*, _root_) -> str:
    """The resolver ``${linrope.job_folder:}`` (``hydra.sweep.subdir``): the folder name of the job whose config
    is being resolved (module docstring)."""
    hydra = _root_.hydra
    num = int(hydra.job.num)
    job = [str(o) for o in hydra.overrides.task]
    try:
        name = _from_the_sweep(Path(str(hydra.sweep.dir)), num, job)
    except Exception:  # noqa: BLE001 - no multirun.yaml, or one this code cannot expand (glob(), a plugin's syntax)
        name = None
    if name is not None:
        return name
    swept = [str(k) for k in (OmegaConf.select(_root_, "hydra.sweeper.params") or {})]
    return numbered(num, job, swept)


OmegaConf.register_new_resolver(RESOLVER, job_folder, replace=True)
