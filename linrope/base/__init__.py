"""Layer 0, foundation: what every layer uses and that knows nothing of attention: the user-facing errors (one base class, ``LinropeError``), atomic file writes, CSV files, a command stopped by a signal, option rules (``options``), a config's dotted keys (``nested``), run names, torch.compile and allocator helpers, figure styling.

May import: nothing of linrope.
"""
