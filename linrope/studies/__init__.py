"""Layer 9, studies: sweeps checked before they start, and the resumable study runner.

May import: layers 0-8.
"""
