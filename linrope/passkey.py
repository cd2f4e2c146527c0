"""The pass-key probe of a checkpoint: ``python -m linrope.passkey ckpt=PATH`` (``linrope-passkey``).

A command: the top level of linrope holds the commands, each the entry point its console script and
``python -m`` run; the work is done in ``linrope.evaluation.passkey`` (docs/architecture.md)."""

from linrope.config.help import command

run, __getattr__ = command("passkey", "linrope.evaluation.passkey")

if __name__ == "__main__":
    run()
