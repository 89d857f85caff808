"""A preallocated KV cache the runner owns, written at the slots it is told.

Why not transformers' ``StaticCache``: in 5.23 it ignores where a forward's
tokens belong and appends at its own on-device counter, advanced in place (also
by graph replays), so forwarding a tree twice at the same slots walks off the
end.  Here the writer says where: :meth:`SlotCache.write_at` takes a device
tensor of slot numbers, one per new row, before each forward (the cache keeps
that tensor itself, not a copy: a captured graph reads its address, and the
graph's owner updates it in place).  The session says how many slots are in use
(:meth:`SlotCache.set_length`); nothing outside rebinds the cache's fields.

Layout: one tensor for every layer's keys and one for the values,
``[layers, kv_heads, capacity + scratch, head_dim]``, so ``keep`` is one gather
and one copy over all layers at once.  Rows padded to a graph's bucket write to
the ``scratch`` slots past ``capacity``, which no real row ever attends to.
A forward attends to keys ``[0, kv_len)``; the caller picks ``kv_len`` in
:meth:`SlotCache.write_at` (a window, so a captured graph's shapes stay fixed)
and masks what is not visible.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, CacheLayerMixin


class _SlotLayer(CacheLayerMixin):
    """One layer's view of the shared buffers; ``update`` writes at the cache's slots."""

    is_sliding = False

    def __init__(self, owner: "SlotCache", index: int) -> None:
        super().__init__()
        self.owner = owner
        self.keys = owner.k[index][None]     # [1, kv_heads, slots, head_dim] views: writes land in the buffer
        self.values = owner.v[index][None]
        self.is_initialized = True

    def lazy_initialization(self, key_states, value_states) -> None:  # preallocated: nothing to do
        pass

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        slots = self.owner._write_slots
        self.keys.index_copy_(2, slots, key_states.to(self.keys.dtype))
        self.values.index_copy_(2, slots, value_states.to(self.values.dtype))
        n = self.owner._kv_len
        return self.keys[:, :, :n], self.values[:, :, :n]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.owner._kv_len, 0

    def get_seq_length(self) -> int:
        return self.owner.length

    def get_max_length(self) -> int:
        return self.owner.capacity


def _text(config):
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def slot_bytes(config, dtype: torch.dtype) -> int:
    """Bytes one cached token takes in every layer (keys and values)."""
    text = _text(config)
    heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    return 2 * text.num_hidden_layers * heads * head_dim * torch.empty(0, dtype=dtype).element_size()


class SlotCache(Cache):
    """``capacity`` slots (plus ``scratch`` for padding) for every layer of one model, batch size 1."""

    def __init__(self, config, capacity: int, scratch: int, dtype: torch.dtype, device: torch.device) -> None:
        text = _text(config)
        if any(kind != "full_attention" for kind in getattr(text, "layer_types", None) or ()):
            raise NotImplementedError("a sliding-window layer cannot be compacted to a tree path; "
                                      "the slot cache takes full-attention models only")
        heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
        head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
        shape = (text.num_hidden_layers, heads, capacity + scratch, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)   # [layers, kv_heads, slots, head_dim]
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.capacity, self.scratch = capacity, scratch
        self._write_slots = torch.zeros(1, dtype=torch.long, device=device)  # [rows] see write_at
        self._kv_len = capacity
        self._length = 0                      # slots in use (the session's length)
        super().__init__(layers=[_SlotLayer(self, i) for i in range(text.num_hidden_layers)])

    @property
    def nbytes(self) -> int:
        return self.k.numel() * self.k.element_size() * 2

    @property
    def length(self) -> int:
        return self._length

    def set_length(self, length: int) -> None:
        """Slots ``[0, length)`` are in use (the session's length, after a forward, keep or crop)."""
        if not 0 <= length <= self.capacity:
            raise ValueError(f"length {length} outside 0..{self.capacity}")
        self._length = length

    def write_at(self, slots: torch.Tensor, kv_len: int) -> None:
        """The next forward writes its rows at ``slots`` ([rows] int64, on the device; kept, not copied, so an
        in-place update before a graph replay is seen) and attends to keys ``[0, kv_len)``."""
        if not 0 < kv_len <= self.capacity:
            raise ValueError(f"kv_len {kv_len} outside 1..{self.capacity}")
        self._write_slots, self._kv_len = slots, kv_len

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self._length

    def get_mask_sizes(self, query_length: int, layer_idx: int = 0) -> tuple[int, int]:
        return self._kv_len, 0

    def move(self, prefix: int, slots: torch.Tensor) -> None:
        """Copy ``slots`` (device, sorted, >= prefix) to ``prefix, prefix + 1, ...`` in every layer at once."""
        end = prefix + slots.numel()
        # index_select copies first, so the write cannot clobber a source slot it still needs.
        self.k[:, :, prefix:end] = self.k.index_select(2, slots)
        self.v[:, :, prefix:end] = self.v.index_select(2, slots)
