"""The race: the guided example's tree on the runtime where trees pay, against that runtime's target alone and the
serving runtime's target alone, in interleaved rounds, told in one sentence with the three rates and why.

Pure functions of data (no model, no Gradio): which runtime the race offers (:func:`offer`, from each runtime's
profile), the order its runs go in (:func:`schedule`: A B C, A B C, ... so a busy machine's slow minute
falls on all three), each lane's rate with its band (:func:`band`), the sentence (:func:`sentence`) and the
figure (:func:`figure`).  Why a race: on a CPU with bf16 matrix kernels (AVX-512-BF16, AMX) torch verifies 16
tokens for about the price of one, so a tree pays there, while llama.cpp's 4-bit target alone is faster still
(verifying 16 tokens costs ~6.5x one on it): both facts are the lesson of speculative decoding, and neither
shows with one runtime on the page.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import plotly.graph_objects as go

from sequoia.core.profiles.profile import HardwareProfile
from sequoia.core.profiles.runtimes import display_name
from sequoia.core.statistics.words import counted
from sequoia.core.trees.optimizer import choose_tree

#: Tokens whose verification the sentence prices against one token's (the profile's largest measured, if fewer).
SHOWN_TOKENS = 16
#: Default timed rounds: three runs a round.
ROUNDS = 3
#: A tree is offered where the optimizer predicts at least this ratio to its runtime's target alone.
PAYS = 1.2


@dataclass(frozen=True)
class Lane:
    """One of the race's three runs."""

    key: str          # "tree", "alone", "serving"
    backend: str      # the runtime it runs on (sequoia.core.profiles.runtimes.BACKENDS)
    method: str       # the engine's method name: "sequoia-auto" or "ar"

    @property
    def label(self) -> str:
        what = "Sequoia (auto)" if self.method != "ar" else "target alone"
        return f"{what} on {display_name(self.backend)}"


@dataclass(frozen=True)
class Offer:
    """The race this machine's profiles offer: the tree's runtime, the serving one, and what each verify costs."""

    tree_backend: str
    serving_backend: str
    predicted_ratio: float                  # the tree's predicted rate over its runtime's target alone
    verify_ratio: Mapping[str, float]       # backend -> cost of SHOWN_TOKENS tokens over one, from its profile
    shown_tokens: int = SHOWN_TOKENS

    def lanes(self) -> tuple[Lane, Lane, Lane]:
        return (Lane("tree", self.tree_backend, "sequoia-auto"), Lane("alone", self.tree_backend, "ar"),
                Lane("serving", self.serving_backend, "ar"))


@dataclass(frozen=True)
class Band:
    """A lane's rates over the rounds: the median with the slowest and fastest round."""

    median: float
    low: float
    high: float
    rounds: int

    @property
    def text(self) -> str:
        return f"{self.median:.1f} tokens/s ({self.low:.1f}-{self.high:.1f} over {counted(self.rounds, 'round')})"


def verify_ratio(profile: HardwareProfile, tokens: int = SHOWN_TOKENS) -> tuple[float, int]:
    """(cost of verifying ``tokens`` tokens over one token's, the tokens actually priced) by ``profile``."""
    n = min(tokens, max(profile.target_n))
    return float(profile.target(n)) / float(profile.target(1)), n


def tree_ratio(profile: HardwareProfile, acceptance: Sequence[float]) -> float:
    """The optimizer's best tree (up to 64 tokens) over the target alone, predicted by ``profile``."""
    return float(choose_tree(acceptance, profile, max_budget=min(64, profile.max_tokens - 1)).speedup)


def offer(serving: str, profiles: Mapping[str, HardwareProfile], acceptance: Sequence[float]) -> Offer | None:
    """The race to offer: a runtime other than ``serving`` where the optimizer's tree is predicted at >= PAYS times
    that runtime's target alone (the best such), or None (no other runtime profiled, or no tree pays on one)."""
    if serving not in profiles:
        return None
    best: tuple[float, str] | None = None
    for backend, prof in profiles.items():
        if backend == serving or same_target(backend, serving):
            continue
        speedup = tree_ratio(prof, acceptance)
        if speedup >= PAYS and (best is None or speedup > best[0]):
            best = (speedup, backend)
    if best is None:
        return None
    ratios = {b: verify_ratio(profiles[b]) for b in (best[1], serving)}
    return Offer(best[1], serving, best[0], {b: r for b, (r, _) in ratios.items()},
                 min(n for _, n in ratios.values()))


def same_target(a: str, b: str) -> bool:
    """Two runtimes running one target (torch's: the Hugging Face runtime and the mixed one, whose draft alone is
    on llama.cpp): racing them races one target alone against itself, and a tree there shows on the page as it
    serves, with no race."""
    return {a, b} == {"hf", "mixed"}


