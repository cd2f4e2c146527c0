"""Train and test one model from a checkout: `python train.py model=linear_rope` (sweeps: `python train.py -m ...`);
installed, the same command is `python -m linrope train` or `linrope-train`. The table of contents is
linrope/studies/train.py's `main`.
Run `python train.py --help` for the config groups and their options."""

from linrope.studies.train import main, run  # noqa: F401 - imported here too by the processes ddp_spawn and submitit start

if __name__ == "__main__":
    run()
