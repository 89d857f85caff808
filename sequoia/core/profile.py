"""Measured costs of one device: the hardware half of hardware-aware Sequoia.

A :class:`HardwareProfile` holds two cost curves, both in milliseconds:

``target_ms``  one target forward of n *new* tokens (a tree-shaped 4-D mask,
               explicit position ids) on top of a cached context of
               ``context_len`` tokens: the cost of verifying a tree of n - 1
               draft tokens plus its root.
``draft_ms``   one draft forward of ``width`` new tokens (one tree level) on
               the same kind of context, including the softmax over the
               vocabulary that sampling the next level needs.

Both are measured on a grid and interpolated linearly in between; past the
last grid point they are extrapolated along the last segment.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from .._meta import int_list, number_list, read_json, require, write_json

FORMAT = "sequoia-hardware/1"
#: New-token counts at which the target is timed (n = tree size + 1).
TARGET_GRID = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)
#: Level widths at which the draft is timed.
DRAFT_GRID = (1, 2, 4, 8, 16, 32, 64)


@dataclass(frozen=True)
class HardwareProfile:
    device: str                       # human-readable device description
    dtype: str                        # e.g. "torch.bfloat16"
    context_len: int                  # cached tokens before the timed forwards
    target_n: tuple[int, ...]         # [G] new-token counts, strictly increasing
    target_ms: tuple[float, ...]      # [G] median ms of one target forward of target_n[i] tokens
    draft_width: tuple[int, ...]      # [H] level widths, strictly increasing
    draft_ms: tuple[float, ...]       # [H] median ms of one draft level of draft_width[i] tokens
    pair: str = ""
    date: str = ""
    version: str = ""
    repeats: int = 0                  # timed repeats per point (0: hand-made)

    def __post_init__(self) -> None:
        for grid, values, name in (("target_n", "target_ms", "target"), ("draft_width", "draft_ms", "draft")):
            g = tuple(int(x) for x in getattr(self, grid))
            v = tuple(float(x) for x in getattr(self, values))
            object.__setattr__(self, grid, g)
            object.__setattr__(self, values, v)
            _check_curve(g, v, grid, values, name)
        if not isinstance(self.context_len, int) or self.context_len < 0:
            raise ValueError(f"context_len must be a non-negative integer, got {self.context_len!r}")

    # ------------------------------------------------------------------ costs
    def target(self, n):
        """ms of one target forward of ``n`` >= 1 new tokens (a tree of n - 1 draft tokens); n may be an array."""
        return _interp(n, self.target_n, self.target_ms, "n")

    def draft(self, width):
        """ms of one draft level of ``width`` >= 1 tokens; width may be an array."""
        return _interp(width, self.draft_width, self.draft_ms, "width")

    @property
    def max_tokens(self) -> int:
        """Largest measured target forward: trees up to max_tokens - 1 draft tokens are interpolated."""
        return self.target_n[-1]

    @classmethod
    def hand_made(cls, target: Callable[[int], float], draft: Callable[[int], float],
                  target_n: Sequence[int] = TARGET_GRID, draft_width: Sequence[int] = DRAFT_GRID) -> "HardwareProfile":
        """A profile from two cost functions, for tests and what-if plots."""
        return cls(device="hand-made", dtype="none", context_len=0,
                   target_n=tuple(target_n), target_ms=tuple(target(n) for n in target_n),
                   draft_width=tuple(draft_width), draft_ms=tuple(draft(w) for w in draft_width))

    # ------------------------------------------------------------- (de)serialise
    def to_dict(self) -> dict:
        return {"format": FORMAT, **{k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}}

    def save(self, path: str | Path) -> None:
        write_json(path, self.to_dict())

    @classmethod
    def from_dict(cls, data: dict, source: str = "hardware profile") -> "HardwareProfile":
        what = source
        try:
            return cls(
                device=require(data, "device", str, what),
                dtype=require(data, "dtype", str, what),
                context_len=require(data, "context_len", int, what),
                target_n=int_list(data, "target_n", what),
                target_ms=number_list(data, "target_ms", what),
                draft_width=int_list(data, "draft_width", what),
                draft_ms=number_list(data, "draft_ms", what),
                pair=data.get("pair", ""),
                date=data.get("date", ""),
                version=data.get("version", ""),
                repeats=int(data.get("repeats", 0)),
            )
        except ValueError as exc:
            if str(exc).startswith(what):
                raise
            raise ValueError(f"{what}: {exc}") from exc

    @classmethod
    def load(cls, path: str | Path, pair: str | None = None) -> "HardwareProfile":
        """Read a profile; with ``pair``, refuse one measured for another model pair."""
        prof = cls.from_dict(read_json(path, FORMAT, "Sequoia hardware profile"), source=str(path))
        if pair is not None and prof.pair and prof.pair != pair:
            raise ValueError(f"{path}: profile was measured for pair {prof.pair!r}, not {pair!r}")
        return prof


def _check_curve(grid: tuple[int, ...], values: tuple[float, ...], gname: str, vname: str, name: str) -> None:
    if not grid:
        raise ValueError(f"{gname} must not be empty")
    if len(grid) != len(values):
        raise ValueError(f"{gname} has {len(grid)} points but {vname} has {len(values)}")
    if grid[0] < 1 or any(b <= a for a, b in zip(grid, grid[1:])):
        raise ValueError(f"{gname} must be strictly increasing integers >= 1, got {list(grid)}")
    if not all(np.isfinite(v) and v > 0 for v in values):
        raise ValueError(f"{vname}: every {name} time must be a positive finite number of ms")


def _interp(x, grid: tuple[int, ...], values: tuple[float, ...], name: str):
    """Piecewise-linear in x, extended along the last segment; float for a scalar, array for an array."""
    arr = np.asarray(x, dtype=np.float64)
    if not np.all(arr >= 1):
        raise ValueError(f"{name} must be >= 1, got {x!r}")
    out = np.interp(arr, grid, values)
    if len(grid) > 1:
        slope = max(0.0, (values[-1] - values[-2]) / (grid[-1] - grid[-2]))
        out = np.where(arr > grid[-1], values[-1] + slope * (arr - grid[-1]), out)
    return float(out) if out.ndim == 0 else out
