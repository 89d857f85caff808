"""A narrow KV-cache interface over transformers' DynamicCache.

The engine only ever needs four things from a cache: its length, a reset, a
crop to a length and ``keep(indices)`` (compact the speculated tail to the
accepted path).  All transformers-version specifics live here: in 5.x
``DynamicCache.crop`` takes a *negative* count of tokens to drop, in 4.x the
length to keep.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache


class KVCache:
    """Owns one model's cache for one sequence (batch size 1)."""

    def __init__(self, config=None) -> None:
        self._config = config
        self.cache = DynamicCache(config=config)

    def __len__(self) -> int:
        return self.cache.get_seq_length()

    def reset(self) -> None:
        self.cache = DynamicCache(config=self._config)

    def crop(self, length: int) -> None:
        """Keep the first ``length`` positions."""
        drop = len(self) - length
        if drop < 0:
            raise ValueError(f"cannot crop a cache of {len(self)} positions to {length}")
        if drop:
            for layer in self._layers():
                layer.keys = layer.keys[..., :length, :]
                layer.values = layer.values[..., :length, :]

    @torch.inference_mode()
    def keep(self, prefix: int, indices: list[int]) -> None:
        """Keep positions ``[0, prefix)`` followed by ``indices`` (sorted, all >= prefix).

        Only the speculated tail is copied, so the cost is O(len(indices)),
        not O(context).
        """
        if any(i < prefix for i in indices) or sorted(indices) != list(indices):
            raise ValueError("keep: indices must be sorted and >= prefix")
        if list(indices) == list(range(prefix, prefix + len(indices))):
            self.crop(prefix + len(indices))
            return
        for layer in self._layers():
            idx = torch.tensor(indices, dtype=torch.long, device=layer.keys.device)
            end = prefix + len(indices)
            # index_select makes a copy first, so the in-place write cannot
            # clobber a source slot it still needs.
            layer.keys[..., prefix:end, :] = layer.keys.index_select(-2, idx)
            layer.values[..., prefix:end, :] = layer.values.index_select(-2, idx)
            layer.keys = layer.keys[..., :end, :]
            layer.values = layer.values[..., :end, :]

    def _layers(self):
        for layer in self.cache.layers:
            if getattr(layer, "is_sliding", False):
                raise NotImplementedError(
                    "sliding-window attention caches cannot be compacted to a tree path; "
                    "use a model without sliding-window layers"
                )
            if layer.is_initialized and layer.keys is not None and layer.keys.numel():
                yield layer
