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
last grid point they are extrapolated along the last segment.  Two measured
overheads complete the cost of a step (see :mod:`sequoia.core.profiles.cost`):
``step_overhead_ms`` per step outside the model forwards (verification walk,
sampling, cache compaction) and ``level_overhead_ms`` per draft level outside
its forward (sampling the level, building masks).

A :class:`~sequoia.core.profiles.fingerprint.Fingerprint` says what the costs were
measured on; a profile is meant for the machines whose fingerprint matches
it, and one without a fingerprint (format 1 files, hand-made profiles)
matches none.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from ..._meta import int_list, named_errors, number_list, optional_number, read_json, require, write_json
from .fingerprint import Fingerprint

FORMAT = "sequoia-hardware/2"
#: Older files (no fingerprint, no overheads) are still read.
FORMAT_1 = "sequoia-hardware/1"
WHAT = "Sequoia hardware profile"
#: New-token counts at which the target is timed (n = tree size + 1).
TARGET_GRID = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)
#: Level widths at which the draft is timed.
DRAFT_GRID = (1, 2, 4, 8, 16, 32, 64)
#: The grids of a target streamed from host memory (:mod:`sequoia.runners.offload`): its forward costs about the
#: same for one token or hundreds (the layers' copy dominates), so trees of hundreds of nodes pay and the
#: curves reach the largest tree (MAX_TREE_SIZE = 1024) and the widest levels such trees have.
STREAMED_TARGET_GRID = tuple(2 ** i for i in range(11))     # 1 .. 1024
STREAMED_DRAFT_GRID = tuple(2 ** i for i in range(9))       # 1 .. 256


