"""Dry run of a sweep: the jobs ``python train.py -m <overrides>`` would launch, each composed and
checked (``linrope.config.checks.validate``) without training anything.

    python -m linrope sweeps experiment=pe_compare
    python -m linrope sweeps experiment=linear_rope_ablation trainer.max_steps=50
    python -m linrope sweeps --config-dir my_conf model=my_preset     (a folder of your own configs)

Expands ``hydra.sweeper.params`` of the composed config and the sweeps on the command line
(``a=x,y``) the way Hydra's basic sweeper does (the command line wins over the config for one key).
Each job's config is checked, not this machine: ``trainer=gpu`` jobs check on a login node without a GPU.
Each line names the job's folder in the sweep folder (``softmax_rope-seed1/``: the values that differ between the
jobs, linrope.run.sweep_folders).  Exit status 1 when a job's config is refused."""

from __future__ import annotations

import sys
from typing import List, Optional, Sequence, Tuple

from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from hydra.experimental.callback import Callback
from omegaconf import OmegaConf

from linrope.base.errors import ConfigError
from linrope.base.naming import job_names
from linrope.config.checks import validate
from linrope.config.command_line import check_command_line, compose_config, config_dirs_as_overrides
from linrope.run.sweep_folders import BASIC_SWEEPER, expand


def compose_train(overrides: Sequence[str], *, hydra_config: bool = False):
    """``conf/train.yaml`` composed with ``overrides``, outside any Hydra run (tools, benchmarks, tests)."""
    return compose_config(overrides, hydra_config=hydra_config)


def sweep_jobs(overrides: Sequence[str]) -> List[List[str]]:
    """The override list of every job, in launch order."""
    return _sweep(overrides)[1]


def _sweep(overrides: Sequence[str]):
    """(the sweep's composed config, with Hydra's part; the override list of every job, in launch order)."""
    parsed = OverridesParser.create().parse_overrides(list(overrides))
    fixed = [o.input_line for o in parsed if not o.is_sweep_override()]
    cfg = compose_train(fixed, hydra_config=True)
    params = cfg.hydra.sweeper.get("params")
    return cfg, expand(OmegaConf.to_container(params) if params else {}, overrides)


def runs_locally(cfg) -> bool:
    """Whether the sweep's jobs run in this process, one after another (Hydra's basic launcher and the like), where a
    strategy that re-runs train.py cannot work; not under SLURM's launcher, whose srun starts the processes."""
    return "Slurm" not in str(OmegaConf.select(cfg, "hydra.launcher._target_"))


def check_jobs(
    overrides: Sequence[str], extra: Sequence[str] = (), local: Optional[bool] = None
) -> List[Tuple[List[str], Optional[str]]]:
    """(job overrides, None if its config is valid else the error) for every job.  The configs alone are
    checked (``validate(hardware=False)``): a sweep of ``trainer=gpu`` jobs checked on a login node without a
    GPU passes; whether the machines have the devices is the launch's business.  ``local``: ``runs_locally`` (None:
    as the sweep's composed config says)."""
    cfg, jobs = _sweep(overrides)
    local = runs_locally(cfg) if local is None else local
    results = []
    for job in jobs:
        try:
            validate(compose_train([*job, *extra]), hardware=False, sweep=local)
            results.append((job, None))
        except ConfigError as e:
            results.append((job, str(e)))
        except Exception as e:  # noqa: BLE001 - a config that does not compose
            results.append((job, f"{type(e).__name__}: {e}"))
    return results


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "--help") for a in argv):
        print(__doc__)
        return 0
    check_command_line(argv, prefix="linrope sweeps")  # model=nope, trainer.max_step=3: one line
    try:
        results = check_jobs(config_dirs_as_overrides(argv))
    except HydraException as e:  # a sweep the basic sweeper cannot expand: one line
        why = str(e).strip().splitlines()[0]
        if "does not support sweep type" in why:  # interval(...), tag(...): a search that picks jobs as it goes
            why += (
                "; its jobs are chosen by the search as it runs (hparams_search=optuna: a range, not a list), so no "
                "dry run can list them: python train.py -m <the same overrides> runs the search"
            )
        raise SystemExit(f"linrope sweeps: {why}") from None
    names = job_names([job for job, _ in results])  # each job's folder in the sweep's (linrope.run.sweep_folders)
    for i, ((job, err), name) in enumerate(zip(results, names)):
        print(f"#{i:<3} {name}/  {' '.join(job)}" + ("" if err is None else f"\n     REFUSED: {err}"))
    bad = sum(err is not None for _, err in results)
    print(f"{len(results)} jobs, {bad} refused")
    return 1 if bad else 0


class CheckJobs(Callback):
    """Hydra callback (conf/hydra/default.yaml): ``train.py -m`` checks every job's config, as ``linrope sweeps``
    does, before its first job starts, so that a bad value in the last job of a long sweep is one line now, not a
    failure hours in.  A sweep whose jobs a search picks as it goes (optuna) is checked job by job, as it runs."""

    def on_multirun_start(self, config, **kwargs) -> None:
        if str(OmegaConf.select(config, "hydra.sweeper._target_")) != BASIC_SWEEPER:
            return
        overrides = [str(o) for o in OmegaConf.select(config, "hydra.overrides.task") or []]
        searchpath = [str(p) for p in OmegaConf.select(config, "hydra.searchpath") or []]
        extra = ["hydra.searchpath=[" + ",".join(searchpath) + "]"] if searchpath else []
        local = runs_locally(config)
        hydra = GlobalHydra.instance().hydra  # compose_config clears it: the running sweep's put back after
        try:
            refused = [(i, job, err) for i, (job, err) in enumerate(check_jobs(overrides, extra, local)) if err]
        except HydraException:  # a sweep linrope cannot expand (a glob): Hydra's own launch, checked job by job
            return
        finally:
            GlobalHydra.instance().hydra = hydra
        if refused:
            said = [f"job #{i} ({' '.join(job)}): {err.splitlines()[0]}" for i, job, err in refused[:3]]
            more = f"; and {len(refused) - 3} more" if len(refused) > 3 else ""
            raise SystemExit(
                f"linrope: {len(refused)} of the sweep's jobs would be refused, so none started: "
                + "; ".join(said)
                + more
                + " (python -m linrope sweeps <the same overrides> lists them all)"
            )
