"""Attention for a few queries on a CPU: grouped-query matmuls in float32 instead of SDPA's flash kernel.

Why: a decode step (one new token) or a small draft or verification tree asks
attention for one to a few query rows per head.  torch's CPU flash-attention
kernel handles that poorly: measured on a 2-vCPU AVX-512-BF16 EPYC, 2 threads,
bf16, one layer of the 1.5B target (12 query heads, 2 key/value heads, head dim
128), one query over 700 cached tokens takes 957 us through SDPA and 116 us as
two matmuls; 16 queries 682 / 517 us; at 2000 tokens one query 2893 / 242 us.
Over the target's 28 layers that is ~24 ms of a ~150 ms one-token forward at a
700-token context, and more of a draft level (0.5B draft: 14 / 2 heads, dim 64,
one query at 700 tokens 563 / 88 us, 24 layers).

How: queries that share a key/value head are stacked into the rows of one
matmul against that head's keys (no ``repeat_kv`` copy), the scores and the
weighted sum are computed in float32 (SDPA accumulates in float32 too: the
error against a float64 reference measured the same, 0.002-0.004, while bf16
scores were 4-5x worse), and the mask is the one transformers builds for SDPA
(boolean, additive, or None for plain causal attention).  Past
``FEW_QUERY_CELLS`` query-key cells per head SDPA is as fast or faster and
takes over, as it does for anything this path does not cover (dropout, a
per-head mask, position biases, soft-capping, a paged cache, a GPU).

Every forward of a loaded model goes through the same function, so the target
alone, every Hugging Face baseline and every speculative method compute with
the same kernel: which one it is changes speed and last-bit rounding, never
whom the output is compared with.
"""

from __future__ import annotations

import threading

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

#: The name models are switched to (``model.set_attn_implementation``); masks are built as for "sdpa".
FEW_QUERY = "sequoia_few_query"
#: Largest queries x keys per head that the matmul path takes; past it SDPA is as fast (measured above).
FEW_QUERY_CELLS = 16 * 1024
_FALLBACK_KWARGS = ("position_bias", "softcap", "cache", "s_aux")


def few_query_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                        attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                        is_causal: bool | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention-function contract: query [b, h, w, d], key/value [b, kv, L, d] -> ([b, w, h, d], None)."""
    b, heads, w, dim = query.shape
    kv_heads, length = key.shape[1], key.shape[2]
    if (w * length > FEW_QUERY_CELLS or dropout or query.device.type != "cpu" or heads % kv_heads
            or (attention_mask is not None and (attention_mask.ndim != 4 or attention_mask.shape[1] != 1))
            or any(kwargs.get(k) is not None for k in _FALLBACK_KWARGS)):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    group = heads // kv_heads
    scale = dim ** -0.5 if scaling is None else scaling
    # Heads h = kv * group + j share key/value head kv (repeat_kv's order): stack their rows.
    q = query.reshape(b, kv_heads, group * w, dim).float()
    scores = torch.matmul(q, key.float().transpose(-1, -2)).mul_(scale)          # [b, kv, group * w, L]
    scores = scores.view(b, kv_heads, group, w, length)
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    if attention_mask is None and causal and w > 1:
        attention_mask = causal_mask(length - w, w, query.device)
    if attention_mask is not None:
        mask = attention_mask[:, :, None]                                               # [b|1, 1, 1, w, L]
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, float("-inf"))
        else:
            scores = scores + mask.float()
    probs = torch.softmax(scores, dim=-1).view(b, kv_heads, group * w, length)
    out = torch.matmul(probs, value.float())                                          # [b, kv, group * w, d]
    out = out.view(b, heads, w, value.shape[-1]).to(query.dtype)
    return out.transpose(1, 2).contiguous(), None


def causal_mask(cached: int, rows: int, device=None) -> torch.Tensor:
    """Plain causal attention of ``rows`` new tokens after ``cached`` ones.  # [1, 1, rows, cached + rows] bool

    Query i sits at key position cached + i and sees every key up to it.
    """
    pos = torch.arange(cached + rows, device=device)
    return (pos[None, :] <= pos[cached:, None])[None, None]


# transformers looks attention functions up by name in one process-wide table (``AttentionInterface``), and a
# model picks its entry through its own ``config._attn_implementation``.  So the choice is per model instance
# (:func:`use_few_query_attention`); the table entry is only a name for the function, registered once under a
# name of this library's own, which no model reads unless switched to it.
_REGISTER_LOCK = threading.Lock()


def _register() -> None:
    """Name :func:`few_query_attention` (and its mask builder) in transformers' tables; idempotent, thread-safe."""
    with _REGISTER_LOCK:
        held = AttentionInterface._global_mapping.get(FEW_QUERY)
        if held is None:
            AttentionInterface.register(FEW_QUERY, few_query_attention)
            AttentionMaskInterface.register(FEW_QUERY, sdpa_mask)
        elif held is not few_query_attention:
            raise RuntimeError(f"transformers' attention name {FEW_QUERY!r} is taken by {held!r}")


def use_few_query_attention(model: torch.nn.Module) -> bool:
    """Switch a CPU model that runs SDPA attention to :func:`few_query_attention`; True if switched.

    Only this model changes (its config names the function); other models in the process keep theirs.
    """
    params = next(model.parameters(), None)
    config = getattr(model, "config", None)
    if params is None or params.device.type != "cpu" or getattr(config, "_attn_implementation", None) != "sdpa":
        return False
    _register()
    model.set_attn_implementation(FEW_QUERY)
    return model.config._attn_implementation == FEW_QUERY
