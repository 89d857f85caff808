"""App-wide state the tabs share, and the catalogue of acceptance vectors.

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

import html
import json
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sequoia._meta import ASSETS  # noqa: E402  (re-exported for the tabs)

#: Fallbacks until measured vectors exist in assets/acceptance/ (Qwen2.5-Coder 0.5B -> 1.5B).
BUILTIN_ACCEPTANCE: dict[str, tuple[float, ...]] = {
    "built-in: code, greedy, int8 draft": (0.797, 0.104, 0.048, 0.020, 0.010, 0.005),
    "built-in: chat": (0.582, 0.151, 0.083, 0.040, 0.020, 0.010),
}

#: Largest tree budget the UI accepts (a server guard, far below sequoia.core.tree.MAX_TREE_SIZE on CPU).
CPU_MAX_BUDGET = 128
GPU_MAX_BUDGET = 512

#: Queue settings for events (``**MODEL_WORK``).  There is one model pair, so everything that runs it
#: (Live, Compare, Hardware and their API endpoints) shares one queue slot; model-free work (the DP
#: explorer) has its own slots and stays responsive while a long decode runs.
MODEL_WORK = {"concurrency_id": "model", "concurrency_limit": 1}
LIGHT_WORK = {"concurrency_limit": 4}


def budget_cap_for(device: Any) -> int:
    """Largest tree budget the UI accepts on a device (a torch.device or its name)."""
    return GPU_MAX_BUDGET if str(device).startswith("cuda") else CPU_MAX_BUDGET


class ModelsNotReady(ValueError):
    """The model pair is still loading, or failed to load; the message says which."""


@dataclass
class LoadStatus:
    """Progress of the model load, written by the loader and read by the page banner.

    Callable as the loader's ``progress(fraction, description)``; ``listener``
    (e.g. a console printer) sees every update too.
    """

    fraction: float = 0.0
    description: str = "waiting to start"
    error: str | None = None
    ready: bool = False
    started: float | None = None            # time.monotonic() when loading began
    listener: Callable[[float, str], None] | None = field(default=None, repr=False)

    def __call__(self, fraction: float, description: str) -> None:
        if self.started is None:
            self.started = time.monotonic()
        self.fraction, self.description = min(max(float(fraction), 0.0), 1.0), str(description)
        if self.listener is not None:
            self.listener(self.fraction, self.description)

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.started if self.started is not None else 0.0

    def summary(self) -> str:
        """One line, e.g. "42%, converting the target, 35 s"."""
        return f"{self.fraction:.0%}, {self.description}, {self.elapsed_s:.0f} s"


def acceptance_catalogue(assets_dir: Path = ASSETS) -> dict[str, tuple[float, ...]]:
    """Measured vectors from ``assets/acceptance/*.json`` (first) plus the built-ins.

    Files are :class:`sequoia.runtime.acceptance.AcceptanceVector` JSON
    (``format: sequoia-acceptance/1``), listed as "stem (T=…, prompt set)";
    the plain ``{"acceptance": [...], "meta": {"name": ...}}`` form is read
    too.  Unreadable files are skipped.
    """
    out: dict[str, tuple[float, ...]] = {}
    for path in sorted((Path(assets_dir) / "acceptance").glob("*.json")):
        found = _read_vector(path)
        if found is not None:
            out[found[0]] = found[1]
    return {**out, **BUILTIN_ACCEPTANCE}


def _read_vector(path: Path) -> tuple[str, tuple[float, ...]] | None:
    from sequoia.runtime.acceptance import AcceptanceVector

    try:
        vec = AcceptanceVector.load(path)
        where = f", {vec.prompt_set}" if vec.prompt_set else ""
        return f"{path.stem} (T={vec.temperature:g}{where})", vec.values
    except ValueError:
        pass
    try:
        data = json.loads(path.read_text())
        meta = data.get("meta") if isinstance(data.get("meta"), dict) else {}
        return str(meta.get("name") or path.stem), parse_acceptance(data["acceptance"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def parse_acceptance(value: Any) -> tuple[float, ...]:
    """A list, or text such as ``"0.8, 0.1"`` / ``"[0.8, 0.1]"``, as a validated vector."""
    from sequoia.core.dp import check_acceptance

    if isinstance(value, str):
        text = value.strip()
        if not text:
            raise ValueError("the acceptance vector is empty")
        try:
            value = json.loads(text if text.startswith("[") else f"[{text}]")
        except json.JSONDecodeError as exc:
            raise ValueError(f"acceptance vector: expected numbers separated by commas ({exc.msg})") from None
    if not isinstance(value, (list, tuple)) or not all(
            isinstance(x, (int, float)) and not isinstance(x, bool) for x in value):
        raise ValueError("acceptance vector: expected a list of numbers")
    return tuple(float(x) for x in check_acceptance(value))


def format_acceptance(vec: tuple[float, ...]) -> str:
    return ", ".join(f"{x:.4g}" for x in vec)


def find_profiles(assets_dir: Path = ASSETS) -> list[Path]:
    """Candidate hardware-profile files: ``assets/profiles/*.json`` (where the bench looks too), newest
    first, then ``assets/*profile*.json``."""
    root = Path(assets_dir)
    return sorted((root / "profiles").glob("*.json"), reverse=True) + sorted(root.glob("*profile*.json"))


@dataclass
class AppContext:
    """Server-wide state; the model pair is loaded once, in the background or on first use."""

    loader: Callable[[], Any]                 # returns a ModelPair (or anything shaped like one)
    assets_dir: Path = ASSETS
    max_budget: int | None = None             # None: by device (CPU_MAX_BUDGET / GPU_MAX_BUDGET)
    status: LoadStatus = field(default_factory=LoadStatus)
    profile: Any = None                       # sequoia.core.profile.HardwareProfile in use
    profile_source: str = ""                  # where it came from (file path / "measured now")
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
        self.load_profile()
        self.status(1.0, "models ready")
        self.status.ready = True

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
        from sequoia.runtime.engine import SpeculativeEngine

        pair = self.pair()
        with self._engine_lock:
            if self._engine is None:
                self._engine = SpeculativeEngine(pair)
            return self._engine

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
        """The shipped calibration for this pair nearest in temperature (``assets/acceptance/calibration-*``),
        or None (the dynamic tree then uses the identity a(q) = q)."""
        from sequoia._meta import pair_name
        from sequoia.runtime.calibration import find_calibration

        name = pair_name(self._pair) if self._pair is not None else None
        return find_calibration(Path(self.assets_dir) / "acceptance", temperature, name)

    def load_profile(self) -> str:
        """Use the newest readable profile in assets/ measured on this kind of device (CPU / CUDA), one
        for this pair and dtype preferred; return a note.  A CPU profile never prices a GPU, nor the
        reverse: with none for this device the server has no profile until *Profile now*."""
        from sequoia._meta import pair_name
        from sequoia.core.profile import HardwareProfile

        found = []
        for path in find_profiles(self.assets_dir):
            try:
                found.append((path, HardwareProfile.load(path)))
            except ValueError:
                continue
        if not found:
            return "No hardware profile in assets/ yet: press *Profile now*."
        pair = self._pair
        name = pair_name(pair) if pair is not None else None
        kind = str(getattr(pair, "device", "cpu")).split(":")[0] if pair is not None else None
        dtype = str(getattr(pair, "dtype", "")) if pair is not None else ""
        if kind is not None:
            found = [(p, h) for p, h in found if h.device.split(":")[0] == kind]
            if not found:
                return f"No hardware profile in assets/ for this device ({kind}): press *Profile now*."

        def fit(item):
            _, h = item
            return (bool(name and h.pair and h.pair != name), bool(dtype and h.dtype != dtype))

        path, prof = min(found, key=fit)  # stable: newest first among equals (find_profiles' order)
        self.profile, self.profile_source = prof, str(path)
        other = f" (measured for {prof.pair}, not this pair)" if name and prof.pair and prof.pair != name else ""
        if dtype and prof.dtype != dtype:
            other += f" (measured with a {prof.dtype} target, this one is {dtype})"
        return f"Profile loaded from `{path.name}`{other}."
