"""Sequoia Studio: scalable, robust, hardware-aware speculative decoding (Chen et al., 2024).

Layers: pure algorithm modules (tree, dp, sampling, stats, optimizer) import only
torch/numpy; model and cache plumbing lives in models, kv_cache, drafter, engine.
Nothing here loads a model at import time.
"""

__version__ = "0.1.0"
