"""Copies from the context: the n-gram index and the acceptance of copied tokens.
Imports sequoia.core's other rooms only (no model code).
"""
