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

import platform
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from ._meta import (Progress, ProgressFn, int_list, library_version, now_iso, number_list, pair_name, read_json,
                    require, write_json)
from .kv_cache import KVCache
from .masks import tree_attention_mask, verify_mask
from .tree import Tree

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


# ---------------------------------------------------------------------------- measuring
def measure_profile(
    pair,
    context_len: int = 128,
    target_grid: Sequence[int] = TARGET_GRID,
    draft_grid: Sequence[int] = DRAFT_GRID,
    repeats: int = 3,
    warmup: int = 1,
    point_s: float = 5.0,
    generator: torch.Generator | None = None,
    progress: ProgressFn | None = None,
    stop_ratio: float | None = 16.0,
) -> HardwareProfile:
    """Time ``pair.target`` by new-token count and ``pair.draft`` by level width.

    Each model prefills ``context_len`` random tokens once; every timed forward
    then appends n tokens and the cache is cropped back, so all points see the
    same realistic cached context.  Each point is the median of up to
    ``repeats`` forwards after ``warmup`` untimed ones; repeats stop early once
    a point has taken ``point_s`` seconds (slow points vary little), which
    keeps a CPU profile of the embedded pair to about a minute.  The target
    grid stops once a forward costs more than ``stop_ratio`` times one token
    (None: never): no tree that large can pay for itself, and on a
    compute-bound CPU the points past it would take minutes.  ``generator``
    draws the token ids (costs do not depend on them); a fixed seed is used
    without one.
    """
    if repeats < 1 or warmup < 0 or context_len < 1:
        raise ValueError("need repeats >= 1, warmup >= 0 and context_len >= 1")
    gen = generator if generator is not None else torch.Generator().manual_seed(0)
    tick = Progress(len(target_grid) + len(draft_grid), progress, "profiling")
    try:
        plan = _Plan(ctx=context_len, repeats=repeats, warmup=warmup, point_s=point_s)
        target_ms = _time_grid(pair.target, target_grid, _verify_inputs, plan, gen, lambda n: tick(f"target n={n}"),
                               stop_ratio)
        for n in target_grid[len(target_ms):]:
            tick(f"target n={n} skipped (over {stop_ratio:g}x one token)")
        target_grid = tuple(target_grid)[: len(target_ms)]
        draft_ms = _time_grid(pair.draft, draft_grid, _level_inputs, plan, gen, lambda w: tick(f"draft width={w}"))
    finally:
        tick.close()
    device = torch.device(getattr(pair, "device", None) or next(pair.target.parameters()).device)
    return HardwareProfile(
        device=describe_device(device), dtype=str(pair.target.dtype), context_len=context_len,
        target_n=tuple(target_grid), target_ms=tuple(target_ms),
        draft_width=tuple(draft_grid), draft_ms=tuple(draft_ms),
        pair=pair_name(pair), date=now_iso(), version=library_version(), repeats=repeats,
    )


def describe_device(device: torch.device) -> str:
    if device.type == "cuda":
        return f"cuda: {torch.cuda.get_device_name(device)}"
    cpu = platform.processor() or platform.machine()
    return f"cpu: {cpu}, {torch.get_num_threads()} threads"


def _verify_inputs(n: int, ctx: int, dtype: torch.dtype, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Position ids [1, n] and mask [1, 1, n, ctx + n] of a tree of n nodes (a heap-shaped binary tree)."""
    tree = Tree((-1,) + tuple((i - 1) // 2 for i in range(1, n)))
    return tree.position_ids(ctx, device)[None], verify_mask(tree, ctx, dtype, device)


def _level_inputs(width: int, ctx: int, dtype: torch.dtype, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Position ids [1, w] and mask [1, 1, w, ctx + w] of one tree level: each node sees the context and itself."""
    allowed = torch.zeros(width, ctx + width, dtype=torch.bool)
    allowed[:, :ctx] = True
    allowed[:, ctx:] = torch.eye(width, dtype=torch.bool)
    pos = torch.full((1, width), ctx, dtype=torch.long, device=device)
    return pos, tree_attention_mask(allowed, dtype, device)


@dataclass(frozen=True)
class _Plan:
    ctx: int          # cached context tokens
    repeats: int      # timed forwards per point, at most
    warmup: int       # untimed forwards per point
    point_s: float    # stop repeating a point once this much wall time went into it (>= 1 timed run)


@torch.inference_mode()
def _time_grid(model, grid, make_inputs, plan: _Plan, gen: torch.Generator,
               on_point: Callable[[int], None], stop_ratio: float | None = None) -> list[float]:
    """Median ms per grid point of one forward (+ softmax of its logits) after a prefill of ``plan.ctx`` tokens.

    With ``stop_ratio``, stops after the first point costing more than that times the first one
    (the list is then shorter than ``grid``; at least two points are measured).
    """
    device = next(model.parameters()).device
    vocab = model.config.vocab_size
    cache = KVCache(model.config)
    prefill = torch.randint(vocab, (1, plan.ctx), generator=gen).to(device)  # [1, ctx]
    model(input_ids=prefill, past_key_values=cache.cache, use_cache=True)
    out = []
    for n in grid:
        ids = torch.randint(vocab, (1, n), generator=gen).to(device)  # [1, n]
        pos, mask = make_inputs(n, plan.ctx, model.dtype, device)
        spent = sum(_forward_ms(model, cache, ids, pos, mask, plan.ctx, device) for _ in range(plan.warmup))
        times = [_forward_ms(model, cache, ids, pos, mask, plan.ctx, device)]
        while len(times) < plan.repeats and spent + sum(times) < plan.point_s * 1000.0:
            times.append(_forward_ms(model, cache, ids, pos, mask, plan.ctx, device))
        out.append(statistics.median(times))
        on_point(n)
        if stop_ratio is not None and len(out) >= 2 and out[-1] > stop_ratio * out[0]:
            break
    return out


def _forward_ms(model, cache: KVCache, ids, pos, mask, ctx: int, device) -> float:
    """One timed forward of ``ids`` on the cached context; the cache is cropped back to ``ctx`` after."""
    _sync(device)
    t0 = time.perf_counter()
    logits = model(input_ids=ids, position_ids=pos, attention_mask=mask,
                   past_key_values=cache.cache, use_cache=True).logits
    torch.softmax(logits.float(), dim=-1)
    _sync(device)
    ms = (time.perf_counter() - t0) * 1000.0
    cache.crop(ctx)
    return ms


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
