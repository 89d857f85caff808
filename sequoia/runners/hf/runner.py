"""The Hugging Face runner: a transformers causal LM behind the :mod:`sequoia.runners.base` seam.

A session holds a ``DynamicCache`` (through :class:`~sequoia.runners.hf.kv_cache.KVCache`)
and, per slot, its parent and position.  A forward whose tokens continue the
cache as a chain is the model's plain causal forward; anything else (a tree, a
draft level over earlier levels) gets a 4-D ancestor mask and explicit position
ids, which sdpa runs at the cost of a causal forward of the same length.

That mask-and-positions forward is the whole GPU path: ``plain=True`` (always on
CUDA) uses the model's own forward with no CPU kernel choices, so the test tier
that runs a ``plain`` runner on CPU exercises exactly what a GPU Space runs.

CPU choices are this runner's own state, made once at load time
(:func:`sequoia.runners.hf.loading.load_runner`): ``forward_fn`` (the lean
forward for a draft, :mod:`sequoia.runners.hf.lean`) and ``single_row_kernel``
(one-row forwards without oneDNN where that is faster, :mod:`sequoia.runners.hf.onednn`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from ...core.trees.masks import tree_attention_mask
from ..base import RunnerInfo, check_forward_args, check_keep_args, check_path, new_positions
from .kv_cache import KVCache
from .lean import model_forward
from .onednn import single_row_scope

ForwardFn = Callable[..., torch.Tensor]  # (model, ids [1, n], pos [1, n], mask | None, cache, keep) -> [1, rows, V]


class HFRunner:
    """One transformers model; ``forward_fn`` is the forward its sessions run (the model's own by default)."""

    def __init__(self, model, name: str, info: RunnerInfo, forward_fn: ForwardFn = model_forward,
                 single_row_kernel: str = "") -> None:
        self.model = model
        self.name = name
        self.info = info
        self.forward_fn = forward_fn
        self.single_row_kernel = single_row_kernel
        self.vocab_size = int(model.config.vocab_size)
        self.device = next(model.parameters()).device
        self.max_context = getattr(model.config, "max_position_embeddings", None)
        dtype = getattr(model, "dtype", torch.float32)
        # An int8 dynamic-quantized model runs its activations (and so its masks) in fp32.
        self.mask_dtype = dtype if dtype.is_floating_point else torch.float32
        self.forward_calls = 0   # every session forward, for the bench's count of target calls
        # The model's own end-of-sequence ids (its generation_config may list several).
        eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        self.end_tokens = tuple(int(t) for t in ([eos] if isinstance(eos, int) else eos or ()))

    @property
    def config(self):
        return self.model.config

    def session(self) -> "HFSession":
        return HFSession(self)


class HFSession:
    """One sequence's cache on an :class:`HFRunner` (slots, parents and positions as in ``runners.base``)."""

    def __init__(self, runner: HFRunner) -> None:
        self.runner = runner
        self.cache = KVCache(runner.model.config)
        self._pos: list[int] = []       # [slots] position of each slot
        self._parent: list[int] = []    # [slots] parent slot (-1: none)
        self._chain = 0                 # slots [0, _chain) form a chain from slot 0

    def __len__(self) -> int:
        return len(self._pos)

    @torch.inference_mode()
    def forward(self, tokens: Sequence[int], parents: Sequence[int] | None = None, keep: int = 0) -> torch.Tensor:
        """Logits after each new token (the last ``keep`` if > 0).  # [rows, V]"""
        start = len(self)
        parents = check_forward_args(start, tokens, parents, keep)
        pos = new_positions(self._pos, parents)
        is_chain = self._chain == start and all(p == start + i - 1 for i, p in enumerate(parents))
        mask = None if is_chain else tree_attention_mask(self._visible(start, parents), self.runner.mask_dtype,
                                                         self.runner.device)
        run = self.runner
        ids = torch.tensor([list(tokens)], dtype=torch.long, device=run.device)          # [1, n]
        pos_t = torch.tensor([pos], dtype=torch.long, device=run.device)                # [1, n]
        with single_row_scope(run.single_row_kernel, len(tokens)):
            logits = run.forward_fn(run.model, ids, pos_t, mask, self.cache.cache, keep)  # [1, rows, V]
        run.forward_calls += 1
        self._pos += pos
        self._parent += parents
        if is_chain:
            self._chain = len(self)
        return logits[0]

    def keep(self, prefix: int, slots: Sequence[int]) -> None:
        slots = check_keep_args(len(self), prefix, slots)
        check_path(self._parent, prefix, slots)
        self.cache.keep(prefix, slots)
        self._pos = self._pos[:prefix] + [self._pos[s] for s in slots]
        self._parent = self._parent[:prefix] + list(range(prefix - 1, prefix + len(slots) - 1))
        if self._chain >= prefix:
            self._chain = len(self)

    def crop(self, length: int) -> None:
        if not 0 <= length <= len(self):
            raise ValueError(f"crop: length {length} outside 0..{len(self)}")
        self.cache.crop(length)
        del self._pos[length:], self._parent[length:]
        self._chain = min(self._chain, length)

    # ------------------------------------------------------------------ internals
    def _visible(self, start: int, parents: list[int]) -> torch.Tensor:
        """Which slots each new token attends to: its ancestors and itself.  # [n, start + n] bool"""
        n = len(parents)
        allowed = torch.zeros(n, start + n, dtype=torch.bool)
        parent_of = self._parent + parents
        for i in range(n):
            slot = start + i
            while slot >= self._chain:         # walk up the tree part; the chain below is seen whole
                allowed[i, slot] = True
                slot = parent_of[slot]
                if slot < 0:
                    break
            if slot >= 0:
                allowed[i, : slot + 1] = True
        return allowed
