"""List and check the jobs of an experiment: ``python -m linrope.sweeps experiment=NAME``.

A command: the top level of linrope holds the commands, each the entry point its console script and
``python -m`` run; the work is done in ``linrope.studies.sweeps`` (docs/architecture.md)."""

import sys

from linrope.studies.sweeps import main  # noqa: F401

if __name__ == "__main__":
    sys.exit(main())
