"""Length extrapolation of a checkpoint: ``python -m linrope.evaluate ckpt=PATH`` (``linrope-evaluate``).

A command: the top level of linrope holds the commands, each the entry point its console script and
``python -m`` run; the work is done in ``linrope.evaluation.evaluate`` (docs/architecture.md)."""

from linrope.evaluation.evaluate import main, run  # noqa: F401

if __name__ == "__main__":
    run()
