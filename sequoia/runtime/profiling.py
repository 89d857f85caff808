"""Measuring a :class:`~sequoia.core.profile.HardwareProfile` on the models at hand."""

from __future__ import annotations

import platform
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from .._meta import Progress, ProgressFn, library_version, now_iso, pair_name
from ..core.masks import tree_attention_mask, verify_mask
from ..core.profile import DRAFT_GRID, TARGET_GRID, HardwareProfile
from ..core.tree import Tree
from .kv_cache import KVCache


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
