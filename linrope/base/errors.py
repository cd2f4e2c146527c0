"""The errors a user can fix, in one place.

Each is reported as one line (``linrope: …``) with exit status 1 and no traceback
(``linrope.run.exit.one_line_errors``): the reporter recognises them by their common base class,
``LinropeError``, so adding an error never means updating a list elsewhere.  Each also derives from
the built-in exception it refines (``ValueError``, ``RuntimeError``, ``OSError``), so code that
catches those keeps working.

This module imports nothing of linrope: every layer of linrope may raise these errors.
"""

import difflib


class LinropeError(Exception):
    """A problem with what the user gave, or a run stopped for a reason the user must act on."""

    # an outcome of the run (it diverged), not a refusal of what it was given: a job of a sweep that ends so is a
    # failed job, and the sweep goes on with the others (``linrope.run.exit.one_line_errors``)
    outcome = False


class ConfigError(LinropeError, ValueError):
    """A config value, or a combination of values, that cannot work (checked before any data is read)."""


class IncompatiblePairing(ConfigError):
    """An attention kind with a position scheme it cannot take (linear attention never forms the scores)."""


class UnknownOption(ConfigError):
    """An option its component does not take (a typo): ``model.attention.feture_map: unknown option; did you
    mean feature_map?`` — the key and the nearest one the component takes."""

    def __init__(self, key: str, valid, what: str = "option"):
        super().__init__(f"{key}: unknown {what}; " + nearest_hint(str(key).rpartition(".")[2], valid))


def nearest_hint(key: str, valid) -> str:
    """``did you mean feature_map?`` (the nearest of ``valid``), else the list of them."""
    valid = sorted(str(v) for v in valid)
    close = difflib.get_close_matches(str(key), valid, n=1, cutoff=0.5)
    if close:
        return f"did you mean {close[0]}?"
    return f"it takes {first_names(valid, 12)}" if valid else "it takes none"


class RunFolderError(ConfigError):
    """The run folder is in use by another run, or holds a run that would be overwritten."""


class UserError(LinropeError):
    """A problem the user fixes from the command line that no config check can see beforehand (a Trainer
    flag Lightning refuses, a wandb mode)."""


class BackendUnavailable(LinropeError, RuntimeError):
    """An attention implementation that cannot run here (``impl=fla`` without CUDA or without the ``gpu`` extra)."""


class CorpusError(LinropeError, ValueError):
    """A corpus that cannot be used (missing, empty, too short for one window per split)."""


class DataMismatch(CorpusError):
    """The tokenizer or corpus a command would use is not the one the checkpoint's run trained on."""


class OutputPathError(LinropeError, OSError):
    """An output path a command cannot write (checked before the work that would fill it)."""


class SavedDataError(LinropeError, ValueError):
    """A saved data config (a run folder's, a checkpoint's) that linrope refuses to rebuild."""


class SequenceTooLong(LinropeError, ValueError):
    """A position beyond the rows of a learned table (learned, tupe, multiplicative with a table)."""


class CheckpointError(LinropeError, ValueError):
    """A checkpoint that cannot be used: missing, incomplete, not loadable with weights_only, not this model's."""


class CheckpointMismatch(CheckpointError):
    """The checkpoint's parameters or identity do not fit the model built from the config."""


class NonFiniteCheckpoint(LinropeError, RuntimeError):
    """Refused to write a checkpoint whose parameters are NaN or infinite (the last good one is kept)."""


class NonFiniteLoss(LinropeError, RuntimeError):
    """Training stopped at a NaN or infinite loss."""

    outcome = True  # a learning rate too high for a sweep's other jobs to be stopped by it


class DiskFull(LinropeError, OSError):
    """No space left on the device while writing a checkpoint (the previous one is kept)."""


class ResultsError(LinropeError, ValueError):
    """Per-run results that cannot be compared as asked: a configuration or seed missing, documents that differ
    between runs, a value that is not a finite number (linrope.analysis.bootstrap, .multiplicity, .seed_outcomes)."""


def first_names(names, limit: int = 4, sep: str = ", ", more: str = ", …") -> str:
    """``a, b, c, … 7 more``: the first ``limit`` of ``names`` for a one-line message, ``sep`` between them and
    ``more`` before the count of the rest (``a; b; … 7 more``, ``a, b and 7 more``)."""
    names = list(names)
    return sep.join(names[:limit]) + (f"{more} {len(names) - limit} more" if len(names) > limit else "")
