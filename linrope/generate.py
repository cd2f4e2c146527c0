"""Sample text from a checkpoint: ``python -m linrope.generate ckpt=PATH`` (``linrope-generate``).

A command: the top level of linrope holds the commands, each the entry point its console script and
``python -m`` run; the work is done in ``linrope.evaluation.generate`` (docs/architecture.md)."""

from linrope.evaluation.generate import main, run  # noqa: F401

if __name__ == "__main__":
    run()
