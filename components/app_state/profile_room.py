"""The hardware profile the app prices trees with: found, measured in the background, and what follows from it.

:class:`ProfileRoom` holds the current :class:`~sequoia.runtime.measuring.finder.ProfileChoice` (cached or shipped,
matched to this machine by fingerprint, never one from another machine), the background measurement when
none matches, the sentences and banner that say which is in use, and the values the page derives from the
profile (:meth:`ProfileRoom.derived`), computed once per profile rather than once per decode.
"""

from __future__ import annotations

import html
import threading
import traceback
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from sequoia._meta import ASSETS
from sequoia.core.profiles.profile import HardwareProfile
from sequoia.core.profiles.runtimes import RuntimeDecision, TargetProbe, display_name
from sequoia.runtime.measuring import background_probe, finder
from sequoia.runtime.measuring.finder import ProfileChoice
from sequoia.runtime.measuring.fingerprint import machine_fingerprint
from sequoia.runtime.measuring.gpu_call import graph_profile
from sequoia.runtime.measuring.target_probe import probe_key
from sequoia.runtime.models import ModelPair

from components.app_state.load_status import LoadStatus


T = TypeVar("T")

#: What Sequoia does while this machine's profile is being measured (conservative: never slower).
UNTIL_MEASURED = ("until this machine's profile is measured, Sequoia (auto) runs the target alone and "
                  "Sequoia (dynamic) drafts nothing")
#: Values derived from one profile that are kept (each is a few numbers; the keys are few: runtimes, vectors).
DERIVED_SIZE = 64


def _not_loaded() -> ProfileChoice:
    return ProfileChoice(None, "none", None, "the models are not loaded yet")


