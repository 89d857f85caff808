"""The whole static-tree draft as one program (runners/hf/graphs/draft_program.py), against the level-by-level drafter.

Everything but the CUDA capture runs here: the program's function runs eagerly on CPU through the same
slot cache, masks and draws a graph would replay.  Eagerly it draws from the generator it is given in the
same calls and shapes as the level-by-level path, so one seed must give the same tree (tokens, q rows and
the cache's bookkeeping) bit for bit; the engine on it must keep greedy equality and the sampled joint.
"""

from __future__ import annotations

import logging

import pytest
import torch
from conftest import CharTokenizer, perturbed, tiny_model
from types import SimpleNamespace

from sequoia.core.config import GenerationConfig, SamplingConfig
from sequoia.core.verification.sampling import warp
from sequoia.runners.base import RunnerInfo
from sequoia.runners.hf.graphs.capture import capture_status, warm_up, warm_up_pair
from sequoia.runners.hf.graphs.draft_program import DraftPlan, SamplingShape, warp_tensors
from sequoia.runners.hf.graphs.graph_runner import GraphRunner
from sequoia.runtime.checks.joint_check import broken_residual, empirical_joint, exact_joint, joint_pvalue
from sequoia.runtime.drafter import Drafter, _parents_by_level
from sequoia.runtime.engine import SpeculativeEngine
from sequoia.runtime.methods import make_method

PROMPT = [1, 5, 9, 3, 7]
INFO = RunnerInfo(runtime="hf", weights="fp32", device="cpu")
TREES = [("sequoia", {"budget": 24, "depth": 5}), ("sequoia", {"budget": 40, "depth": 8}),
         ("kary", {"width": 2, "depth": 3}), ("chain", {"budget": 4}), ("specinfer", {"width": 3, "depth": 3})]
SAMPLINGS = [SamplingConfig(), SamplingConfig(temperature=1.0),
             SamplingConfig(temperature=0.7, top_p=0.9, top_k=12)]


def _pair(draft, target, programs=True):
    vocab = target.config.vocab_size
    return SimpleNamespace(draft=GraphRunner(draft, "tiny-draft", INFO, programs=programs),
                           target=GraphRunner(target, "tiny-target", INFO), tokenizer=CharTokenizer(vocab),
                           device=torch.device("cpu"), dtype=torch.float32, eos_token_ids=(),
                           draft_name="tiny-draft", target_name="tiny-target", vocab_size=vocab)


def _drafts(model, proposer, sampling, steps=3):
    """Drafts of ``steps`` successive steps (the first child accepted each time), level by level and as one
    program, with the same seed; also the drafters (their sessions' bookkeeping)."""
    out = {}
    for programs in (False, True):
        drafter = Drafter(GraphRunner(model, "d", INFO, programs=programs), sampling, model.config.vocab_size)
        gen, committed, drafts = torch.Generator().manual_seed(5), list(PROMPT), []
        for _ in range(steps):
            drafter.begin(committed)
            draft = proposer.propose(drafter, gen)
            assert draft.unread
            draft = draft.read(torch.cat([draft.token_ids.double(), draft.q_token_ids.double()]).tolist())
            drafts.append((draft, {v: q.clone() for v, q in draft.q.items()}))
            path = [0] + list(proposer.tree.children[0][:1])
            drafter.commit(path)
            committed += [draft.tokens[v] for v in path[1:]] + [3]
        out[programs] = (drafts, drafter)
    return out[False], out[True]


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=["T0", "T1", "T0.7-p0.9-k12"])
@pytest.mark.parametrize("name,kwargs", TREES)
def test_the_program_drafts_the_same_tree_as_the_levels(name, kwargs, sampling):
    """(a) T = 0: the same tokens; (b) T > 0, same seed: the same Gumbel noise, so the same tokens; (c) the same
    q rows; and the same cache bookkeeping, over steps that commit part of each tree."""
    proposer = make_method(name, **kwargs)
    (levels, d_levels), (program, d_program) = _drafts(perturbed(tiny_model(0), 0.5, 1), proposer, sampling)
    ran = d_program.runner.draft_program(proposer.tree, proposer.mode, sampling, d_program.vocab_size)
    if not sampling.greedy and proposer.mode == "with_replacement":
        assert ran is None            # SpecInfer's i.i.d. draws keep the level-by-level path
    else:
        assert ran is not None and ran.runs == 3
    for (a, qa), (b, qb) in zip(levels, program):
        assert a.tokens == b.tokens and a.q_token == b.q_token
        assert qa.keys() == qb.keys() and all(torch.equal(qa[v], qb[v]) for v in qa)
    assert d_levels._slots == d_program._slots
    assert d_levels.session._pos == d_program.session._pos and d_levels.session._parent == d_program.session._parent
    assert d_levels.runner.forward_calls == d_program.runner.forward_calls


