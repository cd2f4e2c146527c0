"""Length extrapolation of a checkpoint: ``python -m linrope.evaluate ckpt=PATH`` (``linrope-evaluate``).

A command: the top level of linrope holds the commands, each the entry point its console script and
``python -m`` run; the work is done in ``linrope.evaluation.evaluate`` (docs/architecture.md)."""

from linrope.config.help import command

run, __getattr__ = command("evaluate", "linrope.evaluation.evaluate")

if __name__ == "__main__":
    run()