def serving_pays_line(serving: str, profile: HardwareProfile, acceptance: Sequence[float]) -> str:
    """Where the runtime serving makes a tree pay itself (torch on AMX): no race is needed, the Live tab's own runs
    show it; one line with its arithmetic ("" where no tree pays on it)."""
    ratio = tree_ratio(profile, acceptance)
    if ratio < PAYS:
        return ""
    r, n = verify_ratio(profile)
    name = display_name(serving)
    return (f"**A tree pays on the runtime serving:** verifying {n} tokens costs {r:.1f}x one token on {name} "
            f"(this machine's profile), so Sequoia (auto) is predicted at {ratio:.1f}x its target alone here: run "
            "the guided example with Sequoia (auto), or Compare, to see it measured (no race between runtimes needed).")


def no_race_line(profiles: Mapping[str, HardwareProfile], acceptance: Sequence[float],
                 missing: Sequence[str] = ()) -> str:
    """Where no runtime makes a tree pay: one line with each profiled runtime's arithmetic (its cost of verifying
    SHOWN_TOKENS tokens over one, its best tree's predicted ratio) and what to look at instead (the projection);
    ``missing``: installed runtimes with no profile here, named with the command that measures one."""
    parts = []
    for backend, prof in profiles.items():
        r, n = verify_ratio(prof)
        parts.append(f"on {display_name(backend)} verifying {n} tokens costs {r:.1f}x one, so its best tree is "
                     f"predicted at {tree_ratio(prof, acceptance):.2f}x its target alone")
    unmeasured = "".join(f"; {display_name(b)} is not profiled here (`python -m sequoia profile --backend {b}` "
                         "measures it)" for b in missing)
    return (f"No race between runtimes here: no tree pays on this CPU ({'; '.join(parts)}{unmeasured}). A tree pays "
            "where verifying many tokens costs about one (bf16 matrix kernels, a GPU): the projection under each "
            "Live run's summary shows what its trees would do on an H100.")


def schedule(lanes: Sequence[Lane], rounds: int = ROUNDS) -> list[tuple[int, Lane]]:
    """(round, lane) in the order to run them: every lane once a round, in the same order."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    return [(r, lane) for r in range(rounds) for lane in lanes]


def band(rates: Sequence[float]) -> Band:
    """The median rate and its range over the rounds."""
    if not rates:
        raise ValueError("band: no rates")
    return Band(statistics.median(rates), min(rates), max(rates), len(rates))


def bands(results: Sequence[tuple[Lane, float]]) -> dict[str, Band]:
    """lane key -> its band, from (lane, tokens/s) of every run."""
    by_key: dict[str, list[float]] = {}
    for lane, rate in results:
        by_key.setdefault(lane.key, []).append(rate)
    return {key: band(rates) for key, rates in by_key.items()}


def ratio_band(over: Band, under: Band) -> tuple[float, float, float]:
    """(median ratio, lowest, highest) of one band over another: the extremes pair the extremes."""
    return over.median / under.median, over.low / under.high, over.high / under.low


def sentence(race: Offer, got: Mapping[str, Band]) -> str:
    """One sentence with the three rates, the tree's ratio with its band, and why, from each runtime's verify."""
    tree, alone, serving = got["tree"], got["alone"], got["serving"]
    t_name, s_name = display_name(race.tree_backend), display_name(race.serving_backend)
    mid, lo, hi = ratio_band(tree, alone)
    same = " (the same within noise)" if lo <= 1.0 <= hi else ""
    fastest = max(got, key=lambda k: got[k].median)
    winner = {"tree": f"the tree on {t_name}", "alone": f"the target alone on {t_name}",
              "serving": f"the target alone on {s_name}"}[fastest]
    n = race.shown_tokens
    return (f"Sequoia (auto) on {t_name} decoded {tree.text}, {mid:.2f}x ({lo:.2f}-{hi:.2f}) its target alone's "
            f"{alone.median:.1f}{same}, because verifying {n} tokens costs {race.verify_ratio[race.tree_backend]:.1f}x "
            f"one there; the target alone on {s_name} decoded {serving.text}, where {n} tokens cost "
            f"{race.verify_ratio[race.serving_backend]:.1f}x one; fastest here: {winner}.")


def figure(lanes: Sequence[Lane], got: Mapping[str, Band]) -> go.Figure:
    """One bar per lane at its median rate, the whisker its range over the rounds."""
    shown = [lane for lane in lanes if lane.key in got]
    med = [got[lane.key].median for lane in shown]
    fig = go.Figure(go.Bar(
        x=[lane.label for lane in shown], y=med, text=[f"{m:.1f}" for m in med], textposition="outside",
        error_y=dict(type="data", symmetric=False, array=[got[lane.key].high - m for lane, m in zip(shown, med)],
                     arrayminus=[m - got[lane.key].low for lane, m in zip(shown, med)]),
        marker_color=["#2ca02c" if lane.key == "tree" else "#7f7f7f" for lane in shown]))
    fig.update_layout(title="The race: tokens/s, median of interleaved rounds (whiskers: slowest and fastest)",
                      yaxis_title="tokens/s (end to end)", height=360, margin=dict(t=50, b=40, l=50, r=10))
    return fig
