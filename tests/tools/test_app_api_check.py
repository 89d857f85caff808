"""scripts/gpu/app_api_check.py on CPU with tiny random models: the check a GPU machine runs cannot rot here."""

from __future__ import annotations

import json
import sys

import pytest
from conftest import load_script



@pytest.fixture(scope="module")
def check():
    yield load_script("app_api_check")
    sys.modules.pop("app_api_check", None)


def test_the_verdict_needs_both_ratios_within_the_tolerance(check):
    direct = {"step_ms": 10.0, "wall_ms_per_step": 12.0}
    assert check.compare({"step_ms": 10.5, "wall_ms_per_step": 13.0}, direct, 0.10)["passed"]
    off = check.compare({"step_ms": 10.5, "wall_ms_per_step": 14.0}, direct, 0.10)
    assert not off["passed"] and off["ratios"]["wall_ms_per_step"] == pytest.approx(14 / 12)
    records = [{"draft_s": 1.0, "verify_s": 0.0, "other_s": 0.0}] * 2 + \
        [{"draft_s": 0.001, "verify_s": 0.002, "other_s": 0.0}] * 3
    assert check.step_ms(records) == pytest.approx(3.0)    # the first two steps are left out
    slow_page = check.compare(direct, direct, 0.10, {"ms_per_token": 20.0}, {"ms_per_token": 12.0})
    assert not slow_page["passed"]                           # the Live tab held the engine back
    assert not check.compare(direct, direct, 0.10, {"ms_per_token": 12.0}, {"ms_per_token": 0.0})["passed"]


def test_random_models_are_written_outside_the_output_folder(check, tmp_path, monkeypatch):
    """On a GPU machine everything under --out travels back: a 7B pair (~16 GB) must be written elsewhere (a
    temporary folder, removed at the end, or --models-dir) and --models-dir under --out is refused."""
    written = []

    def fake_make_pair(folder, pair, **kw):
        for role in ("draft", "target"):
            (folder / role).mkdir(parents=True)
            (folder / role / "model.safetensors").write_bytes(b"w" * 4096)
        written.append(folder)

    monkeypatch.setattr(check, "make_pair", fake_make_pair)
    monkeypatch.setattr(check, "run_check", lambda args, out, device: 0 if args.target.startswith(
        str(written[-1])) else 1)
    out = tmp_path / "out"
    assert check.main(["--out", str(out), "--device", "cpu", "--make", "7b"]) == 0
    assert out not in written[-1].parents and not written[-1].exists()         # a temporary folder, gone
    assert sum(f.stat().st_size for f in out.rglob("*") if f.is_file()) == 0
    kept = tmp_path / "models"
    assert check.main(["--out", str(out), "--device", "cpu", "--make", "7b", "--models-dir", str(kept)]) == 0
    assert (kept / "target" / "model.safetensors").exists()
    with pytest.raises(SystemExit):
        check.main(["--out", str(out), "--device", "cpu", "--make", "7b", "--models-dir", str(out / "m")])


@pytest.mark.slow
def test_the_check_runs_on_cpu_with_tiny_models_and_writes_json_and_markdown(check, tmp_path):
    out = tmp_path / "check"
    rc = check.main(["--out", str(out), "--device", "cpu", "--make", "tiny", "--budget", "8", "--depth", "3",
                     "--new-tokens", "12", "--repeats", "1", "--temperatures", "0,1", "--tolerance", "100",
                     "--dtype", "fp32"])
    result = json.loads((out / "app_api_check.json").read_text())
    assert rc == 0 and result["passed"] and "error" not in result, result.get("error")
    for t in ("0.0", "1.0"):
        row = result["temperatures"][t]
        assert row["api"]["steps"] >= 1 and row["api"]["tokens"] == row["direct"]["tokens"]  # same request
        assert row["api"]["step_ms"] > 0 and row["direct"]["wall_ms_per_step"] > 0
        assert row["stream"]["frames"] >= 1 and row["ratios"]["live_ms_per_token"] > 0   # the Live tab's stream
    assert result["temperatures"]["0.0"]["api"]["steps"] == result["temperatures"]["0.0"]["direct"]["steps"]
    page = (out / "app_api_check.md").read_text()
    assert "step ms: API / direct" in page and "Live tab ms per token" in page and "within 10000%" in page
