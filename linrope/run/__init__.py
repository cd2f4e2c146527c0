"""Layer 5, run-time services (may import: layers 0-4). The services around a training run, one file each:
its folder and lock, checkpoint files, provenance and what a resume changes, signals, the process group,
loggers, quiet output, the one-line exit, and every use of Lightning's private parts.  Nothing is
imported here: ``train.py`` imports ``linrope.run.tidy`` before anything heavy."""
