"""linrope: position encodings in attention, with kernelised linear attention + RoPE at its core."""

__version__ = "0.1.0"
