"""Layer 3, models: the attention layers, ``ModelConfig`` (the one description of a model), the Transformer and the optimiser's settings.

May import: linrope.base, linrope.ops, linrope.data, linrope.positions.
"""