def test_the_plan_follows_the_tree():
    tree = make_method("sequoia", budget=24, depth=5).tree
    plan = DraftPlan.build(tree, torch.device("cpu"))
    assert [list(range(*lv.rows)) for lv in plan.levels][0] == [0]
    assert plan.q_nodes() == tuple(v for level in _parents_by_level(tree) for v in level)
    for i, v in enumerate(plan.forwarded):   # each row sees itself and its forwarded ancestors, nothing else
        seen = {plan.forwarded[j] for j in range(plan.n_forwarded) if plan.block[i, j]}
        assert seen == {u for u in tree.path(v) if u != 0} and not plan.block[i, -1]


@pytest.mark.parametrize("sampling", SAMPLINGS[1:], ids=["T1", "T0.7-p0.9-k12"])
def test_warp_with_tensor_values_is_warp(sampling):
    logits = torch.randn(5, 300, generator=torch.Generator().manual_seed(2)) * 3
    shape = SamplingShape.of(sampling)
    got = warp_tensors(logits, torch.tensor(sampling.temperature), torch.tensor(sampling.top_p), shape.top_k,
                       shape.top_p_filter)
    torch.testing.assert_close(got, warp(logits, sampling), atol=1e-7, rtol=1e-6)


def test_the_sampling_values_are_tensors_and_only_the_structure_keys_a_program():
    runner = GraphRunner(tiny_model(0), "d", INFO)
    tree = make_method("sequoia", budget=24, depth=5).tree
    a = runner.draft_program(tree, "without_replacement", SamplingConfig(temperature=0.7, top_p=0.9), 48)
    b = runner.draft_program(tree, "without_replacement", SamplingConfig(temperature=1.3, top_p=0.5), 48)
    c = runner.draft_program(tree, "without_replacement", SamplingConfig(temperature=1.3), 48)
    assert a is b and a is not c and a.buffers.temperature.ndim == 0 and a.buffers.top_p.ndim == 0
    assert runner.draft_program(tree, "with_replacement", SamplingConfig(temperature=1.0), 48) is None
    assert GraphRunner(tiny_model(0), "d", INFO, programs=False).draft_program(
        tree, "without_replacement", SamplingConfig(), 48) is None


def test_a_failed_program_leaves_the_level_by_level_draft():
    model = perturbed(tiny_model(0), 0.5, 1)
    proposer = make_method("sequoia", budget=24, depth=5)
    runner = GraphRunner(model, "d", INFO)
    runner.draft_program(proposer.tree, proposer.mode, SamplingConfig(), 48).failed = "RuntimeError: test"
    drafter = Drafter(runner, SamplingConfig(), 48)
    drafter.begin(PROMPT)
    assert drafter.run_program(proposer.tree, proposer.mode, None) is None
    draft = proposer.propose(drafter, torch.Generator().manual_seed(0))   # the levels: still a device draft
    assert draft.unread and runner.forward_calls == 1 + len(_parents_by_level(proposer.tree)) - 1


@pytest.fixture(scope="module")
def graph_pairs():
    target = tiny_model(0)
    return target, {"same": _pair(target, target), "noisy": _pair(perturbed(target, 0.5, 1), target),
                    "random": _pair(tiny_model(7), target)}


