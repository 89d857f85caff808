"""The llama.cpp runtime: GGUF models through llama-cpp-python, trees as sequence ids in one batch.

* :mod:`.plan`   -- slots -> positions, sequence ids and cache copies (pure Python, no llama.cpp)
* :mod:`.runner` -- :class:`LlamaCppRunner` / :class:`LlamaCppSession` over llama.cpp's C API
* :mod:`.load`   -- loading a GGUF path or the embedded pair, with readable errors
* :mod:`.quantize` -- a GGUF requantized by llama.cpp's own quantizer (e.g. a Q4_0 draft), kept beside it
* :mod:`.backend` -- llama.cpp's process-wide backend and log filter, set up once on first use

The runner needs ``llama-cpp-python`` (``pip install llama-cpp-python==0.3.36``).
Its names are resolved on first use (PEP 562), so ``.plan`` and its tests work
without the compiled package, and a missing package is reported by name when
a runner is actually asked for.  ``sequoia.runners`` never imports this package.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "LlamaCppOptions": "runner", "LlamaCppRunner": "runner", "LlamaCppSession": "runner",
    "load_llamacpp_runner": "load", "load_embedded_llamacpp": "load", "load_embedded_runner": "load",
    "requantize": "quantize", "requantized_path": "quantize",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
