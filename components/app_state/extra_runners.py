"""The runners the app loads on demand beside its pair, planned against the memory budget.

Exact mode (:mod:`sequoia.runtime.checks.exactness`) runs a float32 plain copy of the target; Compare's reference row
runs the same target on llama.cpp, the runtime a CPU user would run instead; the Live tab's race
(:mod:`components.live.race_run`) runs the whole pair on a second runtime, where trees pay.  :class:`ExtraRunners` loads each
on first use (blocking), keeps it until another load needs its memory, and plans every load against the
:class:`~sequoia.runtime.memory.MemoryBudget` first.  Each extra runs in a *view* of the app state: the same
state around another pair, with its own engine (the app state makes them: :meth:`ExtraRunners.exact` takes the
factory).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

import torch

from sequoia._meta import ProgressFn
from sequoia.runners.base import Runner
from sequoia.runners.hf.onednn import blocked_bytes, drop_blocked_copies, restore_blocked_copies
from sequoia.runtime.checks.exactness import exact_copy, exact_pair, is_exact, widened_target
from sequoia.runtime.memory import Holding, MemoryBudget, fp32_copy_bytes, human, release_freed
from sequoia.runtime.models import ModelPair

from components.app_state.load_status import LoadStatus
from components.app_state.pair_room import LoadedPair


#: The on-demand loads by key, as messages name them.
EXTRA_NAMES = {"reference": "the llama.cpp reference target (Compare)", "exact": "exact mode's float32 target",
               "blocked": "the bf16 target's oneDNN-blocked weight copies (a speed cache of its weights)",
               "race": "the race's second runtime (its draft and target)"}
#: The reference's size when nobody says: the embedded target's Q4_K_M file (1.1 GB) on llama.cpp
#: (sequoia.runtime.memory.gguf_size_bytes: 2.5 GB; measured 2.3).
REFERENCE_BYTES = int(2.5e9)

#: What the race's second pair adds, by runtime: torch's bf16 pair with the target's blocked copies (the issue's
#: 8.3 GB resident on torch alone, less the process's own ~0.8), llama.cpp's two GGUF files (3.3 GB resident).
RACE_BYTES = {"hf": int(7.5e9), "mixed": int(7e9), "llamacpp": int(2.5e9)}

#: (pair, progress) -> a runner: how exact mode's target and the llama.cpp reference are loaded.
ExtraLoader = Callable[[ModelPair, ProgressFn], Runner]
#: (backend, progress) -> the served pair on that runtime: how the race's second pair is loaded.
RaceLoader = Callable[[str, ProgressFn], ModelPair]


class View(Protocol):
    """What the extras need of a view of the app state: its pair and its own extras."""

    models: LoadedPair
    extras: ExtraRunners


V = TypeVar("V", bound=View)


def _fp32_bytes(pair: ModelPair) -> int:
    return fp32_copy_bytes(pair.target)


def _reference_bytes(pair: ModelPair) -> int:
    return REFERENCE_BYTES


def _race_bytes(backend: str) -> int:
    return RACE_BYTES.get(backend, RACE_BYTES["hf"])


def _widen_or_copy(pair: ModelPair, progress: ProgressFn) -> Runner:
    return widened_target(pair.target, pair.target_name) or exact_copy(pair.target, pair.target_name)


@dataclass
class ExtraRunners(Generic[V]):
    """Exact mode's float32 target and the llama.cpp reference, each loaded on first use and kept."""

    models: LoadedPair                          # the pair these run beside (the draft object is shared)
    # None: a float32 copy of the loaded target's model (unquantized small models, tests).
    exact_loader: ExtraLoader | None = None
    # None: no llama.cpp reference offered.
    reference_loader: ExtraLoader | None = None
    # pair -> bytes each load adds (by default: the target's parameters at 4 bytes; the embedded Q4_K_M file).
    memory: MemoryBudget = field(default_factory=MemoryBudget)
    exact_bytes: Callable[[ModelPair], int] = _fp32_bytes
    reference_bytes: Callable[[ModelPair], int] = _reference_bytes
    memory_hints: tuple[str, ...] = ()          # what the owner could change to make room (named when refusing)
    exact_status: LoadStatus | None = None      # progress of exact mode's load; None: not started
    # None: no race offered (ZeroGPU, tests); else loads the pair on another runtime for the Live tab's race.
    race_loader: RaceLoader | None = None
    race_bytes: Callable[[str], int] = _race_bytes
    race_status: LoadStatus | None = None       # progress of the race pair's load; None: not started
    _exact: V | None = field(default=None, repr=False)
    _reference: V | None = field(default=None, repr=False)
    _race: tuple[str, V] | None = field(default=None, repr=False)     # (its backend, its view)
    _sizes: dict[str, int] = field(default_factory=dict, repr=False)   # "exact" / "reference" / "race" / "blocked"
    # One lock for both loads: loading one may free the other.
    _lock: threading.RLock = field(default_factory=threading.RLock, repr=False)

    def for_view(self, models: LoadedPair) -> ExtraRunners:
        """The extras of a view around ``models``: the same loaders and budget, nothing loaded, no reference."""
        return dataclasses.replace(self, models=models, reference_loader=None, exact_status=None, _exact=None,
                                   _reference=None, race_loader=None, race_status=None, _race=None, _sizes={},
                                   _lock=threading.RLock())

    # ------------------------------------------------------------------ exact mode
    @property
    def exact_loaded(self) -> bool:
        return self._exact is not None

    def exact(self, view: Callable[[ModelPair], V]) -> V:
        """The view with the exact-mode pair (float32 plain target, the same draft object); loads that target on
        first use (progress in ``exact_status``).  NotEnoughMemory (before loading anything) when it would not
        fit."""
        if self._exact is not None:
            return self._exact
        pair = self.models.get()
        with self._lock:
            if self._exact is None:
                target_pair = pair if is_exact(pair) else self._load_exact(pair)
                made = view(target_pair)
                made.extras._exact = made     # its exact mode is itself
                self._exact = made
        return self._exact

    def _load_exact(self, pair: ModelPair) -> ModelPair:
        need = self.exact_bytes(pair)
        self._make_room("exact", need)
        status = self.exact_status = LoadStatus()
        status(0.0, "loading the float32 target for exact mode")
        target_pair = exact_pair(pair, (self.exact_loader or _widen_or_copy)(pair, status))
        release_freed()       # the loader's transient buffers
        self._sizes["exact"] = need
        status(1.0, "float32 target ready")
        status.ready = True
        return target_pair

    # ------------------------------------------------------------------ the llama.cpp reference
    @property
    def offers_reference(self) -> bool:
        """Compare can add the target alone on llama.cpp: a loader is set and the pair itself runs elsewhere."""
        return self.reference_loader is not None and (not self.models.loaded or
                                                      self.models.get().backend != "llamacpp")

    @property
    def reference_loaded(self) -> bool:
        return self._reference is not None

    def reference(self, view: Callable[[ModelPair], V]) -> V:
        """The view with the target on llama.cpp (the draft object kept, never used by the target alone); loads
        that runner on first use.  ValueError when none is offered; NotEnoughMemory (before loading) when it
        would not fit."""
        if not self.offers_reference:
            raise ValueError("no llama.cpp reference target is offered on this server")
        if self._reference is not None:
            return self._reference
        pair = self.models.get()
        with self._lock:
            if self._reference is None:
                need = self.reference_bytes(pair)
                self._make_room("reference", need)
                runner = self.reference_loader(pair, lambda f, d: None)
                self._sizes["reference"] = need
                ref_pair = dataclasses.replace(pair, target=runner, target_name=runner.name, backend="llamacpp",
                                               dtype=torch.float32)
                self._reference = view(ref_pair)
                self.restore_blocked()      # exact mode may have been freed for it
        return self._reference

    # ------------------------------------------------------------------ the race's second runtime
    @property
    def race_loaded(self) -> str | None:
        """The runtime of the race pair held now, or None."""
        return self._race[0] if self._race is not None else None

    def race(self, backend: str, view: Callable[[ModelPair], V], cancelled: threading.Event | None = None) -> V:
        """The view with the whole pair on ``backend`` (the Live tab's race), loaded on first use with progress in
        ``race_status``; ValueError when no race is offered; NotEnoughMemory (before loading) when it would not
        fit; LoadCancelled at the load's next stage once ``cancelled`` is set (a race stopped while it loads).
        :meth:`free` ("race") unloads it: the race frees it when it ends."""
        if self.race_loader is None:
            raise ValueError("this server offers no race between runtimes")
        with self._lock:
            if self._race is not None and self._race[0] != backend:
                self.free("race")
            if self._race is None:
                need = self.race_bytes(backend)
                self._make_room("race", need)
                status = self.race_status = LoadStatus(cancelled=cancelled)
                status(0.0, f"loading {EXTRA_NAMES['race']}")
                pair = self.race_loader(backend, status)
                release_freed()
                self._sizes["race"] = need
                self._race = (backend, view(pair))
                status(1.0, "the race's second runtime is ready")
                status.ready = True
        return self._race[1]

    # ------------------------------------------------------------------ memory
    def _target_model(self) -> torch.nn.Module | None:
        pair = self.models.current
        return getattr(pair.target, "model", None) if pair is not None else None

    def _make_room(self, key: str, need: int) -> None:
        """Free what the budget says must go so that ``need`` bytes fit, or raise NotEnoughMemory having freed
        nothing.  What could go is idle: every model handler runs in the one MODEL_WORK slot, the one asking
        for this load included.  The reference goes first (cheapest to load again), then the exact target, then
        (for exact mode only: the bf16 pair then verifies without them) the target's blocked weight copies."""
        freeable = [Holding(k, EXTRA_NAMES[k], self._sizes[k]) for k in ("reference", "exact", "race")
                    if k != key and k in self._sizes]
        model = self._target_model()
        if key == "exact" and model is not None and blocked_bytes(model):
            freeable.append(Holding("blocked", EXTRA_NAMES["blocked"], blocked_bytes(model)))
        self.memory.make_room(EXTRA_NAMES[key], need, freeable, lambda h: self.free(h.key, restore=False),
                              self.memory_hints)

    def restore_blocked(self) -> None:
        """Make the target's blocked copies again once exact mode no longer holds their memory, if they fit."""
        model = self._target_model()
        if "blocked" not in self._sizes or self._exact is not None or model is None:
            return
        if self.memory.plan(EXTRA_NAMES["blocked"], self._sizes["blocked"]).fits:
            restore_blocked_copies(model)
            del self._sizes["blocked"]

    def free(self, key: str, restore: bool = True) -> bool:
        """Unload the llama.cpp reference ("reference"), exact mode's target ("exact") or the race's pair ("race"),
        loaded again on its next use, or drop the target's blocked weight copies ("blocked"); False when there was
        nothing to free.
        ``restore``: make the blocked copies again if freeing the exact target leaves room for them."""
        with self._lock:
            if key == "blocked":
                self._sizes["blocked"] = drop_blocked_copies(self._target_model())
                release_freed()
                return True
            if key == "race":
                return self._free_race()
            view = self._reference if key == "reference" else self._exact
            if view is None or view.extras is self:
                return False
            if key == "reference":
                self._reference = None
                close = getattr(view.models.current.target, "close", None)
                if close is not None:
                    close()            # llama.cpp frees its buffers here, not when the object is collected
            else:
                self._exact, self.exact_status = None, None
                view.extras._exact = None     # the view pointed at itself: a cycle only gc.collect would break
            self._sizes.pop(key, None)
            del view
            release_freed()
            if restore:
                self.restore_blocked()
        return True

    def _free_race(self) -> bool:
        if self._race is None:
            return False
        view, self._race, self.race_status = self._race[1], None, None
        pair = view.models.current
        for runner in (pair.draft, pair.target) if pair is not None else ():
            close = getattr(runner, "close", None)
            if close is not None:
                close()            # llama.cpp frees its buffers here, not when the object is collected
        self._sizes.pop("race", None)
        del view, pair
        release_freed()
        return True

    def memory_note(self) -> str:
        """One line: this server's memory now and what it holds on demand (Hardware tab, scripts)."""
        snap = self.memory.snapshot()
        held = [f"{EXTRA_NAMES[k]} ({human(v)})" for k, v in self._sizes.items() if k != "blocked"]
        dropped = (f"; dropped for it: {EXTRA_NAMES['blocked']} ({human(self._sizes['blocked'])}), so verification "
                   "runs slower until exact mode is unloaded") if "blocked" in self._sizes else ""
        return f"Memory: {snap.describe()}" + (f"; loaded on demand: {', '.join(held)}" if held else "") + dropped + "."
