"""The one place that chooses which measurements to use: hardware profiles, acceptance vectors, calibrations.

The app, the bench and the CLI all call these functions, so one rule decides everywhere.

Profiles (:func:`find_profile`), first match wins:

``given``    a file the user named (``--profile``); used even when measured elsewhere, but the reason says so.
``cached``   ``<cache_dir>/profiles/<fingerprint key>.json``: measured earlier on this machine.
``shipped``  an ``assets/profiles/*.json`` whose fingerprint matches this machine.
``none``     nothing matches: the reason says what differs.  A profile measured on another machine (or one
             without a fingerprint) is never used silently; :func:`ensure_profile` then measures one
             (source ``measured``) and caches it for later starts.

Acceptance vectors (:func:`list_acceptance`, :func:`find_acceptance`) are only ``sequoia-acceptance/1``
files, never calibrations; each is labelled by prompt kind and temperature.  Calibrations
(:func:`find_calibration`) are the ``calibration-*.json`` files beside them, and the measured acceptance
of copied tokens (:func:`find_ngram_acceptance`) the ``ngram-*.json`` ones.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..._meta import ASSETS, ProgressFn
from ...core.ngrams.ngram_acceptance import NgramAcceptance, pool_ngram_acceptance
from ...core.profiles.acceptance import AcceptanceVector
from ...core.profiles.calibration import Calibration
from ...core.profiles.fingerprint import Fingerprint
from ...core.profiles.profile import HardwareProfile
from ...runners.embedded import DRAFT, TARGET, default_cache_dir
from ..methods import DEFAULT_ACCEPTANCE
from .fingerprint import machine_fingerprint
from .profiling import measure_profile

SOURCES = ("given", "cached", "shipped", "measured", "none")
_SAME_T = 1e-9


# ---------------------------------------------------------------------------------------------- profiles
@dataclass(frozen=True)
class ProfileChoice:
    profile: HardwareProfile | None
    source: str                  # one of SOURCES
    path: Path | None            # the file it was read from / cached to (None: none, or set in memory)
    reason: str                  # one readable sentence: which profile and why, or why none matched

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise ValueError(f"profile source must be one of {', '.join(SOURCES)}, got {self.source!r}")
        if (self.profile is None) != (self.source == "none"):
            raise ValueError("a profile choice has a profile exactly when its source is not 'none'")

    @property
    def file_name(self) -> str:
        """The file name only (never a server's absolute path), or "" without a file."""
        return self.path.name if self.path is not None else ""


def profile_cache_path(fingerprint: Fingerprint, cache_dir: str | Path | None = None) -> Path:
    """Where this machine's measured profile is cached: ``<cache_dir>/profiles/<fingerprint key>.json``."""
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    return root / "profiles" / f"{fingerprint.key()}.json"


def find_profile(fingerprint: Fingerprint, explicit: str | Path | None = None, cache_dir: str | Path | None = None,
                 assets_dir: str | Path = ASSETS) -> ProfileChoice:
    """The profile to use on the machine ``fingerprint`` describes; never measures (see the module doc)."""
    if explicit is not None:
        return _given(Path(explicit), fingerprint)
    cached = profile_cache_path(fingerprint, cache_dir)
    prof = _read_profile(cached)
    if prof is None and not fingerprint.pair:
        cached, prof = _cached_embedded(fingerprint, cache_dir)
    if prof is not None and prof.matches(fingerprint):
        return ProfileChoice(prof, "cached", cached,
                             f"cached {cached.name} was measured on this machine ({_when(prof)})")
    misses = []
    for path in sorted((Path(assets_dir) / "profiles").glob("*.json")):
        prof = _read_profile(path)
        if prof is None:
            continue
        diff = prof.mismatches(fingerprint)
        if not diff:
            return ProfileChoice(prof, "shipped", path, f"shipped {path.name} was measured on a machine like "
                                 f"this one ({_when(prof)})")
        why = ("records no machine fingerprint" if prof.fingerprint is None
               else f"was measured on another machine ({'; '.join(diff)})")
        misses.append((len(diff), f"shipped {path.name} {why}"))
    if not misses:
        return ProfileChoice(None, "none", None, "no profile measured on this machine is cached or shipped")
    closest = [text for _, text in sorted(misses)[:2]]
    return ProfileChoice(None, "none", None, f"{' and '.join(closest)}; none matches this machine")


def cache_profile(profile: HardwareProfile, cache_dir: str | Path | None = None) -> Path:
    """Save ``profile`` where :func:`find_profile` looks for this machine's cached one; returns the path."""
    if profile.fingerprint is None:
        raise ValueError("only a profile with a machine fingerprint can be cached (measure it with measure_profile)")
    path = profile_cache_path(profile.fingerprint, cache_dir)
    profile.save(path)
    return path


def ensure_profile(pair, explicit: str | Path | None = None, cache_dir: str | Path | None = None,
                   progress: ProgressFn | None = None, assets_dir: str | Path = ASSETS) -> ProfileChoice:
    """:func:`find_profile` for ``pair`` on this machine; with none, measure a quick profile now and cache it."""
    found = find_profile(machine_fingerprint(pair), explicit, cache_dir, assets_dir)
    if found.profile is not None:
        return found
    return measure_and_cache(pair, found, cache_dir, progress)


def measure_and_cache(pair, why: ProfileChoice, cache_dir: str | Path | None = None,
                      progress: ProgressFn | None = None, background: bool = False) -> ProfileChoice:
    """Measure a quick profile of ``pair`` here, cache it; ``why`` is the choice that found none.
    ``background``: give way to every request that waits for the models (the app's profiler)."""
    prof = measure_profile(pair, quick=True, progress=progress, background=background)
    path = cache_profile(prof, cache_dir)
    return ProfileChoice(prof, "measured", path,
                         f"measured this machine now and cached it as {path.name} ({why.reason})")


def _given(path: Path, fingerprint: Fingerprint) -> ProfileChoice:
    prof = HardwareProfile.load(path)  # a named file that cannot be read is the user's error: say so
    if prof.fingerprint is None:
        note = "it records no machine fingerprint, so it may come from another machine"
    else:
        diff = prof.fingerprint.mismatches(fingerprint)
        note = f"WARNING: it was measured on another machine ({'; '.join(diff)})" if diff else \
            "it was measured on a machine like this one"
    return ProfileChoice(prof, "given", path, f"{path.name} was given explicitly; {note}")


def _cached_embedded(fingerprint: Fingerprint, cache_dir: str | Path | None) -> tuple[Path, HardwareProfile | None]:
    """The newest cached profile of the embedded pair matching ``fingerprint``, which names no pair (a runtime's
    expected fingerprint, its pair not loaded): a profile is cached under its pair's key (the loaded pair's
    name is in it: ``python -m sequoia profile --backend hf``, the app's profiler), which such a lookup cannot
    compute.  Only the embedded pair's profiles stand in (another pair of the same weight types costs more)."""
    folder = profile_cache_path(fingerprint, cache_dir).parent
    found: list[tuple[str, Path, HardwareProfile]] = []
    for path in sorted(folder.glob("*.json")):
        prof = _read_profile(path)
        pair = prof.fingerprint.pair if prof is not None and prof.fingerprint is not None else ""
        if pair.startswith(DRAFT.name) and f"+{TARGET.name}" in pair and prof.matches(fingerprint):
            found.append((prof.date or "", path, prof))
    if not found:
        return profile_cache_path(fingerprint, cache_dir), None
    _, path, prof = max(found, key=lambda item: item[0])
    return path, prof


def _read_profile(path: Path) -> HardwareProfile | None:
    """A readable profile, or None: a broken or foreign file in a search folder must not stop the app."""
    if not path.is_file():
        return None
    try:
        return HardwareProfile.load(path)
    except (ValueError, OSError):
        return None


def _when(prof: HardwareProfile) -> str:
    return prof.date[:10] if prof.date else "date unknown"


# ------------------------------------------------------------------------------------ acceptance vectors
@dataclass(frozen=True)
class AcceptanceEntry:
    label: str                    # e.g. "code, T=0 (embedded-code-greedy)"
    path: Path | None             # None: the built-in default
    kind: str                     # prompt kind, e.g. "code" / "chat"; "" when the file does not say
    temperature: float
    values: tuple[float, ...]     # [W] p_1..p_W
    top_p: float = 1.0
    top_k: int = 0


def same_models(a: str, b: str) -> bool:
    """Whether two pair names name the same models, whatever their weight quantization or runtime.

    Acceptance vectors and calibrations measured with an int8 draft serve an int4 one of the same
    model (top-1 agreement with the target 0.88 vs 0.86 on the embedded pair), and the same models as
    GGUF files on llama.cpp ("... (Q4_K_M)", "... (Q4_0, llama.cpp)"): the embedded torch models are
    those files dequantized.  A hardware profile does not, and its fingerprint compares both on its own.
    """
    strip = lambda name: _QUANT_SUFFIX.sub("", name)  # noqa: E731
    return strip(a) == strip(b)


_QUANT_SUFFIX = re.compile(r" \((?:int8|int4|[QF]\d+(?:_[0-9A-Z]+)*|BF16)(?:, llama\.cpp)?\)")

#: The built-in vector (measured on the embedded pair, code prompts, greedy) when no file fits.
DEFAULT_ENTRY = AcceptanceEntry(label="built-in: code, T=0 (embedded pair)", path=None, kind="code",
                                temperature=0.0, values=tuple(DEFAULT_ACCEPTANCE))


def acceptance_folder(assets_dir: str | Path = ASSETS) -> Path:
    return Path(assets_dir) / "acceptance"


def list_acceptance(assets_dir: str | Path = ASSETS, pair: str | None = None) -> list[AcceptanceEntry]:
    """Every acceptance vector under ``assets_dir/acceptance`` (measured for ``pair`` when given), by kind
    then temperature.  Calibrations and unreadable files are skipped."""
    folder = acceptance_folder(assets_dir)
    out = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else ():
        try:
            vec = AcceptanceVector.load(path)  # checks the format tag: a calibration is refused here
        except (ValueError, OSError):
            continue
        if pair and vec.pair and not same_models(vec.pair, pair):
            continue
        kind = Path(vec.prompt_set).stem if vec.prompt_set else ""
        warp = "" if vec.top_p == 1.0 and vec.top_k == 0 else f", top-p {vec.top_p:g}, top-k {vec.top_k}"
        label = f"{kind or 'any prompts'}, T={vec.temperature:g}{warp} ({path.stem})"
        out.append(AcceptanceEntry(label, path, kind, float(vec.temperature), tuple(vec.values),
                                   float(vec.top_p), int(vec.top_k)))
    return sorted(out, key=lambda e: (e.kind, e.temperature, e.label))


def find_acceptance(kind: str, temperature: float, assets_dir: str | Path = ASSETS, pair: str | None = None,
                    entries: Sequence[AcceptanceEntry] | None = None) -> AcceptanceEntry:
    """The vector for prompts of ``kind`` at ``temperature``: same temperature (same kind first), else at
    T > 0 the nearest temperature (same kind first); else :data:`DEFAULT_ENTRY`.  A greedy request never
    takes a sampled vector (those accept less), ``entries`` defaults to :func:`list_acceptance`."""
    found = list_acceptance(assets_dir, pair) if entries is None else entries
    usable = [e for e in found if e.top_p == 1.0 and e.top_k == 0]
    same_t = [e for e in usable if abs(e.temperature - temperature) <= _SAME_T]
    candidates = same_t or (usable if temperature > 0 else [])
    if not candidates:
        return DEFAULT_ENTRY
    return min(candidates, key=lambda e: (e.kind != kind, abs(e.temperature - temperature), e.label))


def _measured(assets_dir: str | Path, pattern: str, load, pair: str | None) -> dict:
    """file name -> record of every readable ``pattern`` file under ``assets_dir/acceptance`` measured for
    ``pair`` (or not saying for which pair), in name order; unreadable files are skipped."""
    folder = acceptance_folder(assets_dir)
    found = {}
    for path in sorted(folder.glob(pattern)) if folder.is_dir() else ():
        try:
            rec = load(path)
        except (ValueError, OSError):
            continue
        if not (pair and rec.pair and not same_models(rec.pair, pair)):
            found[path.name] = rec
    return found


def find_calibration(temperature: float = 0.0, assets_dir: str | Path = ASSETS,
                     pair: str | None = None) -> Calibration | None:
    """The ``calibration-*.json`` under ``assets_dir/acceptance`` nearest in temperature (measured for
    ``pair`` when both name one), or None (the dynamic tree then uses the identity).  Unreadable files are
    skipped."""
    found = _measured(assets_dir, "calibration-*.json", Calibration.load, pair).values()
    return min(found, key=lambda c: abs(c.temperature - float(temperature)), default=None)


def find_ngram_acceptance(kind: str, temperature: float, assets_dir: str | Path = ASSETS,
                          pair: str | None = None) -> NgramAcceptance | None:
    """The measured acceptance of copied tokens (``ngram-*.json`` under ``assets_dir/acceptance``) for prompts
    of ``kind`` at ``temperature``: same kind first, then the nearest temperature (measured for ``pair`` when
    both name one); ``kind`` "" (not known): every kind's table at the nearest temperature, pooled.  None
    without any (the proposers then use :func:`sequoia.core.ngrams.ngram_acceptance.ngram_prior`).  Unreadable files are skipped."""
    found = _measured(assets_dir, "ngram-*.json", NgramAcceptance.load, pair)
    if not kind:
        nearest = min((abs(a.temperature - float(temperature)) for a in found.values()), default=None)
        same = [a for a in found.values() if abs(a.temperature - float(temperature)) == nearest]
        return pool_ngram_acceptance(same) if same else None
    best = min(found, default=None, key=lambda name: (Path(found[name].prompt_set).stem != kind,
                                                      abs(found[name].temperature - float(temperature)), name))
    return found[best] if best is not None else None
