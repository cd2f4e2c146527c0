"""Layer 8, analysis: reading finished runs, reports with intervals and provenance, study verdicts, figures and dashboards.

May import: layers 0-7.
"""
