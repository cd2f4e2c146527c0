"""Sample text from a checkpoint: ``python -m linrope.generate ckpt=PATH`` (``linrope-generate``).

A command: the top level of linrope holds the commands, each the entry point its console script and
``python -m`` run; the work is done in ``linrope.evaluation.generate`` (docs/architecture.md)."""

from linrope.config.help import answer_help


def run() -> None:
    """The ``linrope-generate`` command: ``--help`` answered here, before torch and Lightning are imported (seconds),
    the rest by ``linrope.evaluation.generate.run``."""
    answer_help("generate")
    from linrope.evaluation.generate import run as command

    command()


def __getattr__(name: str):
    if name == "main":  # the Hydra entry point, imported only when asked for
        from linrope.evaluation.generate import main

        return main
    raise AttributeError(name)


if __name__ == "__main__":
    run()
