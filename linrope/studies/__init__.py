"""Layer 9, studies: one training run (``train``: fit, test, extrapolate), sweeps checked before they start, and the
resumable study runner.

May import: layers 0-8.
"""
