"""One ZeroGPU call: how long to ask for, and whether capturing CUDA graphs inside it pays.

On a ZeroGPU Space each ``@spaces.GPU`` call runs in a process that is fresh for
(almost) every call, so graphs captured in one call are gone in the next: a call
either runs eagerly (launch-bound: a step costs ``eager_step_ms``) or captures the
graphs it needs first (``graphs`` captures of ``capture_s`` each) and then replays
them (a step costs ``eager_step_ms / EAGER_OVER_GRAPH``).  Capturing pays when
the call's steps save more than the captures cost (:func:`capture_pays`).

The duration asked for is the expected time of the request (its new tokens over
the expected tokens per step, times the step time of the mode chosen, plus the
captures; or the target alone's time when that is longer), with a margin and a
fixed part for moving the weights and the prompt's forward, clamped to what
ZeroGPU grants one call (:func:`plan_call`).

A card with no hardware profile of its own (ZeroGPU's, until a Space measures it) is priced with the H100's
measured graph-runner costs at the 1.5B shapes, eager as those times :data:`EAGER_OVER_GRAPH`
(:func:`proxy_profile`): the call's duration and its capture decision then rest on measured numbers of
another card, and say so.

Two numbers here are not measured on ZeroGPU's card (RTX Pro 6000 Blackwell,
sm_120): the capture time per graph (:func:`estimated_capture`: a capture's
anatomy priced in eager forwards) and the eager over graph ratio
(:data:`EAGER_OVER_GRAPH`, measured on an H100).  The ZeroGPU call check
(``scripts/gpu/zerogpu_call_check.py``) measures both on a card; until then each
says so where it is used.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace
from pathlib import Path

from ...core.profiles.cost import draft_widths
from ..._meta import ASSETS
from ...core.profiles.profile import HardwareProfile
from ...core.profiles.projection import load_elsewhere
from ...core.trees.dp import optimal_tree
from ...core.trees.optimizer import choose_tree, predict
from ...runners.hf.graphs.call_graphs import CALL_WINDOW
from ...runners.hf.graphs.graph_runner import BUCKETS, bucket_of, window_of


@dataclass(frozen=True)
class CaptureCost:
    """Seconds to capture one CUDA graph (one bucket of rows at one key window), and where it comes from."""

    per_graph_s: float
    measured: bool
    source: str


#: A capture's anatomy (:class:`~sequoia.runners.hf.graphs.forward_graph.ForwardGraph`): two warm-up forwards on a side
#: stream, the recorded forward, then the graph's instantiation (a few microseconds a kernel, ~1,000 kernels for
#: a 28-layer model): about three eager forwards, priced at twice that until a card times it.
CAPTURE_FORWARDS = 6
#: An eager forward over a graph replay of the same forward: 16.2 / 3.08 ms (0.5B), 20.0 / 4.50 (1.5B) on one
#: H100 (docs/data/gpu-check-h100.md); not measured on an RTX Pro 6000.
EAGER_OVER_GRAPH = 4.4
#: Seconds every call asks for beyond its steps (moving the weights onto the card, the prompt's forward), the
#: margin on the steps' expected time, and ZeroGPU's bounds on one call.
BASE_S, MARGIN, MIN_S, MAX_S = 15.0, 1.5, 20, 300
#: Without a profile to price the steps: a fixed part and seconds per new token (a generous flat rule, not
#: measured on ZeroGPU).
FLAT_BASE_S, PER_TOKEN_S = 20.0, 0.15


#: The card a call is priced on where its own has no profile: the H100's graph runner at the 1.5B shapes (the
#: smaller target: its steps gain the least from graphs, so capturing is decided conservatively).
PROXY = "h100-1.5b"


def graph_profile(name: str = PROXY, assets_dir: str | Path = ASSETS) -> HardwareProfile:
    """A shipped graph-runner profile (``assets/projections/<name>.json``: the H100's, by target shape)."""
    return load_elsewhere(Path(assets_dir) / "projections" / f"{name}.json").profile


def replays(profile: HardwareProfile) -> bool:
    """True for a profile of graph replays measured elsewhere (a shipped projection, no fingerprint)."""
    return profile.fingerprint is None and "cuda graphs" in profile.device.lower()


@functools.lru_cache(maxsize=4)
def proxy_profile(assets_dir: str | Path = ASSETS, name: str = PROXY) -> HardwareProfile:
    """The eager profile a call is priced with on a card not profiled yet: :data:`PROXY`'s graph-runner costs
    times :data:`EAGER_OVER_GRAPH` (every forward and the step's host work), so that :func:`plan_call`'s graph
    step is the H100's measured replay."""
    return eager_of(graph_profile(name, assets_dir))


def eager_of(graphs: HardwareProfile) -> HardwareProfile:
    """A graph-runner profile as the eager one of the same card: every cost times :data:`EAGER_OVER_GRAPH`."""
    k = EAGER_OVER_GRAPH
    return replace(graphs, device=f"CUDA, priced as {graphs.device} (eager = graphs x {k})",
                   target_ms=tuple(x * k for x in graphs.target_ms), draft_ms=tuple(x * k for x in graphs.draft_ms),
                   step_overhead_ms=graphs.step_overhead_ms * k, level_overhead_ms=graphs.level_overhead_ms * k,
                   contexts=())


@dataclass(frozen=True)
class CallPlan:
    """What one ZeroGPU call will do and ask for."""

    duration_s: int          # what @spaces.GPU(duration=...) asks for
    capture: bool            # capture the call's graphs before its steps
    steps: int               # expected steps of the request
    graphs: int              # graphs the request's forwards need
    eager_s: float           # expected seconds of the steps, eager
    graphs_s: float          # expected seconds with graphs, captures included
    reason: str              # one sentence: why this mode, which numbers are not measured


def estimated_capture(profile: HardwareProfile) -> CaptureCost:
    """Seconds to capture one graph on the card ``profile`` measured eagerly: :data:`CAPTURE_FORWARDS` of its
    dearer one-row forward (not measured: said so)."""
    per = CAPTURE_FORWARDS * max(float(profile.target(1)), float(profile.draft(1))) / 1e3
    return CaptureCost(per, False, f"not measured (estimated: {CAPTURE_FORWARDS} eager forwards, {per:.2f} s a graph)")


def graphs_needed(draft_widths: tuple[int, ...], verify_rows: int, context: int, new_tokens: int,
                  buckets: tuple[int, ...] = BUCKETS, capacity: int = 4096, min_window: int = CALL_WINDOW) -> int:
    """(bucket, window) graphs a request's forwards replay: one per bucket of the draft's level widths and one
    for the verify forward, at every key window the context passes through (the prompt's own forward is eager;
    a call's runners attend to at least ``min_window`` keys, :data:`~sequoia.runners.hf.graphs.call_graphs.CALL_WINDOW`)."""
    top = context + new_tokens + verify_rows
    windows = {window_of(max(n, min_window), capacity) for n in range(context, top + 1, 64)}
    windows.add(window_of(max(top, min_window), capacity))
    draft = {bucket_of(w, buckets) for w in draft_widths} - {None}
    target = {bucket_of(verify_rows, buckets)} - {None}
    return (len(draft) + len(target)) * len(windows)


def capture_pays(steps: int, eager_step_s: float, graph_step_s: float, graphs: int, capture_s: float) -> bool:
    """True when capturing ``graphs`` (``capture_s`` each) and replaying them beats running every step eagerly."""
    if steps < 0 or graphs < 0 or min(eager_step_s, graph_step_s, capture_s) < 0:
        raise ValueError("steps, graphs and times must be non-negative")
    return graphs * capture_s + steps * graph_step_s < steps * eager_step_s


def plan_call(new_tokens: int, profile: HardwareProfile | None, acceptance, context: int = 128,
              capture: CaptureCost | None = None, eager_over_graph: float = EAGER_OVER_GRAPH,
              n_runs: int = 1, tree: tuple[int, int] | None = None, graphs_ok: bool = True) -> CallPlan:
    """The plan of a call decoding ``new_tokens`` ``n_runs`` times with the tree ``profile`` chooses for
    ``acceptance`` (the profile measured eagerly on this card); without a profile, the flat per-token rule.
    ``tree`` (budget, depth): the request's own fixed tree, priced too (on a CPU a big tree's verify forward
    costs many one-token forwards: the call must last for it).  ``graphs_ok=False``: the runner is eager
    whatever would pay (SEQUOIA_CALL_GRAPHS=0), so every step is priced eager."""
    if not isinstance(new_tokens, int) or new_tokens < 0 or n_runs < 1:
        raise ValueError(f"new_tokens must be a non-negative integer and n_runs >= 1, got {new_tokens!r}, {n_runs!r}")
    if profile is None:
        seconds = PER_TOKEN_S * new_tokens * n_runs
        return CallPlan(_clamp(FLAT_BASE_S + seconds), False, 0, 0, seconds, math.inf,
                        f"no hardware profile yet: {PER_TOKEN_S} s a token, eager")
    capture = capture or estimated_capture(profile)
    choice = choose_tree(acceptance, profile)
    steps = math.ceil(new_tokens / max(choice.expected_tokens, 1.0)) * n_runs
    eager_step = choice.cost.total_ms / 1e3
    widths = tuple(draft_widths(choice.tree)) if choice.budget else ()
    graphs = graphs_needed(widths, choice.tree.n_nodes, context, new_tokens)
    graphs_s = graphs * capture.per_graph_s + steps * eager_step / eager_over_graph
    eager_s = steps * eager_step
    # CUDA graphs only on a GPU's profile (the stand-in serves a CPU's: its steps run as measured)
    take = graphs_ok and not profile.device.lower().startswith("cpu") and \
        capture_pays(steps, eager_step, eager_step / eager_over_graph, graphs, capture.per_graph_s)
    # The request's method may be slower than the profile's tree (the target alone: one token a step), and a
    # call that outlives its duration is cut off: price the slower of the two.
    alone_s = new_tokens * n_runs * (float(profile.target(1)) + profile.step_overhead_ms) / 1e3
    asked_s = _asked_tree_s(tree, new_tokens * n_runs, acceptance, profile)
    worst = max(graphs_s, graphs * capture.per_graph_s + max(alone_s, asked_s) / eager_over_graph) if take else \
        max(eager_s, alone_s, asked_s)
    unmeasured = [] if capture.measured else [f"capture time {capture.source}"]
    unmeasured.append(f"eager/graph ratio {eager_over_graph} (H100, not measured on this card)")
    reason = (f"{steps} steps of the profile's tree: eager {eager_s:.1f} s, with {graphs} graphs captured "
              f"{graphs_s:.1f} s, so {'capture' if take else 'eager'}; priced at {worst:.1f} s (the slowest of "
              "that tree, the target alone and the request's own tree); " + "; ".join(unmeasured))
    return CallPlan(_clamp(BASE_S + MARGIN * worst), take, steps, graphs, eager_s, graphs_s, reason)


def _asked_tree_s(tree: tuple[int, int] | None, tokens: int, acceptance, profile: HardwareProfile) -> float:
    """Expected seconds of ``tokens`` decoded with the DP tree of the request's (budget, depth), eager."""
    if not tree or tree[0] < 1 or tokens == 0:
        return 0.0
    budget, depth = int(tree[0]), max(int(tree[1]), 1)
    cost = predict(optimal_tree(acceptance, budget, depth).tree(budget, depth), acceptance, profile)
    return math.ceil(tokens / max(cost.expected_tokens, 1.0)) * cost.total_ms / 1e3


def _clamp(seconds: float) -> int:
    return int(min(MAX_S, max(MIN_S, math.ceil(seconds))))
