"""A lean forward for Llama-style decoders (Qwen2, Llama): the same modules and numbers, less plumbing.

Why: a draft level is a forward of one to a few rows through a small model, and
at that size the Hugging Face forward's plumbing costs a tenth of it: building
the attention mask, per-layer keyword plumbing, output containers, module
hooks.  Measured on a 2-vCPU AVX-512-BF16 EPYC, 2 threads, the int4 0.5B draft
over 128 cached tokens, interleaved (8 rounds, medians): 1 / 4 / 16 rows
25.2 / 40.1 / 74.4 ms through ``model(...)``, 22.7 / 36.5 / 72.6 ms here.  Its
97 int4 products alone take 16.6 ms called back to back, and that kernel is
compute-bound (it runs twice as long on one thread), so what is left is glue.

What it computes is the model's own forward, step by step, with the model's own
modules and functions: the embedding, the rotary module (so every rope variant
it knows) and its modeling file's ``apply_rotary_pos_emb``, each layer's norms,
projections (a fused q|k|v or gate|up product taken whole rather than slice by
slice: :class:`~sequoia.runners.hf.kernels.FusedProjections`), the activation, the
cache update of the ``DynamicCache`` it is given, and attention through
:func:`~sequoia.runners.hf.attention.few_query_attention` with the mask the model
would have built.  The logits equal the model's (tests/runners/test_lean.py compares
them in fp32 and in quantized bf16, with tree masks over a cache).

Taken only where it is exactly that: a CPU model switched to few-query
attention, of a class listed in :data:`CLASSES`, with full attention in every
layer (no sliding window) and the plain layer structure (no q/k norms).  For
anything else :func:`lean_support` gives the reason and callers use the
model's forward.  The draft alone runs it: the draft's forward changes speed,
never the output distribution, and the target and every baseline keep the
forward everyone else runs.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

from .attention import FEW_QUERY, causal_mask, few_query_attention
from .kernels import ProjectionPart

#: Model classes whose decoder layers are exactly what :func:`lean_forward` computes.
CLASSES = ("Qwen2ForCausalLM", "LlamaForCausalLM")


def lean_support(model: torch.nn.Module) -> str:
    """Empty if :func:`lean_forward` computes ``model``'s forward; otherwise why not."""
    name = type(model).__name__
    if name not in CLASSES:
        return f"{name} is not one of {', '.join(CLASSES)}"
    config = model.config
    if getattr(config, "_attn_implementation", None) != FEW_QUERY:
        return f"attention is {config._attn_implementation!r}, not few-query (CPU models only)"
    if not hasattr(sys.modules[type(model).__module__], "apply_rotary_pos_emb"):
        return f"{name}'s modeling file has no apply_rotary_pos_emb"
    if any(kind != "full_attention" for kind in getattr(config, "layer_types", None) or ()):
        return "a layer has sliding-window attention"
    if getattr(config, "use_sliding_window", False):
        return "sliding-window attention"
    for layer in model.model.layers:
        attn = layer.self_attn
        if hasattr(attn, "q_norm") or hasattr(attn, "k_norm") or not hasattr(layer.mlp, "act_fn"):
            return "a decoder layer is not the plain Llama structure"
    return ""


