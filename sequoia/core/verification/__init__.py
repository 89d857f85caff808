"""Sampling and verification rules: SWOR children, the residual walk, what verification saw, the goodness-of-fit check.
Imports sequoia.core's other rooms only (no model code).
"""
