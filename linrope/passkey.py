"""The pass-key probe of a checkpoint: ``python -m linrope.passkey ckpt=PATH`` (``linrope-passkey``).

A command: the top level of linrope holds the commands, each the entry point its console script and
``python -m`` run; the work is done in ``linrope.evaluation.passkey`` (docs/architecture.md)."""

from linrope.evaluation.passkey import run  # noqa: F401

if __name__ == "__main__":
    run()
