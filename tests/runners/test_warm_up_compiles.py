"""A compiled draft compiles a bounded number of times at a cold start, whatever the warm-up captures.

The warm-up (runners/hf/graphs/capture.py) runs on CPU here as on CUDA: the CUDA calls it makes (streams, graphs,
synchronize) are stand-ins that run the captured code eagerly, so every forward a capture would record runs
through the compiled forward.  ``torch.compile`` gets a backend that counts what dynamo hands it (each call
one compile: a recompile for a guard that failed, or a graph break) and runs the graph as traced.  Traced so
before the fix: six compiles (grad mode differing between the first call and the captures; the bucket 1 -> 2
and the window 256 -> 512 each recompiling under automatic dynamic shapes); now two.
"""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest
import torch
from conftest import tiny_model

from sequoia.runners.base import RunnerInfo
from sequoia.runners.hf.graphs.capture import warm_up
from sequoia.runners.hf.graphs.compile_cache import CompilePlan
from sequoia.runners.hf.graphs.graph_runner import GraphRunner
from sequoia.runtime.methods import make_method

INFO = RunnerInfo(runtime="hf", weights="fp32", device="cpu")


class _Graph:
    """torch.cuda.CUDAGraph's stand-in: a capture runs its body eagerly; nothing replays."""

    def register_generator_state(self, generator) -> None:
        pass

    def replay(self) -> None:
        pass


@contextlib.contextmanager
def _eagerly(*args, **kwargs):
    yield


@pytest.fixture
def fake_cuda(monkeypatch):
    waits = SimpleNamespace(wait_stream=lambda other: None)
    for name, value in (("CUDAGraph", _Graph), ("graph", _eagerly), ("stream", _eagerly),
                        ("Stream", lambda *a, **k: waits), ("current_stream", lambda *a: waits),
                        ("synchronize", lambda *a: None), ("graph_pool_handle", lambda: None)):
        monkeypatch.setattr(torch.cuda, name, value)


@pytest.fixture
def counted(monkeypatch):
    """torch.compile with a backend that counts its compiles and runs each graph as dynamo traced it."""
    compiles = []

    def backend(gm, example_inputs):
        compiles.append(len(gm.graph.nodes))
        return gm.forward

    real = torch.compile
    monkeypatch.setattr(torch, "compile", lambda model, **kw: real(model, backend=backend, **kw))
    torch._dynamo.reset()
    yield compiles
    torch._dynamo.reset()


def test_a_cold_start_compiles_the_draft_at_most_twice(fake_cuda, counted):
    runner = GraphRunner(tiny_model(0), "draft", INFO, capacity=1024, compile=CompilePlan(True, "test"))
    runner.graphs = True                           # every capture of the warm-up, as on CUDA
    tree = make_method("sequoia", budget=24, depth=5).tree
    status = warm_up(runner, trees=[tree])
    assert status.errors == () and status.graphs == len(runner.buckets) * 3    # windows 256, 512, 1024
    assert status.programs == 2 * 3                                           # T=0 and T=1, every window
    assert runner.compile_status.state == "cold" and runner.compile_status.seconds is not None
    assert len(counted) <= 2, f"{len(counted)} compiles at a cold start"
    assert len(counted) == 2                      # one row specialised, every wider forward and window in one
    before = len(counted)
    session = runner.session()                    # serving compiles nothing again: a prompt past the largest
    session.forward([i % 40 + 1 for i in range(200)])   # bucket runs eagerly, a step's forwards replay
    session.forward(list(range(1, 6)))
    assert len(counted) == before


def test_every_forward_runs_in_inference_mode_whoever_calls(fake_cuda, monkeypatch):
    """One grad mode for every call of the forward (a compiled forward guards on it): a capture, the warm-up's
    first calls, a session and a draft program outside any inference_mode of their own."""
    model = tiny_model(0)
    modes = []
    real = model.forward
    monkeypatch.setattr(model, "forward", lambda *a, **k: modes.append(torch.is_inference_mode_enabled())
                        or real(*a, **k))
    runner = GraphRunner(model, "draft", INFO, capacity=512, compile=CompilePlan(False, "test"))
    runner.graphs = True
    warm_up(runner, trees=[make_method("chain", budget=3).tree])
    assert modes and all(modes)
