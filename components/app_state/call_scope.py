"""The GPU call this process serves, if any: what ZeroGPU's worker process decodes with.

ZeroGPU runs one ``@spaces.GPU`` call at a time in a worker process made for it
(:mod:`components.app_state.serving`), so "the call" is a fact of the process:
:func:`entered` marks it for the call's duration, with the plan the server made
for it (:class:`~sequoia.runtime.measuring.gpu_call.CallPlan`).  While a call is
on, the pair room hands out the call's own pair
(:class:`~sequoia.runners.hf.call_graphs.CallGraphs`: graph runners over the
same models, capturing what the call replays) when the plan says capturing pays;
when the call ends its graphs are dropped, and :func:`last_line` keeps what they
did for the page's summary.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from sequoia.runners.hf.call_graphs import CallGraphs
from sequoia.runtime.call_engine import CallEngine
from sequoia.runtime.engine import SpeculativeEngine

log = logging.getLogger("sequoia")
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
_last_line = ""


def current() -> CallScope | None:
    """The call this process is serving, or None (the server itself, or a machine without ZeroGPU)."""
    return _current


@contextmanager
def entered(capture: bool, reason: str = "", emulate: bool = False) -> Iterator[CallScope]:
    """Mark this process as serving one call until the block ends; its graphs are dropped then."""
    global _current, _last_line
    scope = _current = CallScope(capture, reason, emulate)
    try:
        yield scope
    finally:
        _current = None
        if scope.graphs is not None:
            _last_line = scope.close()
            log.info("GPU call: %s", _last_line)


def line() -> str:
    """What the current call's graphs have done so far ("" outside a call or before its pair was used)."""
    scope = _current
    if scope is None or scope.graphs is None:
        return ""
    return scope.graphs.report().line()


def last_line() -> str:
    """What the last call this process served did with graphs ("" if none)."""
    return _last_line
