"""Layer 6, training: the LightningModule, the callbacks it trains with, and the builders ``linrope.train`` calls in order.

May import: layers 0-5.
"""
