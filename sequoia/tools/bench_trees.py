"""Which Sequoia tree the bench runs, per prompt set and temperature.

Sequoia's tree depends on the workload (the acceptance vector of the pair on
that kind of prompt, at that temperature) and on the machine (the hardware
profile).  The vectors and calibrations are chosen by :mod:`sequoia.runtime.measuring.finder`
(the same rule as the app's and the CLI's) and handed with the profile to
:func:`sequoia.core.trees.optimizer.choose_tree`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from .._meta import ASSETS
from ..core.profiles.cost import baseline_ms
from ..core.trees.dp import optimal_tree
from ..core.trees.optimizer import choose_tree, predict
from ..runtime.measuring.finder import AcceptanceEntry, find_acceptance, find_calibration
from ..runtime.methods import make_method
from .bench import PromptSet, TreeChoice


def choose_trees(prompt_sets: Sequence[PromptSet], temperatures: Sequence[float],
                 entries: Sequence[AcceptanceEntry], profile, max_budget: int | None = None,
                 max_depth: int | None = 16, fixed_budget: int | None = None) -> list[TreeChoice]:
    """One tree per (prompt set, temperature): the optimizer's choice, or with ``fixed_budget`` the DP tree
    of exactly that budget (the paper's fixed-size Sequoia; the profile then only predicts its speed).
    ``entries``: the acceptance vectors to choose from (:func:`sequoia.runtime.measuring.finder.list_acceptance`)."""
    out = []
    for s in prompt_sets:
        for temp in temperatures:
            entry = find_acceptance(s.name, temp, entries=entries)
            values, source = entry.values, entry.label
            if fixed_budget is None:
                choice = choose_tree(values, profile, max_budget=max_budget, max_depth=max_depth)
                tree, speedup, expected = choice.tree, choice.speedup, choice.expected_tokens
            else:
                tree = optimal_tree(values, fixed_budget, max_depth).tree()
                cost = predict(tree, values, profile)
                speedup, expected = baseline_ms(profile) / cost.ms_per_token, cost.expected_tokens
            out.append(TreeChoice(prompt_set=s.name, temperature=temp, tree=tree, acceptance=values,
                                  acceptance_source=source, predicted_speedup=speedup, expected_tokens=expected))
    return out


def dynamic_proposers(prompt_sets: Sequence[PromptSet], temperatures: Sequence[float],
                      entries: Sequence[AcceptanceEntry], profile, assets_dir: str | Path = ASSETS,
                      pair: str | None = None, budget: int | None = None, max_depth: int | None = None) -> dict:
    """(prompt set, temperature) -> a ``sequoia-dynamic`` proposer: priced by ``profile``, with the
    calibration under ``assets_dir`` nearest in temperature (identity without one) and the acceptance
    vector :func:`sequoia.runtime.measuring.finder.find_acceptance` picks from ``entries`` as its prior; ``max_depth``
    None: the proposer's own cap (:data:`sequoia.runtime.proposers.dynamic.MAX_DEPTH`)."""
    out = {}
    for s in prompt_sets:
        for temp in temperatures:
            entry = find_acceptance(s.name, temp, entries=entries)
            out[(s.name, temp)] = make_method("sequoia-dynamic", acceptance=entry.values, profile=profile,
                                              budget=budget, depth=max_depth,
                                              calibration=find_calibration(temp, assets_dir, pair))
    return out
