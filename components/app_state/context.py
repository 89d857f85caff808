"""App-wide state the tabs share, in named rooms (the acceptance vectors offered: :mod:`components.app_state.acceptance_choice`).

:class:`AppContext` is built once by ``app.build_demo`` and handed to every tab.  It holds what is per
*server*, not per browser session, and composes the rooms that own it:

* ``models`` (:class:`~components.app_state.pair_room.LoadedPair`): the model pair, its load status and its engine;
* ``extras`` (:class:`~components.app_state.extra_runners.ExtraRunners`): exact mode's float32 target and Compare's
  llama.cpp reference, loaded on demand within the memory budget;
* ``hardware`` (:class:`~components.app_state.profile_room.ProfileRoom`): the hardware profile in use, its background
  measurement, and what is derived from it once per profile;
* ``lanes`` (:class:`~components.app_state.lanes.WorkLanes`): where model-free work runs, and the parsed DP requests.

The few properties here that read a room keep the tabs' call sites short.  Per-session state lives in small
dataclasses inside ``gr.State`` in each tab.
"""

from __future__ import annotations

import logging
import os
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from sequoia._meta import ASSETS, pair_name  # ASSETS re-exported for the tabs
from sequoia.core.config import caps_for
from sequoia.core.profiles.profile import HardwareProfile
from sequoia.core.requests.request import Limits
from sequoia.core.trees.tree import MAX_TREE_SIZE
from sequoia.runtime.engine import SpeculativeEngine
from sequoia.runtime.measuring import finder
from sequoia.runtime.measuring.finder import ProfileChoice
from sequoia.runtime.measuring.learned import LearnedAcceptance
from sequoia.runtime.methods import DEFAULT_ACCEPTANCE
from sequoia.runtime.memory import MemoryBudget, NotEnoughMemory  # noqa: F401 (re-exported for the tabs)
from sequoia.runtime.models import ModelPair

from components.app_state.extra_runners import ExtraLoader, ExtraRunners
from components.app_state.lanes import WorkLanes
from components.app_state.load_status import LoadStatus, ModelsNotReady  # noqa: F401 (re-exported for the app and the tabs)
from components.app_state.memo import RequestMemo
from components.app_state.pair_room import LoadedPair
from components.app_state.profile_room import ProfileRoom
from components.app_state.target_rate import TargetRates

log = logging.getLogger("sequoia")


#: Largest tree budget the UI accepts (a server guard, far below sequoia.core.trees.tree.MAX_TREE_SIZE on CPU).
CPU_MAX_BUDGET = 128
GPU_MAX_BUDGET = 512
#: Requests remembered per pair between the validator's parse and the handler's (each holds its prompt ids).
MEMO_SIZE = 64

#: Queue settings for events (``**MODEL_WORK``).  There is one model pair, so everything that runs it
#: (Live, Compare, Hardware and their API endpoints) shares one queue slot; model-free work (the DP
#: explorer, plots) shares its own group and stays responsive while a long decode runs.  On a small
#: CPU the light group runs one job at a time, so the model keeps the other cores: eight DP clients at
#: once slow a 2-core machine's decodes about 6x when the light group runs them side by side.
MODEL_WORK = {"concurrency_id": "model", "concurrency_limit": 1}
LIGHT_WORK = {"concurrency_id": "light", "concurrency_limit": 1 if (os.cpu_count() or 1) <= 4 else 4}


def budget_cap_for(device: torch.device | str) -> int:
    """Largest tree budget the UI accepts on a device (a torch.device or its name)."""
    return GPU_MAX_BUDGET if str(device).startswith("cuda") else CPU_MAX_BUDGET


def server_limits(device: torch.device | str, max_budget: int | None = None) -> Limits:
    """What one request may ask of this server, derived once for the device the pair runs on: the tree budget
    (``max_budget``, else by device, within MAX_TREE_SIZE) and the token caps (sequoia.core.config.caps_for)."""
    caps = caps_for(device)
    cap = max_budget if max_budget is not None else budget_cap_for(device)
    return Limits(budget_cap=min(cap, MAX_TREE_SIZE), max_new_tokens=caps.max_new_tokens,
                  max_prompt_tokens=caps.max_prompt_tokens, device=caps.device)


