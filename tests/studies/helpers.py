"""Study folders written by hand, as linrope study leaves them, for the tests of tests/studies."""

import json
from pathlib import Path

from omegaconf import OmegaConf

from linrope.studies.study import DEFAULTS, DONE
from linrope.studies.sweeps import compose_train


def finished_job(folder: Path, overrides, code=None):
    """A job folder as a finished study job leaves it: Hydra's saved config, a metrics.csv, study_job.json (and
    provenance.json naming its code, when given)."""
    (folder / ".hydra").mkdir(parents=True)
    OmegaConf.save(compose_train([*overrides, *DEFAULTS]), folder / ".hydra" / "config.yaml")
    (folder / "csv").mkdir()
    (folder / "csv" / "metrics.csv").write_text("step,test/bpb\n40,3.0\n")
    (folder / DONE).write_text(json.dumps({"job": [], "test": {"test/bpb": 3.0}}))
    if code:
        (folder / "provenance.json").write_text(json.dumps({"linrope": {"code": code, "commit": "c" * 40}}))
