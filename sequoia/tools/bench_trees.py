"""Which Sequoia tree the bench runs, per prompt set and temperature.

Sequoia's tree depends on the workload (the acceptance vector of the pair on
that kind of prompt, at that temperature) and on the machine (the hardware
profile).  The bench looks for measured vectors in a directory of
``sequoia-acceptance/1`` files, picks the best-matching one for every
(prompt set, temperature) and hands it with the profile to
:func:`sequoia.core.optimizer.choose_tree`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from .bench import PromptSet, TreeChoice

_SAME_T = 1e-9


def acceptance_files(directory: str | Path | None, pair: str | None = None) -> list:
    """Every acceptance vector in ``directory`` (measured for ``pair`` when given); other files are skipped."""
    from ..runtime.acceptance import AcceptanceVector

    if directory is None or not Path(directory).is_dir():
        return []
    out = []
    for path in sorted(Path(directory).glob("*.json")):
        try:
            vec = AcceptanceVector.load(path)
        except ValueError:
            continue  # not an acceptance file (or a broken one): the bench must not die on it
        if pair is None or not vec.pair or vec.pair == pair:
            out.append((str(path), vec))
    return out


def pick_acceptance(files: Sequence, prompt_set: str, temperature: float) -> tuple[tuple[float, ...], str]:
    """The vector for (prompt set, temperature): same set and T, else same T, else nearest T, else the default.

    Returns (values, source) where source is the file path or ``"default"``.
    """
    from ..runtime.methods import DEFAULT_ACCEPTANCE

    usable = [(path, vec) for path, vec in files if vec.top_p == 1.0 and vec.top_k == 0]
    same_t = [f for f in usable if abs(f[1].temperature - temperature) <= _SAME_T]
    # At T > 0 a vector measured at a nearby temperature beats the greedy default.
    candidates = same_t or (usable if temperature > 0 else [])
    if candidates:
        def rank(item):
            path, vec = item
            other_set = vec.prompt_set != prompt_set and prompt_set not in Path(path).stem
            return abs(vec.temperature - temperature), other_set, path

        path, vec = min(candidates, key=rank)
        return tuple(vec.values), path
    return tuple(DEFAULT_ACCEPTANCE), "default"


def find_profile(directory: str | Path | None, pair: str, dtype: str):
    """The newest hardware profile in ``directory`` measured for this pair and target dtype, or None."""
    from ..core.profile import HardwareProfile

    if directory is None or not Path(directory).is_dir():
        return None
    found = []
    for path in Path(directory).glob("*.json"):
        try:
            prof = HardwareProfile.load(path)
        except (ValueError, json.JSONDecodeError):
            continue
        if prof.pair == pair and prof.dtype == dtype:
            found.append(prof)
    return max(found, key=lambda p: p.date) if found else None


def choose_trees(prompt_sets: Sequence[PromptSet], temperatures: Sequence[float], files: Sequence, profile,
                 max_budget: int | None = None, max_depth: int | None = 16,
                 fixed_budget: int | None = None) -> list[TreeChoice]:
    """One tree per (prompt set, temperature): the optimizer's choice, or with ``fixed_budget`` the DP tree
    of exactly that budget (the paper's fixed-size Sequoia; the profile then only predicts its speed)."""
    from ..core.dp import optimal_tree
    from ..core.optimizer import choose_tree, predict

    out = []
    for s in prompt_sets:
        for temp in temperatures:
            values, source = pick_acceptance(files, s.name, temp)
            if fixed_budget is None:
                choice = choose_tree(values, profile, max_budget=max_budget, max_depth=max_depth)
                tree, speedup, expected = choice.tree, choice.speedup, choice.expected_tokens
            else:
                tree = optimal_tree(values, fixed_budget, max_depth).tree()
                cost = predict(tree, values, profile)
                speedup, expected = profile.target(1) / cost.ms_per_token, cost.expected_tokens
            out.append(TreeChoice(prompt_set=s.name, temperature=temp, tree=tree, acceptance=values,
                                  acceptance_source=source, predicted_speedup=speedup, expected_tokens=expected))
    return out


def dynamic_proposers(prompt_sets: Sequence[PromptSet], temperatures: Sequence[float], files: Sequence, profile,
                      calibration_dir: str | Path | None, pair: str | None = None, budget: int | None = None,
                      max_depth: int | None = 16) -> dict:
    """(prompt set, temperature) -> a ``sequoia-dynamic`` proposer: priced by ``profile``, with the
    calibration nearest in temperature from ``calibration_dir`` (identity without one) and the acceptance
    vector :func:`pick_acceptance` gives as its prior."""
    from ..runtime.calibration import find_calibration
    from ..runtime.methods import make_method

    out = {}
    for s in prompt_sets:
        for temp in temperatures:
            values, _ = pick_acceptance(files, s.name, temp)
            out[(s.name, temp)] = make_method("sequoia-dynamic", acceptance=values, profile=profile,
                                              budget=budget, depth=max_depth,
                                              calibration=find_calibration(calibration_dir, temp, pair))
    return out
