"""The engine of one GPU call: a static tree's shapes captured before the generation that replays them.

Why: a graph captured during a step makes that step as slow as the capture, and a
decode rate taken over such steps is the capture's, not the replays'.  Before each
generation the shapes its proposer's tree will replay
(:func:`planned_buckets`) are captured
(:meth:`sequoia.runners.hf.graphs.call_graphs.CallGraphs.prepare`); the captures count in
the call's time, never in a step's.  A shape nobody planned is captured the second
time it is met (:class:`~sequoia.runners.hf.graphs.call_graphs.CallGraphRunner`).
"""

from __future__ import annotations

from ..core.profiles.cost import draft_widths
from ..runners.hf.graphs.call_graphs import CallGraphs
from ..runners.hf.graphs.forward_graph import bucket_of
from .engine import SpeculativeEngine


class CallEngine(SpeculativeEngine):
    """The engine of one call: before each generation, the shapes its proposer's tree will replay are captured
    (:meth:`CallGraphs.prepare`), so that no step's time holds a capture; other shapes are captured the second
    time they are met."""

    def __init__(self, pair, graphs: CallGraphs) -> None:
        super().__init__(pair)
        self.call_graphs = graphs

    def generate(self, prompt_ids, proposer, config, *args, **kwargs):
        draft, target = planned_buckets(proposer)
        self.call_graphs.prepare(draft, target, len(prompt_ids) + config.max_new_tokens + proposer.max_nodes + 1)
        return super().generate(prompt_ids, proposer, config, *args, **kwargs)


def planned_buckets(proposer) -> tuple[set[int], set[int]]:
    """(draft buckets, target buckets) a static tree's steps replay: each draft level's width (the first level
    with and without the caught-up leaf) and the verify forward's rows; the target alone's one row.  A proposer
    whose trees change from step to step plans nothing (its shapes are captured when met twice)."""
    tree = getattr(proposer, "tree", None)
    if tree is None:
        return set(), set()
    if tree.size == 0:
        return set(), {1}
    widths = [int(w) for w in draft_widths(tree)]
    draft = {bucket_of(w) for w in [widths[0] + 1, *widths]} - {None}
    return draft, {bucket_of(tree.n_nodes)} - {None}
