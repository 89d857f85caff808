"""Why it pays there and not here: a run projected onto the machines the project measured, in words and a figure.

:func:`projection_lines` says, for each shipped machine (:func:`sequoia.core.profiles.projection.shipped_elsewhere`)
and this one's profile, what a finished run's trees would do there (:func:`sequoia.core.profiles.projection.project`).
A run that drew no tree would be the target alone anywhere, so for it the lines price, instead, the tree the
optimizer picks there for the code prompts' measured acceptance.  :func:`projection_markdown` and
:func:`roofline_figure` are the app's two entry points (the Live tab's summary, the Hardware tab's figure).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

from sequoia.core.profiles.profile import HardwareProfile
from sequoia.core.profiles.projection import Elsewhere, Projection, decoding_steps, project, shipped_elsewhere
from sequoia.core.statistics.trace import StepRecord
from sequoia.core.trees.optimizer import Choice, choose_tree

from components.widgets import roofline_view

if TYPE_CHECKING:
    # the finder loads the runtime (transformers): a view names its type only
    from sequoia.runtime.measuring.finder import AcceptanceEntry

HERE = "this machine (by its profile)"
PROJECTED = "projected from measured costs"


@lru_cache(maxsize=4)
def elsewhere(assets_dir: Path) -> tuple[Elsewhere, ...]:
    """The shipped machines, read once per folder (an unreadable file: none, rather than a failing summary)."""
    try:
        return shipped_elsewhere(assets_dir)
    except (OSError, ValueError):
        return ()


def machines(here: HardwareProfile | None, shipped: Sequence[Elsewhere]) -> list[tuple[str, HardwareProfile]]:
    """(label, profile) of every shipped machine, then this one's when it has a profile."""
    return [(e.label, e.profile) for e in shipped] + ([(HERE, here)] if here is not None else [])


def projection_line(p: Projection) -> str:
    return (f"On {p.label} this run's trees would run at **{p.tokens_per_s:.0f} tokens/s, {p.speedup:.2f}× the "
            f"target alone** ({p.alone_tokens_per_s:.0f} tokens/s; {PROJECTED}).")


def choice_line(label: str, c: Choice) -> str:
    if not c.budget:
        return f"On {label} no tree pays for this acceptance either: the target alone ({PROJECTED})."
    return (f"On {label} its tree of {c.budget} draft tokens, depth {c.depth}, would run at "
            f"**{1e3 / c.ms_per_token:.0f} tokens/s, {c.speedup:.2f}× the target alone** ({PROJECTED}).")


@lru_cache(maxsize=16)
def _choice(profile: HardwareProfile, acceptance: tuple[float, ...]) -> Choice:
    return choose_tree(acceptance, profile)


def projection_lines(records: Sequence[StepRecord], here: HardwareProfile | None,
                     shipped: Sequence[Elsewhere], acceptance: AcceptanceEntry,
                     temperature: float | None = None) -> list[str]:
    """The summary's lines for a finished run ([] when it has no decoding step); ``temperature``: the run's, said
    beside the vector's where the two differ (None: not said)."""
    steps = decoding_steps(records)
    if not steps:
        return []
    found = machines(here, shipped)
    if any(r.tree.n_nodes > 1 for r in steps):
        per_call = sum(r.n_new for r in steps) / len(steps)
        head = (f"**Where this run would pay**: its trees and accepted tokens ({per_call:.2f} a target call) do not "
                f"depend on the device; each machine's measured costs price them.")
        return [head] + [projection_line(project(records, prof, label)) for label, prof in found]
    kind = f"{acceptance.kind} prompts'" if acceptance.kind else "the"
    apart = (f"; this run sampled at T={temperature:g}, where no offered vector was measured"
             if temperature is not None and abs(acceptance.temperature - temperature) > 1e-6 else "")
    head = (f"**Where a tree would pay**: this run drew no tree, so it would be the target alone anywhere. "
            f"Sequoia's tree for {kind} measured acceptance (T={acceptance.temperature:g}, “{acceptance.label}”"
            f"{apart}), priced by each machine's measured costs:")
    return [head] + [choice_line(label, _choice(prof, tuple(acceptance.values))) for label, prof in found]


def projection_markdown(records: Sequence[StepRecord], ctx, acceptance: AcceptanceEntry,
                        temperature: float | None = None) -> str:
    """The Live tab's projection of a finished run (``ctx``: the app's context; "" before any decoding step);
    ``acceptance``: what prices the tree a run without one would have drawn; ``temperature``: the run's."""
    return "  \n".join(projection_lines(records, ctx.profile, elsewhere(Path(ctx.assets_dir)), acceptance,
                                        temperature))


def roofline_figure(ctx):
    """The Hardware tab's roofline picture: this machine's measured curve beside every shipped one."""
    data = roofline_view.roofline_data(ctx.profile, elsewhere(Path(ctx.assets_dir)), here_label="this machine")
    return roofline_view.figure(data)
