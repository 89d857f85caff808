"""The GPU check's capture times: seconds to capture one CUDA graph per bucket, what a ZeroGPU call must pay.

On ZeroGPU the process is fresh for (almost) every call, so a call that replays
graphs first captures them (:mod:`sequoia.runtime.measuring.gpu_call` decides whether that
pays, from a capture time per graph it labels "not measured" until this measures
it).  For each bucket of new rows, on a fresh graph runner: the first forward
(warm-up, capture, replay) less the median of the replays after it.  Off CUDA
the runner runs eagerly and the capture times are ~0 (the rows say so).
"""

from __future__ import annotations

import statistics
import time

import torch

from ...runners.hf.graphs.graph_runner import BUCKETS
from ...runtime.engine import sync
from .models import Shape, random_model, runner


def capture_times(rn, ctx: int, buckets: tuple[int, ...] = BUCKETS, replays: int = 3) -> dict[int, dict]:
    """Per bucket: the first forward's ms (capture included), the replays' median ms, and their difference (s)."""
    gen = torch.Generator().manual_seed(3)
    session = rn.session()
    session.forward(torch.randint(rn.vocab_size, (ctx,), generator=gen).tolist(), keep=1)
    out = {}
    for n in buckets:
        ids = torch.randint(rn.vocab_size, (n,), generator=gen).tolist()
        parents = [ctx - 1] + [ctx + (i - 1) // 2 for i in range(1, n)]
        times = []
        for _ in range(1 + replays):
            sync(rn.device)
            t0 = time.perf_counter()
            session.forward(ids, parents)
            sync(rn.device)
            times.append(time.perf_counter() - t0)
            session.crop(ctx)
        replay = statistics.median(times[1:])
        out[n] = {"first_ms": 1e3 * times[0], "replay_ms": 1e3 * replay, "capture_s": max(times[0] - replay, 0.0)}
    return out


def check_capture(device: torch.device, dtype: torch.dtype, shapes: list[Shape], ctx: int,
                  log=print) -> dict:
    """:func:`capture_times` for each shape on a fresh graph runner; the mean capture time per graph."""
    out: dict = {"graphs": device.type == "cuda", "shapes": {}}
    for shape in shapes:
        model = random_model(shape, device, dtype, seed=4)
        rows = capture_times(runner(model, "graph", shape.name), ctx)
        mean = statistics.fmean(r["capture_s"] for r in rows.values())
        out["shapes"][shape.name] = {"buckets": rows, "mean_capture_s": mean}
        each = ", ".join(f"{n}: {r['capture_s']:.3f}" for n, r in rows.items())
        log(f"  {shape.name}: capture {mean:.3f} s a graph on average ({each})")
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return out


def capture_markdown(capture: dict | None) -> str:
    """The capture section of the check's page ("" when the part did not run)."""
    if not capture:
        return ""
    lines = ["", "## (e) Capture time per CUDA graph (what a ZeroGPU call pays before replaying)", "",
             "Fresh graph runner, one bucket of new rows at a time: first forward (capture included) less the "
             "median replay." + ("" if capture.get("graphs") else " Off CUDA: eager, nothing captured."), "",
             "| shape | bucket | first ms | replay ms | capture s |", "|---|---|---|---|---|"]
    for name, s in capture.get("shapes", {}).items():
        for n, r in s["buckets"].items():
            lines.append(f"| {name} | {n} | {r['first_ms']:.1f} | {r['replay_ms']:.2f} | {r['capture_s']:.3f} |")
        lines.append(f"| {name} | mean | | | **{s['mean_capture_s']:.3f}** |")
    lines.append("")
    lines.append("`sequoia/runtime/measuring/gpu_call.py` takes the mean as its `CaptureCost` (measured) on the card it "
                 "was measured on.")
    return "\n".join(lines) + "\n"
