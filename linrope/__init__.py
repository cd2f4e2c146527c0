"""linrope: position encodings in attention, with kernelised linear attention + RoPE at its core.

The folders are the layers (docs/architecture.md); ``python -m linrope <command>`` (linrope/__main__.py) runs the
commands."""

__version__ = "0.1.0"