def _request_memo() -> RequestMemo:
    return RequestMemo(MEMO_SIZE)


class PerPair:
    """A value per live pair object, dropped with the pair (a ``ModelPair`` is an unhashable dataclass, so no
    ``WeakKeyDictionary``: entries are kept by ``id`` and checked against a weak reference)."""

    def __init__(self) -> None:
        self._by_id: dict[int, tuple[weakref.ref, object]] = {}

    def get(self, pair, default=None):
        entry = self._by_id.get(id(pair))
        return entry[1] if entry is not None and entry[0]() is pair else default

    def setdefault(self, pair, value):
        entry = self._by_id.get(id(pair))
        if entry is None or entry[0]() is not pair:   # new, or an id reused after its pair was freed
            self._by_id = {k: e for k, e in self._by_id.items() if e[0]() is not None}
            entry = self._by_id[id(pair)] = (weakref.ref(pair), value)
        return entry[1]

    def clear(self) -> None:
        self._by_id.clear()


@dataclass
class AppContext:
    """Server-wide state: the rooms, what one request may ask, and the owner switch."""

    models: LoadedPair
    hardware: ProfileRoom
    extras: ExtraRunners[AppContext]
    # Derived once, when the app is built, so the sliders and the request checks agree (server_limits).
    limits: Limits = field(default_factory=lambda: server_limits("cpu"))
    lanes: WorkLanes = field(default_factory=WorkLanes)
    owner: bool = False                       # server-wide changes (Profile now) allowed: SEQUOIA_OWNER=1
    # Parsed decode requests by raw values (components.app_state.validation); per pair, since their proposers belong to
    # one engine's runs.
    requests: RequestMemo = field(default_factory=_request_memo, repr=False)
    # The target alone's rate measured per prompt and settings (components.app_state.target_rate), shared by every view of
    # this context: its key holds the target, so exact mode's float32 target keeps its own entries.
    target_rates: TargetRates = field(default_factory=TargetRates, repr=False)
    # The comparison methods whose untimed warm-up already ran on a pair (components.compare.compare_run): first-call
    # costs are paid once per process, so a second comparison skips them.  Keyed weakly by the pair, so a
    # reloaded pair warms up again.
    warmed: PerPair = field(default_factory=lambda: PerPair(), repr=False)
    # The acceptance this server learns from its own decodes, over the vector a request picks as the prior
    # (sequoia.runtime.measuring.learned): on for a pair nobody measured (the GPU Space's); None elsewhere.
    learned: LearnedAcceptance | None = field(default=None, repr=False)

    @classmethod
    def from_pair_or_loader(cls, pair_or_loader: ModelPair | Callable[[], ModelPair], *, assets_dir: Path = ASSETS,
                            max_budget: int | None = None, device: torch.device | str | None = None,
                            status: LoadStatus | None = None,
                            cache_dir: Path | None = None, auto_profile: bool = False, owner: bool = False,
                            exact_loader: ExtraLoader | None = None, reference_loader: ExtraLoader | None = None,
                            memory: MemoryBudget | None = None, exact_bytes: Callable[[ModelPair], int] | None = None,
                            reference_bytes: Callable[[ModelPair], int] | None = None,
                            memory_hints: tuple[str, ...] = (), lanes: WorkLanes | None = None) -> AppContext:
        """The app state around a loaded pair, or a zero-argument callable that loads one (on first use or in
        :meth:`LoadedPair.start_loading`) on ``device`` (None: the CPU); the rest is each room's settings (None:
        the room's default)."""
        hardware = ProfileRoom(Path(assets_dir), cache_dir, auto_profile)
        if callable(pair_or_loader) and not hasattr(pair_or_loader, "target"):
            models = LoadedPair(pair_or_loader, status or LoadStatus(), on_loaded=hardware.on_pair_loaded)
        else:
            models = LoadedPair.ready(pair_or_loader, status)
            device = pair_or_loader.device
        sizes = {k: v for k, v in (("exact_bytes", exact_bytes), ("reference_bytes", reference_bytes)) if v}
        extras = ExtraRunners(models, exact_loader, reference_loader, memory or MemoryBudget(),
                              memory_hints=tuple(memory_hints), **sizes)
        return cls(models, hardware, extras, server_limits(device or "cpu", max_budget), lanes or WorkLanes(),
                   owner=owner)

    def _view(self, pair: ModelPair) -> AppContext:
        """This state around another pair, with its own engine and its own memo of parsed requests (their
        proposers belong to one engine's runs); the profile, lanes and measured rates are shared."""
        models = LoadedPair.ready(pair)
        return AppContext(models, self.hardware, self.extras.for_view(models), self.limits, self.lanes,
                          self.owner, target_rates=self.target_rates, learned=self.learned)

    # ------------------------------------------------------------------ the pair (models)
    @property
    def status(self) -> LoadStatus:
        return self.models.status

    @property
    def loaded(self) -> bool:
        return self.models.loaded

    def pair(self) -> ModelPair:
        """The loaded pair; ModelsNotReady while it loads (:meth:`LoadedPair.get`)."""
        return self.models.get()

    def engine(self) -> SpeculativeEngine:
        return self.models.engine()

    def budget_cap(self) -> int:
        """Largest tree budget one request may ask (the sliders' maximum)."""
        return self.limits.budget_cap

    def acceptance_for(self, vector, temperature: float):
        """The vector a request decodes with: ``vector`` (None: the built-in one) as it was picked, or, where
        this server learns (:attr:`learned`), that vector as the prior updated with its own decodes."""
        if self.learned is None:
            return vector
        return self.learned.vector(DEFAULT_ACCEPTANCE if vector is None else vector, temperature).values

    def learn(self, records, temperature: float) -> None:
        """Add a finished decode's steps to what this server learns (nothing where it does not learn); a
        failure to write is logged, never the request's."""
        if self.learned is None or not records:
            return
        try:
            self.learned.observe(records, temperature)
        except OSError as exc:
            log.warning("learned acceptance not saved (%s): %s", self.learned.path, exc)

    def method_state(self, info, temperature: float) -> dict:
        """What this server prices and grows a method with, as :func:`sequoia.runtime.methods.make_method`'s
        keywords: the profile (priced methods), the calibration (calibrated ones), the copy acceptance (copies);
        ``info``: the method's :class:`~sequoia.core.requests.request.MethodInfo`."""
        pair = self.models.current
        name = pair_name(pair) if pair is not None else None
        state = {}
        if info.priced:
            state["profile"] = self.profile
        if info.calibrated:
            state["calibration"] = finder.find_calibration(temperature, self.assets_dir, name)
        if info.copies:
            state["copy_acceptance"] = finder.find_ngram_acceptance("", temperature, self.assets_dir, name)
        return state

    # ------------------------------------------------------------------ the extra runners (extras)
    def exact_context(self) -> AppContext:
        """This state with the exact-mode pair (float32 plain target) and its own engine, loaded on first use
        (:meth:`ExtraRunners.exact`); NotEnoughMemory when it would not fit."""
        return self.extras.exact(self._view)

    @property
    def exact_loaded(self) -> bool:
        return self.extras.exact_loaded

    @property
    def offers_reference(self) -> bool:
        return self.extras.offers_reference

    def reference_context(self) -> AppContext:
        """This state with the target on llama.cpp and its own engine, loaded on first use
        (:meth:`ExtraRunners.reference`); ValueError when none is offered."""
        return self.extras.reference(self._view)

    # ------------------------------------------------------------------ the hardware profile (hardware)
    @property
    def assets_dir(self) -> Path:
        return self.hardware.assets_dir

    @assets_dir.setter
    def assets_dir(self, path: Path) -> None:
        self.hardware.assets_dir = Path(path)

    @property
    def cache_dir(self) -> Path | None:
        return self.hardware.cache_dir

    @property
    def choice(self) -> ProfileChoice:
        return self.hardware.choice

    @choice.setter
    def choice(self, choice: ProfileChoice) -> None:
        self.hardware.choice = choice

    @property
    def profile(self) -> HardwareProfile | None:
        """The hardware profile in use (None: none matches this machine yet)."""
        return self.hardware.profile

    @profile.setter
    def profile(self, prof: HardwareProfile | None) -> None:
        self.hardware.profile = prof

    def find_profile(self) -> ProfileChoice:
        """Use the cached or shipped profile measured on a machine like this one (never one from another)."""
        return self.hardware.find(self.pair())

    def profile_note(self) -> str:
        return self.hardware.note()
