"""The GPU runner: a transformers causal LM over a cache it owns, each forward one CUDA graph replay.

Why: on an H100 an eager forward of the embedded 0.5B draft costs 16 ms (as much
as the 1.5B target: it is launch-bound), the same forward replayed as one CUDA
graph 3.1 ms (../shared/GPU.md).  A graph replays fixed addresses and shapes, so:

* the KV cache is preallocated and written at given slots
  (:class:`~sequoia.runners.hf.graphs.slot_cache.SlotCache`); ``keep`` is one gather;
* a forward of n new tokens is padded to a **bucket** of rows (1, 2, 4, ... 128)
  and attends to a **window** of keys (a power of two >= 256, up to the
  capacity); one graph per (bucket, window), captured on first use, all in one
  memory pool; padded rows write to scratch slots no real row sees
  (:mod:`sequoia.runners.hf.graphs.forward_graph`: the shapes, masks and one capture);
* positions come from the parents (host integers, a few per token) and the
  tree's ancestor mask is built on the device from a small boolean block cached
  per tree shape, so the same tree every step costs no mask building at all;
* inputs go up through pinned memory without a host wait; the logits rows come
  back as a device tensor (a copy: the next replay overwrites the graph's own).

What is captured is the model's own forward (``model(input_ids, position_ids,
attention_mask={"full_attention": mask}, past_key_values=cache)``), so any
transformers causal LM with full attention runs here.  Off CUDA (and for a
forward longer than the largest bucket, e.g. a prompt) the same cache and masks
run eagerly: the CPU tests of this runner test everything but the capture.

A static tree's whole draft runs as one more captured graph
(:meth:`GraphRunner.draft_program`, :mod:`sequoia.runners.hf.graphs.draft_program`).
Graphs are captured before serving by :func:`sequoia.runners.hf.graphs.capture.warm_up`
(``load_pair`` calls it); :func:`~sequoia.runners.hf.graphs.capture.capture_status` says what was
captured, what failed and what runs instead, for the page and the log.

One cache per runner: a new session takes it over and the older one is refused.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import torch

from ....core.config import SamplingConfig
from ....core.trees.tree import Tree
from ...base import RunnerInfo, check_forward_args, check_keep_args, check_path, new_positions
from .compile_cache import CompilePlan, compile_forward, failed
from .draft_program import DraftProgram, SamplingShape, program_key, try_capture
from .forward_graph import (BUCKETS, MIN_WINDOW, ForwardGraph, ancestor_block, bucket_of, fill_mask,
                            upload_host, window_of)
from .slot_cache import SlotCache, slot_bytes

CACHE_SHARE = 0.25                         # most of the device's free memory one runner's cache may take
_SHAPES = 512                              # tree shapes whose ancestor blocks stay cached
_PROGRAMS = 8                              # draft programs (tree, sampling shape) kept with their graphs
log = logging.getLogger("sequoia")


class GraphRunner:
    """One transformers model on CUDA graphs (or eagerly, off CUDA); the :mod:`sequoia.runners.base` seam."""

    device_tokens = True          # forward accepts a device tensor of token ids (a draft level stays on the GPU)
    graph_class = ForwardGraph    # what captures a forward shape (call_graphs: replays emulated off CUDA)

    def __init__(self, model, name: str, info: RunnerInfo, capacity: int | None = None,
                 graphs: bool | None = None, buckets: Sequence[int] = BUCKETS,
                 compile: bool | CompilePlan = False, programs: bool = True) -> None:
        self.model, self.name, self.info = model, name, info
        # compile: inductor fuses the forward's many small kernels (norms, rotary, activations) before the
        # graphs are captured; a graph of a small model replays ~40 kernels a layer and is bound by their count.
        # A CompilePlan with artifacts persists the compile (compile_cache); True compiles without persisting.
        plan = compile if isinstance(compile, CompilePlan) else CompilePlan(bool(compile), "not asked")
        self._forward, self.compile_status = compile_forward(model, plan)
        self.device = next(model.parameters()).device
        self.dtype = getattr(model, "dtype", torch.float32)
        self.vocab_size = int(model.config.vocab_size)
        limit = getattr(model.config, "max_position_embeddings", None) or 4096
        self.capacity = int(capacity or min(limit, 4096))   # an explicit capacity wins (rope extrapolates)
        per_slot = slot_bytes(model.config, self.dtype)
        if self.device.type == "cuda":   # sized from what the device has free, not only what the model allows
            free = torch.cuda.mem_get_info(self.device)[0]
            self.capacity = max(MIN_WINDOW, min(self.capacity, int(CACHE_SHARE * free / per_slot)))
        self.max_context = self.capacity
        self.buckets = tuple(sorted(buckets))
        self.graphs = (self.device.type == "cuda") if graphs is None else bool(graphs)
        if self.graphs and self.device.type != "cuda":
            raise ValueError("CUDA graphs need a CUDA device")
        self.cache = SlotCache(model.config, self.capacity, self.buckets[-1], self.dtype, self.device)
        said = f"slot cache {self.capacity} slots ({self.cache.nbytes / 2**20:.0f} MiB)"
        self.info = replace(info, kernels=f"{info.kernels}; {said}" if info.kernels else said)
        self.forward_calls = 0
        eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        self.end_tokens = tuple(int(t) for t in ([eos] if isinstance(eos, int) else eos or ()))
        self.neg = torch.finfo(self.dtype).min
        self._blocks: OrderedDict[tuple, torch.Tensor] = OrderedDict()
        self._graphs: dict[tuple[int, int], ForwardGraph] = {}
        self.capture_errors: dict[tuple[int, int], str] = {}
        self._pool = torch.cuda.graph_pool_handle() if self.graphs else None
        self._owner = None
        self.programs = programs          # False: a static tree's levels replay one graph each
        self._programs: OrderedDict[tuple, DraftProgram] = OrderedDict()
        self.capture_seconds: float | None = None   # the warm-up's, once it ran (capture.warm_up)

    @property
    def config(self):
        return self.model.config

    def uncompile(self, exc: BaseException) -> None:
        """The compiled forward failed: run the model's own from here on (graphs are captured after this)."""
        self._forward = self.model
        self.compile_status = failed(self.compile_status, exc)

    def session(self) -> "GraphSession":
        self._owner = GraphSession(self)
        return self._owner

    # ------------------------------------------------------------------ forwards
    def run(self, ids: torch.Tensor, host: np.ndarray, block: torch.Tensor, chain: int, start: int) -> torch.Tensor:
        """Logits of the n new rows.  ids: [n] device; host: [2, n] positions and slots; block: [n, m] bool."""
        n = host.shape[1]
        end = start + n
        bucket = bucket_of(n, self.buckets) if self.graphs else None
        window = self.window_for(end)
        if bucket is not None and (bucket, window) not in self.capture_errors:
            graph = self._graphs.get((bucket, window)) or self._capture(bucket, window)
            if graph is not None:
                graph.load(ids, host, block, chain, self.capacity)
                graph.graph.replay()
                return graph.logits[0, :n].clone()
        return self._eager(ids, host, block, chain, end)

    def _eager(self, ids, host, block, chain, end) -> torch.Tensor:
        n = host.shape[1]
        window = end if not self.graphs else self.window_for(end)
        mask = torch.full((n, window), self.neg, dtype=self.dtype, device=self.device)
        fill_mask(mask, block, chain, n)
        up = upload_host(host, self.device)
        self.cache.write_at(up[1], window)
        return self.call(ids[None], up[0][None], mask[None, None])[0]

    def call(self, ids: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The model's own forward over the slot cache.  # [1, rows, V]

        Always in inference mode, whoever calls (a session, a capture, the warm-up's first call, a draft
        program): a compiled forward guards on the grad mode, so a call with grad on would compile it again.
        """
        with torch.inference_mode():
            out = self._forward(input_ids=ids, position_ids=pos, attention_mask={"full_attention": mask},
                                past_key_values=self.cache, use_cache=True)
        return out.logits

    def _capture(self, bucket: int, window: int) -> "ForwardGraph | None":
        graph, error = try_capture(lambda: self.graph_class.capture(self, bucket, window), self, (bucket, window))
        if graph is None:   # eager forwards for this shape, said on the runner and in the log
            self.note_capture_error((bucket, window), error)
            return None
        self._graphs[(bucket, window)] = graph
        return graph

    def capture(self, bucket: int, window: int) -> bool:
        """Capture the forward of ``bucket`` rows over ``window`` keys now (a warm-up); False: it failed."""
        key = (bucket, window)
        return key in self._graphs or (key not in self.capture_errors and self._capture(bucket, window) is not None)

    def note_capture_error(self, key: tuple, message: str) -> None:
        """A capture failed: kept for ``capture_status`` (the Hardware tab) and logged with what runs instead."""
        self.capture_errors[key] = message
        instead = "the level-by-level draft" if key and key[0] == "draft program" else "eager forwards"
        log.warning("%s: capturing %s failed (%s); %s run instead", self.name, key, message, instead)

    @property
    def graph_pool(self):
        """The memory pool every graph of this runner is captured into."""
        return self._pool

    def window_for(self, length: int) -> int:
        """The key window a forward reaching ``length`` slots attends to on graphs."""
        return window_of(length, self.capacity)

    def draft_program(self, tree: Tree, mode: str, sampling: SamplingConfig, vocab: int) -> DraftProgram | None:
        """The whole draft of static ``tree`` as one program (one graph per window on CUDA); None: none runs
        it here (programs off, children drawn with replacement, or its capture failed)."""
        key = program_key(tree, mode, sampling, vocab) if self.programs and tree.size else None
        if key is None:
            return None
        program = self._programs.get(key)
        if program is None:
            program = DraftProgram(self, tree, key[1], SamplingShape.of(sampling), vocab)
            self._programs[key] = program
            if len(self._programs) > _PROGRAMS:
                self._programs.popitem(last=False)
        else:
            self._programs.move_to_end(key)
        return None if program.failed else program

    @property
    def program_graph_count(self) -> int:
        return sum(len(p.graphs) for p in self._programs.values())

    def tree_block(self, rel_parents: tuple[int, ...], rows: int) -> torch.Tensor:
        """:func:`ancestor_block` on the device, cached per tree shape.  # [rows, m] bool"""
        key = (rel_parents, rows)
        block = self._blocks.get(key)
        if block is None:
            block = upload_host(ancestor_block(rel_parents, rows), self.device)
            self._blocks[key] = block
            if len(self._blocks) > _SHAPES:
                self._blocks.popitem(last=False)
        else:
            self._blocks.move_to_end(key)
        return block

    def chain_block(self, n: int) -> torch.Tensor:
        """A chain of n new rows sees itself causally.  # [n, n] bool"""
        key = ("chain", n)
        block = self._blocks.get(key)
        if block is None:
            block = torch.ones(n, n, dtype=torch.bool, device=self.device).tril_()
            if n <= self.buckets[-1]:
                self._blocks[key] = block
        return block

    @property
    def graph_count(self) -> int:
        return len(self._graphs)


class GraphSession:
    """One sequence on a :class:`GraphRunner`'s cache (slots, parents and positions as in ``runners.base``)."""

    def __init__(self, runner: GraphRunner) -> None:
        self.runner = runner
        self._pos: list[int] = []
        self._parent: list[int] = []
        self._anchor: list[int] = []    # each slot's last ancestor in the chain part (a chain slot: itself)
        self._chain = 0                 # slots [0, _chain) form a chain from slot 0
        runner.cache.set_length(0)

    def __len__(self) -> int:
        return len(self._pos)

    def _check_live(self) -> None:
        if self.runner._owner is not self:
            raise RuntimeError("this session's cache was taken over by a newer session of the same runner")

    @torch.inference_mode()
    def forward(self, tokens, parents: Sequence[int] | None = None, keep: int = 0) -> torch.Tensor:
        """Logits after each new token (the last ``keep`` if > 0).  tokens: ints or a device tensor.  # [rows, V]"""
        self._check_live()
        run, start = self.runner, len(self)
        parents = check_forward_args(start, tokens, parents, keep)
        n = len(parents)
        if start + n > run.capacity:
            raise ValueError(f"forward: {start + n} slots exceed this runner's cache of {run.capacity}")
        pos = new_positions(self._pos, parents)
        chain_call = self._chain == start and all(p == start + i - 1 for i, p in enumerate(parents))
        anchors = list(range(start, start + n)) if chain_call else self._anchors(parents)
        if chain_call:
            lo, block = start, run.chain_block(n)
        else:
            # Columns below lo are seen by every new row (the chain up to the lowest row's anchor); the rest
            # by ancestry, from a block cached per shape.
            lo = min(anchors) + 1
            rel = tuple(p - lo if p >= lo else -1 for p in self._parent[lo:] + parents)
            block = run.tree_block(rel, n)
        ids = (tokens if isinstance(tokens, torch.Tensor)
               else upload_host(np.asarray(tokens, dtype=np.int64), run.device))
        host = np.array([pos, range(start, start + n)], dtype=np.int64)
        logits = run.run(ids.to(run.device).reshape(-1), host, block, lo, start)
        run.forward_calls += 1
        self._pos += pos
        self._parent += parents
        self._anchor += anchors
        run.cache.set_length(len(self))
        if chain_call:
            self._chain = len(self)
        return logits[-keep:] if keep else logits

    def root_position(self) -> int | None:
        """The last slot's position when the session is one chain (a tree hung off it sees every slot);
        else None."""
        return self._pos[-1] if self._pos and self._chain == len(self) else None

    def note_forwarded(self, parents: Sequence[int], forwards: int) -> None:
        """Slots a draft program wrote in ``forwards`` level forwards (parents as in ``forward``): the
        bookkeeping of those forwards, without running them."""
        self._check_live()
        start = len(self)
        parents = check_forward_args(start, parents, parents, 0)
        chain_call = self._chain == start and all(p == start + i - 1 for i, p in enumerate(parents))
        anchors = list(range(start, start + len(parents))) if chain_call else self._anchors(parents)
        self._pos += new_positions(self._pos, parents)
        self._parent += parents
        self._anchor += anchors
        self.runner.cache.set_length(len(self))
        self.runner.forward_calls += forwards
        if chain_call:
            self._chain = len(self)

    def keep(self, prefix: int, slots: Sequence[int]) -> None:
        self._check_live()
        slots = check_keep_args(len(self), prefix, slots)
        check_path(self._parent, prefix, slots)
        if slots != list(range(prefix, prefix + len(slots))):
            self.runner.cache.move(prefix, upload_host(np.asarray(slots, dtype=np.int64), self.runner.device))
        self._pos = self._pos[:prefix] + [self._pos[s] for s in slots]
        self._parent = self._parent[:prefix] + list(range(prefix - 1, prefix + len(slots) - 1))
        if self._chain >= prefix:
            self._chain = len(self)
        below = prefix - 1 if prefix - 1 < self._chain else self._anchor[prefix - 1]
        self._anchor = self._anchor[:prefix] + [s if s < self._chain else below
                                                for s in range(prefix, len(self))]
        self.runner.cache.set_length(len(self))

    def crop(self, length: int) -> None:
        self._check_live()
        if not 0 <= length <= len(self):
            raise ValueError(f"crop: length {length} outside 0..{len(self)}")
        del self._pos[length:], self._parent[length:], self._anchor[length:]
        self._chain = min(self._chain, length)
        self.runner.cache.set_length(length)

    def _anchors(self, parents: list[int]) -> list[int]:
        """Each new token's last ancestor below ``_chain`` (-1: none); it sees the chain up to there."""
        start, chain, out = len(self), self._chain, []
        for p in parents:
            out.append(p if p < chain else self._anchor[p] if p < start else out[p - start])
        return out
