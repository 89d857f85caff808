"""Checks and baselines: exact mode, where outputs part, the joint and distribution checks, teacher forcing,
Hugging Face generate.  Imports sequoia.core, sequoia.runners, the engine room and the proposers; never measuring.
"""
