"""Tokenizers and token shards for ``data=text``: ``python -m linrope.tokenize {train,shards} …``.

A command: the top level of linrope holds the commands, each the entry point its ``python -m`` runs; the work is
done in ``linrope.data.tokenize_command`` (docs/architecture.md)."""

import sys

from linrope.data.tokenize_command import main  # noqa: F401

if __name__ == "__main__":
    sys.exit(main())
