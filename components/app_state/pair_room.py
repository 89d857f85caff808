"""The loaded model pair and its engine: loaded once, in a background thread or on first use.

While the pair is loading, :meth:`LoadedPair.get` raises :class:`ModelsNotReady` at once instead of blocking a
worker for minutes; it is a ``ValueError`` so every handler's "readable message" path shows it.  Inside a GPU
call (:mod:`components.app_state.call_scope`) it hands out the call's own pair: graph runners over the same
models when the call captures, the loaded pair itself when it runs eagerly.
"""

from __future__ import annotations

import html
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field

from sequoia.runtime.engine import SpeculativeEngine
from sequoia.runtime.models import ModelPair

from components.app_state import call_scope
from components.app_state.load_status import LoadStatus, ModelsNotReady
from components.widgets.runtime_view import pair_words


def _nothing(pair: ModelPair) -> None:
    return None


@dataclass
class LoadedPair:
    """One model pair, its :class:`LoadStatus` and the engine around it."""

    loader: Callable[[], ModelPair]
    status: LoadStatus = field(default_factory=LoadStatus)
    # Runs once the pair is loaded, before the status says ready (the app finds its hardware profile there).
    on_loaded: Callable[[ModelPair], None] = field(default=_nothing, repr=False)
    why: str = ""                     # why this pair serves (components.app_state.pair_choice), for the banner
    _pair: ModelPair | None = field(default=None, repr=False)
    _engine: SpeculativeEngine | None = field(default=None, repr=False)
    _load_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _engine_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def ready(cls, pair: ModelPair, status: LoadStatus | None = None) -> LoadedPair:
        """A room around a pair loaded already."""
        room = cls(loader=lambda: pair, status=status or LoadStatus(), _pair=pair)
        room.status.fraction, room.status.description, room.status.ready = 1.0, "models ready", True
        return room

    @property
    def loaded(self) -> bool:
        return self._pair is not None

    @property
    def current(self) -> ModelPair | None:
        """The pair if it is loaded (never loads it)."""
        return self._pair

    def get(self) -> ModelPair:
        """The loaded pair (in a GPU call: the call's, see the module's docstring); loads it now if nobody has
        started to; ModelsNotReady while another thread is."""
        call = call_scope.current()
        if call is not None:
            return call.pair(self._loaded())
        return self._loaded()

    def _loaded(self) -> ModelPair:
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
        self.on_loaded(self._pair)
        self.status(1.0, "models ready")
        self.status.ready = True

    def start_loading(self) -> threading.Thread:
        """Load the pair in a daemon thread so the page can come up (and show progress) meanwhile."""
        def run() -> None:
            try:
                self.get()
            except ModelsNotReady:
                pass                          # someone else is loading it
            except Exception:
                traceback.print_exc()         # the banner shows the message; the console the traceback

        thread = threading.Thread(target=run, name="sequoia-model-loader", daemon=True)
        thread.start()
        return thread

    def engine(self) -> SpeculativeEngine:
        call = call_scope.current()
        if call is not None:
            return call.engine(self._loaded())
        pair = self.get()
        with self._engine_lock:
            if self._engine is None:
                self._engine = SpeculativeEngine(pair)
            return self._engine

    def label(self) -> str:
        """The loaded pair in one line of HTML (names escaped)."""
        if self._pair is None:
            return "model pair not loaded yet"
        p = self._pair
        names = [html.escape(str(getattr(p, k, "?"))) for k in ("draft_name", "target_name")]
        where = html.escape(pair_words(p.target.info, p.draft.info))
        streamed = ", target streamed from host memory" if getattr(p, "target_streamed", False) else ""
        why = f"<br><small>Why this pair: {html.escape(self.why)}.</small>" if self.why else ""
        return f"draft <b>{names[0]}</b> → target <b>{names[1]}</b> · {where}{streamed}{why}"
