"""scripts/gpu/wheelhouse.py: the wheels a GPU machine lacks, in parts that each fit one transfer."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import load_script

ROOT = Path(__file__).resolve().parents[2]


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
    assert "--no-index" in script and "--no-deps" in script and "--target .pydeps" in script
    joined = subprocess.run(["sh", "-c", script.split("python3 -m pip")[0]], cwd=tmp_path, capture_output=True,
                            text=True)
    assert joined.returncode == 0, joined.stdout + joined.stderr
    assert (out / "joined" / "big-1.0-py3-none-any.whl").read_bytes() == data


def test_dry_run_prints_the_download_for_cpython_312_manylinux(wh):
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu" / "wheelhouse.py"), "--dry-run"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0
    assert "--python-version 3.12" in proc.stdout and "manylinux_2_17_x86_64" in proc.stdout
    assert "--only-binary=:all:" in proc.stdout and "gradio==6.31.0" in proc.stdout


def test_the_machines_own_packages_stay_its_own(wh):
    """numpy, scipy, torch and the rest the GPU machine has are dropped from the wheelhouse (a second numpy on
    PYTHONPATH would shadow the one its torch was built with), pandas, regex and the hub client among them (the
    H200's image has them); what the app lacks travels, and the wheels fit one part."""
    dropped = ["numpy-2.3.1-cp312-cp312-manylinux_2_28_x86_64.whl", "scipy-1.16.0-cp312-cp312-manylinux.whl",
               "torch-2.11.0-cp312-cp312-manylinux.whl", "nvidia_cublas_cu12-12.8-py3-none-manylinux.whl",
               "Tokenizers-0.22.0-cp39-abi3-manylinux.whl", "safetensors-0.6.2-cp38-abi3-manylinux.whl",
               "pandas-2.3.3-cp312.whl", "regex-2025.9.1-cp312-cp312-manylinux.whl", "pillow-12.0-cp312.whl",
               "huggingface_hub-1.2.0-py3-none-any.whl", "httpx-0.28.1-py3-none-any.whl", "Jinja2-3.1.6-py3.whl",
               "PyYAML-6.0.3-cp312.whl", "rich-14.2.0-py3-none-any.whl"]
    kept = ["gradio-6.31.0-py3-none-any.whl", "transformers-5.23.0-py3-none-any.whl", "plotly-7.1.0-py3.whl",
            "gguf-0.19.0-py3-none-any.whl", "fastapi-0.118.0-py3-none-any.whl"]
    assert all(wh.machine_has(w) for w in dropped) and not any(wh.machine_has(w) for w in kept)


def test_install_works_with_the_parts_that_travelled(wh, tmp_path):
    """Part 2 of 3 missing: it is named, the wheel cut across it is skipped, every other wheel is installed
    without resolving dependencies."""
    src, out = tmp_path / "all", tmp_path / ".whl"
    src.mkdir()
    (src / "big-1.0-py3-none-any.whl").write_bytes(b"b" * 10000)
    (src / "small-1.0-py3-none-any.whl").write_bytes(b"s" * 100)
    (src / "other-1.0-py3-none-any.whl").write_bytes(b"o" * 3000)
    parts = wh.plan_parts({p.name: p.stat().st_size for p in src.iterdir()}, 4096)
    wh.write_parts(src, out, parts, 4096)
    holder = next(k for k, part in enumerate(parts, 1) if any(n.startswith("other") for n, _, _ in part))
    gone = next(k for k, part in enumerate(parts, 1) if k != holder and all(n.startswith("big") for n, _, _ in part))
    subprocess.run(["rm", "-r", str(out / f"part{gone}")], check=True)
    script = (out / f"part{holder}" / "install.sh").read_text().replace("python3 -m pip install", "echo pip install")
    proc = subprocess.run(["sh", "-c", script], cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"parts missing: {gone} of {len(parts)}" in proc.stdout and "skipped big-1.0-py3-none-any.whl" in proc.stdout
    line = next(x for x in proc.stdout.splitlines() if x.startswith("pip install"))
    assert "--no-deps" in line and "other-1.0" in line and "small-1.0" in line and "big-1.0" not in line
