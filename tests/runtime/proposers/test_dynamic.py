"""The dynamic tree (sequoia-dynamic) and its calibration: lossless, adaptive, capped."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from test_engine import (  # noqa: F401  (small_vocab_pair is a fixture)
    PROMPT,
    _empirical_joint,
    _hf_greedy,
    _joint_pvalue,
    _run,
    small_vocab_pair,
)

from sequoia.core.config import GenerationConfig, SamplingConfig
from sequoia.core.profiles.calibration import Calibration, child_outcomes, fit_outcomes, fit_records
from sequoia.core.profiles.profile import HardwareProfile
from sequoia.core.statistics.trace import DynamicInfo, StepRecord
from sequoia.core.trees.tree import Tree
from sequoia.runtime.checks.teacher import target_continuation
from sequoia.runtime.drafter import Draft
from sequoia.runtime.measuring.calibration import calibrate
from sequoia.runtime.methods import ENGINE_METHODS, make_method
from sequoia.runtime.proposers.dynamic import DynamicTreeProposer
from sequoia.runtime.proposers.price import PredictedGate as _Gate

#: Verification nearly free, drafting cheap: the policy grows trees whenever a node adds anything.
CHEAP = HardwareProfile.hand_made(target=lambda n: 100.0 + 0.5 * n, draft=lambda w: 2.0 + 0.1 * w)
#: Costs of the same proportions as the embedded pair on a CPU.
CPU_LIKE = HardwareProfile.hand_made(target=lambda n: 100.0 + 4.0 * n, draft=lambda w: 17.0 + 1.5 * w)


def _dynamic(**kwargs) -> DynamicTreeProposer:
    kwargs.setdefault("profile", CPU_LIKE)
    return DynamicTreeProposer(**kwargs)


# --------------------------------------------------------------- lossless
@pytest.mark.parametrize("pair_name", ["same", "noisy", "random"])
@pytest.mark.parametrize("kwargs", [{}, {"profile": CHEAP, "budget": 12, "max_depth": 4}])
def test_greedy_output_equals_target_greedy(tiny_pairs, tiny_target, pair_name, kwargs):
    reference = _hf_greedy(tiny_target, PROMPT, 40)
    tokens, records = _run(tiny_pairs[pair_name], _dynamic(**kwargs), GenerationConfig(max_new_tokens=40))
    assert tokens == reference
    assert records[-1].finish_reason == "length"
    if pair_name == "same":
        # An identical draft is accepted all the way down every step.
        assert all(r.n_accepted == r.tree.depth for r in records[:-1])


def test_greedy_with_the_registered_method(tiny_pairs, tiny_target):
    assert "sequoia-dynamic" in ENGINE_METHODS
    method = make_method("sequoia-dynamic", budget=10, depth=5, profile=CPU_LIKE)
    tokens, records = _run(tiny_pairs["noisy"], method, GenerationConfig(max_new_tokens=30))
    assert tokens == _hf_greedy(tiny_target, PROMPT, 30)
    assert all(r.method == "sequoia-dynamic" and r.tree.size <= 10 and r.tree.depth <= 5 for r in records)


@pytest.mark.parametrize("profile,sampling", [
    (CHEAP, SamplingConfig(temperature=1.0)),
    (CPU_LIKE, SamplingConfig(temperature=0.7, top_p=0.9)),
])
def test_sampled_output_matches_target_distribution(small_vocab_pair, profile, sampling):
    # CPU_LIKE makes child counts and expansions vary with the draft's draws: the case
    # where a policy peeking at its own children would bias the output.
    method = DynamicTreeProposer(profile=profile, budget=6, max_depth=3)
    counts, exact = _empirical_joint(small_vocab_pair, method, sampling, n=1000)
    assert _joint_pvalue(counts, exact) > 1e-6


# --------------------------------------------------------------- adaptivity
class FakeDrafter:
    """Every node has the same q: ``top`` on one token and the rest spread evenly, or geometric."""

    def __init__(self, top: float | None = None, ratio: float | None = None, vocab: int = 64) -> None:
        if ratio is not None:
            q = ratio ** torch.arange(vocab, dtype=torch.float32)
            q /= q.sum()
        else:
            q = torch.full((vocab,), (1.0 - top) / (vocab - 1))
            q[0] = top
        self.q, self.root_token, self.root_q = q, 5, q
        self.forwards: list[int] = []

    def expand(self, nodes, parents, depths, tokens):
        self.forwards.append(len(nodes))
        return self.q.expand(len(nodes), -1)

    def sample(self, q, k, mode, generator):
        return torch.topk(q, k, dim=-1).indices


@pytest.mark.parametrize("profile", [CPU_LIKE, CHEAP])
def test_grows_deeper_when_the_draft_is_confident(profile):
    confident = _dynamic(profile=profile).propose(FakeDrafter(0.95), None)
    unsure = _dynamic(profile=profile).propose(FakeDrafter(0.3), None)
    assert isinstance(confident, Draft)
    assert confident.tree.depth > unsure.tree.depth
    assert confident.dynamic.predicted_tokens > unsure.dynamic.predicted_tokens


def test_a_hopeless_draft_drafts_nothing():
    expensive = HardwareProfile.hand_made(target=lambda n: 100.0 + 20.0 * n, draft=lambda w: 90.0)
    draft = _dynamic(profile=expensive).propose(FakeDrafter(0.02), None)
    assert draft.tree.size == 0


def test_gate_skips_the_draft_while_it_does_not_pay(tiny_pairs, tiny_target):
    # A perfect draft would pay under this profile, so the gate has to learn from the steps.
    costly = HardwareProfile.hand_made(target=lambda n: 100.0 + 20.0 * (n - 1), draft=lambda w: 30.0)
    cfg = GenerationConfig(max_new_tokens=30)
    tokens, records = _run(tiny_pairs["random"], _dynamic(profile=costly), cfg)
    assert tokens == _hf_greedy(tiny_target, PROMPT, 30)
    drafted = [r.dynamic is not None for r in records]
    assert not drafted[0] and drafted[1] and drafted.count(False) > len(records) // 2   # step 0: the prompt's forward
    assert _dynamic(profile=costly).can_pay
    _, ungated = _run(tiny_pairs["random"], _dynamic(profile=costly, gate=False), cfg)
    assert all(r.dynamic is not None for r in ungated[1:])


def test_one_hard_first_step_does_not_stop_the_draft():
    """The gate's average starts from the prior's static tree, worth one step: a first step that accepts
    nothing leaves the draft running (an empty start skipped the next step); steps that keep losing still stop it."""
    dyn = _dynamic()
    tokens, ms = dyn.gate_prior
    assert tokens > 1.0 and ms > CPU_LIKE.target(1)
    dyn.start()
    ar_rate = 1.0 / CPU_LIKE.target(1)
    dyn._gate.observe(1, ms, ar_rate)
    assert dyn.wants_draft()
    for _ in range(5):
        dyn._gate.observe(1, ms, ar_rate)
    assert not dyn.wants_draft()
    empty = _Gate()
    empty.observe(1, ms, ar_rate)
    assert not empty.wants_draft()


def test_drafting_that_only_breaks_even_by_the_prediction_stops():
    """The gate keeps drafting only while steps are predicted to beat the target alone by min_gain: steps
    predicted 5% faster than it are within the cost model's error and are stopped, 20% faster go on."""
    def observed(gain: float) -> bool:
        dyn = _dynamic()
        dyn.start()
        ms = 4 * CPU_LIKE.target(1) / (1.0 + gain)       # four tokens a step, (1 + gain) x the target alone's rate
        info = DynamicInfo(static_tree_parents=(-1,), added=(), pruned=(), predicted_tokens=4.0, predicted_ms=ms,
                           widths=(1,))
        for _ in range(6):
            dyn.observe(SimpleNamespace(dynamic=info, n_new=4, prompt_tokens=0))
        return dyn.wants_draft()

    assert observed(0.2) and not observed(0.05)


