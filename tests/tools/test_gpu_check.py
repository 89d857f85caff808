"""scripts/gpu/gpu_check.py runs on a CPU (tiny stand-in shapes), so the check a GPU machine runs cannot rot here."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


BLOCKED = ("gradio", "gradio_client", "plotly", "pandas", "gguf", "llama_cpp")
IMPORT_BLOCKED = f"""
import importlib.util, sys
for name in {BLOCKED!r}:
    sys.modules[name] = None   # as if not installed: import fails, find_spec says None
sys.argv = ["gpu_check.py"]
spec = importlib.util.spec_from_file_location("gpu_check", "scripts/gpu/gpu_check.py")
spec.loader.exec_module(importlib.util.module_from_spec(spec))
import sequoia.tools.gpucheck.draft, sequoia.tools.gpucheck.baselines   # the compiled draft's child too
print("imported")
"""


def test_gpu_check_needs_no_wheels():
    """A GPU machine has torch and transformers but no gradio, plotly, pandas, gguf or llama_cpp: the check (and
    the compiled draft's child process) imports none of them, so its call needs no wheels."""
    proc = subprocess.run([sys.executable, "-c", IMPORT_BLOCKED], capture_output=True, text=True, timeout=300,
                          cwd=ROOT)
    assert proc.returncode == 0 and "imported" in proc.stdout, proc.stderr[-2000:]


def test_presets_are_the_device_recipes_calls():
    spec = importlib.util.spec_from_file_location("gpu_check_presets", ROOT / "scripts" / "gpu" / "gpu_check.py")
    check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check)
    first = check.parse(["--out", "x", "--device", "cpu", "--preset", "no-compile"])
    assert first.targets == "7b" and first.quick and first.skip_draft_compile and not first.compile_runners
    assert not (first.compile or first.skip_costs or first.skip_host or first.skip_capture)
    second = check.parse(["--out", "x", "--device", "cpu", "--preset", "compiled-draft", "--child-timeout", "150"])
    assert second.skip_correctness and second.skip_costs and second.skip_host and second.skip_capture
    assert not second.skip_draft and not second.skip_draft_compile and second.child_timeout == 150
    calls = (ROOT / "scripts" / "gpu" / "gpu_calls.sh").read_text()
    assert "--preset no-compile" in calls and "--preset compiled-draft" in calls and "--compile 0" in calls
    assert "timeout=1800" not in (ROOT / "sequoia" / "tools" / "gpucheck" / "draft.py").read_text()


@pytest.mark.slow
def test_gpu_check_runs_on_cpu_and_writes_json_and_markdown(tmp_path):
    """Every part on the tiny CPU shapes; 500 trials a chi-square, not 1,500 (two thirds of the run): the broken
    residual still fails with p ~ 1e-8, far under alpha 1e-3."""
    out = tmp_path / "check"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu" / "gpu_check.py"), "--out", str(out),
                           "--device", "cpu", "--quick", "--repeats", "1", "--new-tokens", "16", "--trials", "500"],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = json.loads((out / "gpu_check.json").read_text())
    assert result["versions"]["torch"] and result["versions"]["transformers"]
    c = result["correctness"]
    assert c["passed"] and c["greedy_graph"]["equal"] == c["greedy_graph"]["runs"] > 0
    assert c["distribution"]["broken_residual_p"] < c["distribution"]["alpha"]   # the foil is caught
    target = next(iter(result["costs"]["targets"].values()))
    assert target["engine"]["ar"]["step_ms"] > 0 and target["profile"]["target_ms"]
    rows = target["baselines"]            # sequoia/tools/gpucheck/baselines.py; a failing one carries its error
    assert {"graph target alone (engine ar)", "HF generate, eager"} <= set(rows)
    assert all("tokens_per_s" in r or "error" in r for r in rows.values())
    capture = next(iter(result["capture"]["shapes"].values()))
    assert set(capture["buckets"]) == {"1", "2", "4", "8", "16", "32", "64", "128"} and capture["mean_capture_s"] >= 0
    host = result["host"]["rows"]
    assert {"55 nodes, T=1", "127 nodes, T=0", "127 nodes, T=1"} <= set(host)
    assert all(r["host_ms"] > 0 and r["forward_ms"] > 0 for r in host.values())
    assert host["127 nodes, T=1"]["scalar_reads"] == 0   # the sampled step reads back once, with .tolist()
    draft = result["draft"]   # (d): the whole-tree program against the levels, and the compiled starts
    assert {"T=0, program", "T=0, levels", "T=1, program", "T=1, levels"} == set(draft["uncompiled"]["rows"])
    assert all(r["level_ms"] > 0 for r in draft["uncompiled"]["rows"].values())
    assert draft["compile"]["unavailable"] == "not on CUDA"   # what runs instead is said, the children still run
    assert draft["compile"]["warm"]["timings"]["levels"] == draft["uncompiled"]["levels"] > 0
    page = (out / "gpu_check.md").read_text()
    assert "greedy output = target's greedy generate" in page and "Projected Sequoia" in page
    assert "Host work per engine step" in page and "(d) The draft alone" in page and "Compiling: unavailable" in page
    assert "(e) Capture time per CUDA graph" in page
