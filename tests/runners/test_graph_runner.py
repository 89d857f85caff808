"""The graph runner (static slot cache, device-built tree masks, CUDA graphs on a GPU) behind the seam.

Everything but the capture runs here on CPU, eagerly, through the same cache, masks
and input packing a GPU replays; the capture itself is tested where CUDA exists.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import CharTokenizer, perturbed, tiny_model
from runner_checks import check_runner_conformance
from types import SimpleNamespace

from sequoia.core.config import GenerationConfig, SamplingConfig
from sequoia.runners.base import RunnerInfo
from sequoia.runners.hf.graphs.graph_runner import GraphRunner, ancestor_block, bucket_of, window_of
from sequoia.runners.hf.loading import wrap_model
from sequoia.runtime.drafter import Drafter
from sequoia.runtime.engine import SpeculativeEngine
from sequoia.runtime.methods import make_method

PROMPT = [1, 5, 9, 3, 7]
METHODS = [
    ("ar", {}), ("chain", {"budget": 4}), ("specinfer", {"width": 3, "depth": 3}),
    ("kary", {"width": 2, "depth": 3}), ("sequoia", {"budget": 16, "depth": 5}),
    ("sequoia", {"budget": 40, "depth": 8}), ("sequoia-dynamic", {}), ("ngram", {}), ("sequoia-ngram", {}),
]
INFO = RunnerInfo(runtime="hf", weights="fp32", device="cpu")


def graph_runner(model, name="tiny", capacity=None, device="cpu"):
    return GraphRunner(model.to(device), name, INFO, capacity=capacity)


def graph_pair(draft, target, vocab):
    return SimpleNamespace(draft=graph_runner(draft, "tiny-draft"), target=graph_runner(target, "tiny-target"),
                           tokenizer=CharTokenizer(vocab), device=torch.device("cpu"), dtype=torch.float32,
                           eos_token_ids=(), draft_name="tiny-draft", target_name="tiny-target", vocab_size=vocab)


def test_buckets_and_windows():
    assert [bucket_of(n) for n in (1, 2, 3, 16, 17, 128, 129)] == [1, 2, 4, 16, 32, 128, None]
    assert window_of(5, 4096) == 256 and window_of(257, 4096) == 512 and window_of(3000, 2048) == 2048


def test_ancestor_block_sees_itself_and_its_ancestors():
    # tree part: 0 (parent in the chain), 1 <- 0, 2 <- 0, 3 <- 1; the last two rows asked
    block = ancestor_block((-1, 0, 0, 1), 2)
    assert block.tolist() == [[True, False, True, False], [True, True, False, True]]


def test_graph_runner_conforms_to_the_slot_contract():
    report = check_runner_conformance(graph_runner(tiny_model(3, vocab=64), capacity=1024), atol=1e-4)
    assert report.worst < 1e-4


def test_a_newer_session_takes_the_cache_over():
    runner = graph_runner(tiny_model(3, vocab=64))
    old = runner.session()
    old.forward([1, 2, 3])
    runner.session().forward([4])
    with pytest.raises(RuntimeError, match="taken over"):
        old.forward([5])


def test_the_cache_is_bounded_with_a_clear_error():
    session = graph_runner(tiny_model(3, vocab=64), capacity=8).session()
    session.forward([1] * 6)
    with pytest.raises(ValueError, match="exceed this runner's cache of 8"):
        session.forward([1, 2, 3])


def test_device_tokens_give_the_same_logits_as_host_tokens():
    runner = graph_runner(tiny_model(3, vocab=64))
    a = runner.session().forward([3, 1, 4, 1, 5])
    b = runner.session().forward(torch.tensor([3, 1, 4, 1, 5]))
    torch.testing.assert_close(a, b, atol=0, rtol=0)


@pytest.fixture(scope="module")
def graph_pairs():
    target = tiny_model(0)
    vocab = target.config.vocab_size
    return target, {"same": graph_pair(target, target, vocab),
                    "noisy": graph_pair(perturbed(target, 0.5, 1), target, vocab),
                    "random": graph_pair(tiny_model(7), target, vocab)}


@pytest.mark.parametrize("pair_name", ["same", "noisy", "random"])
@pytest.mark.parametrize("name,kwargs", METHODS)
def test_greedy_output_on_the_graph_runner_equals_target_greedy(graph_pairs, pair_name, name, kwargs):
    target, pairs = graph_pairs
    ref = target.generate(torch.tensor([PROMPT]), max_new_tokens=40, do_sample=False, eos_token_id=None,
                          pad_token_id=0)[0, len(PROMPT):].tolist()
    records = list(SpeculativeEngine(pairs[pair_name]).generate(PROMPT, make_method(name, **kwargs),
                                                                GenerationConfig(max_new_tokens=40)))
    assert [t for r in records for t in r.new_tokens] == ref


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_device_grown_tree_equals_the_host_grown_tree(temperature):
    """Same draws level by level: the device path changes where tokens live, never which are drawn."""
    draft = perturbed(tiny_model(0), 0.5, 1)
    proposer = make_method("sequoia", budget=24, depth=5)
    sampling = SamplingConfig(temperature=temperature)
    drafts = []
    for runner in (wrap_model(draft, "host", plain=True), graph_runner(draft)):
        drafter = Drafter(runner, sampling, draft.config.vocab_size)
        drafter.begin(PROMPT)
        assert drafter.on_device == isinstance(runner, GraphRunner)
        drafts.append(proposer.propose(drafter, torch.Generator().manual_seed(5)))
    host, device = drafts
    assert device.unread   # left on the device until the engine's one readback
    device = device.read(torch.cat([device.token_ids.double(), device.q_token_ids.double()]).tolist())
    assert host.tokens == device.tokens
    np.testing.assert_allclose(host.q_token, device.q_token, rtol=1e-6)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_step_reads_no_scalar_back(temperature):
    """Outside the forwards a step's only readback is the engine's one ``.tolist()``: no ``.item()``, no
    indexing by a 0-d tensor (each a host wait on a GPU), at T = 0 and on the device walk at T > 0."""
    from sequoia.tools.gpucheck.host import measure_step_host

    target = tiny_model(0, vocab=64)
    pair = graph_pair(perturbed(target, 0.3, 1), target, 64)
    tree = make_method("sequoia", budget=24, depth=5).tree
    res = measure_step_host(pair, tree, SamplingConfig(temperature=temperature), new_tokens=16)
    assert res["scalar_reads"] == 0 and res["ops_outside_forwards"] > 0 and res["host_ms"] > 0


def test_wrap_model_keeps_the_eager_runner_off_cuda():
    assert not isinstance(wrap_model(tiny_model(3), "tiny"), GraphRunner)


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.gpu
@cuda
def test_graph_replays_equal_eager_forwards_on_cuda():
    model = tiny_model(3, vocab=64)
    graphs = GraphRunner(model.cuda(), "g", INFO, graphs=True, capacity=1024)
    eager = GraphRunner(model, "e", INFO, graphs=False, capacity=1024)
    for runner in (graphs, eager):
        s = runner.session()
        s.forward(list(range(1, 20)))
        start = len(s)
        runner.out = s.forward([3, 4, 5, 6, 7], [start - 1, start, start, start + 1, start + 2])
    assert graphs.graph_count >= 1 and not graphs.capture_errors
    torch.testing.assert_close(graphs.out, eager.out, atol=1e-5, rtol=1e-5)
    check_runner_conformance(graphs, atol=1e-4)
