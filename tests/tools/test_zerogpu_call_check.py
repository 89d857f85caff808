"""scripts/gpu/zerogpu_call_check.py in its CPU form: the pair built in the parent, each call in a process forked
for it, one capturing (replays emulated off CUDA) and one eager, the page's two decodes each beside the target
alone; the JSON a GPU run will commit."""

import json

import pytest
from conftest import load_script


@pytest.fixture(scope="module")
def checked(tmp_path_factory):
    out = tmp_path_factory.mktemp("zerogpu-call")
    assert load_script("zerogpu_call_check").main(["--out", str(out), "--device", "cpu", "--timeout", "120"]) == 0
    return json.loads((out / "zerogpu_call_check.json").read_text()), (out / "zerogpu_call_check.md").read_text()


def test_each_call_runs_in_its_own_process_and_reports_its_parts(checked):
    result, md = checked
    entry = result["shapes"]["tiny"]
    graphs, eager = entry["calls"]["graphs"], entry["calls"]["eager"]
    assert "error" not in graphs and "error" not in eager, (graphs.get("traceback"), eager.get("traceback"))
    assert graphs["mode"] == "emulated" and eager["mode"] == "eager"
    assert graphs["captures"] and all(c["ok"] and c["seconds"] > 0 for c in graphs["captures"])
    assert sum(r["captures"] for r in graphs["rows"]) == len(graphs["captures"])
    assert graphs["capture_s"] == pytest.approx(sum(c["seconds"] for c in graphs["captures"]))
    assert not eager["captures"] and all(r["captures"] == 0 for r in eager["rows"])
    for call in (graphs, eager):
        assert call["weights_to_card_s"] >= 0 and call["forked_call_s"] >= call["call_s"] > 0
        assert [(r["row"], r["method"] == "target alone") for r in call["rows"]] == \
            [("guided", False), ("guided", True), ("default", False), ("default", True)]
        assert all(r["tokens"] >= r["steps"] > 0 and r["first_token_s"] > 0 for r in call["rows"])
        assert {r["tokens"] for r in call["rows"] if r["row"] == "default"} == {128}


def test_greedy_rows_decode_the_same_tokens_on_graphs_and_eagerly(checked):
    calls = checked[0]["shapes"]["tiny"]["calls"]
    for i, row in enumerate(calls["graphs"]["rows"]):
        if row["temperature"] == 0:
            assert row["tokens_sha"] == calls["eager"]["rows"][i]["tokens_sha"]


def test_the_summary_projects_each_tree_with_the_shipped_vector(checked):
    result, md = checked
    summary = result["shapes"]["tiny"]["summary"]
    assert set(summary) == {"guided", "default"} and set(summary["guided"]) == {"graphs", "eager"}
    assert all(s["projected_ratio"] > 0 and s["measured_ratio"] > 0 for m in summary.values() for s in m.values())
    assert "| graphs | guided |" in md and "projected" in md


def test_unknown_shapes_are_refused_by_name():
    with pytest.raises(SystemExit):
        load_script("zerogpu_call_check")._args(["--out", "/tmp/x", "--shapes", "70b"])
