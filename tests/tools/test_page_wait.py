"""scripts/page/page_wait.py on tiny random models: the timing a class waits for cannot rot (no figure asserted)."""

from __future__ import annotations

import json
import re
import sys

import pytest
from conftest import load_script

from sequoia.tools.random_pair import make_pair



@pytest.fixture(scope="module")
def page_wait():
    yield load_script("page_wait")
    sys.modules.pop("page_wait", None)


@pytest.mark.slow
def test_page_wait_times_start_guided_example_and_compare_default(page_wait, tmp_path, monkeypatch):
    models = tmp_path / "models"
    make_pair(models, "tiny", seed=0, device="cpu")
    for name, value in {"SEQUOIA_DRAFT": models / "draft", "SEQUOIA_TARGET": models / "target",
                        "SEQUOIA_CACHE": tmp_path / "cache", "SEQUOIA_DEVICE": "cpu"}.items():
        monkeypatch.setenv(name, str(value))
    out = tmp_path / "wait.json"
    assert page_wait.main(["--json", str(out), "--timeout", "300", "--compare-runs", "2"]) == 0
    result = json.loads(out.read_text())
    assert result["runtime"] == "hf" and result["start_to_ready_s"] > 0   # model folders load on hf only
    for run in ("guided", "guided_again"):
        assert 0 < result[run]["first_step_frame_s"] <= result[run]["total_s"] and result[run]["frames"] >= 2
        assert re.search(r"\d+ tokens?\** in", result[run]["summary"]), result[run]["summary"]   # "**48 tokens** in"
    compare = result["compare_default"]
    assert "Target alone" in compare["methods"] and compare["total_s"] > 0
    assert len(compare["rows"]) >= len(compare["methods"]) - 1   # a row per method run, with its band and verdict
    alone = next(r for r in compare["rows"] if r["label"] == "Target alone")
    assert alone["verdict"] == "reference" and alone["speedup"] == 1.0
    assert all({"speedup min", "speedup max", "verdict"} <= set(r) for r in compare["rows"])
    runs = result["compare_default_runs"]   # two clicks: each row's ratios, band widths and verdicts over them
    assert runs["runs"] == 2 and len(runs["total_s"]) == 2
    assert all(len(v["speedups"]) == 2 and len(v["verdicts"]) == 2 for v in runs["rows"].values())
