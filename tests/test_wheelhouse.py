"""scripts/wheelhouse.py: the wheels a GPU machine lacks, in parts that each fit one transfer."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import load_script

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wh():
    return load_script("wheelhouse")


def test_parts_stay_under_the_limit_and_hold_every_byte(wh):
    sizes = {"gradio.whl": 31, "numpy.whl": 16, "pandas.whl": 12, "huge.whl": 130, **{f"s{i}.whl": 1 for i in range(9)}}
    parts = wh.plan_parts(sizes, limit=58)
    assert all(sum(length for _, _, length in part) <= 58 for part in parts)
    held = {}
    for part in parts:
        for name, offset, length in part:
            held.setdefault(name, []).append((offset, length))
    for name, size in sizes.items():
        spans = sorted(held[name])
        assert spans[0][0] == 0 and sum(n for _, n in spans) == size          # every byte, once
        assert all(a + n == b for (a, n), (b, _) in zip(spans, spans[1:]))
    assert len(held["huge.whl"]) == 3                                       # cut into 58 + 58 + 14
    with pytest.raises(ValueError):
        wh.plan_parts(sizes, 0)


def test_cut_wheels_join_back_on_the_far_side(wh, tmp_path):
    src, out = tmp_path / "all", tmp_path / ".whl"
    src.mkdir()
    data = bytes(range(256)) * 40                                           # 10240 bytes
    (src / "big-1.0-py3-none-any.whl").write_bytes(data)
    (src / "small-1.0-py3-none-any.whl").write_bytes(b"x" * 100)
    sizes = {p.name: p.stat().st_size for p in src.iterdir()}
    parts = wh.plan_parts(sizes, 4096)
    wh.write_parts(src, out, parts, 4096)
    pieces = sorted(out.glob("part*/big-1.0-py3-none-any.whl.*"), key=lambda p: p.suffix)
    assert [p.suffix for p in pieces] == [".000", ".001", ".002"]
    assert b"".join(p.read_bytes() for p in pieces) == data
    script = (out / "part1" / "install.sh").read_text()
    assert "--no-index" in script and "--target .pydeps" in script and "'gradio==6.31.0'" in script
    joined = subprocess.run(["sh", "-c", script.split("python -m pip")[0]], cwd=tmp_path, capture_output=True,
                            text=True)
    assert joined.returncode == 0, joined.stdout + joined.stderr
    assert (out / "joined" / "big-1.0-py3-none-any.whl").read_bytes() == data


def test_dry_run_prints_the_download_for_cpython_312_manylinux(wh):
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "wheelhouse.py"), "--dry-run"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0
    assert "--python-version 3.12" in proc.stdout and "manylinux_2_17_x86_64" in proc.stdout
    assert "--only-binary=:all:" in proc.stdout and "gradio==6.31.0" in proc.stdout
