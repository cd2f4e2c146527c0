"""Layer 7, evaluation: length extrapolation and generation from a trained model or checkpoint; the reference
byte models (unigram, Kneser–Ney n-gram) fitted on the train split.

May import: layers 0-6.
"""
