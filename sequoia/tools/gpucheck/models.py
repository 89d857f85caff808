"""Models the GPU check builds from a config: tiny ones for correctness, real shapes for costs."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from ...runners.base import RunnerInfo
from ...runners.hf.graphs.capture import warm_up
from ...runners.hf.graphs.compile_cache import CompilePlan
from ...runners.hf.graphs.graph_runner import GraphRunner
from ...runners.hf.loading import dtype_name, wrap_model


@dataclass(frozen=True)
class Shape:
    """A Qwen2-family decoder's sizes (what a forward's cost depends on)."""

    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    tied: bool = False

    def config(self, max_positions: int = 32768) -> Qwen2Config:
        return Qwen2Config(vocab_size=self.vocab, hidden_size=self.hidden, intermediate_size=self.intermediate,
                           num_hidden_layers=self.layers, num_attention_heads=self.heads,
                           num_key_value_heads=self.kv_heads, max_position_embeddings=max_positions,
                           tie_word_embeddings=self.tied, attn_implementation="sdpa")

    @property
    def params_b(self) -> float:
        emb = self.vocab * self.hidden * (1 if self.tied else 2)
        attn = self.hidden * (self.hidden + 2 * self.kv_heads * self.hidden // self.heads) + self.hidden ** 2
        return (emb + self.layers * (attn + 3 * self.hidden * self.intermediate)) / 1e9


#: The embedded pair's shapes (Qwen2.5-Coder-0.5B / 1.5B) and Qwen2.5-7B's.
DRAFT_05B = Shape("0.5B (Qwen2.5-Coder-0.5B shapes)", 896, 24, 14, 2, 4864, 151936)
TARGET_15B = Shape("1.5B (Qwen2.5-Coder-1.5B shapes)", 1536, 28, 12, 2, 8960, 151936)
TARGET_7B = Shape("7B (Qwen2.5-7B shapes)", 3584, 28, 28, 4, 18944, 152064)
#: Qwen2.5-32B's shapes (65.5 GB in bf16): the streamed target of scripts/gpu/offload_check.py.
TARGET_32B = Shape("32B (Qwen2.5-32B shapes)", 5120, 64, 40, 8, 27648, 152064)
#: Stand-ins for ``--device cpu``: the same code on shapes a CPU runs in seconds.
CPU_DRAFT = Shape("tiny draft (CPU stand-in)", 64, 2, 4, 2, 128, 512)
CPU_TARGET = Shape("tiny target (CPU stand-in)", 96, 3, 4, 2, 192, 512)


def random_model(shape: Shape, device: torch.device, dtype: torch.dtype, seed: int = 0) -> Qwen2ForCausalLM:
    """Random weights at ``shape``, built on ``device`` directly (no host copy of a 7B model)."""
    torch.manual_seed(seed)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = Qwen2ForCausalLM(shape.config())
    finally:
        torch.set_default_dtype(previous)
    return model.eval().requires_grad_(False)


def tiny_model(seed: int, device: torch.device, vocab: int = 48, init: float = 0.3) -> Qwen2ForCausalLM:
    """A 2-layer fp32 model (correctness checks)."""
    cfg = Qwen2Config(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                      tie_word_embeddings=False, initializer_range=init, attn_implementation="sdpa")
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(cfg).eval().float().to(device).requires_grad_(False)


def perturbed(model, scale: float, seed: int):
    """A copy of ``model`` with noise on every weight: a draft that agrees only partly."""
    out = copy.deepcopy(model)
    g = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    with torch.no_grad():
        for prm in out.parameters():
            prm.add_(torch.randn(prm.shape, generator=g, device=prm.device) * scale * prm.std().clamp(min=1e-3))
    return out


def runner(model, kind: str, name: str, capacity: int | None = None, compile: bool = False,
           artifacts: str | Path | None = None):
    """``kind`` "graph": the graph runner (CUDA graphs on a GPU, eager elsewhere); "eager": the plain runner.

    ``compile``: inductor-fused forwards under the graphs, through the compile cache as the app compiles
    (:class:`~sequoia.runners.hf.graphs.compile_cache.CompilePlan`: off, and why, where compilation is unavailable;
    artifacts saved under ``artifacts``, None: not kept), compiled and captured here (``warm_up``), so that
    ``compile_status.seconds`` is the compile's time and ``capture_seconds`` the captures', never a first
    forward's."""
    if kind == "eager":
        return wrap_model(model, name, plain=True, graphs=False)
    device = next(model.parameters()).device
    plan = CompilePlan.for_draft(device, artifacts) if compile else CompilePlan(False, "not asked")
    info = RunnerInfo(runtime="hf", weights=dtype_name(model.dtype), device=str(device),
                      kernels=("compiled, " if plan.enabled else "")
                      + ("cuda graphs, slot cache" if device.type == "cuda" else "slot cache, eager"))
    rn = GraphRunner(model, name, info, capacity=capacity, compile=plan)
    if plan.enabled:
        warm_up(rn)
    return rn


class _Ids:
    """Token ids as text, enough for the engine's records (the check decodes nothing)."""

    def __len__(self) -> int:
        return 1 << 20

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return " ".join(str(i) for i in ids)

    def batch_decode(self, seqs, skip_special_tokens: bool = False) -> list[str]:
        return [self.decode(s) for s in seqs]


def pair_of(draft, target, name: str) -> SimpleNamespace:
    """The engine's view of a pair of runners (what :class:`~sequoia.runtime.models.ModelPair` offers it)."""
    dtype = getattr(target, "dtype", None) or next(target.model.parameters()).dtype
    return SimpleNamespace(draft=draft, target=target, tokenizer=_Ids(), device=target.device, dtype=dtype,
                           eos_token_ids=(), draft_name=draft.name, target_name=target.name, name=name,
                           vocab_size=min(draft.vocab_size, target.vocab_size))
