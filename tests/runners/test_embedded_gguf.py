"""The kept GGUF of the embedded models (the llama.cpp runtime loads it directly): assembly, marker, reuse."""

from __future__ import annotations

import hashlib
import os

import pytest

from sequoia.runners import embedded
from sequoia.runners.embedded import EmbeddedSpec, Part
from sequoia.runners.hf import convert as hf_convert

CHUNKS = [b"GGUF" + b"a" * 996, b"b" * 700, b"c" * 5]
WHOLE = b"".join(CHUNKS)


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """A spec whose parts are local files; counts assemblies and full-file hashes."""
    parts = []
    for i, data in enumerate(CHUNKS, 1):
        path = tmp_path / "parts" / f"part{i:02d}.bin"
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(data)
        parts.append(Part(f"fake-part{i}", path, hashlib.sha256(data).hexdigest(), len(data)))
    spec = EmbeddedSpec("draft", "Fake-Model", tuple(p.package for p in parts), "1.0", len(WHOLE),
                        hashlib.sha256(WHOLE).hexdigest())
    calls = {"locate": 0, "hash": 0}
    real_hash = embedded._file_sha256

    def locate(s):
        calls["locate"] += 1
        return parts

    def hash_file(path):
        calls["hash"] += 1
        return real_hash(path)

    monkeypatch.setattr(embedded, "locate_parts", locate)
    monkeypatch.setattr(embedded, "_file_sha256", hash_file)
    return spec, tmp_path / "cache", calls


def test_ensure_gguf_assembles_once_then_only_stats(fake):
    spec, cache, calls = fake
    path = embedded.ensure_gguf(spec, cache)
    assert path == cache / "fake-model.Q4_K_M.gguf" and path.read_bytes() == WHOLE
    assert embedded.is_gguf_kept(spec, cache) and calls["locate"] == 1
    calls.update(locate=0, hash=0)
    assert embedded.ensure_gguf(spec, cache) == path
    assert calls == {"locate": 0, "hash": 0}  # a warm start neither assembles nor hashes


def test_a_touched_gguf_is_rehashed_and_a_damaged_one_reassembled(fake):
    spec, cache, calls = fake
    path = embedded.ensure_gguf(spec, cache)
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # same bytes, new mtime
    assert not embedded.is_gguf_kept(spec, cache)
    calls.update(locate=0, hash=0)
    embedded.ensure_gguf(spec, cache)
    assert calls == {"locate": 0, "hash": 1} and embedded.is_gguf_kept(spec, cache)
    path.write_bytes(b"X" * len(WHOLE))  # same size, wrong bytes
    embedded.ensure_gguf(spec, cache)
    assert path.read_bytes() == WHOLE and calls["locate"] == 1


def test_ensure_converted_reuses_a_kept_gguf_and_leaves_it(fake, monkeypatch):
    spec, cache, calls = fake
    seen = []

    def convert(spec_, gguf, out, progress):
        seen.append(gguf.read_bytes() == WHOLE)
        out.mkdir(parents=True)
        (out / embedded.MARKER).write_text(spec_.sha256)

    monkeypatch.setattr(hf_convert, "_convert", convert)
    monkeypatch.setattr(hf_convert, "_check_free_space", lambda spec_, where: None)
    path = embedded.ensure_gguf(spec, cache)
    calls.update(locate=0, hash=0)
    hf_convert.ensure_converted(spec, cache)
    assert seen == [True] and calls == {"locate": 0, "hash": 0}
    assert path.is_file() and embedded.is_gguf_kept(spec, cache)  # still there for llama.cpp


def test_ensure_converted_still_deletes_a_gguf_nobody_kept(fake, monkeypatch):
    spec, cache, calls = fake
    monkeypatch.setattr(hf_convert, "_convert", lambda s, g, out, p: (out.mkdir(parents=True),
                                                                     (out / embedded.MARKER).write_text(s.sha256)))
    monkeypatch.setattr(hf_convert, "_check_free_space", lambda spec_, where: None)
    hf_convert.ensure_converted(spec, cache)
    assert not embedded.gguf_path(spec, cache).exists() and calls["locate"] == 1
