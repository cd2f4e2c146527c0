"""Layer 6, training: the LightningModule, the callbacks it trains with, and the builders the train command
(``linrope.studies.train``) calls in order.

May import: layers 0-5.
"""
