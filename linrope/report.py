"""Tables, intervals and figures of a sweep or study: ``python -m linrope.report DIR`` (``linrope-report``).

A command: the top level of linrope holds the commands, each the entry point its console script and
``python -m`` run; the work is done in ``linrope.analysis.report_command`` (docs/architecture.md)."""

import sys

from linrope.analysis.report_command import main  # noqa: F401

if __name__ == "__main__":
    sys.exit(main())
