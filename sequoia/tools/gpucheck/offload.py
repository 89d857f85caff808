"""The offload check's parts: a random-weight target streamed from pinned host memory, what it costs, and what
Sequoia would make of it (``scripts/gpu/offload_check.py`` runs them and writes the report).

* :func:`build_target`: random weights at a shape, written straight into the streamed runner's host buffers
  (never a file, never a second copy): one pool of random numbers drawn once and laid across every tensor at
  rotating offsets, norms at one (a forward's cost does not depend on the values);
* :func:`copy_rate`: the host-to-device rate of one layer's buffer into a device slot, the floor of a
  streamed forward (its layers' bytes over this rate);
* :func:`accelerate_alone`: the baseline a user would reach for, accelerate's ``cpu_offload`` over the same
  host weights (the layers' pinned buffers themselves, no copy), one token at a time;
* :func:`projections`: the optimizer's tree for each shipped acceptance vector on the measured profile, its
  predicted ms per token against the streamed target alone and against accelerate.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import replace

import torch
from transformers import DynamicCache

from ...core.profiles.profile import HardwareProfile
from ...core.trees.optimizer import choose_tree
from ...runners.hf.lean import model_forward
from ...runners.offload.runner import StreamedRunner, host_model, streamed_runner
from ...runtime.engine import sync
from ...runtime.measuring.finder import list_acceptance
from .models import Shape

#: Elements of the random pool every tensor is cut from (64 MB of bf16).
POOL = 1 << 25
#: Depth limit of the projected trees (the paper's offloaded trees stay under ~20 levels).
MAX_DEPTH = 20


class RandomFill:
    """``fill(name, out)`` for :func:`~sequoia.runners.offload.runner.streamed_runner`: random values, cheaply."""

    def __init__(self, dtype: torch.dtype, seed: int = 0, std: float = 0.02) -> None:
        g = torch.Generator().manual_seed(seed)
        self.pool = (torch.randn(POOL, generator=g) * std).to(dtype)   # [POOL]
        self.offset = 0

    def __call__(self, name: str, out: torch.Tensor) -> None:
        if name.endswith("norm.weight"):
            out.fill_(1.0)
            return
        flat, done = out.view(-1), 0
        while done < flat.numel():
            take = min(flat.numel() - done, POOL - self.offset)
            flat[done: done + take].copy_(self.pool[self.offset: self.offset + take])
            done += take
            self.offset = (self.offset + take) % POOL
        self.offset = (self.offset + 7919) % POOL     # the next tensor starts elsewhere in the pool


def build_target(shape: Shape, device: torch.device, dtype: torch.dtype, in_flight: int) -> tuple[StreamedRunner, float]:
    """The streamed target at ``shape`` with random weights, and the seconds building it took."""
    t0 = time.perf_counter()
    runner = streamed_runner(shape.config(), RandomFill(dtype), shape.name, device, dtype, in_flight)
    return runner, time.perf_counter() - t0


def copy_rate(runner: StreamedRunner, repeats: int = 8) -> dict:
    """GB/s of one layer's host buffer copied into a device slot (asynchronously where the device is a GPU)."""
    stream = runner.stream
    src = stream.host[0]
    nbytes = src.numel() * src.element_size()
    gbps = nbytes / _copy_seconds(runner, src, repeats) / 1e9
    return {"layer_bytes": nbytes, "gb_per_s": gbps, "pinned": bool(src.is_pinned()) if src.device.type == "cpu"
            and torch.cuda.is_available() else False, "host_bytes": runner.host_bytes,
            "floor_ms": runner.host_bytes / (gbps * 1e9) * 1e3}


def pageable_copy_rate(runner: StreamedRunner, repeats: int = 8) -> dict:
    """GB/s of one layer copied into a device slot from ordinary (pageable) host memory, as a user's weights sit
    there unless something pins them: a pageable clone of the first layer's buffer (one layer's bytes more)."""
    src = runner.stream.host[0].clone()   # clone(): pageable, whatever the source was
    nbytes = src.numel() * src.element_size()
    return {"layer_bytes": nbytes, "gb_per_s": nbytes / _copy_seconds(runner, src, repeats) / 1e9, "pinned": False}