@pytest.mark.parametrize("pair_name", ["same", "noisy", "random"])
@pytest.mark.parametrize("name,kwargs", TREES[:3])
def test_greedy_output_with_the_program_equals_target_greedy(graph_pairs, pair_name, name, kwargs):
    target, pairs = graph_pairs
    pair = pairs[pair_name]
    ref = target.generate(torch.tensor([PROMPT]), max_new_tokens=40, do_sample=False, eos_token_id=None,
                          pad_token_id=0)[0, len(PROMPT):].tolist()
    proposer = make_method(name, **kwargs)
    records = list(SpeculativeEngine(pair).generate(PROMPT, proposer, GenerationConfig(max_new_tokens=40)))
    assert [t for r in records for t in r.new_tokens] == ref
    program = pair.draft.draft_program(proposer.tree, proposer.mode, SamplingConfig(), pair.vocab_size)
    assert program.runs >= len(records) - 2   # every drafted step ran the program (the last may stop early)


@pytest.fixture(scope="module")
def pair8():
    return _pair(tiny_model(3, vocab=8, init=0.2), tiny_model(0, vocab=8, init=0.2))


@pytest.mark.slow
@pytest.mark.parametrize("sampling", [SamplingConfig(temperature=1.0), SamplingConfig(temperature=0.7, top_p=0.9)])
def test_the_program_keeps_the_targets_distribution(pair8, sampling):
    """The sampled joint of two tokens through the program and the device walk passes chi-square."""
    proposer = make_method("sequoia", budget=6, depth=3)
    counts, firsts = empirical_joint(pair8, proposer, sampling, [1, 5, 3], 1000, device_walk=True)
    assert joint_pvalue(counts, exact_joint(pair8.target, [1, 5, 3], sampling, firsts)) > 1e-6
    assert pair8.draft.draft_program(proposer.tree, proposer.mode, sampling, 8).runs > 0


@pytest.mark.slow
def test_a_broken_residual_fails_through_the_program(pair8):
    sampling = SamplingConfig(temperature=1.0)
    with broken_residual():
        counts, firsts = empirical_joint(pair8, make_method("chain", budget=2), sampling, [1, 5, 3], 1000,
                                         device_walk=True)
    assert joint_pvalue(counts, exact_joint(pair8.target, [1, 5, 3], sampling, firsts)) < 1e-6


def test_capture_status_says_what_runs_off_cuda():
    runner = GraphRunner(tiny_model(0), "d", INFO)
    seen = []
    status = warm_up(runner, lambda f, d: seen.append(d), trees=[make_method("chain", budget=3).tree])
    assert status.state == "eager" and status.graphs == 0 and seen == []
    assert "CUDA graphs need a CUDA device" in status.line() and "not compiled" in status.line()
    assert capture_status(runner) == status
    warm_up_pair(runner, GraphRunner(tiny_model(0), "t", INFO))   # a no-op here, as load_pair calls it


