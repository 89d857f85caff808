"""The lean draft forward: the model's own logits and cache, for every kind of call the drafter makes."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_model
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from sequoia.core.trees.masks import tree_attention_mask
from sequoia.runners.hf import kernels
from sequoia.runners.hf.attention import use_few_query_attention
from sequoia.runners.hf.cpu import SINGLE_ROW_ATEN
from sequoia.runners.hf.kernels import quantize_weights
from sequoia.runners.hf.lean import draft_forward, lean_forward, lean_support, model_forward
from sequoia.runners.hf.loading import wrap_model
from sequoia.runners.hf.runner import HFRunner
from sequoia.runtime.drafter import Drafter

needs_int4 = pytest.mark.skipif(not kernels.int4_available(), reason="this torch has no CPU int4 kernel")


def _qwen2(seed: int = 3) -> Qwen2ForCausalLM:
    return tiny_model(seed, vocab=1000, hidden=64, layers=2)


def _llama(seed: int = 3) -> LlamaForCausalLM:
    cfg = LlamaConfig(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      attention_bias=True, attn_implementation="sdpa")
    torch.manual_seed(seed)
    return LlamaForCausalLM(cfg).eval()


def _few_query(model):
    assert use_few_query_attention(model)
    return model


def _calls(model, forward) -> tuple[list[torch.Tensor], DynamicCache]:
    """The drafter's kinds of call in order: a prompt, pending tokens on a cache, a tree level, one token."""
    cache = DynamicCache(config=model.config)
    gen = torch.Generator().manual_seed(0)
    out = []
    with torch.inference_mode():
        prompt = torch.randint(1000, (1, 9), generator=gen)
        out.append(forward(model, prompt, torch.arange(9)[None], None, cache, 1))
        pending = torch.randint(1000, (1, 3), generator=gen)
        out.append(forward(model, pending, torch.arange(9, 12)[None], None, cache, 0))
        # A level of three siblings under the last cached token: each sees the context and itself.
        allowed = torch.zeros(3, 15, dtype=torch.bool)
        allowed[:, :12] = True
        allowed[:, 12:] = torch.eye(3, dtype=torch.bool)
        level = torch.randint(1000, (1, 3), generator=gen)
        mask = tree_attention_mask(allowed, model.dtype, "cpu")
        out.append(forward(model, level, torch.full((1, 3), 12), mask, cache, 0))
        one = torch.randint(1000, (1, 1), generator=gen)
        out.append(forward(model, one, torch.tensor([[13]]), None, cache, 0))
    return out, cache


@pytest.mark.parametrize("make", [_qwen2, _llama], ids=["qwen2", "llama"])
def test_lean_forward_gives_the_models_logits_and_cache(make):
    model = _few_query(make())
    assert lean_support(model) == ""
    ours, our_cache = _calls(model, lean_forward)
    theirs, their_cache = _calls(model, model_forward)
    for a, b in zip(ours, theirs):
        assert a.shape == b.shape
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    for mine, ref in zip(our_cache.layers, their_cache.layers):
        torch.testing.assert_close(mine.keys, ref.keys, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(mine.values, ref.values, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("scheme", ["int8", pytest.param("int4", marks=needs_int4)])
def test_lean_forward_of_a_fused_quantized_draft_is_bit_for_bit(scheme):
    """The drafter's real case: bf16 activations, q|k|v and gate|up as one quantized product each."""
    model = _few_query(quantize_weights(_qwen2(), scheme))
    assert isinstance(model.model.layers[0].self_attn.q_proj, kernels.ProjectionPart)
    ours, _ = _calls(model, lean_forward)
    theirs, _ = _calls(model, model_forward)
    for a, b in zip(ours, theirs):
        assert torch.equal(a, b)


def test_models_it_does_not_compute_are_left_to_their_forward():
    assert "not few-query" in lean_support(_qwen2())                    # plain SDPA, as on a GPU
    assert draft_forward(_qwen2()) is model_forward
    windowed = _qwen2()
    windowed.config.layer_types = ["sliding_attention", "full_attention"]
    assert "sliding-window" in lean_support(_few_query(windowed))
    normed = _few_query(_qwen2())
    normed.model.layers[1].self_attn.q_norm = torch.nn.Identity()       # a Qwen3-style layer
    assert "plain Llama structure" in lean_support(normed)

    class Other(Qwen2ForCausalLM):
        pass

    assert "is not one of" in lean_support(Other(_qwen2().config))
    assert draft_forward(_few_query(_qwen2())) is lean_forward


def test_a_draft_runner_runs_the_lean_forward_where_supported():
    assert wrap_model(_few_query(_qwen2()), role="draft", plain=False).forward_fn is lean_forward
    assert wrap_model(_few_query(_qwen2()), role="target", plain=False).forward_fn is model_forward
    assert wrap_model(_few_query(_qwen2()), role="draft", plain=True).forward_fn is model_forward   # the GPU path


def test_one_row_lean_forwards_take_the_runners_one_row_kernel():
    """A runner whose one-row kernel is "aten" runs one-token forwards with oneDNN off, wider ones with it on."""
    model = _few_query(_qwen2().to(torch.bfloat16))
    runner = HFRunner(model, "bf16", wrap_model(model).info, forward_fn=lean_forward,
                      single_row_kernel=SINGLE_ROW_ATEN)
    seen = []
    down = model.model.layers[0].mlp.down_proj
    down.register_forward_pre_hook(lambda m, a: seen.append(torch.backends.mkldnn.enabled))
    before = torch.backends.mkldnn.enabled
    session = runner.session()
    session.forward([3, 5])
    session.forward([7])
    assert seen == [before, False]
    assert torch.backends.mkldnn.enabled == before


def test_a_profile_times_the_draft_with_the_forward_the_drafter_runs(monkeypatch):
    from conftest import make_pair

    from sequoia.runtime.measuring import profiling
    from sequoia.runtime.measuring.profiling import measure_profile

    used = {}
    monkeypatch.setattr(profiling, "_forward_ms", lambda session, *a: used.setdefault(
        id(session.runner.model), set()).add(session.runner.forward_fn) or 1.0)
    draft, target = _few_query(tiny_model(0, vocab=64)), _few_query(tiny_model(1, vocab=64))
    pair = make_pair(wrap_model(draft, role="draft", plain=False), wrap_model(target, plain=False), 64)
    measure_profile(pair, context_len=4, target_grid=(1, 2), draft_grid=(1, 2), repeats=1,
                    warmup=0, progress=lambda *a: None, overhead_steps=0)
    assert used == {id(draft): {lean_forward}, id(target): {model_forward}}   # the target verifies as everyone runs it
