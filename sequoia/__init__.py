"""Sequoia Studio: scalable, robust, hardware-aware speculative decoding (Chen et al., 2024).

Three layers, imports flowing one way (a test checks it):

``sequoia.core``     the pure algorithms: the tree, the DP, sampling and verification,
                     step records and statistics, the hardware profile record, the cost
                     model and the optimizer.  Imports torch and numpy only, never
                     transformers or gradio.
``sequoia.runtime``  model plumbing: loading and kernels, the KV cache, the drafter,
                     proposers, the engine, teacher forcing and the measurements of
                     acceptance and cost.  Imports ``core``.
``sequoia.tools``    front ends: the command line and the benchmark.  Imports both.

The app (``app.py``, ``components/``) is a front end too.  Nothing here loads a
model at import time.
"""

__version__ = "0.2.0"