def test_a_prior_that_does_not_pay_starts_with_a_plain_step():
    """A perfect chain would pay here (so the gate may try), but the workload's prior tree is predicted only 3%
    faster than the target alone: the first step skips the draft (and its prefill of the prompt), then the
    gate checks.  A prior that pays drafts from the first step, as before."""
    marginal = HardwareProfile.hand_made(target=lambda n: 100.0 + 45.0 * (n - 1), draft=lambda w: 30.0)
    dyn = _dynamic(profile=marginal)
    tokens, ms = dyn.gate_prior
    assert dyn.can_pay and 1.0 < tokens / ms * marginal.target(1) < 1.0 + dyn.min_gain
    dyn.start()
    assert [dyn.wants_draft() for _ in range(2)] == [False, True]
    paying = _dynamic()
    paying.start()
    assert paying.wants_draft()


def test_seeds_make_sampling_reproducible(tiny_pairs):
    cfg = GenerationConfig(max_new_tokens=24, sampling=SamplingConfig(temperature=0.8), seed=5)
    method = _dynamic(budget=10)
    assert _run(tiny_pairs["noisy"], method, cfg)[0] == _run(tiny_pairs["noisy"], method, cfg)[0]


@pytest.mark.parametrize("budget,depth", [(1, 4), (5, 16), (24, 3)])
def test_budget_and_depth_caps(budget, depth):
    drafter = FakeDrafter(ratio=0.7)
    draft = _dynamic(profile=CHEAP, budget=budget, max_depth=depth).propose(drafter, None)
    assert draft.tree.size == budget  # everything pays under CHEAP, so the cap binds
    assert draft.tree.depth <= depth
    assert len(drafter.forwards) == len(draft.dynamic.widths) - 1
    assert set(draft.q) == {v for v in range(draft.tree.n_nodes) if draft.tree.children[v]}


