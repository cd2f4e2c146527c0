"""Length extrapolation of a checkpoint: ``python -m linrope.evaluate ckpt=PATH`` (``linrope-evaluate``).

A command: the top level of linrope holds the commands, each the entry point its console script and
``python -m`` run; the work is done in ``linrope.evaluation.evaluate`` (docs/architecture.md)."""

from linrope.config.help import answer_help


def run() -> None:
    """The ``linrope-evaluate`` command: ``--help`` answered here, before torch and Lightning are imported (seconds),
    the rest by ``linrope.evaluation.evaluate.run``."""
    answer_help("evaluate")
    from linrope.evaluation.evaluate import run as command

    command()


def __getattr__(name: str):
    if name == "main":  # the Hydra entry point, imported only when asked for
        from linrope.evaluation.evaluate import main

        return main
    raise AttributeError(name)


if __name__ == "__main__":
    run()
