"""Loading GGUF files on llama.cpp, with errors that say what was wrong; the embedded pair without conversion."""

from __future__ import annotations

import gc
from pathlib import Path

from ..._meta import ProgressFn
from ..embedded import EMBEDDED, ensure_gguf
from .runner import LlamaCppOptions, LlamaCppRunner

GGUF_MAGIC = b"GGUF"


def load_llamacpp_runner(path: str | Path, options: LlamaCppOptions | None = None,
                         name: str | None = None) -> LlamaCppRunner:
    """A :class:`LlamaCppRunner` for the GGUF file at ``path``; refuses a missing or non-GGUF file by name."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"no GGUF file at {path}" + (" (that is a directory)" if path.is_dir() else ""))
    with open(path, "rb") as f:
        head = f.read(4)
    if head != GGUF_MAGIC:
        raise ValueError(f"{path} is not a GGUF file (it starts with {head!r}, a GGUF starts with {GGUF_MAGIC!r}); "
                         "llama.cpp needs a .gguf model (convert a Hugging Face model with llama.cpp's "
                         "convert_hf_to_gguf.py)")
    return LlamaCppRunner(path, options or LlamaCppOptions(), name=name)


def load_embedded_runner(role: str, cache_dir: str | Path, options: LlamaCppOptions | None = None,
                         progress: ProgressFn | None = None) -> LlamaCppRunner:
    """One embedded model (``role``: "draft" or "target") as shipped (Q4_K_M), from its kept GGUF."""
    spec = EMBEDDED[role]
    return load_llamacpp_runner(ensure_gguf(spec, cache_dir, progress), options, name=f"{spec.name} (Q4_K_M)")


def load_embedded_llamacpp(cache_dir: str | Path, options: LlamaCppOptions | None = None,
                           progress: ProgressFn | None = None) -> dict[str, LlamaCppRunner]:
    """``{"draft": runner, "target": runner}`` for the embedded Q4_K_M pair, straight from the kept GGUFs.

    The first call assembles and hashes the files (seconds per GB); later calls
    only stat them.  No bf16 conversion is involved.
    """
    runners: dict[str, LlamaCppRunner] = {}
    try:
        for i, role in enumerate(EMBEDDED):
            span = (i / len(EMBEDDED), (i + 1) / len(EMBEDDED))
            report = (lambda f, d, lo=span[0], hi=span[1]: progress(lo + (hi - lo) * f, d)) if progress else None
            runners[role] = load_embedded_runner(role, cache_dir, options, report)
    except BaseException:
        for r in runners.values():
            r.close()
        gc.collect()
        raise
    return runners
