"""Attention masks in the form transformers 5.x passes through untouched.

A 4-D mask reaches the attention kernels as-is.  An *additive* float mask
(0 where attention is allowed, the dtype's minimum elsewhere) works for both
the sdpa and the eager kernels, where a boolean one works only for sdpa.
"""

from __future__ import annotations

import torch

from .tree import Tree


def tree_attention_mask(allowed: torch.Tensor, dtype: torch.dtype, device) -> torch.Tensor:
    """allowed: [q, kv] bool -> additive mask [1, 1, q, kv] in ``dtype``."""
    if allowed.ndim != 2:
        raise ValueError(f"allowed must be [q, kv], got {tuple(allowed.shape)}")
    mask = torch.zeros(allowed.shape, dtype=dtype)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[None, None].to(device)


def verify_mask(tree: Tree, prefix: int, dtype: torch.dtype, device) -> torch.Tensor:
    """Mask for one target forward of every tree node after ``prefix`` cached tokens.  # [1,1,N,prefix+N]"""
    n = tree.n_nodes
    allowed = torch.ones(n, prefix + n, dtype=torch.bool)
    allowed[:, prefix:] = tree.ancestor_mask()
    return tree_attention_mask(allowed, dtype, device)


def is_chain(tree: Tree) -> bool:
    """A chain needs no custom mask: the default causal mask is the ancestor mask."""
    return all(p == i - 1 for i, p in enumerate(tree.parents) if i > 0)
