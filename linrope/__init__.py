"""linrope: position encodings in attention, with kernelised linear attention + RoPE at its core.

The folders are the layers (docs/architecture.md); the top-level modules are the commands."""

from linrope.base import moved as _moved

__version__ = "0.1.0"
_moved.install()  # run folders saved before the layers had folders name classes by their old paths
