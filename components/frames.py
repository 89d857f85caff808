"""How often a streaming handler updates the page (shared by the Live and Compare tabs).

A browser re-rendering Plotly figures for every step of a fast method (target
only: ~10 steps/s) falls behind and stops answering clicks, Stop included, so
the handlers send a frame at most every :data:`FRAME_S`.
"""

from __future__ import annotations

from dataclasses import dataclass

#: The text and the summary line: at most one update this often while streaming.
FRAME_S = 0.2


@dataclass
class Throttle:
    """``due(now)`` is True at most once every ``period_s`` (and always the first time, or when forced)."""

    period_s: float
    last: float = float("-inf")

    def due(self, now: float, force: bool = False) -> bool:
        if force or now - self.last >= self.period_s:
            self.last = now
            return True
        return False
