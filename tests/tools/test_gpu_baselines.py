"""sequoia.tools.gpucheck.baselines: every baseline is a row, a failing one a row with its error."""

from __future__ import annotations

import torch

from sequoia.tools.gpucheck import baselines
from sequoia.tools.gpucheck.models import tiny_model


def test_a_failing_baseline_is_a_row_with_its_error():
    def boom():
        raise RuntimeError("accessing tensor output of CUDAGraphs that has been overwritten\nmore")

    assert baselines.row(boom) == {"error": "RuntimeError: accessing tensor output of CUDAGraphs that has been "
                                            "overwritten"}
    assert baselines.row(lambda: {"tokens_per_s": 3.0}) == {"tokens_per_s": 3.0}


def test_hf_generate_rows_on_cpu_and_the_forward_restored():
    model = tiny_model(0, torch.device("cpu"))
    forward = model.forward
    eager = baselines.hf_generate(model, ctx=8, new_tokens=4)
    static = baselines.hf_generate(model, ctx=8, new_tokens=4, static=True)
    assert eager["tokens_per_s"] > 0 and static["tokens_per_s"] > 0
    assert static["compiled"] is False                    # transformers compiles a static-cache generate on CUDA only
    assert model.forward == forward


def test_target_baselines_lists_every_row_and_keeps_going_past_a_failure(monkeypatch):
    model = tiny_model(0, torch.device("cpu"))
    said = []
    rows = baselines.target_baselines(model, "tiny", 8, 4, ar_step_ms=2.0, compile=False,
                                      alone=lambda target: {"step_ms": 1.0}, log=said.append)
    assert set(rows) == {baselines.ROW_GRAPH, baselines.ROW_EAGER} and rows[baselines.ROW_GRAPH]["tokens_per_s"] == 500

    def failing(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr(baselines, "hf_generate", failing)
    monkeypatch.setattr(baselines, "runner", lambda model, kind, name, compile=False: (kind, compile))
    rows = baselines.target_baselines(model, "tiny", 8, 4, ar_step_ms=2.0, compile=True,
                                      alone=lambda target: {"step_ms": 4.0 if target == ("graph", True) else 0},
                                      log=said.append)
    assert rows[baselines.ROW_COMPILED]["tokens_per_s"] == 250
    for label in (baselines.ROW_EAGER, baselines.ROW_STATIC, baselines.ROW_STATIC_COMPILE):
        assert rows[label] == {"error": "OutOfMemoryError: CUDA out of memory"}
    assert any("CUDA out of memory" in s for s in said)


def test_capture_times_per_bucket_on_cpu_and_their_section():
    from sequoia.tools.gpucheck.capture import capture_markdown, capture_times
    from sequoia.tools.gpucheck.models import runner

    rn = runner(tiny_model(0, torch.device("cpu")), "graph", "tiny")
    rows = capture_times(rn, ctx=8, buckets=(1, 4), replays=1)
    assert set(rows) == {1, 4} and all(r["capture_s"] >= 0 and r["replay_ms"] > 0 for r in rows.values())
    page = capture_markdown({"graphs": False, "shapes": {"tiny": {"buckets": rows, "mean_capture_s": 0.0}}})
    assert "Off CUDA: eager" in page and "| tiny | 4 |" in page
    assert capture_markdown(None) == ""
