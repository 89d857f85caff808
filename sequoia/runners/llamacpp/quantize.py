"""Requantizing a GGUF file with llama.cpp's own quantizer (``llama_model_quantize``), kept beside the source.

The embedded models ship as Q4_K_M.  A draft's weights decide only how fast
it drafts and how often its guesses are accepted, never what the target
outputs, so a draft may trade accuracy for speed: on 2 Zen 4 cores Q4_0's
one-token step is 12.5 ms against Q4_K_M's 18.5 (``docs/models.md``).
Requantizing an already quantized file loses more than quantizing from
16 bits, so it is meant for drafts; the file is written next to the source
under a temporary name and renamed into place when llama.cpp has finished.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import llama_cpp

from .backend import ensure_backend

#: GGUF weight types this module writes -> llama.cpp's ``llama_ftype`` (LLAMA_FTYPE_MOSTLY_*).
TYPES = {"Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q4_K_M": 15, "Q5_K_M": 17, "Q6_K": 18}


def requantized_path(source: str | Path, kind: str) -> Path:
    """Where :func:`requantize` keeps ``source`` as ``kind``: ``name.Q4_K_M.gguf`` -> ``name.Q4_0.gguf``."""
    source = Path(source)
    stem = source.stem
    for known in TYPES:
        if stem.upper().endswith("." + known):
            stem = stem[: -len(known) - 1]
            break
    return source.with_name(f"{stem}.{kind}.gguf")


def requantize(source: str | Path, kind: str, threads: int | None = None) -> Path:
    """``source`` requantized to ``kind`` (a key of :data:`TYPES`), made once and then reused.

    A kept file newer than its source is reused as it is; llama.cpp's quantizer writes a new one otherwise
    (seconds for the embedded draft).  ValueError names an unknown type; RuntimeError a failed run.
    """
    kind = kind.upper()
    if kind not in TYPES:
        raise ValueError(f"unknown GGUF weight type {kind!r}; choose one of {', '.join(TYPES)}")
    source = Path(source)
    if not source.is_file():
        raise FileNotFoundError(f"no GGUF file at {source}")
    dest = requantized_path(source, kind)
    if dest == source:
        return source
    if dest.is_file() and dest.stat().st_mtime_ns >= source.stat().st_mtime_ns:
        return dest
    ensure_backend()
    tmp = dest.with_name(f"{dest.name}.tmp-{os.getpid()}")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = TYPES[kind]
    params.nthread = threads or os.cpu_count() or 1
    params.allow_requantize = True
    try:
        rc = llama_cpp.llama_model_quantize(str(source).encode(), str(tmp).encode(), ctypes.byref(params))
        if rc != 0:
            raise RuntimeError(f"llama.cpp could not requantize {source.name} to {kind} (llama_model_quantize "
                               f"returned {rc}; see the error it printed above)")
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    return dest