@dataclass
class ProfileRoom:
    """This server's hardware profile; server-wide, since it describes the machine."""

    assets_dir: Path = ASSETS                 # the shipped profiles, calibrations and acceptance vectors
    cache_dir: Path | None = None             # where this machine's measured profiles are cached (None: default)
    auto_profile: bool = False                # measure a profile in the background when none matches
    choice: ProfileChoice = field(default_factory=_not_loaded)
    profiling: LoadStatus | None = None       # progress of the background measurement; None: none started
    runtime: RuntimeDecision | None = None    # the runtime the server chose at start, and why (None: not told)
    # Where no profile matches and none is measured here (ZeroGPU: no profiler outside a GPU call), the profile
    # that stands in, and why (the H100's measured graph replays at the served target's shapes).
    stand_in: ProfileChoice | None = None
    # Where no profile ranks torch and llama.cpp: their targets alone, timed after the profile (background_probe).
    timing: LoadStatus | None = None          # progress of that timing; None: none started
    later_probes: dict[str, TargetProbe] = field(default_factory=dict)
    _profiler: threading.Thread | None = field(default=None, repr=False)
    _derived: dict[Hashable, object] = field(default_factory=dict, repr=False)
    _derived_for: ProfileChoice | None = field(default=None, repr=False)   # the choice _derived belongs to
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def profile(self) -> HardwareProfile | None:
        """The hardware profile in use (None: none matches this machine yet)."""
        return self.choice.profile

    @profile.setter
    def profile(self, prof: HardwareProfile | None) -> None:
        """Set a profile by hand (tests, scripts); the reason says so."""
        self.choice = (ProfileChoice(None, "none", None, "no profile set") if prof is None else
                       ProfileChoice(prof, "given", None, f"set by hand ({prof.device})"))

    def find(self, pair: ModelPair) -> ProfileChoice:
        """Use the cached or shipped profile measured on a machine like this one (never one from another)."""
        self.choice = finder.find_profile(machine_fingerprint(pair), cache_dir=self.cache_dir,
                                          assets_dir=self.assets_dir)
        return self.choice

    def on_pair_loaded(self, pair: ModelPair) -> None:
        """Find the profile for a newly loaded pair; measure one in the background when none matches and the
        app asked for that."""
        self.find(pair)
        if self.choice.profile is None and self.stand_in is not None:
            self.choice = self.stand_in
        if self.auto_profile and self.choice.profile is None:
            self.start_profiling(pair)
        if self.auto_profile and background_probe.pending(self.runtime) and self.cache_dir is not None:
            self.start_timing(background_probe.pending(self.runtime))

    def start_profiling(self, pair: ModelPair) -> threading.Thread:
        """Measure a quick profile of this machine in a daemon thread, cache it and switch to it when done;
        ``profiling`` reports the progress (the page banner shows it)."""
        status = self.profiling = LoadStatus()
        status(0.0, "measuring this machine's profile")
        why = self.choice

        def run() -> None:
            try:
                self.choice = finder.measure_and_cache(
                    pair, why, self.cache_dir, background=True,   # visitors' requests go first, point by point
                    progress=lambda fraction, label: status(fraction, f"measuring this machine's profile: {label}"))
                status(1.0, "profile measured")
                status.ready = True
            except Exception as exc:  # the banner and the Hardware tab say so; decoding goes on conservatively
                status.error = f"{type(exc).__name__}: {exc}"
                traceback.print_exc()

        thread = self._profiler = threading.Thread(target=run, name="sequoia-profiler", daemon=True)
        thread.start()
        return thread

    def start_timing(self, backends: tuple[str, ...], time_one=background_probe.time_in_child) -> threading.Thread:
        """Time ``backends``' targets alone in a daemon thread, after the profile measurement (one piece of
        background work at a time), each in a child process (``time_one(backend, cache_dir)``); each result is
        kept in the cache and in ``later_probes``; ``timing`` reports the progress (the banner shows it)."""
        status = self.timing = LoadStatus()
        names = " and ".join(display_name(b) for b in backends)
        status(0.0, f"timing the target alone on {names} in the background")
        runtime, profiler = self.runtime, self._profiler
        key = probe_key(runtime.machine.cpu_features) if runtime and runtime.machine else "unknown"
        key = background_probe.start_key(self.cache_dir, runtime, key) if runtime else key

        def run() -> None:
            if profiler is not None:
                profiler.join()
            failed = []
            for i, backend in enumerate(backends):
                try:
                    probe = time_one(backend, self.cache_dir)
                    background_probe.record(self.cache_dir, key, probe)
                    self.later_probes = {**self.later_probes, backend: probe}
                except Exception as exc:  # noqa: BLE001 - advice only: the banner says it failed
                    failed.append(f"timing {display_name(backend)} failed: {type(exc).__name__}: {exc}")
                    traceback.print_exc()
                status((i + 1) / len(backends), f"timed the target alone on {display_name(backend)}")
            status.error = "; ".join(failed) or None   # set once all ran: an error ends the banner's polling
            status.ready = True

        thread = threading.Thread(target=run, name="sequoia-runtime-timing", daemon=True)
        thread.start()
        return thread

    @property
    def measuring(self) -> bool:
        """A background profile measurement, or the timing of another runtime after it, is running."""
        return any(p is not None and not p.ready and p.error is None for p in (self.profiling, self.timing))

    def note(self) -> str:
        """One sentence for the Hardware tab and the live view: the profile in use and why (file names only),
        or what Sequoia does until one is measured."""
        p = self.profiling
        if p is not None and not p.ready and p.error is None:
            return f"Measuring this machine's profile ({p.fraction:.0%}); {UNTIL_MEASURED}."
        if self.choice.profile is not None:
            return f"Hardware profile ({self.choice.source}): {self.choice.reason}."
        failed = f" Measuring one failed: {self.profiling.error}." if self.profiling and self.profiling.error else ""
        return f"No hardware profile: {self.choice.reason}; {UNTIL_MEASURED}.{failed}"

    def banner(self) -> str:
        """HTML for the banner: the background measurement while it runs, then the other runtimes' timing
        (while it runs, then what it found: the switch offered with both rates where another proved faster)."""
        p = self.profiling
        out = "" if p is None or p.ready or p.error is not None else (
            f'<div class="sq-status sq-status-profiling"><small>Measuring this machine\'s profile: '
            f"{p.fraction:.0%} ({html.escape(p.description)}); {UNTIL_MEASURED}.</small></div>")
        return out + self.timing_banner()

    def timing_banner(self) -> str:
        """The other runtimes' background timing: its progress, then its outcome ("" where none ran)."""
        t = self.timing
        if t is None:
            return ""
        offer = background_probe.switch_offer(self.runtime, self.later_probes) if self.runtime else None
        if not t.ready and t.error is None:
            text = (f"{html.escape(t.description)} ({t.fraction:.0%}), one thread, CPU time: no profile ranks the "
                    f"runtimes on this CPU kind yet; this line says which is faster, with both rates, when done.")
        else:
            text = background_probe.outcome(self.runtime, self.later_probes) if self.runtime else ""
            text = html.escape(text + "." if text else t.error or "")
        if not text:
            return ""
        kind = "sq-status-switch" if offer else "sq-status-timing"
        return f'<div class="sq-status {kind}"><small>{"<b>Switch?</b> " if offer else ""}{text}</small></div>'

    def derived(self, key: Hashable, compute: Callable[[], T]) -> T:
        """``compute()`` once per profile choice and ``key``: kept until the choice changes (a new object, set
        by finding, measuring or by hand), so a value read on every decode costs a dictionary lookup."""
        choice = self.choice
        with self._lock:
            if self._derived_for is not choice:
                self._derived, self._derived_for = {}, choice
            if key in self._derived:
                return self._derived[key]
        value = compute()   # outside the lock: a DP solve per runtime; errors propagate and are not kept
        with self._lock:
            if self._derived_for is choice:
                if len(self._derived) >= DERIVED_SIZE:
                    self._derived.pop(next(iter(self._derived)))
                self._derived[key] = value
        return value


def zerogpu_stand_in(seven_b: bool) -> ProfileChoice:
    """The profile Sequoia (auto) and the calls' durations use on a ZeroGPU card nobody profiled: the H100's
    measured graph-runner costs at the served target's shapes (``seven_b``: the GPU Space pair's 7B, else the
    1.5B's)."""
    name = "h100-7b" if seven_b else "h100-1.5b"
    return ProfileChoice(graph_profile(name), "given", None,
                         f"this ZeroGPU card has no profile yet; the H100's measured CUDA-graph costs stand in "
                         f"({name}), since each call captures its graphs")