def test_confident_pair_grows_bigger_trees_than_an_unrelated_one(tiny_pairs):
    """With calibrations fitted per pair, a draft equal to the target earns bigger trees."""
    sizes = {}
    for name in ("same", "random"):
        pair = tiny_pairs[name]
        seqs = [(PROMPT, target_continuation(pair.target, PROMPT, SamplingConfig(), 16, None)), ([2, 4], [6, 8, 1, 3] * 4)]
        cal, = calibrate(pair, seqs, [SamplingConfig()], width=3)
        _, records = _run(pair, _dynamic(calibration=cal), GenerationConfig(max_new_tokens=30))
        sizes[name] = np.mean([r.tree.size for r in records])
        depth = np.mean([r.tree.depth for r in records])
        sizes[name + "_depth"] = depth
    assert sizes["same"] > sizes["random"]
    assert sizes["same_depth"] > sizes["random_depth"]


def test_static_annotations_match_nodes_by_rank_path(tiny_pairs):
    _, records = _run(tiny_pairs["noisy"], _dynamic(budget=12), GenerationConfig(max_new_tokens=20))
    drafted = [r for r in records if r.dynamic is not None]  # the gate may skip some steps
    assert drafted
    for r in drafted:
        static = r.dynamic.static_tree_parents
        matched = r.tree.n_nodes - len(r.dynamic.added)
        assert matched == len(static) - len(r.dynamic.pruned)
        assert all(0 < v < r.tree.n_nodes for v in r.dynamic.added)
        assert len(static) - 1 == r.tree.size or len(static) - 1 < r.tree.size  # DP may use fewer nodes


# --------------------------------------------------------------- calibration
def test_sampled_calibration_on_a_tiny_pair(tiny_pairs):
    greedy, sampled = calibrate(tiny_pairs["same"], [(PROMPT, [4, 8, 15, 16, 23, 42] * 3)],
                                [SamplingConfig(), SamplingConfig(temperature=1.0)], width=2)
    for cal in (greedy, sampled):  # q == p: the first child is always accepted
        assert cal.acceptance[0] == pytest.approx(1.0) and cal.acceptance[1] == 0.0
    assert sampled.temperature == 1.0 and sampled.steps == 18


