"""How well the calibration fits the prompt at hand, from what verification saw (the dynamic tree's scale).

The dynamic tree (:mod:`sequoia.runtime.proposers.dynamic`) estimates a drawn child's
acceptance from the draft's probability and the child's rank, through a
calibration measured on the shipped calibration prompts
(:mod:`sequoia.core.profiles.calibration`).  On prompts unlike those the draft agrees
with the target less often, and a tree sized for the calibration's estimate
verifies more tokens than pay: on held-out retrieval prompts of 617-779 tokens
the dynamic tree accepted 0.76-0.91 of the tokens it predicted (Intel Xeon,
AVX-512-BF16 + AMX, one thread; ``scripts/measure/check_context_prices.py``), while the
profile priced its forwards at that context as well as the target alone's.

:class:`PromptFit` keeps, over one generation, the drawn children of nodes that
verification reached (the root and the accepted nodes): each child's predicted
acceptance before scaling (the calibration's marginal chance that it is the
child accepted) and whether it was.  The scale is observed over expected, with
:data:`PRIOR` pseudo-tokens at a ratio of 1 so that a few steps cannot swing it
(each step's evidence weighs :data:`DECAY` less per later step, so the scale
follows a prompt whose difficulty changes), and it is kept in
[:data:`MIN_SCALE`, 1]: a child's acceptance is the calibration's times the
scale.  Never above 1: siblings' marginal acceptances add up to at most 1, which
a larger factor could break; a prompt easier than the calibration keeps the
calibration's estimate.

Losslessness: the scale changes which tree is drafted, never verification, and
it reads only past steps' outcomes, so it is reproducible from a seed.
"""

from __future__ import annotations

from collections.abc import Mapping

from ...core.statistics.trace import ACCEPTED, StepRecord

#: Pseudo-tokens of evidence at a ratio of 1 (the calibration trusted) before any step is seen.
PRIOR = 4.0
#: Weight of a step's evidence one step later (about the last 20 steps count).
DECAY = 0.95
#: Lowest scale: a prompt the draft never gets right still drafts what a quarter of the calibration's
#: estimate pays for (the price gate, not this scale, decides when no draft pays at all).
MIN_SCALE = 0.25


class PromptFit:
    """Observed over expected acceptance of drawn children this generation; :attr:`scale` multiplies estimates."""

    def __init__(self) -> None:
        self.start()

    def start(self) -> None:
        """A new generation: no evidence, scale 1."""
        self.observed = 0.0     # accepted drawn children of reached nodes (decayed sum)
        self.expected = 0.0     # their predicted acceptance, unscaled (decayed sum)

    @property
    def scale(self) -> float:
        ratio = (self.observed + PRIOR) / (self.expected + PRIOR)
        return min(1.0, max(MIN_SCALE, ratio))

    def observe(self, record: StepRecord, predicted: Mapping[int, float]) -> None:
        """One verified step: ``predicted`` maps each drawn node of its tree to its unscaled acceptance."""
        if not predicted:
            return
        if max(predicted) >= record.tree.n_nodes:
            raise ValueError(f"predicted acceptance for node {max(predicted)} of a {record.tree.n_nodes}-node tree")
        reached = {0} | {v for v, s in enumerate(record.status) if s == ACCEPTED}
        seen = [(a, record.status[v] == ACCEPTED) for v, a in predicted.items() if record.tree.parents[v] in reached]
        self.observed = DECAY * self.observed + sum(1.0 for _, ok in seen if ok)
        self.expected = DECAY * self.expected + sum(a for a, _ in seen)
