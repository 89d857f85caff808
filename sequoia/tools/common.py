"""Argument helpers shared by the front ends (``cli``, ``bench_cli``, scripts): model options and loading.

Kept apart from :mod:`sequoia.tools.cli` so that the bench and the scripts import them without importing
the CLI (which imports the bench: a cycle otherwise).
"""

from __future__ import annotations

import argparse
import os
import sys

from ..core.profiles.fingerprint import Fingerprint
from ..runners.hf.kernels import SCHEMES
from ..runtime.measuring.finder import ProfileChoice, find_profile, measure_and_cache
from ..runtime.measuring.fingerprint import expected_fingerprint as fingerprint_as_loaded
from ..runtime.measuring.fingerprint import machine_fingerprint
from ..runtime.measuring.runtime_choice import choose_runtime
from ..runtime.models import BACKENDS, load_pair, resolve_device, resolve_draft_quant, resolve_dtype


def add_model_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("models")
    g.add_argument("--backend", choices=BACKENDS, default=None,
                   help="the runtime the models run on: hf (transformers/torch, any hub pair), llamacpp (GGUF "
                   "files through llama.cpp: the embedded pair as shipped, or --draft/--target .gguf paths) or mixed "
                   "(the hf target, the draft on llama.cpp: the embedded draft as Q4_0, or a --draft .gguf path); "
                   "default: $SEQUOIA_BACKEND, else the one this machine runs fastest by its measured costs")
    g.add_argument("--draft", default="embedded", help="draft model: 'embedded' (offline default), a hub id or a path")
    g.add_argument("--target", default="embedded", help="target model: 'embedded', a hub id or a path")
    g.add_argument("--device", default=None, help="cuda / cpu (default: cuda when available)")
    g.add_argument("--offload", action="store_true", help="stream the target's layers from host memory (hf runtime; "
                   "default: only on CUDA when the target does not fit the GPU's free memory)")
    g.add_argument("--dtype", default="auto", help="auto / bf16 / fp32 / fp16")
    g.add_argument("--draft-quant", choices=SCHEMES, default=None,
                   help="weight-only quantization of the draft (default: the fastest measured for this kind of "
                   "machine: int4 on AVX-512-BF16 CPUs, int8 on other CPUs, none on GPUs)")
    g.add_argument("--target-quant", choices=SCHEMES, default="none",
                   help="weight-only quantization of the target; every baseline runs this same target (CPU, bf16)")
    g.add_argument("--no-int8", action="store_true", help="same as --draft-quant none")
    g.add_argument("--no-blocked-weights", action="store_true",
                   help="keep one copy of the weights (CPU, bf16): less memory, slower verification of trees")
    g.add_argument("--cache-dir", default=None, help="where the embedded pair is converted to and this machine's "
                   "measured profiles are cached (default ~/.cache/sequoia-studio)")


def load_from_args(args):
    """The model pair the ``add_model_args`` options name."""
    return load_pair(args.draft, args.target, device=args.device, dtype=args.dtype,
                     draft_quant=_draft_quant(args), target_quant=args.target_quant, cache_dir=args.cache_dir,
                     blocked_weights=not args.no_blocked_weights, backend=backend_of(args),
                     threads=getattr(args, "threads", None), offload=True if getattr(args, "offload", False) else None)


def backend_of(args) -> str:
    """``--backend``, else ``$SEQUOIA_BACKEND``, else the runtime this machine runs the models fastest on
    (:mod:`sequoia.runtime.measuring.runtime_choice`; decided once, its reason printed on stderr, and kept in ``args``)."""
    name = getattr(args, "backend", None) or os.environ.get("SEQUOIA_BACKEND", "").strip().lower()
    if name:
        if name not in BACKENDS:
            raise SystemExit(f"SEQUOIA_BACKEND={name!r} is not a backend; use one of {', '.join(BACKENDS)}")
        return name
    decision = choose_runtime(device=getattr(args, "device", None), draft=getattr(args, "draft", "embedded"),
                              target=getattr(args, "target", "embedded"), cache_dir=getattr(args, "cache_dir", None))
    print(decision.summary() + " (--backend or SEQUOIA_BACKEND names another)", file=sys.stderr)
    args.backend = decision.backend
    return decision.backend


def _draft_quant(args) -> str | None:
    return "none" if args.no_int8 else args.draft_quant


def expected_fingerprint(args) -> Fingerprint:
    """This machine's fingerprint with the models as ``load_from_args`` would load them, without loading them.

    The pair's name is left out (it is known only once loaded), so it does not decide a match here.
    """
    device = resolve_device(args.device)
    return fingerprint_as_loaded(device, resolve_dtype(args.dtype, device),
                                resolve_draft_quant(device, None, _draft_quant(args)), args.target_quant,
                                not args.no_blocked_weights, backend_of(args))


def profile_for(pair, explicit: str | None, cache_dir: str | None) -> ProfileChoice:
    """The profile the auto methods and the bench use: ``explicit`` (``--profile``) if given, else a cached
    or shipped one measured on this machine, else one measured now (a quick grid) and cached.  Prints the
    choice and its reason on stderr."""
    choice = find_profile(machine_fingerprint(pair), explicit, cache_dir)
    if choice.profile is None:
        print(f"hardware profile: {choice.reason}; measuring this machine now (about a minute)", file=sys.stderr)
        choice = measure_and_cache(pair, choice, cache_dir)
    print(f"hardware profile ({choice.source}): {choice.reason}", file=sys.stderr)
    return choice
