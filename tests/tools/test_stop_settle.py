"""scripts/page/stop_settle.py on tiny random models in Chromium: the Stop and first-frame timings the page promises
are measured by the script (its figures asserted nowhere), and the script cannot rot."""

from __future__ import annotations

import json
import os
import sys
import time

import pytest
from conftest import load_script

from components.compare import compare_tab
from components.distribution import distribution_tab
from components.live import live_tab
from sequoia.tools.random_pair import make_pair

pytestmark = [pytest.mark.browser, pytest.mark.embedded, pytest.mark.slow,
              pytest.mark.skipif(not os.path.exists("/usr/bin/chromium"), reason="no /usr/bin/chromium")]


@pytest.fixture(scope="module")
def stop_settle():
    yield load_script("stop_settle")
    sys.modules.pop("stop_settle", None)


def _slowed(monkeypatch, module, name: str, delay_s: float = 0.1) -> None:
    """Each state of ``module.name`` (a generator) a little later: a tiny model's run outlasts the click after it."""
    real = getattr(module, name)

    def slow(*args, **kwargs):
        for state in real(*args, **kwargs):
            time.sleep(delay_s)
            yield state

    monkeypatch.setattr(module, name, slow)


def test_stop_settle_times_each_stop_and_the_first_frame(stop_settle, tmp_path, monkeypatch):
    models = tmp_path / "models"
    make_pair(models, "tiny", seed=0, device="cpu")
    for name, value in {"SEQUOIA_DRAFT": models / "draft", "SEQUOIA_TARGET": models / "target",
                        "SEQUOIA_CACHE": tmp_path / "cache", "SEQUOIA_DEVICE": "cpu"}.items():
        monkeypatch.setenv(name, str(value))
    _slowed(monkeypatch, live_tab, "run_decode")
    _slowed(monkeypatch, compare_tab, "iter_comparison")
    _slowed(monkeypatch, distribution_tab, "iter_check")
    out = tmp_path / "stop.json"
    assert stop_settle.main(["--json", str(out), "--tries", "1", "--max-new-tokens", "200"]) == 0
    result = json.loads(out.read_text())
    for kind in stop_settle.KINDS:
        assert result[f"{kind}.settle_s"]["n"] == 1 and result[f"{kind}.free_s"]["n"] == 1, kind
        row = result["tries"][kind][0]
        assert 0 < row["settle_s"] <= row["free_s"] and "Stopped" in row["said"], (kind, row)
    assert 0 < result["live_forward.first_frame_s"]["median"] and result["load_before"] >= 0