def _copy_seconds(runner: StreamedRunner, src: torch.Tensor, repeats: int) -> float:
    """Median seconds of ``src`` copied into the first device slot (after two untimed copies)."""
    stream = runner.stream
    times = []
    for i in range(repeats + 2):
        sync(stream.device)
        t0 = time.perf_counter()
        stream.slots[0].copy_(src, non_blocking=True)
        sync(stream.device)
        if i >= 2:
            times.append(time.perf_counter() - t0)
    stream.restart()                    # the slot was overwritten: the ring copies its layer again
    return statistics.median(times)


def accelerate_ordinary(pinned: dict, pinned_rate: float, pageable_rate: float) -> dict:
    """accelerate's time a token over ordinary memory, from its measured time over pinned buffers: its forward is
    its weights' copies (one blocking copy per module), each slower by the two copy rates' ratio.  Projected, not
    measured: a second copy of a 32B model's weights (~65 GB) does not fit beside the first in 128 GiB."""
    if "ms_per_token" not in pinned or pageable_rate <= 0:
        return {"error": "no pinned measurement or pageable rate to project from"}
    scale = pinned_rate / pageable_rate
    return {"ms_per_token": pinned["ms_per_token"] * scale, "scale": scale, "projected": True,
            "how": f"accelerate over pinned buffers x {scale:.2f} (pinned {pinned_rate:.1f} GB/s / pageable "
                   f"{pageable_rate:.1f} GB/s, one layer copied)"}


def accelerate_alone(runner: StreamedRunner, ctx: int, repeats: int) -> dict:
    """One-token forwards of accelerate's ``cpu_offload`` model over the same host weights (median ms)."""
    from accelerate import cpu_offload   # optional: only this baseline needs it (its absence is the row)

    device = runner.device
    model = cpu_offload(host_model(runner), execution_device=device)
    try:
        cache = DynamicCache(config=model.config)
        gen = torch.Generator().manual_seed(2)
        ids = torch.randint(runner.vocab_size, (1, ctx + repeats + 1), generator=gen).to(device)
        pos = torch.arange(ids.shape[1], device=device)[None]
        with torch.inference_mode():
            model_forward(model, ids[:, :ctx], pos[:, :ctx], None, cache, keep=1)
            times = []
            for i in range(repeats + 1):
                sync(device)
                t0 = time.perf_counter()
                model_forward(model, ids[:, ctx + i: ctx + i + 1], pos[:, ctx + i: ctx + i + 1], None, cache, keep=1)
                sync(device)
                times.append((time.perf_counter() - t0) * 1e3)
        return {"ms_per_token": statistics.median(times[1:]), "runs": len(times) - 1,
                "how": "accelerate.cpu_offload over the same pinned host weights, one token a forward"}
    finally:
        del model


def projections(profile: HardwareProfile, accelerate_ms: float | None, scale: float = 1.0,
                accelerate_ordinary_ms: float | None = None) -> list[dict]:
    """The optimizer's tree for each shipped acceptance vector on ``profile`` (its target curve times ``scale``:
    a run that streamed fewer layers projected to the whole model), with its predicted speedups: over the streamed
    target alone, over accelerate as measured (its weights in pinned buffers: near the copy floor) and over
    accelerate on ordinary memory (what a user gets; projected from the pageable copy rate)."""
    if scale != 1.0:
        profile = replace(profile, target_ms=tuple(ms * scale for ms in profile.target_ms), contexts=())
    rows = []
    for entry in list_acceptance():
        t0 = time.perf_counter()
        choice = choose_tree(entry.values, profile, max_depth=MAX_DEPTH)
        rows.append({"vector": entry.label, "budget": choice.budget, "depth": choice.depth,
                     "expected_tokens": choice.expected_tokens, "ms_per_token": choice.ms_per_token,
                     "alone_ms": choice.baseline_ms, "speedup_vs_streamed": choice.speedup,
                     "speedup_vs_accelerate": (accelerate_ms * scale / choice.ms_per_token
                                               if accelerate_ms else None),
                     "speedup_vs_accelerate_ordinary": (accelerate_ordinary_ms * scale / choice.ms_per_token
                                                        if accelerate_ordinary_ms else None),
                     "optimizer_s": time.perf_counter() - t0})
    return rows
