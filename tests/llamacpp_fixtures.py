"""A tiny random-weight GGUF for the llama.cpp runner, written with the ``gguf`` package (nothing downloaded).

The weights are those of a tiny Hugging Face ``Qwen2ForCausalLM`` built from a
config (2 layers, hidden 64, 320 tokens, f32), copied tensor by tensor under
llama.cpp's names, so the same model can be run on both runtimes.  Qwen2 uses
the "neox" rotary layout in both, so no q/k permutation is needed.  Runners
never see text, so the GGUF carries no tokenizer (``tokenizer.ggml.model =
"none"`` plus ``qwen2.vocab_size``, which llama.cpp accepts as dummy tokens).
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

TINY_VOCAB = 320


def tiny_qwen2(seed: int = 0, vocab: int = TINY_VOCAB, hidden: int = 64, layers: int = 2) -> Qwen2ForCausalLM:
    """A random Qwen2 with every weight (norms and q/k/v biases too) away from its neutral init."""
    cfg = Qwen2Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                      tie_word_embeddings=False, initializer_range=0.3, rms_norm_eps=1e-6)
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(cfg).eval().float()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith(".bias"):
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
    return model


_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.weight": "attn_k.weight", "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def gguf_name(hf_name: str) -> str:
    """llama.cpp's tensor name for a Qwen2ForCausalLM parameter."""
    top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
           "lm_head.weight": "output.weight"}
    if hf_name in top:
        return top[hf_name]
    _, _, layer, rest = hf_name.split(".", 3)  # model.layers.<i>.<rest>
    return f"blk.{layer}.{_LAYER_NAMES[rest]}"


def write_tiny_gguf(path: str | Path, model: Qwen2ForCausalLM) -> Path:
    """Write ``model`` as an f32 GGUF llama.cpp loads (architecture qwen2)."""
    cfg, path = model.config, Path(path)
    rope = getattr(cfg, "rope_theta", None) or (cfg.rope_parameters or {}).get("rope_theta", 10000.0)
    w = gguf.GGUFWriter(str(path), "qwen2")
    w.add_name("tiny-qwen2")
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_freq_base(float(rope))
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_vocab_size(cfg.vocab_size)
    w.add_tokenizer_model("none")
    for name, p in model.state_dict().items():
        # numpy (out, in) row-major is ggml's {in, out}: the layout llama.cpp expects for every matrix
        w.add_tensor(gguf_name(name), np.ascontiguousarray(p.detach().float().numpy()))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
