"""The sampled walk on the device (every node verified at once, one readback) keeps the output exactly p's.

It runs on CPU here as on a GPU (only the default differs: on on CUDA), so the statistical tests of the
engine run on it in CI: the sampled joint of two tokens passes chi-square for each sampling mode and a
broken residual fails it.
"""

from __future__ import annotations

import pytest
import torch
from conftest import make_pair, tiny_model

from sequoia.core.config import GenerationConfig, SamplingConfig
from sequoia.runtime.checks.joint_check import broken_residual, empirical_joint, exact_joint, joint_pvalue
from sequoia.runtime.engine import SpeculativeEngine
from sequoia.runtime.methods import make_method
from sequoia.runtime.verify import can_walk_on_device

PROMPT = [1, 5, 3]


@pytest.fixture(scope="module")
def pair8():
    return make_pair(tiny_model(3, vocab=8, init=0.2), tiny_model(0, vocab=8, init=0.2), 8)


@pytest.mark.parametrize("name,kwargs,sampling", [
    ("sequoia", {"budget": 6, "depth": 3}, SamplingConfig(temperature=1.0)),
    ("specinfer", {"width": 2, "depth": 2}, SamplingConfig(temperature=0.7, top_p=0.9)),
    ("sequoia-dynamic", {}, SamplingConfig(temperature=1.0)),
])
def test_the_device_walk_keeps_the_targets_distribution(pair8, name, kwargs, sampling):
    counts, firsts = empirical_joint(pair8, make_method(name, **kwargs), sampling, PROMPT, 1000, device_walk=True)
    assert joint_pvalue(counts, exact_joint(pair8.target, PROMPT, sampling, firsts)) > 1e-6


def test_a_broken_residual_fails_on_the_device_walk(pair8):
    sampling = SamplingConfig(temperature=1.0)
    with broken_residual():
        counts, firsts = empirical_joint(pair8, make_method("chain", budget=2), sampling, PROMPT, 1000,
                                         device_walk=True)
    assert joint_pvalue(counts, exact_joint(pair8.target, PROMPT, sampling, firsts)) < 1e-6


def test_a_draft_equal_to_the_target_is_accepted_all_the_way_down():
    model = tiny_model(0)
    pair = make_pair(model, model, model.config.vocab_size)
    config = GenerationConfig(max_new_tokens=24, sampling=SamplingConfig(temperature=1.0), stop_at_eos=False)
    records = list(SpeculativeEngine(pair, device_walk=True).generate(PROMPT, make_method("sequoia", budget=12,
                                                                                          depth=4), config))
    assert all(r.n_accepted == r.tree.depth for r in records[1:-1])
    for r in records[1:]:   # the verified nodes: each node on the path and the siblings tested before it
        assert set(r.accepted[1:]) <= {v for v in range(r.tree.n_nodes) if r.status[v] != "unreached"}


def test_the_host_walk_stays_where_the_device_walk_does_not_apply(pair8):
    engine = SpeculativeEngine(pair8)
    assert engine.device_walk is False   # a CPU pair: the host walk by default
    draft = type("D", (), {"tree": make_method("chain", budget=2).tree, "sources": None, "q": {}})()
    assert not can_walk_on_device(draft, SamplingConfig(temperature=1.0), inspect=False)   # no q
    assert not can_walk_on_device(draft, SamplingConfig(temperature=0.0), inspect=False)   # greedy


@pytest.mark.parametrize("mode", ["without_replacement", "with_replacement", "topk"])
def test_rows_with_fewer_children_change_no_verdict_and_no_residual(mode):
    """Rows sorted widest first, slot i tested in the first widths[i] rows only: each row's verdict and
    residual are those of verifying its own children alone."""
    from sequoia.core.verification.sampling import sample_children, verify_rows_state

    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(64, 12, generator=g) * 2, -1)
    q = torch.softmax(torch.randn(64, 12, generator=g) * 2, -1)
    drawn = sample_children(q, 4, mode, g)
    u = torch.rand(drawn.shape, generator=g)
    kids = torch.randint(1, 5, (64,), generator=g).sort(descending=True).values   # each row's children: 1..4
    widths = [int((kids > i).sum()) for i in range(4)]
    first, residual = verify_rows_state(p, q, drawn, u, mode, widths)
    for k in range(1, 5):
        rows = kids == k
        want_first, want_r = verify_rows_state(p[rows], q[rows], drawn[rows, :k], u[rows, :k], mode)
        assert torch.equal(first[rows], want_first) and torch.equal(residual[rows], want_r)
    assert (first < kids).all()
    with pytest.raises(ValueError, match="non-increasing"):
        verify_rows_state(p, q, drawn, u, mode, [64, 10, 20, 0])
