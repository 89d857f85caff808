"""The runtimes of this machine side by side: each one's profile, and the fastest configuration they predict.

Both read profile files and the second solves a DP per runtime, so each is kept in the profile room
(:meth:`components.profile_room.ProfileRoom.derived`): computed once per profile in use, not per decode.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from sequoia.core.optimizer import choose_tree
from sequoia.core.profile import HardwareProfile
from sequoia.runners.hf.cpu import cpu_facts
from sequoia.runners.hf.kernels import default_draft_scheme
from sequoia.runtime.finder import find_profile
from sequoia.runtime.fingerprint import expected_fingerprint
from sequoia.runtime.models import BACKENDS

from .context import AppContext
from .profile_room import ProfileRoom

#: (runtime, its profile, where the profile comes from)
RuntimeProfile = tuple[str, HardwareProfile, str]


def runtime_profiles(ctx: AppContext) -> list[RuntimeProfile]:
    """(runtime, profile, source) for each runtime with a profile measured on this machine: the loaded pair's
    own, and for the other runtimes the one the finder would pick for their default models (never measured here)."""
    loaded = ctx.pair().backend if ctx.loaded else None
    return ctx.hardware.derived(("runtimes", loaded), lambda: _find_runtime_profiles(ctx.hardware, loaded))


def _find_runtime_profiles(hardware: ProfileRoom, loaded: str | None) -> list[RuntimeProfile]:
    out = []
    for backend in BACKENDS:
        if backend == loaded and hardware.profile is not None:
            out.append((backend, hardware.profile, "in use"))
            continue
        choice = find_profile(_expected_fingerprint(backend), cache_dir=hardware.cache_dir,
                              assets_dir=hardware.assets_dir)
        if choice.profile is not None:
            out.append((backend, choice.profile, choice.source))
    return out


def _expected_fingerprint(backend: str):
    """This machine's fingerprint for the embedded pair on ``backend`` as it would load by default."""
    return expected_fingerprint(torch.device("cpu"), torch.bfloat16, default_draft_scheme("cpu", cpu_facts()[1]),
                                backend=backend)


def _fastest(found: Sequence[RuntimeProfile], acceptance: tuple[float, ...]) -> tuple[str, str, float] | None:
    """(runtime, configuration, tokens/s) of the fastest prediction over ``found`` (None: nothing profiled)."""
    best = None
    for backend, prof, _ in found:
        choice = choose_tree(acceptance, prof, max_budget=min(128, prof.max_tokens - 1), max_depth=12)
        label = f"Sequoia (n={choice.budget}, d={choice.depth})" if choice.budget else "the target alone"
        rate = 1000.0 / choice.ms_per_token
        if best is None or rate > best[2]:
            best = (backend, label, rate)
    return best


def fastest_elsewhere(ctx: AppContext, acceptance, running: str) -> str:
    """A line naming the fastest configuration predicted from this machine's measured profiles, when it is not
    the one ``running`` on the pair in use ("" when it is, or nothing else is profiled here)."""
    loaded = ctx.pair().backend if ctx.loaded else None
    vector = tuple(float(a) for a in acceptance)
    best = ctx.hardware.derived(("fastest", loaded, vector), lambda: _fastest(runtime_profiles(ctx), vector))
    if best is None or (best[0] == loaded and running != "ar" and best[1] != "the target alone"):
        return ""
    return (f"Fastest on this machine by its measured costs: {best[1]} on {best[0]}, about {best[2]:.0f} tokens/s "
            "(Hardware tab).")
