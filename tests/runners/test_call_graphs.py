"""Graphs captured inside one GPU call (sequoia.runners.hf.graphs.call_graphs), on CPU: replays emulated over the same
static buffers, so every part but the CUDA capture runs here."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from conftest import make_pair, perturbed, tiny_model

from sequoia.core.config import GenerationConfig
from sequoia.runners.hf.graphs import call_graphs
from sequoia.runners.hf.graphs.call_graphs import CallGraphRunner, CallGraphs
from sequoia.runners.hf.graphs.forward_graph import bucket_of
from sequoia.runtime.engine import SpeculativeEngine
from sequoia.runtime.methods import make_method

PROMPT = [1, 5, 9, 3, 7]
METHODS = [("ar", {}), ("chain", {"budget": 4}), ("sequoia", {"budget": 16, "depth": 5}),
           ("sequoia-dynamic", {})]


@pytest.fixture(scope="module")
def pair():
    target = tiny_model(0)
    return make_pair(perturbed(target, 0.5, 1), target, target.config.vocab_size)


def decode(pair, name, kwargs, tokens=40):
    records = list(SpeculativeEngine(pair).generate(PROMPT, make_method(name, **kwargs),
                                                    GenerationConfig(max_new_tokens=tokens)))
    return [t for r in records for t in r.new_tokens], records


@pytest.mark.parametrize("name,kwargs", METHODS)
def test_a_call_on_emulated_graphs_decodes_the_eager_calls_tokens(pair, name, kwargs):
    eager, _ = decode(pair, name, kwargs)
    call = CallGraphs(pair)
    tokens, records = decode(call.pair, name, kwargs)
    assert tokens == eager
    report = call.report()
    assert report.mode == "emulated" and report.captures >= 1 and report.capture_s > 0 and not report.failed
    # each shape captured once, a bucket of rows at a key window (the target's at least the one-row forward)
    for runner in call.runners():
        keys = [k for k, _, _ in runner.captured]
        assert len(keys) == len(set(keys)) == runner.graph_count
        assert all(bucket_of(b) == b and w >= 256 for b, w in keys)
    assert "captured" in report.line() and "emulated" in report.line()


def test_captures_are_counted_once_per_shape_and_dropped_when_the_call_ends(pair):
    call = CallGraphs(pair)
    for _ in range(2):   # shapes met once in the first run are captured in the second
        decode(call.pair, "sequoia", {"budget": 16, "depth": 5})
    first = call.report().captures
    decode(call.pair, "sequoia", {"budget": 16, "depth": 5})   # a third run in the same call: replays only
    assert call.report().captures == first
    runners = call.runners()
    call.close()
    assert call.final.captures == first
    assert all(r.graph_count == 0 and r.cache is None for r in runners)
    assert call.runners() == []


def test_a_failed_capture_runs_that_shape_eagerly_and_says_why(pair, monkeypatch):
    eager, _ = decode(pair, "sequoia", {"budget": 16, "depth": 5})

    def broken(cls, runner, bucket, window):
        raise RuntimeError("capture refused (test)")
    monkeypatch.setattr(call_graphs.ReplayedEagerly, "capture", classmethod(broken))
    call = CallGraphs(pair)
    tokens, _ = decode(call.pair, "sequoia", {"budget": 16, "depth": 5})
    assert tokens == eager
    report = call.report()
    assert report.captures == 0 and report.failed and "capture refused (test)" in report.failed[0]
    assert "failed and ran eagerly" in report.line()


def test_a_call_not_asked_to_capture_is_the_eager_pair_with_its_reason(pair):
    call = CallGraphs(pair, capture=False, reason="capturing would not pay for 8 tokens")
    assert call.pair is pair
    assert call.report().mode == "eager" and "would not pay" in call.report().line()


def test_a_pair_graphs_cannot_serve_stays_eager_with_the_reason(pair):
    other = SimpleNamespace(**{**vars(pair), "target": SimpleNamespace(info=SimpleNamespace(runtime="llamacpp"))})
    call = CallGraphs(other)
    assert call.pair is other
    assert "llamacpp" in call.report().reason


def test_building_the_runners_failing_leaves_the_call_eager(pair, monkeypatch):
    def no_memory(*a, **k):
        raise torch.cuda.OutOfMemoryError("no room for the slot cache (test)")
    monkeypatch.setattr(call_graphs, "_graph_runner", no_memory)
    call = CallGraphs(pair)
    assert call.pair is pair and "could not be built" in call.report().reason


def test_emulated_replays_refuse_a_cuda_only_capture_path():
    runner = CallGraphRunner(tiny_model(2), "tiny", make_pair(tiny_model(2), tiny_model(2), 48).target.info,
                             emulate=True)
    assert runner.graphs and runner.emulated and runner.graph_pool is None


def test_a_cpu_pair_stays_eager_unless_emulation_is_asked(pair):
    call = CallGraphs(pair, emulate_ok=False)
    assert call.pair is pair and "no CUDA in this call" in call.report().line()


@pytest.mark.parametrize("name,kwargs", [("ar", {}), ("sequoia", {"budget": 16, "depth": 5}), ("chain", {"budget": 4})])
def test_a_calls_engine_captures_a_static_trees_shapes_before_its_first_step(pair, name, kwargs):
    from sequoia.runtime.call_engine import CallEngine

    eager, _ = decode(pair, name, kwargs)
    call = CallGraphs(pair)
    engine = CallEngine(call.pair, call)
    steps = engine.generate(PROMPT, make_method(name, **kwargs), GenerationConfig(max_new_tokens=40))
    before = call.report().captures
    assert before >= 1                                   # captured as the generation was asked for
    tokens = [t for r in steps for t in r.new_tokens]
    assert tokens == eager
    assert call.report().captures == before              # no step captured anything: every shape was planned


def test_a_one_off_forward_runs_eagerly_and_a_shape_met_twice_is_captured(pair):
    call = CallGraphs(pair)
    session = call.pair.target.session()
    session.forward([1, 2, 3, 4, 5])                     # the prompt: 5 rows (bucket 8), met once
    session.forward([6])
    assert call.report().captures == 0
    session.forward([7])                                 # one row again: now worth a capture
    assert call.report().captures == 1


def test_a_call_keeps_each_pair_it_uses_apart_and_drops_them_all(pair):
    from components.app_state import pair_room

    target = tiny_model(0)
    other = make_pair(target, target, target.config.vocab_size)   # exact mode's pair, say
    with pair_room.entered(True, "test", emulate=True) as scope:
        first, second = scope.pair(pair), scope.pair(other)
        assert first is not second and first.target.model is pair.target.model
        assert second.target.model is other.target.model and scope.pair(pair) is first
        assert scope.engine(other).pair is second
        runners = [*scope.graphs_of(pair).runners(), *scope.graphs_of(other).runners()]
    assert pair_room.current() is None and all(r.cache is None for r in runners)
