"""Typed requests: the method registry, a decode request parsed field by field with every bad field named.
Imports sequoia.core's other rooms only (no model code).
"""
