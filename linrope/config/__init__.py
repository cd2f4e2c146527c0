"""Layer 4, configuration: the checks of a composed config before any data is read, and the command line's own checks before Hydra runs (no torch).

May import: layers 0-3.
"""
