"""Layer 1, data (may import: linrope.base). Byte-level corpora (and the synthetic tasks).  The Lightning data modules live in
``linrope.data.modules`` so that the corpus tools import without Lightning."""

from .bytes import CorpusError, load_corpus

__all__ = ["CorpusError", "load_corpus"]