def _products(module: torch.nn.Module, names: tuple[str, ...], x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The sibling projections ``names`` of ``x``: one fused product split, or each layer's own."""
    first = getattr(module, names[0])
    if isinstance(first, ProjectionPart):
        group = first._group[0]
        return group.fused(x).split(group.sizes, dim=-1)
    return tuple(getattr(module, name)(x) for name in names)


@torch.inference_mode()
def lean_forward(model: torch.nn.Module, ids: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor | None,
                 cache, keep: int = 0) -> torch.Tensor:
    """``model(input_ids=ids, position_ids=pos, attention_mask=mask, past_key_values=cache, use_cache=True,
    logits_to_keep=keep).logits`` for a model :func:`lean_support` accepts.  # [1, keep or rows, V]

    ``mask`` is None (causal) or a 4-D mask over the cache and the new rows, as the model's forward takes it.
    """
    base = model.model
    rotate = sys.modules[type(model).__module__].apply_rotary_pos_emb
    batch, rows = ids.shape
    cached = cache.get_seq_length()
    if mask is None and rows > 1 and cached:   # what transformers builds; None means causal from key 0
        mask = causal_mask(cached, rows)
    x = base.embed_tokens(ids)
    cos, sin = base.rotary_emb(x, pos)
    for index, layer in enumerate(base.layers[: model.config.num_hidden_layers]):   # as the model's forward
        attn = layer.self_attn
        h = layer.input_layernorm(x)
        q, k, v = _products(attn, ("q_proj", "k_proj", "v_proj"), h)
        q = q.view(batch, rows, -1, attn.head_dim).transpose(1, 2)
        k = k.view(batch, rows, -1, attn.head_dim).transpose(1, 2)
        v = v.view(batch, rows, -1, attn.head_dim).transpose(1, 2)
        q, k = rotate(q, k, cos, sin)
        k, v = cache.update(k, v, index)
        out, _ = few_query_attention(attn, q, k, v, mask, scaling=attn.scaling)
        x = x + attn.o_proj(out.reshape(batch, rows, -1))
        h = layer.post_attention_layernorm(x)
        gate, up = _products(layer.mlp, ("gate_proj", "up_proj"), h)
        x = x + layer.mlp.down_proj(layer.mlp.act_fn(gate) * up)
    x = base.norm(x if keep == 0 else x[:, -keep:].contiguous())
    return model.lm_head(x)


def model_forward(model: torch.nn.Module, ids: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor | None,
                  cache, keep: int = 0) -> torch.Tensor:
    """The model's own forward, with :func:`lean_forward`'s arguments."""
    return model(input_ids=ids, position_ids=pos, attention_mask=mask, past_key_values=cache, use_cache=True,
                 logits_to_keep=head_rows(keep, ids.shape[1], ids.device)).logits


def head_rows(keep: int, rows: int, device=None) -> int | torch.Tensor:
    """``logits_to_keep`` for the last ``keep`` of ``rows`` (0: all): their indices where that is not all rows.

    Why: given a count, transformers hands the head ``hidden[:, -keep:]``, a view whose
    batch stride is still rows x H, and torch (2.13, CPU) multiplies such a 3-D input
    through a batched matmul that first copies the whole transposed weight: on the
    embedded target (1536 x 151936 bf16) 1.3 s instead of 26 ms for a prompt's last row
    (measured on a 2-vCPU AVX-512-BF16 EPYC).  Given indices, it gathers the rows into a
    plain [1, keep, H] tensor.  Hugging Face ``generate`` passes a count; its target
    (a :class:`~sequoia.runners.hf.onednn.BlockedLinear` head where blocked weights are
    installed) multiplies 2-D rows itself, and :func:`plain_head_rows` covers the others.
    """
    if not 0 < keep < rows:
        return keep
    return torch.arange(rows - keep, rows, device=device)


@contextmanager
def plain_head_rows(*models: torch.nn.Module) -> Iterator[None]:
    """While inside, each model's ``nn.Linear`` head gets its input rows with plain strides (see :func:`head_rows`),
    for code that calls the model itself with a count (Hugging Face ``generate``); the hooks go on exit."""
    heads = (m.get_output_embeddings() for m in models)
    handles = [h.register_forward_pre_hook(_plain_rows) for h in heads if isinstance(h, torch.nn.Linear)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _plain_rows(module, args):
    x = args[0]
    return (x.reshape(-1, x.shape[-1]).view(x.shape),) + tuple(args[1:])   # [..., H], standard strides


def draft_forward(model: torch.nn.Module) -> Callable[..., torch.Tensor]:
    """The forward a draft level runs (the drafter's, and the one its profile times): lean where supported."""
    return model_forward if lean_support(model) else lean_forward
