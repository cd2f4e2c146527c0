"""The run-time services of a training run, one file each (docs/architecture.md, layer 4).  Nothing is
imported here: ``train.py`` imports ``linrope.run.tidy`` before anything heavy."""
