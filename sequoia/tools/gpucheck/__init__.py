"""The GPU check (``scripts/gpu/gpu_check.py``): correctness on tiny fp32 models, costs at real shapes.

No download: tiny random-weight models for correctness, random bf16 weights at the
embedded pair's and a 7B target's shapes for costs (a forward's cost does not
depend on the weights' values).  ``--device cpu`` runs the same on tiny shapes.
"""
