"""A command stopped by SIGINT or SIGTERM: ``signals_to`` hands both signals to a handler for the length of a block,
``stopped`` is the handler that raises ``Stopped``, which the command catches to say what it kept (evaluate,
generate, a run's test and extrapolation: linrope.training.after_training)."""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Optional


class Stopped(BaseException):
    """SIGINT or SIGTERM (BaseException: nothing on the way swallows it).  ``text`` and ``sampled``: what a command
    that streams text had printed by then and how many bytes it sampled (None and 0: nothing yet)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum
        self.text: Optional[str] = None
        self.sampled = 0


def stopped(signum, frame):
    """The handler of ``signals_to`` that stops a command: raises ``Stopped``."""
    raise Stopped(signum)


@contextlib.contextmanager
def signals_to(handler):
    """SIGINT and SIGTERM go to ``handler`` inside the block, their own handlers restored after; in the main thread
    only (another thread cannot set them: there the block runs as it is)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