def test_a_failed_capture_is_said_and_decoding_goes_on(graph_pairs, monkeypatch, caplog):
    """Every capture attempted, as on CUDA, and failing (here: no CUDA at all): the runner says so in its status
    and the log, the draft falls back to the levels and the forwards to eager, and the output is unchanged."""
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *args: None)
    target, _ = graph_pairs
    pair = _pair(perturbed(target, 0.5, 1), target)
    pair.draft.graphs = True
    ref = target.generate(torch.tensor([PROMPT]), max_new_tokens=20, do_sample=False, eos_token_id=None,
                          pad_token_id=0)[0, len(PROMPT):].tolist()
    with caplog.at_level(logging.WARNING, logger="sequoia"):
        records = list(SpeculativeEngine(pair).generate(PROMPT, make_method("sequoia", budget=24, depth=5),
                                                        GenerationConfig(max_new_tokens=20)))
    assert [t for r in records for t in r.new_tokens] == ref
    status = capture_status(pair.draft)
    assert status.state == "partial" and status.graphs == status.programs == 0
    assert any(e.startswith("('draft program'") for e in status.errors) and len(status.errors) > 1
    assert "failed" in status.line() and "the level-by-level draft run instead" in caplog.text
    assert "eager forwards run instead" in caplog.text


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.gpu
@cuda
def test_the_captured_program_on_cuda():
    """Captured: the T = 0 tree equals the levels'; at T > 0 each node's q_token is its parent's q at its token
    (the q the walk verifies against); the engine keeps greedy equality and the sampled joint."""
    model = perturbed(tiny_model(0), 0.5, 1).cuda()
    proposer = make_method("sequoia", budget=24, depth=5)
    drafts = {}
    for programs in (False, True):
        runner = GraphRunner(model, "d", INFO, programs=programs)
        warm_up(runner, trees=[proposer.tree])
        drafter = Drafter(runner, SamplingConfig(), 48)
        drafter.begin(PROMPT)
        draft = proposer.propose(drafter, torch.Generator("cuda").manual_seed(0))
        drafts[programs] = draft.read(torch.cat([draft.token_ids.double(), draft.q_token_ids.double()]).tolist())
    assert runner.program_graph_count >= 1 and not runner.capture_errors
    assert capture_status(runner).state == "captured"
    assert drafts[True].tokens == drafts[False].tokens
    drafter = Drafter(runner, SamplingConfig(temperature=1.0), 48)
    drafter.begin(PROMPT)
    d = proposer.propose(drafter, torch.Generator("cuda").manual_seed(0))
    tokens, q_tok = d.token_ids.tolist(), d.q_token_ids.tolist()
    for v in range(1, proposer.tree.n_nodes):
        assert q_tok[v] == pytest.approx(d.q[proposer.tree.parents[v]][tokens[v]].item(), rel=1e-6)
    target = tiny_model(0).cuda()
    pair = SimpleNamespace(**{**vars(_pair(model, target)), "device": torch.device("cuda")})
    ref = target.generate(torch.tensor([PROMPT], device="cuda"), max_new_tokens=30, do_sample=False,
                          eos_token_id=None, pad_token_id=0)[0, len(PROMPT):].tolist()
    records = list(SpeculativeEngine(pair).generate(PROMPT, proposer, GenerationConfig(max_new_tokens=30)))
    assert [t for r in records for t in r.new_tokens] == ref
    pair8 = _pair(tiny_model(3, vocab=8, init=0.2).cuda(), tiny_model(0, vocab=8, init=0.2).cuda())
    pair8.device = torch.device("cuda")
    sampling = SamplingConfig(temperature=1.0)
    counts, firsts = empirical_joint(pair8, make_method("sequoia", budget=6, depth=3), sampling, [1, 5, 3], 1000)
    assert joint_pvalue(counts, exact_joint(pair8.target, [1, 5, 3], sampling, firsts)) > 1e-6


def test_the_app_captures_its_default_trees_drafts_at_load(monkeypatch):
    """The guided example's and Compare's fixed tree reach load_pair (the graph runner warms their draft
    programs before serving; off graphs the warm-up is a no-op)."""
    import app
    import sequoia.runtime.models as models
    from components.served_trees import served_trees

    seen = {}
    monkeypatch.setattr(models, "load_pair", lambda **kw: seen.update(kw) or "pair")
    assert app.load_from_env({"SEQUOIA_BACKEND": "hf"}) == "pair"
    trees = served_trees(app.ASSETS)
    assert seen["warm_trees"] == trees and len(trees) == 1
    # Compare opens on the guided example's 12/5 tree: with the code vectors at T=0.6 and T=0 the DP gives the
    # same shape, captured once (13 nodes, root included)
    assert {t.n_nodes for t in trees} == {13}


def test_a_capture_that_leaves_the_device_failing_falls_back_instead_of_crashing(monkeypatch):
    """try_capture drains the device after a failed try; where that drain itself fails (a sticky CUDA error), the
    tries end with both errors, for the eager fallback, instead of raising from the error handler."""
    from types import SimpleNamespace

    from sequoia.runners.hf.graphs import draft_program

    def sticky(device=None):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(draft_program.torch.cuda, "synchronize", sticky)
    runner = SimpleNamespace(device="cuda:0", name="draft")
    calls = []

    def capture():
        calls.append(1)
        raise RuntimeError("capture failed")

    out, error = draft_program.try_capture(capture, runner, ("tree",))
    assert out is None and calls == [1]
    assert "capture failed" in error and "illegal memory access" in error
    # a passing failure on a healthy device is retried once
    monkeypatch.setattr(draft_program.torch.cuda, "synchronize", lambda device=None: None)
    calls.clear()
    assert draft_program.try_capture(capture, runner, ("tree",))[0] is None and calls == [1, 1]
