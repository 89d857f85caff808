"""The embedded models as bf16 safetensors directories, the Hugging Face runtime's copy of the GGUF files.

Loading a GGUF dequantizes every tensor (a minute and several GB), so each model
(:mod:`sequoia.runners.embedded`) is converted once to a bf16 safetensors
directory in the cache::

    <cache_dir>/qwen2.5-coder-0.5b-instruct/   config.json, model.safetensors, tokenizer files,
                                               SEQUOIA_OK  (sha256 of the source GGUF)

A directory counts as converted only when ``SEQUOIA_OK`` holds the expected
sha256; it is written inside a temporary directory that is renamed into place
last, so an interrupted conversion is never mistaken for a finished one.
"""

from __future__ import annotations

import gc
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import torch
from filelock import FileLock

from ..._meta import ProgressFn
from ..embedded import (EMBEDDED, MARKER, EmbeddedModelError, EmbeddedSpec, converted_dir, drop_gguf_unless_kept,
                        gguf_to_convert, is_converted, make_cache)


def ensure_converted(spec: EmbeddedSpec, cache_dir: str | Path, progress: ProgressFn | None = None,
                     keep_gguf: bool = False) -> Path:
    """The bf16 safetensors directory of ``spec`` in ``cache_dir``, converting it first if needed.

    Fast (a file read) when already converted.  A lock file keeps two processes
    (say CI and the app) from converting the same model at once.
    """
    out = converted_dir(spec, cache_dir)
    if is_converted(spec, cache_dir):
        return out
    make_cache(out.parent)
    with FileLock(str(out.parent / f".{spec.slug}.lock")):
        if is_converted(spec, cache_dir):  # another process finished while we waited
            return out
        for stale in out.parent.glob(f".{out.name}.tmp-*"):  # left by a killed conversion; we hold the lock
            shutil.rmtree(stale, ignore_errors=True)
        _check_free_space(spec, out.parent)
        gguf = gguf_to_convert(spec, cache_dir, keep_gguf, _span(progress, 0.0, 0.25))
        try:
            _convert(spec, gguf, out, _span(progress, 0.25, 1.0))
        finally:
            drop_gguf_unless_kept(spec, cache_dir, keep_gguf)   # a kept GGUF stays for llama.cpp
    return out


def _check_free_space(spec: EmbeddedSpec, where: Path) -> None:
    # The GGUF plus its bf16 copy: bf16 safetensors are 2.6x (0.5B) to 3.2x (1.5B) the Q4_K_M file.
    need = int(spec.size * 4.5)
    free = shutil.disk_usage(where).free
    if free < need:
        raise EmbeddedModelError(f"converting the {spec.role} needs about {need / 1e9:.1f} GB free in {where}, "
                                 f"only {free / 1e9:.1f} GB are; free some space or set SEQUOIA_CACHE elsewhere")


def tokenizer_from_gguf(gguf: Path):
    """The Hugging Face tokenizer a GGUF file describes, built by its class directly.

    ``AutoTokenizer.from_pretrained(gguf_file=...)`` first builds the model's config, and for architectures
    transformers' fast GGUF reader does not cover (qwen2 among them) it parses every metadata field with
    gguf-py's reader, the vocabulary's 300k strings one by one: 40-55 s on 2 busy cores for the embedded
    target, against 5 s here for the same tokenizer (same vocabulary, special tokens and chat template).
    Falls back to ``AutoTokenizer`` for an architecture with no tokenizer class on record.
    """
    # Local, as in _convert: importing transformers takes seconds, and only reading a GGUF's tokenizer needs it.
    from transformers import AutoTokenizer
    from transformers.integrations.gguf import read_gguf_metadata  # its fast metadata reader
    # the registry naming each architecture's tokenizer class
    from transformers.models.auto.tokenization_auto import TOKENIZER_MAPPING_NAMES, tokenizer_class_from_name

    gguf = Path(gguf)
    metadata = read_gguf_metadata(str(gguf))[0]
    names = TOKENIZER_MAPPING_NAMES.get(metadata.get("general.architecture", ""))
    name = next((n for n in ((names,) if isinstance(names, str) else names or ()) if n), None)
    cls = tokenizer_class_from_name(name) if name else None
    tok = (cls or AutoTokenizer).from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    # The special tokens the file names, whatever the transformers release made of them (5.17 took the
    # embedded target's eos as <|endoftext|> where its GGUF says <|im_end|>; 5.23 reads the file's).
    for role in ("eos", "bos", "pad"):
        token_id = metadata.get(f"tokenizer.ggml.{'padding' if role == 'pad' else role}_token_id")
        if isinstance(token_id, int) and 0 <= token_id < len(tok):
            token = tok.convert_ids_to_tokens(token_id)
            if getattr(tok, f"{role}_token") != token:
                setattr(tok, f"{role}_token", token)
    return tok


