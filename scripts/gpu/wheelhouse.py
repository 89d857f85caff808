"""Wheels for a GPU machine with no package index, in parts that fit one transfer each.

    python scripts/gpu/wheelhouse.py [--out .whl] [--limit-mib 58] [--python 3.12] [--dry-run]

The GPU machine (an H200, as last seen: GPU.md) has ``python3`` 3.12 with torch 2.11, triton, transformers 5.17,
accelerate, numpy, pandas, pillow, regex, huggingface_hub, tokenizers, safetensors, scipy, networkx and pytest
(and what they depend on), but no gradio, plotly or gguf, no package index, and takes at most 64 MiB of files per
call (the working tree, ~4 MiB, included).  This downloads, for CPython 3.12 on manylinux
x86_64, the app's packages that are missing there (:data:`PACKAGES`, with their dependencies) into ``OUT/all``,
drops the wheels of what the machine has (:data:`MACHINE_HAS`: its torch and CUDA stack, numpy, scipy, pandas,
the hub client and what those depend on; a second numpy on ``PYTHONPATH`` would shadow the one its torch and scipy
were built with), then sorts the rest
into ``OUT/part1``,
``OUT/part2``, ... of at most ``--limit-mib`` each (a wheel larger than that is cut into byte pieces,
``NAME.whl.000``, ``.001``, ..., joined again on the far side).  ``OUT`` (default ``.whl/``) is git-ignored:
wheels are never committed.  Each part travels in its own call (the folder stays on the warm machine):

    run(carry=[".whl/part1"], command="true")
    run(carry=[".whl/part2"], command="sh .whl/part2/install.sh && python scripts/gpu/app_api_check.py ...")

and ``install.sh`` (written into every part) joins the cut wheels whose pieces are all there and installs every
wheel present with ``pip install --no-index --no-deps --target .pydeps``: exactly the listed wheels, nothing
resolved against the index it does not have, so the machine's own packages stay the ones imported; parts that
did not travel are named and the rest installed (``scripts/gpu/gpu_check.py`` needs none of them).  Put ``.pydeps``
first on ``PYTHONPATH`` for the commands after it.

transformers: the project's pin (5.23) travels as a wheel (~12 MB), as it ran there before (GPU.md); the slot
cache (``sequoia/runners/hf/graphs/slot_cache.py``) is written against 5.23's cache classes, and the machine's 5.17 is
not tested there, so the app's check runs on the shipped 5.23.  Its ``regex`` is the machine's.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

#: What the app needs on the GPU machine beyond what it has (GPU.md: no gradio, plotly or gguf; transformers 5.17,
#: where the project pins 5.23).
PACKAGES = ("gradio==6.31.0", "plotly==7.1.0", "gradio_client", "gguf==0.19.0", "transformers==5.23.0")
#: Distributions the GPU machine has (GPU.md, the H200's image): its torch and CUDA stack (gigabytes, matched to
#: its driver), the compiled packages built against them, and the pure-Python ones that torch, transformers,
#: huggingface_hub, accelerate and pandas bring; their wheels are dropped, so nothing shadows the machine's own.
MACHINE_HAS = (
    "torch", "triton", "numpy", "scipy", "networkx", "accelerate", "safetensors", "tokenizers", "pytest",
    "pandas", "pillow", "regex", "huggingface-hub", "hf-xet", "python-dateutil", "pytz", "tzdata", "six",
    "filelock", "fsspec", "jinja2", "markupsafe", "sympy", "mpmath", "typing-extensions", "packaging", "pyyaml",
    "tqdm", "psutil", "setuptools", "httpx", "httpcore", "h11", "anyio", "idna", "certifi", "sniffio",
    "pluggy", "iniconfig", "pygments", "rich", "markdown-it-py", "mdurl", "click", "shellingham", "typer",
    "typer-slim", "annotated-doc",
)
MACHINE_PREFIXES = ("nvidia-", "cuda-")
MIB = 2 ** 20


def download_command(out: Path, python: str, packages=PACKAGES) -> list[str]:
    """``pip download`` of ``packages`` and their dependencies as wheels for CPython ``python`` on manylinux."""
    tag = python.replace(".", "")
    cmd = [sys.executable, "-m", "pip", "download", "--dest", str(out), "--only-binary=:all:",
           "--python-version", python, "--implementation", "cp", "--abi", f"cp{tag}", "--abi", "abi3",
           "--abi", "none"]
    for plat in ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "any"):
        cmd += ["--platform", plat]
    return cmd + list(packages)


def distribution(wheel: str) -> str:
    """The normalised distribution name of a wheel (or a cut piece of one): ``NumPy-2.3.1-...whl`` -> numpy."""
    return wheel.split("-")[0].lower().replace("_", "-").replace(".", "-")


def machine_has(wheel: str) -> bool:
    """True for a wheel of something the GPU machine already has (:data:`MACHINE_HAS`)."""
    name = distribution(wheel)
    return name in MACHINE_HAS or name.startswith(MACHINE_PREFIXES)


def plan_parts(sizes: dict[str, int], limit: int) -> list[list[tuple[str, int, int]]]:
    """Files into parts of at most ``limit`` bytes: (name, offset, length) pieces, largest first into the first
    part with room (first-fit decreasing); a file over ``limit`` is cut into pieces of ``limit`` bytes."""
    if limit <= 0:
        raise ValueError("limit must be positive")
    pieces = []
    for name, size in sizes.items():
        for k, offset in enumerate(range(0, max(size, 1), limit)):
            pieces.append((name, offset, min(limit, size - offset), k))
    pieces.sort(key=lambda p: (-p[2], p[0], p[3]))
    parts: list[list[tuple[str, int, int]]] = []
    room: list[int] = []
    for name, offset, length, _ in pieces:
        i = next((i for i, free in enumerate(room) if free >= length), None)
        if i is None:
            parts.append([])
            room.append(limit)
            i = len(parts) - 1
        parts[i].append((name, offset, length))
        room[i] -= length
    return parts


def install_script(n_parts: int, out_name: str, cut: dict[str, int] | None = None) -> str:
    """The far side's install: join each cut wheel whose ``cut[name]`` pieces are all here, then one offline
    ``pip install --no-deps`` of every wheel present (parts that did not travel are named, the rest installed)."""
    joins = "".join(f"join_pieces {name} {count}\n" for name, count in sorted((cut or {}).items()))
    return f"""#!/bin/sh
