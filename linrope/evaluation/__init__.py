"""Layer 7, evaluation: length extrapolation and generation from a trained model or checkpoint.

May import: layers 0-6.
"""
