"""Reproductions of the papers' experiments; run them with ``python experiments/run.py``."""
