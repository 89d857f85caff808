"""The one cost model: what a speculative step costs under a :class:`HardwareProfile`.

Every price in the library comes from here: the static optimizer
(:mod:`sequoia.core.trees.optimizer`), the dynamic tree
(:mod:`sequoia.runtime.proposers.dynamic`), the app and the bench.  A step that drafts
levels of widths ``w_1 .. w_d`` and verifies ``n`` tokens (the root included)
costs, in ms,

    step_overhead + sum_l (draft(w_l) + level_overhead) + target(n)

where ``draft`` and ``target`` are the profile's measured forward costs and
the two overheads are measured into the profile (walk, sampling and cache
compaction per step; sampling and masks per level).  The target alone pays
the step overhead too: its baseline is ``target(1) + step_overhead`` per token.

Which widths a tree needs: level l >= 1 forwards only the level-l nodes that
have children (see :class:`sequoia.runtime.drafter.Drafter`); the first draft
forward feeds the root, plus the last step's accepted leaf when the accepted
path ended on one (the draft proposed that token but never forwarded it).
That happens with the probability :func:`leaf_mass` gives, so the first
level is priced at width ``1 + leaf_mass`` (the profile interpolates
between draft(1) and draft(2)).  On a GPU the two cost about the same; on a
CPU they do not: on a 2-vCPU AMD EPYC (Zen 3, AVX2), llama.cpp, the embedded
0.5B draft forwarded 1 token in 29 ms and 2 in 48 ms, and a chain of one
token measured 64 ms of drafting a step where the model, pricing one token,
said 38 (docs/data/check-prediction-zen3-avx2-llamacpp.json): the error made
chains look 1.15x the target alone's cost where they measured 1.45x.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..trees.dp import node_acceptance
from ..trees.tree import Tree
from .profile import DRAFT_GRID, TARGET_GRID, HardwareProfile

#: Per-token cost of the conservative stand-in: only ratios matter to a choice.
_CONSERVATIVE_TOKEN_MS = 100.0


@dataclass(frozen=True)
class StepCost:
    draft_ms: float        # all draft levels of one step, their level overheads included
    target_ms: float       # the one verifying target forward
    expected_tokens: float
    overhead_ms: float = 0.0  # per step outside the model forwards

    @property
    def total_ms(self) -> float:
        return self.draft_ms + self.target_ms + self.overhead_ms

    @property
    def ms_per_token(self) -> float:
        return self.total_ms / self.expected_tokens


def draft_widths(tree: Tree, catch_up: float = 0.0) -> tuple[float, ...]:
    """Tokens the draft forwards at each level: the root (plus ``catch_up``, the expected accepted leaf the draft
    never saw: :func:`leaf_mass`), then the nodes with children."""
    if tree.depth == 0:
        return ()
    parents_at = [set() for _ in range(tree.depth)]  # level -> nodes there with children
    for v in range(1, tree.n_nodes):
        p = tree.parents[v]
        parents_at[tree.depths[p]].add(p)
    return (1 + catch_up if catch_up else 1,) + tuple(len(s) for s in parents_at[1:])


def leaf_mass(tree: Tree, acceptance) -> float:
    """Probability that a step's accepted path ends on a draft leaf: the sum of f(v) over the tree's leaves, f the
    DP's node acceptance (the product of p_rank along the path).  The next step's first draft forward feeds that
    token too, beside the new root."""
    f = node_acceptance(tree, acceptance)
    return float(sum(f[v] for v in range(1, tree.n_nodes) if not tree.children[v]))


def draft_ms(profile: HardwareProfile, widths: Sequence[float]) -> float:
    """All draft levels of a step, each with its level overhead."""
    return sum(float(profile.draft(w)) + profile.level_overhead_ms for w in widths)


def step_ms(profile: HardwareProfile, widths: Sequence[float], n_nodes: int) -> float:
    """Predicted ms of a step drafting levels of ``widths`` and verifying ``n_nodes`` tokens (root included)."""
    return overhead_ms(profile, n_nodes) + draft_ms(profile, widths) + float(profile.target(n_nodes))


def overhead_ms(profile: HardwareProfile, n_nodes: int) -> float:
    """The step overhead, paid by steps that verify a tree (``n_nodes`` > 1), not by plain target steps.

    It is measured on drafting steps (sequoia.runtime.measuring.profiling), and what it holds is theirs: a verification
    forward with its tree, the draft catching up, the walk.  A plain step is one forward of one token, as
    the target alone's is: measured on a 2-vCPU AMD EPYC (AVX-512-BF16), the engine's plain steps took
    111-146 ms (median 118) against target(1) = 125 ms and a step overhead of 18 ms, and Hugging Face
    ``generate`` 125 ms a token.  Charging it to the target alone priced drafting ~13% too well there, and
    Sequoia drafted on chat prompts where it lost to the target alone.
    """
    return profile.step_overhead_ms if n_nodes > 1 else 0.0


def baseline_ms(profile: HardwareProfile) -> float:
    """ms per token of the target alone: one forward of one token (no step overhead: see overhead_ms)."""
    return float(profile.target(1))


def step_cost(tree: Tree, expected: float, profile: HardwareProfile, catch_up: float = 0.0) -> StepCost:
    """Predicted cost of one step with ``tree`` yielding ``expected`` tokens on average; ``catch_up``: the tokens
    the first draft forward feeds beside the root, on average (:func:`leaf_mass` of the tree and the vector)."""
    return StepCost(draft_ms=draft_ms(profile, draft_widths(tree, catch_up)),
                    target_ms=float(profile.target(tree.n_nodes)), expected_tokens=expected,
                    overhead_ms=overhead_ms(profile, tree.n_nodes))


def illustrative_gpu_profile(draft_ratio: float) -> HardwareProfile:
    """A hand-made GPU-like cost model (not a measurement), in units of one target step.

    The target is memory-bound: a forward of n <= 64 tokens costs about one token, then grows
    slowly; a draft forward costs ``draft_ratio`` of a target one (0.05: the paper's 68M/7B pair,
    0.35: a 0.5B draft for a 1.5B target).  For what-if tables only.
    """
    return HardwareProfile.hand_made(target=lambda n: 1.0 + 0.002 * n + 0.01 * max(0, n - 64),
                                     draft=lambda w: draft_ratio * (1.0 + 0.002 * w))


def conservative_profile() -> HardwareProfile:
    """A stand-in for a machine not yet measured, under which no tree pays.

    Verifying k tokens costs k times one (a compute-bound target) and a draft
    level costs something, so a step of L draft tokens costs more than L + 1
    plain steps while yielding at most L + 1 tokens: the optimizer keeps the
    root-only tree and the dynamic tree drafts nothing.  Decoding is then the
    target alone, which is never slower than the target alone.
    """
    t = _CONSERVATIVE_TOKEN_MS
    return HardwareProfile.hand_made(
        target=lambda n: t * n, draft=lambda w: 0.2 * t + 0.05 * t * w,
        target_n=TARGET_GRID, draft_width=DRAFT_GRID, device="conservative stand-in (not measured)",
        note="No measured profile for this machine: a stand-in under which no tree pays, so nothing is drafted.")