@dataclass(frozen=True)
class ContextCurves:
    """The same two curves measured after another number of cached tokens (same grids as the profile's)."""

    context_len: int
    target_ms: tuple[float, ...]      # [G] on the profile's target_n
    draft_ms: tuple[float, ...]       # [H] on the profile's draft_width

    def to_dict(self) -> dict:
        return {"context_len": self.context_len, "target_ms": list(self.target_ms), "draft_ms": list(self.draft_ms)}


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
    fingerprint: Fingerprint | None = None  # what it was measured on (None: matches no machine)
    step_overhead_ms: float = 0.0     # per step outside the model forwards (walk, sampling, cache compaction)
    level_overhead_ms: float = 0.0    # per draft level outside its forward
    note: str = ""                    # how it was made, what is unknown
    # The curves at other context lengths, sorted (attention reads every cached token, so costs grow with the
    # context); :meth:`at_context` interpolates between them.  () : priced at ``context_len`` everywhere.
    contexts: tuple[ContextCurves, ...] = ()

    def __post_init__(self) -> None:
        for grid, values, name in (("target_n", "target_ms", "target"), ("draft_width", "draft_ms", "draft")):
            g = tuple(int(x) for x in getattr(self, grid))
            v = tuple(float(x) for x in getattr(self, values))
            object.__setattr__(self, grid, g)
            object.__setattr__(self, values, v)
            _check_curve(g, v, grid, values, name)
        if not isinstance(self.context_len, int) or self.context_len < 0:
            raise ValueError(f"context_len must be a non-negative integer, got {self.context_len!r}")
        for name in ("step_overhead_ms", "level_overhead_ms"):
            value = float(getattr(self, name))
            if not (math.isfinite(value) and value >= 0.0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
            object.__setattr__(self, name, value)
        curves = tuple(sorted(self.contexts, key=lambda c: c.context_len))
        for c in curves:
            _check_curve(self.target_n, tuple(c.target_ms), "target_n", f"target_ms at context {c.context_len}",
                         "target")
            _check_curve(self.draft_width, tuple(c.draft_ms), "draft_width", f"draft_ms at context {c.context_len}",
                         "draft")
        if len({c.context_len for c in curves} | {self.context_len}) != len(curves) + 1:
            raise ValueError("contexts: each context length may be measured once (and not the profile's own)")
        object.__setattr__(self, "contexts", curves)

    # ------------------------------------------------------------------ costs
    def at_context(self, context_len: int) -> "HardwareProfile":
        """This profile with its curves priced after ``context_len`` cached tokens.

        Piecewise-linear in the context between measured lengths, extended along the last segment
        above the longest (never below its costs) and held at the shortest below it.  Itself
        when no other context was measured.
        """
        if not self.contexts or context_len == self.context_len:
            return self
        points = sorted([(self.context_len, self.target_ms, self.draft_ms)]
                        + [(c.context_len, c.target_ms, c.draft_ms) for c in self.contexts])
        ctx = np.array([p[0] for p in points], dtype=np.float64)
        target = _along_context(context_len, ctx, np.array([p[1] for p in points]))
        draft = _along_context(context_len, ctx, np.array([p[2] for p in points]))
        return replace(self, context_len=int(context_len), target_ms=tuple(target), draft_ms=tuple(draft),
                       contexts=())


    def target(self, n):
        """ms of one target forward of ``n`` >= 1 new tokens (a tree of n - 1 draft tokens); n may be an array."""
        return _interp(n, self.target_n, self.target_ms, "n")

    def draft(self, width):
        """ms of one draft level of ``width`` >= 1 tokens; width may be an array."""
        return _interp(width, self.draft_width, self.draft_ms, "width")

    # ------------------------------------------------------------- matching
    def mismatches(self, machine: Fingerprint) -> list[str]:
        """Why this profile does not describe ``machine`` ([] when it does)."""
        if self.fingerprint is None:
            return ["the profile has no fingerprint (measured before fingerprints, or hand-made)"]
        return self.fingerprint.mismatches(machine)

    def matches(self, machine: Fingerprint) -> bool:
        return not self.mismatches(machine)

    @property
    def max_tokens(self) -> int:
        """Largest measured target forward: trees up to max_tokens - 1 draft tokens are interpolated."""
        return self.target_n[-1]

    @classmethod
    def hand_made(cls, target: Callable[[int], float], draft: Callable[[int], float],
                  target_n: Sequence[int] = TARGET_GRID, draft_width: Sequence[int] = DRAFT_GRID,
                  step_overhead_ms: float = 0.0, level_overhead_ms: float = 0.0,
                  device: str = "hand-made", note: str = "") -> "HardwareProfile":
        """A profile from two cost functions, for tests and what-if plots (no fingerprint: matches no machine)."""
        return cls(device=device, dtype="none", context_len=0,
                   target_n=tuple(target_n), target_ms=tuple(target(n) for n in target_n),
                   draft_width=tuple(draft_width), draft_ms=tuple(draft(w) for w in draft_width),
                   step_overhead_ms=step_overhead_ms, level_overhead_ms=level_overhead_ms, note=note)

    # ------------------------------------------------------------- (de)serialise
    def to_dict(self) -> dict:
        out = {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()
               if k not in ("fingerprint", "contexts")}
        out["contexts"] = [c.to_dict() for c in self.contexts]
        return {"format": FORMAT, **out, "fingerprint": self.fingerprint.to_dict() if self.fingerprint else None}

    def save(self, path: str | Path) -> None:
        write_json(path, self.to_dict())

    @classmethod
    def from_dict(cls, data: dict, source: str = "hardware profile") -> "HardwareProfile":
        what = source
        with named_errors(what):
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
                fingerprint=Fingerprint.from_dict(fp, what) if (fp := data.get("fingerprint")) is not None else None,
                step_overhead_ms=optional_number(data, "step_overhead_ms", what),
                level_overhead_ms=optional_number(data, "level_overhead_ms", what),
                note=data.get("note", ""),
                contexts=tuple(_context_curves(c, what) for c in data.get("contexts", [])),
            )

    @classmethod
    def load(cls, path: str | Path, pair: str | None = None) -> "HardwareProfile":
        """Read a profile; with ``pair``, refuse one measured for another model pair."""
        prof = cls.from_dict(_read(path), source=str(path))
        if pair is not None and prof.pair and prof.pair != pair:
            raise ValueError(f"{path}: profile was measured for pair {prof.pair!r}, not {pair!r}")
        return prof


def _context_curves(data, what: str) -> ContextCurves:
    if not isinstance(data, dict):
        raise ValueError(f"{what}: each entry of 'contexts' must be an object")
    return ContextCurves(context_len=require(data, "context_len", int, what),
                         target_ms=tuple(number_list(data, "target_ms", what)),
                         draft_ms=tuple(number_list(data, "draft_ms", what)))


def _along_context(x: float, ctx: np.ndarray, curves: np.ndarray) -> np.ndarray:
    """Each column of ``curves`` [C, G] interpolated at context ``x``; linear past the last, held before the first."""
    if x >= ctx[-1] and len(ctx) >= 2:
        slope = (curves[-1] - curves[-2]) / (ctx[-1] - ctx[-2])
        return np.maximum(curves[-1] + slope * (x - ctx[-1]), curves[-1])
    return np.array([np.interp(x, ctx, curves[:, j]) for j in range(curves.shape[1])])


def _read(path: str | Path) -> dict:
    """A format-2 file, or a format-1 one (read as having no fingerprint and zero overheads)."""
    try:
        return read_json(path, FORMAT, WHAT)
    except ValueError as exc:
        try:
            return read_json(path, FORMAT_1, WHAT)
        except ValueError:
            raise exc from None


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
