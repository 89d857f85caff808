"""App-wide state the tabs share (the acceptance vectors offered: :mod:`components.acceptance_choice`).

:class:`AppContext` is built once by ``app.build_demo`` and handed to every
tab.  It owns what is per *server*, not per browser session: the model pair
(loaded once from a loader callable, either in a background thread started
by :meth:`AppContext.start_loading` or on first use), its
:class:`LoadStatus`, the engine around it, the hardware profile in use and
the tree-size cap.  Per-session state lives in small dataclasses inside
``gr.State`` in each tab.

While the pair is loading, :meth:`AppContext.pair` raises
:class:`ModelsNotReady` at once instead of blocking a worker for minutes;
it is a ``ValueError`` so every handler's "readable message" path shows it.
"""

from __future__ import annotations

import dataclasses
import html
import os
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from sequoia._meta import ASSETS, ProgressFn, pair_name  # ASSETS re-exported for the tabs
from sequoia.core.profile import HardwareProfile
from sequoia.runtime import finder
from sequoia.runtime.engine import SpeculativeEngine
from sequoia.runtime.exactness import exact_copy, exact_pair, is_exact, widened_target
from sequoia.runtime.finder import ProfileChoice
from sequoia.runners.hf.onednn import blocked_bytes, drop_blocked_copies, restore_blocked_copies
from sequoia.runtime.fingerprint import machine_fingerprint
from sequoia.runtime.memory import (Holding, MemoryBudget, NotEnoughMemory,  # noqa: F401 (re-exported for the tabs)
                                   fp32_copy_bytes, human, release_freed)

from .load_status import LoadStatus, ModelsNotReady  # noqa: F401 (re-exported for the app and the tabs)
from .target_rate import TargetRates

#: What Sequoia does while this machine's profile is being measured (conservative: never slower).
UNTIL_MEASURED = ("until this machine's profile is measured, Sequoia (auto) runs the target alone and "
                  "Sequoia (dynamic) drafts nothing")

#: The on-demand loads (AppContext.exact_context / reference_context) by key, as messages name them.
EXTRA_NAMES = {"reference": "the llama.cpp reference target (Compare)", "exact": "exact mode's float32 target",
               "blocked": "the bf16 target's oneDNN-blocked weight copies (a speed cache of its weights)"}
#: The reference's size when nobody says (AppContext.reference_bytes): the embedded target's Q4_K_M file (1.1 GB)
#: on llama.cpp (sequoia.runtime.memory.gguf_size_bytes: 2.5 GB; measured 2.3).
REFERENCE_BYTES = int(2.5e9)

#: Largest tree budget the UI accepts (a server guard, far below sequoia.core.tree.MAX_TREE_SIZE on CPU).
CPU_MAX_BUDGET = 128
GPU_MAX_BUDGET = 512

#: Queue settings for events (``**MODEL_WORK``).  There is one model pair, so everything that runs it
#: (Live, Compare, Hardware and their API endpoints) shares one queue slot; model-free work (the DP
#: explorer, plots) shares its own group and stays responsive while a long decode runs.  On a small
#: CPU the light group runs one job at a time: eight DP clients at once starved a 2-core machine's
#: decodes 6x (issue 12), so the model keeps the other cores.
MODEL_WORK = {"concurrency_id": "model", "concurrency_limit": 1}
LIGHT_WORK = {"concurrency_id": "light", "concurrency_limit": 1 if (os.cpu_count() or 1) <= 4 else 4}


def budget_cap_for(device: Any) -> int:
    """Largest tree budget the UI accepts on a device (a torch.device or its name)."""
    return GPU_MAX_BUDGET if str(device).startswith("cuda") else CPU_MAX_BUDGET


