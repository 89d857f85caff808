"""The command line (python -m sequoia: generate, tree, accept, profile, calibrate, bench) and the benchmark.
Imports sequoia.core, sequoia.runners and sequoia.runtime; nothing imports it but its own entry point.
"""