def test_outcomes_from_step_records():
    tree = Tree.from_children_counts([2, 1, 0, 1])      # root -> 1, 2; 1 -> 3; 3 -> 4
    rec = StepRecord.fake(tree, accepted=(0, 1))
    q, rank, hit = child_outcomes([rec])                 # children of accepted nodes 0 and 1
    assert rank.tolist() == [0, 1, 0] and hit.tolist() == [1.0, 0.0, 0.0] and q.tolist() == [0.5] * 3
    assert fit_records([rec] * 50, ranks=2).acceptance == pytest.approx((0.5, 0.0))


def test_identity_calibration_is_q():
    q = torch.tensor([0.0, 0.1, 0.5, 0.99])
    torch.testing.assert_close(Calibration.identity().accept(q, torch.tensor(3)), q)


def test_fit_recovers_a_known_mapping_and_round_trips(tmp_path):
    rng = np.random.default_rng(0)
    q = rng.uniform(0, 1, 40_000)
    rank = rng.integers(0, 2, q.shape)
    truth = np.where(rank == 0, q ** 2, 0.5 * q)   # an overconfident rank 0, a flat rank 1
    hit = (rng.uniform(0, 1, q.shape) < truth).astype(float)
    cal = fit_outcomes(q, rank, hit, ranks=2)
    grid = torch.tensor([0.15, 0.45, 0.75, 0.92])
    fitted0 = cal.accept(grid, torch.tensor(0)).numpy()
    fitted1 = cal.accept(grid, torch.tensor(1)).numpy()
    np.testing.assert_allclose(fitted0, grid.numpy() ** 2, atol=0.04)
    np.testing.assert_allclose(fitted1, 0.5 * grid.numpy(), atol=0.04)
    assert np.all(np.diff(np.array(cal.values), axis=1) >= 0)  # monotone in q
    cal.save(tmp_path / "cal.json")
    assert Calibration.load(tmp_path / "cal.json") == cal
    method = make_method("sequoia-dynamic", calibration=str(tmp_path / "cal.json"))
    assert method.calibration == cal


@pytest.mark.parametrize("build", [
    lambda: Calibration(knots=(0.5, 0.2), values=((0.1, 0.2),)),
    lambda: Calibration(knots=(0.0, 1.0), values=((0.1, 1.5),)),
    lambda: make_method("sequoia-dynamic", budget=0),
    lambda: DynamicTreeProposer(profile=CPU_LIKE, max_depth=0),
])
def test_bad_parameters_raise(build):
    with pytest.raises(ValueError):
        build()


def test_never_drafts_when_no_tree_can_pay(tiny_pairs, tiny_target):
    linear = HardwareProfile.hand_made(target=lambda n: 100.0 * n, draft=lambda w: 20.0)
    method = _dynamic(profile=linear)
    assert not method.can_pay and _dynamic().can_pay
    forwards = []  # counted, not timed: a busy machine makes any time bound flaky
    hook = tiny_pairs["noisy"].draft.model.register_forward_hook(lambda *args: forwards.append(1))
    try:
        tokens, records = _run(tiny_pairs["noisy"], method, GenerationConfig(max_new_tokens=12))
    finally:
        hook.remove()
    assert tokens == _hf_greedy(tiny_target, PROMPT, 12)
    assert all(r.tree.size == 0 for r in records) and not forwards


def test_a_gain_within_the_cost_models_error_is_not_worth_drafting():
    # A bf16 CPU profile where a confident draft's best chain gains ~5% over the target alone.
    cpu = HardwareProfile.hand_made(target=lambda n: 233.0 + 160.0 * (n - 1), draft=lambda w: 40.0)
    assert not _dynamic(profile=cpu).can_pay
    assert _dynamic(profile=cpu, min_gain=0.0).can_pay
    with pytest.raises(ValueError, match="min_gain"):
        _dynamic(min_gain=-0.1)
