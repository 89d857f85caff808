"""One captured forward of a :class:`~sequoia.runners.hf.graphs.graph_runner.GraphRunner` and the shapes it is keyed by.

A graph replays fixed shapes, so a forward of n new rows is padded to a
**bucket** (:func:`bucket_of`) and attends to a **window** of keys
(:func:`window_of`); the tree part of its mask comes from an ancestor block
(:func:`ancestor_block`), written into the additive mask by :func:`fill_mask`.
:class:`ForwardGraph` holds one capture with its static inputs and output.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from ...base import upload

#: What a graph is captured for: a GraphRunner (the runner builds its graphs; the graphs never import a runner).
Runner = object

BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)   # new-token counts a graph is captured for
MIN_WINDOW = 256                           # smallest key window a forward attends to


def bucket_of(n: int, buckets: Sequence[int] = BUCKETS) -> int | None:
    """The smallest bucket holding ``n`` rows; None past the largest (eager)."""
    return next((b for b in buckets if b >= n), None)


def window_of(length: int, capacity: int) -> int:
    """Keys a forward reaching ``length`` slots attends to: a power of two >= MIN_WINDOW, at most ``capacity``."""
    w = MIN_WINDOW
    while w < length:
        w *= 2
    return min(w, capacity)


def ancestor_block(rel_parents: tuple[int, ...], rows: int) -> np.ndarray:
    """Which tree-part slots each of the last ``rows`` slots sees (itself and its ancestors).  # [rows, m] bool

    ``rel_parents[j]`` is slot j's parent within the tree part (-1: in the chain below, seen whole).
    """
    m = len(rel_parents)
    seen = np.zeros((m, m), dtype=bool)
    for j, p in enumerate(rel_parents):
        if p >= 0:
            seen[j] = seen[p]
        seen[j, j] = True
    return seen[m - rows:]


def fill_mask(mask: torch.Tensor, block: torch.Tensor, chain: int, n: int) -> None:
    """Additive mask rows [0, n): the chain below ``chain`` whole, the tree part by ``block``.  mask: [rows, kv]"""
    if chain:
        mask[:n, :chain] = 0
    m = block.shape[1]
    mask[:n, chain: chain + m].masked_fill_(block, 0)


def upload_host(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """A host array on the device without waiting for the device."""
    return upload(torch.from_numpy(np.ascontiguousarray(array)), device)


class ForwardGraph:
    """One captured forward of ``bucket`` rows over ``window`` keys, with its static inputs and output."""

    def __init__(self, runner: Runner, bucket: int, window: int) -> None:
        dev = runner.device
        self.runner, self.bucket, self.window = runner, bucket, window
        self.ids = torch.zeros(1, bucket, dtype=torch.long, device=dev)
        self.pos = torch.zeros(1, bucket, dtype=torch.long, device=dev)
        self.slots = torch.arange(runner.capacity, runner.capacity + bucket, device=dev)  # scratch while capturing
        self.mask = torch.zeros(1, 1, bucket, window, dtype=runner.dtype, device=dev)
        self.pad_slots = self.slots.clone()
        self.graph = self.new_graph()
        self.logits: torch.Tensor | None = None

    def new_graph(self):
        """What records and replays this forward (call_graphs emulates one off CUDA)."""
        return torch.cuda.CUDAGraph()

    @classmethod
    @torch.inference_mode()
    def capture(cls, runner: Runner, bucket: int, window: int) -> "ForwardGraph":
        # In inference mode whoever asks (the warm-up or a session): the static inputs are then inference
        # tensors like every other caller's, and a compiled forward's guards on them hold (no recompile).
        g = cls(runner, bucket, window)
        cache = runner.cache
        cache.write_at(g.slots, window)
        stream = torch.cuda.Stream(runner.device)
        stream.wait_stream(torch.cuda.current_stream(runner.device))
        with torch.cuda.stream(stream):   # warm-up off the capture (lazy inits, autotuning), as torch advises
            for _ in range(2):
                runner.call(g.ids, g.pos, g.mask)
        torch.cuda.current_stream(runner.device).wait_stream(stream)
        # thread_local: only this thread's unsafe calls invalidate the capture (another thread's sync does not)
        with torch.cuda.graph(g.graph, pool=runner.graph_pool, capture_error_mode="thread_local"):
            g.logits = runner.call(g.ids, g.pos, g.mask)
        return g

    def load(self, ids: torch.Tensor, host: np.ndarray, block: torch.Tensor, chain: int, capacity: int) -> None:
        """Write one forward's inputs into the static buffers (device work only, no host wait)."""
        n, b = host.shape[1], self.bucket
        packed = np.empty((2, b), dtype=np.int64)
        packed[:, :n] = host
        packed[0, n:] = 0
        packed[1, n:] = np.arange(capacity + n, capacity + b)   # padding writes scratch slots
        up = upload_host(packed, self.runner.device)
        self.pos[0].copy_(up[0])
        self.slots.copy_(up[1])
        self.ids[0, :n].copy_(ids)
        mask = self.mask[0, 0]
        mask.fill_(self.runner.neg)
        fill_mask(mask, block, chain, n)
        if b > n:
            mask[n:, 0] = 0   # a padded row sees one real key: finite numbers, read by nobody
