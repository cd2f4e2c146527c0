"""The run-time services of a training run, one file each (none of them imported here: ``train.py`` imports
``linrope.run.tidy`` before anything heavy).

- ``folder``: one run folder, one run (its lock, and the Hydra callback that keeps an earlier run's files).
- ``signals``: SIGTERM / SIGINT stop every process after the same step, with last.ckpt, one line, exit 128 + signal.
- ``process_group``: the torch.distributed process group destroyed at exit (gloo).
- ``exit``: the errors a user can fix, and a stop by a signal, as one ``linrope: …`` line and an exit status.
- ``tidy``: every console line once, dependency notices filtered, no empty run folder after a refusal.
- ``loggers``: the CSV and wandb loggers, a resumed run's metrics history kept.
- ``lightning_internals``: the only uses of Lightning's private parts, each with its reason."""
