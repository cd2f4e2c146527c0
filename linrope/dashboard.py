"""A wandb workspace and report for a sweep: ``python -m linrope.dashboard DIR`` (``linrope-dashboard``).

A command: the top level of linrope holds the commands, each the entry point its console script and
``python -m`` run; the work is done in ``linrope.analysis.dashboard`` (docs/architecture.md)."""

import sys

from linrope.analysis.dashboard import main  # noqa: F401

if __name__ == "__main__":
    sys.exit(main())
