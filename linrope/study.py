"""Run a study job by job across sessions: ``python -m linrope.study experiment=NAME``.

A command: the top level of linrope holds the commands, each the entry point its console script and
``python -m`` run; the work is done in ``linrope.studies.study`` (docs/architecture.md)."""

import sys

from linrope.studies.study import main  # noqa: F401

if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # Ctrl+C before any job started (composing, checking)
        print("linrope.study: interrupted before any job started", file=sys.stderr)
        sys.exit(130)
