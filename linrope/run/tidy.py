"""A quiet, tidy run: every console line once, the dependencies' tips and notices that say nothing about
this run filtered, and no empty run folder (nor the empty folders above it) left behind by a refused config.

Imports only the standard library: train.py applies ``filter_warnings`` when it is imported (also in the
processes ``trainer=ddp_spawn`` and submitit start, which import it again)."""

from __future__ import annotations

import logging
import shutil
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional

from hydra.core.hydra_config import HydraConfig

# Lightning's notices that say nothing to a user: a tip, the default of limit_val_batches, and that it skips its own
# model summary because linrope's (linrope.training.throughput.Summary, with the FLOPs) is configured
NOTICES = ("💡 Tip:", "was configured so 100% of the batches will be used", "Skipping setting a default `ModelSummary`")
# files Hydra writes into a run folder before train.py's code runs
HYDRA_FILES = {".hydra/config.yaml", ".hydra/hydra.yaml", ".hydra/overrides.yaml", "train.log", ".linrope.lock"}


def filter_warnings() -> None:
    """Warnings raised inside dependencies about their own use of other dependencies."""
    # Lightning's pytree helper still constructs torch's deprecated LeafSpec (torch >= 2.10)
    warnings.filterwarnings(
        "ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated", category=FutureWarning
    )
    # conf/hydra/launcher/submitit_{local,slurm}.yaml keep the plugin's names on purpose, so that
    # `hydra/launcher=submitit_local` gives our defaults, checked against the plugin's schema
    warnings.filterwarnings(
        "ignore", message=r"\s*'hydra/launcher/submitit_\w+' is validated against ConfigStore schema"
    )


class _DropNotices(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(n in message for n in NOTICES)


def quiet_logging() -> None:
    """One handler per line.  Lightning adds a console handler to its ``lightning`` logger (and, when it is
    imported before logging is set up, to ``lightning.pytorch`` / ``lightning.fabric``); once Hydra has
    configured the root logger (console and ``train.log``) those print every line a second time.  They
    are removed, so Lightning's lines go once to the console and also to ``train.log``."""
    root = logging.getLogger()
    if root.handlers:
        for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
            logger = logging.getLogger(name)
            for handler in list(logger.handlers):
                if type(handler) is logging.StreamHandler:
                    logger.removeHandler(handler)
            logger.propagate = True
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropNotices) for f in logger.filters):
            logger.addFilter(_DropNotices())


def _hydra_output_dir() -> Optional[Path]:
    try:
        return Path(HydraConfig.get().runtime.output_dir) if HydraConfig.initialized() else None
    except Exception:  # noqa: BLE001 - no Hydra run (tests call train.main with a composed config)
        return None


def remove_if_only_hydra_files(folder: Path) -> bool:
    """Delete ``folder`` when it holds nothing but the files Hydra wrote before the run started (the
    composed config and an empty or short train.log); anything else in it is kept, and so is the folder."""
    if not folder.is_dir():
        return False
    files = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if not p.is_dir()}
    if not files <= HYDRA_FILES:
        return False
    shutil.rmtree(folder, ignore_errors=True)
    return True


@contextmanager
def no_folder_on_refusal() -> Iterator[None]:
    """A run refused in one line (``linrope: …``, SystemExit) leaves no run folder of Hydra's files
    only; a sweep folder left with nothing but multirun.yaml goes too.  A resume stopped before it began (refused,
    or any error) leaves the earlier run as it was: its ``.hydra/`` put back (linrope.run.folder)."""
    try:
        yield
    except BaseException as e:
        from linrope.run.folder import undo_refused_resume  # hydra and the standard library only

        folder = _hydra_output_dir()
        undo_refused_resume(folder)
        if not isinstance(e, SystemExit):
            raise
        if isinstance(e.code, str) and e.code.startswith("linrope:") and folder is not None:
            if remove_if_only_hydra_files(folder):
                sweep = folder.parent
                if (sweep / "multirun.yaml").is_file() and {p.name for p in sweep.iterdir()} == {"multirun.yaml"}:
                    shutil.rmtree(sweep, ignore_errors=True)
                remove_empty_parents(folder)
        raise


def remove_empty_parents(folder: Path, levels: int = 3) -> None:
    """The folders above ``folder`` that Hydra made for it and that are now empty (``logs/<task>/runs``,
    ``logs/<task>``, ``logs``), up to ``levels`` of them, never the current folder nor one outside it."""
    here = Path.cwd().resolve()
    parent = folder.resolve().parent
    for _ in range(levels):
        if parent == here or here not in parent.parents:
            return
        try:
            parent.rmdir()  # only an empty folder
        except OSError:
            return
        parent = parent.parent