@dataclass
class AppContext:
    """Server-wide state; the model pair is loaded once, in the background or on first use."""

    loader: Callable[[], Any]                 # returns a ModelPair (or anything shaped like one)
    assets_dir: Path = ASSETS
    max_budget: int | None = None             # None: by device (CPU_MAX_BUDGET / GPU_MAX_BUDGET)
    status: LoadStatus = field(default_factory=LoadStatus)
    cache_dir: Path | None = None             # where this machine's measured profiles are cached (None: default)
    auto_profile: bool = False                # measure a profile in the background when none matches
    owner: bool = False                       # server-wide changes (Profile now) allowed: SEQUOIA_OWNER=1
    choice: ProfileChoice = field(default_factory=lambda: ProfileChoice(
        None, "none", None, "the models are not loaded yet"))
    profiling: LoadStatus | None = None       # progress of the background measurement; None: none started
    requests: Any = field(default=None, repr=False)   # parsed requests by raw values (components.validation.memo)
    # Exact mode (sequoia.runtime.exactness): (pair, progress) -> the float32 plain target runner, loaded on first
    # use and kept; None: a float32 copy of the loaded target's model (unquantized small models, tests).
    exact_loader: Callable[[Any, ProgressFn], Any] | None = None
    exact_status: LoadStatus | None = None    # progress of that load; None: not started
    # Compare's reference row on the runtime a CPU user would run instead: (pair, progress) -> a runner of the
    # same target on llama.cpp (the shipped GGUF), loaded on first use and kept; None: no such row offered.
    reference_loader: Callable[[Any, ProgressFn], Any] | None = None
    # Those two loads are planned against the memory budget first (sequoia.runtime.memory): pair -> bytes each
    # adds (by default: the target's parameters at 4 bytes; the embedded target's Q4_K_M file and its context).
    memory: MemoryBudget = field(default_factory=MemoryBudget)
    exact_bytes: Callable[[Any], int] = lambda pair: fp32_copy_bytes(pair.target)
    reference_bytes: Callable[[Any], int] = lambda pair: REFERENCE_BYTES
    memory_hints: tuple[str, ...] = ()        # what the owner could change to make room (named when refusing)
    _reference: Any = field(default=None, repr=False)
    # The target alone's rate measured per prompt and settings (components.target_rate), shared by every view of
    # this context: its key holds the target, so exact mode's float32 target keeps its own entries.
    target_rates: TargetRates = field(default_factory=TargetRates, repr=False)
    _exact: Any = field(default=None, repr=False)
    _sizes: dict = field(default_factory=dict, repr=False)   # loaded on demand: "exact" / "reference" -> bytes
    # One lock for both on-demand loads: loading one may free the other.
    _extras_lock: threading.RLock = field(default_factory=threading.RLock, repr=False)
    _pair: Any = field(default=None, repr=False)
    _engine: Any = field(default=None, repr=False)
    _load_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _engine_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def from_pair_or_loader(cls, pair_or_loader, **kwargs) -> "AppContext":
        if callable(pair_or_loader) and not hasattr(pair_or_loader, "target"):
            return cls(loader=pair_or_loader, **kwargs)
        ctx = cls(loader=lambda: pair_or_loader, **kwargs)
        ctx._pair = pair_or_loader
        ctx.status.fraction, ctx.status.description, ctx.status.ready = 1.0, "models ready", True
        return ctx

    def pair(self):
        """The loaded pair; loads it now if nobody has started to; ModelsNotReady while another thread is."""
        if self._pair is not None:
            return self._pair
        if self.status.error is not None:
            raise ModelsNotReady(f"the model pair could not be loaded: {self.status.error}")
        if not self._load_lock.acquire(blocking=False):
            raise ModelsNotReady(f"the models are still loading ({self.status.summary()}); "
                                 "try again when the banner at the top says they are ready")
        try:
            if self._pair is None:
                self._load()
            return self._pair
        finally:
            self._load_lock.release()

    def _load(self) -> None:
        self.status(0.0, "loading the model pair")
        try:
            self._pair = self.loader()
        except Exception as exc:
            self.status.error = f"{type(exc).__name__}: {exc}"
            raise
        self.find_profile()
        self.status(1.0, "models ready")
        self.status.ready = True
        if self.auto_profile and self.choice.profile is None:
            self.start_profiling()

    def start_loading(self) -> threading.Thread:
        """Load the pair in a daemon thread so the page can come up (and show progress) meanwhile."""
        def run() -> None:
            try:
                self.pair()
            except ModelsNotReady:
                pass                          # someone else is loading it
            except Exception:
                traceback.print_exc()         # the banner shows the message; the console the traceback

        thread = threading.Thread(target=run, name="sequoia-model-loader", daemon=True)
        thread.start()
        return thread

    @property
    def loaded(self) -> bool:
        return self._pair is not None

    def engine(self):
        pair = self.pair()
        with self._engine_lock:
            if self._engine is None:
                self._engine = SpeculativeEngine(pair)
            return self._engine

    def exact_context(self) -> "AppContext":
        """This context with the exact-mode pair (float32 plain target, the same draft object) and its own
        engine; loads that target on first use (blocking, progress in ``exact_status``) and keeps it until
        another load needs its memory.  NotEnoughMemory (before loading anything) when it would not fit."""
        if self._exact is not None:
            return self._exact
        pair = self.pair()
        with self._extras_lock:
            if self._exact is None:
                if is_exact(pair):
                    target_pair = pair
                else:
                    need = self.exact_bytes(pair)
                    self._make_room("exact", EXTRA_NAMES["exact"], need)
                    status = self.exact_status = LoadStatus()
                    status(0.0, "loading the float32 target for exact mode")
                    load = self.exact_loader or (lambda p, progress: widened_target(p.target, p.target_name)
                                                 or exact_copy(p.target, p.target_name))
                    target_pair = exact_pair(pair, load(pair, status))
                    release_freed()       # the loader's transient buffers
                    self._sizes["exact"] = need
                    status(1.0, "float32 target ready")
                    status.ready = True
                view = self._view(target_pair)
                view._exact = view
                self._exact = view
        return self._exact

    @property
    def exact_loaded(self) -> bool:
        return self._exact is not None

    @property
    def offers_reference(self) -> bool:
        """Compare can add the target alone on llama.cpp: a loader is set and the pair itself runs elsewhere."""
        return self.reference_loader is not None and (not self.loaded or self.pair().backend != "llamacpp")

    def reference_context(self) -> "AppContext":
        """This context with the target on llama.cpp (the draft object kept, never used by the target alone) and
        its own engine; loads that runner on first use (blocking) and keeps it until another load needs its
        memory.  ValueError when none is offered; NotEnoughMemory (before loading) when it would not fit."""
        if not self.offers_reference:
            raise ValueError("no llama.cpp reference target is offered on this server")
        if self._reference is not None:
            return self._reference
        pair = self.pair()
        with self._extras_lock:
            if self._reference is None:
                need = self.reference_bytes(pair)
                self._make_room("reference", EXTRA_NAMES["reference"], need)
                runner = self.reference_loader(pair, lambda f, d: None)
                self._sizes["reference"] = need
                ref_pair = dataclasses.replace(pair, target=runner, target_name=runner.name, backend="llamacpp",
                                               dtype=torch.float32)
                self._reference = self._view(ref_pair)
                self._restore_blocked()      # exact mode may have been freed for it
        return self._reference

    # ------------------------------------------------------------------ memory of the on-demand loads
    def _make_room(self, key: str, what: str, need: int) -> None:
        """Free what the budget says must go so that ``need`` bytes fit, or raise NotEnoughMemory having freed
        nothing.  What could go is idle: every model handler runs in the one MODEL_WORK slot, the one asking
        for this load included.  The reference goes first (cheapest to load again), then the exact target, then
        (for exact mode only: the bf16 pair then verifies without them) the target's blocked weight copies."""
        freeable = [Holding(k, EXTRA_NAMES[k], self._sizes[k]) for k in ("reference", "exact")
                    if k != key and k in self._sizes]
        model = getattr(self._pair.target, "model", None) if self._pair is not None else None
        if key == "exact" and model is not None and blocked_bytes(model):
            freeable.append(Holding("blocked", EXTRA_NAMES["blocked"], blocked_bytes(model)))
        self.memory.make_room(what, need, freeable, lambda h: self.free_extra(h.key, restore=False),
                              self.memory_hints)

    def _restore_blocked(self) -> None:
        """Make the target's blocked copies again once exact mode no longer holds their memory, if they fit."""
        model = getattr(self._pair.target, "model", None) if self._pair is not None else None
        if "blocked" not in self._sizes or self._exact is not None or model is None:
            return
        if self.memory.plan(EXTRA_NAMES["blocked"], self._sizes["blocked"]).fits:
            restore_blocked_copies(model)
            del self._sizes["blocked"]

    def free_extra(self, key: str, restore: bool = True) -> bool:
        """Unload the llama.cpp reference ("reference") or exact mode's target ("exact"), loaded again on its next
        use, or drop the target's blocked weight copies ("blocked"); False when there was nothing to free.
        ``restore``: make the blocked copies again if freeing the exact target leaves room for them."""
        with self._extras_lock:
            if key == "blocked":
                self._sizes["blocked"] = drop_blocked_copies(self._pair.target.model)
                release_freed()
                return True
            view = self._reference if key == "reference" else self._exact
            if view is None or view is self:
                return False
            if key == "reference":
                self._reference = None
                close = getattr(view._pair.target, "close", None)
                if close is not None:
                    close()            # llama.cpp frees its buffers here, not when the object is collected
            else:
                self._exact, self.exact_status = None, None
                view._exact = None     # the view pointed at itself: a cycle only gc.collect would break
            self._sizes.pop(key, None)
            del view
            release_freed()
            if restore:
                self._restore_blocked()
        return True

    def memory_note(self) -> str:
        """One line: this server's memory now and what it holds on demand (Hardware tab, scripts)."""
        snap = self.memory.snapshot()
        held = [f"{EXTRA_NAMES[k]} ({human(v)})" for k, v in self._sizes.items() if k != "blocked"]
        dropped = (f"; dropped for it: {EXTRA_NAMES['blocked']} ({human(self._sizes['blocked'])}), so verification "
                   "runs slower until exact mode is unloaded") if "blocked" in self._sizes else ""
        return f"Memory: {snap.describe()}" + (f"; loaded on demand: {', '.join(held)}" if held else "") + dropped + "."

    def _view(self, pair) -> "AppContext":
        """This context around another pair, with its own engine and its own memo of parsed requests (their
        proposers belong to one engine's runs); its exact mode and llama.cpp reference are unset."""
        return dataclasses.replace(self, loader=lambda: pair, _pair=pair, _engine=None, _engine_lock=threading.Lock(),
                                   _exact=None, requests=None, reference_loader=None, _reference=None, _sizes={})

    def budget_cap(self) -> int:
        if self.max_budget is not None:
            return self.max_budget
        return budget_cap_for(getattr(self._pair, "device", "cpu") if self._pair is not None else "cpu")

    def pair_label(self) -> str:
        """The loaded pair in one line of HTML (names escaped)."""
        if self._pair is None:
            return "model pair not loaded yet"
        p = self._pair
        esc = [html.escape(str(getattr(p, k, "?"))) for k in ("draft_name", "target_name", "device", "dtype")]
        return f"draft <b>{esc[0]}</b> → target <b>{esc[1]}</b> on {esc[2]} ({esc[3]})"

    def calibration(self, temperature: float = 0.0):
        """The shipped calibration for this pair nearest in temperature, or None (identity a(q) = q)."""
        name = pair_name(self._pair) if self._pair is not None else None
        return finder.find_calibration(temperature, self.assets_dir, name)

    def copy_acceptance(self, temperature: float = 0.0):
        """The measured acceptance of copied tokens nearest in temperature, pooled over the prompt kinds
        (the page does not know the prompt's kind), or None (the hand-set prior)."""
        name = pair_name(self._pair) if self._pair is not None else None
        return finder.find_ngram_acceptance("", temperature, self.assets_dir, name)

    # ------------------------------------------------------------------------------- hardware profile
    @property
    def profile(self) -> HardwareProfile | None:
        """The hardware profile in use (None: none matches this machine yet)."""
        return self.choice.profile

    @profile.setter
    def profile(self, prof: HardwareProfile | None) -> None:
        """Set a profile by hand (tests, scripts); the reason says so."""
        self.choice = (ProfileChoice(None, "none", None, "no profile set") if prof is None else
                       ProfileChoice(prof, "given", None, f"set by hand ({prof.device})"))

    def find_profile(self) -> ProfileChoice:
        """Use the cached or shipped profile measured on a machine like this one (never one from another)."""
        self.choice = finder.find_profile(machine_fingerprint(self.pair()), cache_dir=self.cache_dir,
                                          assets_dir=self.assets_dir)
        return self.choice

    def start_profiling(self) -> threading.Thread:
        """Measure a quick profile of this machine in a daemon thread, cache it and switch to it when done;
        ``profiling`` reports the progress (the page banner shows it)."""
        status = self.profiling = LoadStatus()
        status(0.0, "measuring this machine's profile")
        why = self.choice

        def run() -> None:
            try:
                self.choice = finder.measure_and_cache(
                    self.pair(), why, self.cache_dir,
                    progress=lambda fraction, label: status(fraction, f"measuring this machine's profile: {label}"))
                status(1.0, "profile measured")
                status.ready = True
            except Exception as exc:  # the banner and the Hardware tab say so; decoding goes on conservatively
                status.error = f"{type(exc).__name__}: {exc}"
                traceback.print_exc()

        thread = threading.Thread(target=run, name="sequoia-profiler", daemon=True)
        thread.start()
        return thread

    @property
    def measuring(self) -> bool:
        """A background profile measurement is running."""
        p = self.profiling
        return p is not None and not p.ready and p.error is None

    def profile_note(self) -> str:
        """One sentence for the Hardware tab and the live view: the profile in use and why (file names only),
        or what Sequoia does until one is measured."""
        if self.measuring:
            return f"Measuring this machine's profile ({self.profiling.fraction:.0%}); {UNTIL_MEASURED}."
        if self.choice.profile is not None:
            return f"Hardware profile ({self.choice.source}): {self.choice.reason}."
        failed = f" Measuring one failed: {self.profiling.error}." if self.profiling and self.profiling.error else ""
        return f"No hardware profile: {self.choice.reason}; {UNTIL_MEASURED}.{failed}"

    def profile_banner(self) -> str:
        """HTML for the banner while the background measurement runs ("" otherwise)."""
        if not self.measuring:
            return ""
        return (f'<div class="sq-status sq-status-profiling"><small>Measuring this machine\'s profile: '
                f"{self.profiling.fraction:.0%} ({html.escape(self.profiling.description)}); "
                f"{UNTIL_MEASURED}.</small></div>")
