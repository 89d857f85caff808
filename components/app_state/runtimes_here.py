"""The runtimes of this machine side by side: each one's profile, and which is fastest by them.

One :class:`~sequoia.runtime.measuring.runtime_choice.RuntimeDecision` per acceptance vector and limits, decided by the
same rule the server chose its runtime with at start (:func:`sequoia.runtime.measuring.runtime_choice.decide`), so the
Hardware tab's "fastest" line, the live summary's and the choice agree.  Reading the profiles and solving a
DP per runtime is kept in the profile room (:meth:`components.app_state.profile_room.ProfileRoom.derived`): computed
once per profile in use, not per decode.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from sequoia.runtime.measuring.runtime_choice import (MAX_BUDGET, MAX_DEPTH, FoundProfile, RuntimeDecision, decide,
                                                      display_name, machine_here, profiles_here)
from sequoia.runtime.models import BACKENDS

from components.app_state.context import AppContext
from components.app_state.profile_room import ProfileRoom


def runtimes_here(ctx: AppContext, acceptance: Sequence[float], budget: int = MAX_BUDGET,
                  depth: int = MAX_DEPTH) -> tuple[dict[str, FoundProfile], RuntimeDecision]:
    """(backend -> its profile here, the decision) for ``acceptance`` and trees within ``budget`` / ``depth``:
    the loaded pair's own profile for its runtime, the finder's for the others."""
    loaded = ctx.pair().backend if ctx.loaded else None
    device = str(ctx.pair().device) if ctx.loaded else None
    vector = tuple(float(a) for a in acceptance)
    timed = tuple(sorted(ctx.hardware.later_probes))   # a runtime timed in the background since: decided anew
    return ctx.hardware.derived(("runtimes", loaded, vector, int(budget), int(depth), timed),
                                lambda: _decide_here(ctx.hardware, loaded, device, vector, int(budget), int(depth)))


def _decide_here(hardware: ProfileRoom, loaded: str | None, device: str | None, acceptance: tuple[float, ...],
                 budget: int, depth: int) -> tuple[dict[str, FoundProfile], RuntimeDecision]:
    started = hardware.runtime
    machine = started.machine if started is not None and started.machine is not None else machine_here(device)
    known = {loaded: FoundProfile(hardware.profile, "in use")} \
        if loaded in BACKENDS and hardware.profile is not None else {}
    found = profiles_here(machine, hardware.cache_dir, hardware.assets_dir, known)
    # the targets alone timed at start rank the runtimes here too, while no profile does (decide ignores them then)
    probes = {r.backend: r.probe for r in started.runtimes if r.probe is not None} if started is not None else {}
    probes.update(hardware.later_probes)   # timed in the background since start
    decision = decide(machine, found, acceptance, budget, depth, probes=probes)
    if started is not None and started.explicit:   # SEQUOIA_BACKEND named it: say so, as the banner does
        decision = replace(decision, backend=started.backend, reason=started.reason, explicit=True)
    return {b: found[b] for b in BACKENDS if b in found}, decision


def fastest_elsewhere(ctx: AppContext, acceptance, running: str) -> str:
    """A line naming the fastest configuration predicted from this machine's measured profiles, when it is not
    the one ``running`` on the pair in use ("" when it is, or nothing is profiled here)."""
    loaded = ctx.pair().backend if ctx.loaded else None
    best = runtimes_here(ctx, acceptance)[1].fastest()
    if best is None or (best.backend == loaded and running != "ar" and best.method != "target alone"):
        return ""
    label = "the target alone" if best.method == "target alone" else best.method
    return (f"Fastest on this machine by its measured costs: {label} on {display_name(best.backend)}, about "
            f"{best.tokens_per_s:.0f} tokens/s (Hardware tab).")
