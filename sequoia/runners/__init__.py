"""Runners: the seam between the model-agnostic engine and each runtime (see base.py)."""
