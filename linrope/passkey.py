"""The pass-key probe of a checkpoint: ``python -m linrope.passkey ckpt=PATH`` (``linrope-passkey``).

A command: the top level of linrope holds the commands, each the entry point its console script and
``python -m`` run; the work is done in ``linrope.evaluation.passkey`` (docs/architecture.md)."""

from linrope.config.help import answer_help


def run() -> None:
    """The ``linrope-passkey`` command: ``--help`` answered here, before torch and Lightning are imported (seconds),
    the rest by ``linrope.evaluation.passkey.run``."""
    answer_help("passkey")
    from linrope.evaluation.passkey import run as command

    command()


if __name__ == "__main__":
    run()