def _convert(spec: EmbeddedSpec, gguf: Path, out: Path, progress: ProgressFn) -> None:
    """GGUF -> bf16 safetensors + tokenizer, written to a temp dir renamed into ``out``."""
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    what = f"{spec.role} {spec.name}"
    # only the bf16 conversion needs transformers (seconds to import); the llama.cpp runtime never does
    from transformers import AutoModelForCausalLM

    try:
        progress(0.0, f"reading the {what} tokenizer from GGUF")
        tok = tokenizer_from_gguf(gguf)
        progress(0.2, f"dequantizing {what} (minutes, done once)")
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=str(gguf), dtype=torch.bfloat16)
        _add_chat_eos(model, tok)
        # transformers 5.x refuses to save a model that still remembers its GGUF quantizer.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        progress(0.8, f"saving {what} as bf16 safetensors")
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        (tmp / MARKER).write_text(spec.sha256 + "\n")
        del model, tok
        gc.collect()  # the dequantized weights are GBs; free them before the next model
        if out.exists():
            shutil.rmtree(out)  # a stale or foreign directory without a valid marker
        os.replace(tmp, out)
        progress(1.0, f"{what} ready")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _add_chat_eos(model, tok) -> None:
    """Stop on both <|im_end|> (end of a chat turn) and <|endoftext|>, as Qwen's own generation_config does."""
    vocab = tok.get_vocab()
    ids = [vocab[t] for t in ("<|im_end|>", "<|endoftext|>") if t in vocab]
    current = model.generation_config.eos_token_id
    current = [current] if isinstance(current, int) else list(current or [])
    merged = list(dict.fromkeys(current + ids))
    if merged:
        model.generation_config.eos_token_id = merged


def _span(progress: ProgressFn | None, lo: float, hi: float) -> ProgressFn:
    """Map a sub-task's [0, 1] onto [lo, hi] of the caller's bar."""
    if progress is None:
        return lambda frac, desc: None
    return lambda frac, desc: progress(lo + (hi - lo) * min(max(frac, 0.0), 1.0), desc)


def prepare(cache_dir: str | Path, progress: ProgressFn | None = None, keep_gguf: bool = False,
            log: Callable[[str], None] | None = None) -> dict[str, Path]:
    """Convert the draft, then the target (one at a time: peak memory is the larger one alone).

    Returns ``{"draft": dir, "target": dir}``.  ``log`` receives one line per model with timings.
    """
    spans = {"draft": (0.0, 0.3), "target": (0.3, 1.0)}  # roughly by conversion time
    dirs = {}
    for role, spec in EMBEDDED.items():
        done = is_converted(spec, cache_dir)
        phases = _PhaseTimer(_span(progress, *spans[role]))
        dirs[role] = ensure_converted(spec, cache_dir, phases, keep_gguf=keep_gguf)
        gc.collect()
        if log:
            log(f"{role}: {spec.name} " + ("already converted" if done else phases.summary()) + f" -> {dirs[role]}")
    if progress:
        progress(1.0, "embedded models ready")
    return dirs


class _PhaseTimer:
    """A progress callback that also times each phase (the first word of its description)."""

    def __init__(self, inner: ProgressFn) -> None:
        self.inner, self.t0 = inner, time.perf_counter()
        self.phases: dict[str, float] = {}
        self.current: str | None = None
        self.since = self.t0

    def __call__(self, frac: float, desc: str) -> None:
        word = desc.split()[0] if desc else ""
        if word != self.current:
            now = time.perf_counter()
            if self.current is not None:
                self.phases[self.current] = self.phases.get(self.current, 0.0) + now - self.since
            self.current, self.since = word, now
        self.inner(frac, desc)

    def summary(self) -> str:
        total = time.perf_counter() - self.t0
        parts = ", ".join(f"{k} {v:.0f} s" for k, v in self.phases.items())
        return f"converted in {total:.0f} s ({parts})"
