"""Every use linrope makes of Lightning's private parts, with the reason; no other module touches them.

Written against the Lightning versions ``LIGHTNING`` names (the requirement in pyproject.toml);
tests/run/test_run.py fails when the installed Lightning is outside that range, and exercises each use below.
On an upgrade: read the lines below against the new Lightning, then widen the range."""

from __future__ import annotations

LIGHTNING = ">=2.6,<2.7"


def stop_after_this_step(trainer) -> None:
    """Make Lightning finish the current training step (and the validation that follows it, if any), then raise
    ``SIGTERMException`` — what its own SIGTERM handler does.  That handler cannot be used under DDP: it
    broadcasts from inside the handler, which hangs every rank when the signal reaches a rank other than 0
    first (linrope.run.signals).  Lightning has no public way to request this stop (``trainer.should_stop``
    runs a validation first and returns normally).  Private: ``Trainer._signal_connector``."""
    trainer._signal_connector.received_sigterm = True


def drop_wandb_anonymous(logger) -> None:
    """Lightning's WandbLogger passes ``anonymous`` to ``wandb.init`` always (None when unset); wandb >= 0.19 then
    prints a deprecation warning on every run.  Private: ``WandbLogger._wandb_init``, the arguments of
    ``wandb.init``."""
    logger._wandb_init.pop("anonymous", None)
