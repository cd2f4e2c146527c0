"""Sample text from a checkpoint: ``python -m linrope.generate ckpt=PATH`` (``linrope-generate``).

A command: the top level of linrope holds the commands, each the entry point its console script and
``python -m`` run; the work is done in ``linrope.evaluation.generate`` (docs/architecture.md)."""

from linrope.config.help import command

run, __getattr__ = command("generate", "linrope.evaluation.generate")

if __name__ == "__main__":
    run()