# Written by scripts/gpu/wheelhouse.py: run from the repository root; installs the wheels of the parts that are here.
set -e
W={out_name}
missing=""
for k in $(seq 1 {n_parts}); do [ -d $W/part$k ] || missing="$missing $k"; done
[ -z "$missing" ] || echo "parts missing:$missing of {n_parts}; installing the wheels that are here"
mkdir -p $W/joined
join_pieces() {{  # NAME COUNT: the pieces NAME.000 .. in order, if every one travelled
  i=0; : > $W/joined/"$1.tmp"
  while [ $i -lt "$2" ]; do
    piece=$(ls $W/part*/"$1".$(printf %03d $i) 2>/dev/null | head -n 1)
    [ -n "$piece" ] || {{ echo "skipped $1: piece $i missing"; rm -f $W/joined/"$1.tmp"; return 0; }}
    cat "$piece" >> $W/joined/"$1.tmp"; i=$((i + 1))
  done
  mv $W/joined/"$1.tmp" $W/joined/"$1"
}}
{joins}wheels=$(ls $W/part*/*.whl $W/joined/*.whl 2>/dev/null || true)
[ -n "$wheels" ] || {{ echo "no wheels here"; exit 1; }}
python3 -m pip install --no-index --no-deps --target .pydeps --upgrade $wheels
echo "installed into .pydeps: export PYTHONPATH=$PWD/.pydeps:$PYTHONPATH"
"""


def write_parts(src: Path, out: Path, parts: list[list[tuple[str, int, int]]], limit: int) -> None:
    cut = {name: -(-(src / name).stat().st_size // limit) for part in parts for name, _, length in part
           if length != (src / name).stat().st_size}
    for k, part in enumerate(parts, 1):
        folder = out / f"part{k}"
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
        for name, offset, length in part:
            whole = (src / name).stat().st_size
            if length == whole:
                shutil.copyfile(src / name, folder / name)
                continue
            with (src / name).open("rb") as f:
                f.seek(offset)
                (folder / f"{name}.{offset // limit:03d}").write_bytes(f.read(length))
        (folder / "install.sh").write_text(install_script(len(parts), out.name, cut))


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=".whl")
    ap.add_argument("--limit-mib", type=float, default=58.0, help="most MiB a part holds (64 less the tree)")
    ap.add_argument("--python", default="3.12")
    ap.add_argument("--dry-run", action="store_true", help="print the pip command and the install script only")
    args = ap.parse_args(argv)
    if args.limit_mib <= 0:
        ap.error("--limit-mib must be positive")
    out = Path(args.out)
    cmd = download_command(out / "all", args.python)
    if args.dry_run:
        print(" ".join(cmd))
        print(install_script(2, out.name))
        return 0
    (out / "all").mkdir(parents=True, exist_ok=True)
    subprocess.run(cmd, check=True)
    for skipped in [p for p in (out / "all").iterdir() if machine_has(p.name)]:
        skipped.unlink()
    sizes = {p.name: p.stat().st_size for p in sorted((out / "all").glob("*.whl"))}
    limit = int(args.limit_mib * MIB)
    parts = plan_parts(sizes, limit)
    write_parts(out / "all", out, parts, limit)
    for k, part in enumerate(parts, 1):
        print(f"part{k}: {len(part)} files, {sum(p[2] for p in part) / MIB:.1f} MiB")
    print(f"{len(sizes)} wheels, {sum(sizes.values()) / MIB:.1f} MiB, in {len(parts)} parts under {out}; "
          f"on the far side: sh {out}/part{len(parts)}/install.sh")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
