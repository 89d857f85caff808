"""Few-query attention: the same numbers as SDPA for every mask the models are given, and the same decodes."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch
from conftest import make_pair, perturbed, tiny_model
from test_engine import _hf_greedy
from transformers import AttentionInterface

from sequoia.core.config import GenerationConfig
from sequoia.core.trees.masks import verify_mask
from sequoia.core.trees.tree import Tree
from sequoia.runners.hf import attention
from sequoia.runners.hf.attention import FEW_QUERY, few_query_attention, use_few_query_attention
from sequoia.runtime.engine import SpeculativeEngine
from sequoia.runtime.methods import make_method

SDPA = torch.nn.functional.scaled_dot_product_attention


def _reference(query, key, value, mask):
    """float64 SDPA with the key/value heads repeated: [b, w, h, d]."""
    group = query.shape[1] // key.shape[1]
    k, v = (t.double().repeat_interleave(group, 1) for t in (key, value))
    m = mask if mask is None or mask.dtype == torch.bool else mask.double()
    return SDPA(query.double(), k, v, attn_mask=m).transpose(1, 2)


def _qkv(heads, kv_heads, w, length, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, heads, w, 16, generator=g).to(dtype)
    k = (2 * torch.randn(1, kv_heads, length, 16, generator=g)).to(dtype)
    v = torch.randn(1, kv_heads, length, 16, generator=g).to(dtype)
    return q, k, v


MODULE = SimpleNamespace(is_causal=True, num_key_value_groups=2)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("heads,kv_heads", [(4, 2), (14, 2), (4, 4)])
@pytest.mark.parametrize("w", [1, 3, 8])
def test_equals_sdpa_for_every_kind_of_mask(dtype, tol, heads, kv_heads, w):
    length = 40
    q, k, v = _qkv(heads, kv_heads, w, length, dtype)
    allowed = torch.rand(1, 1, w, length, generator=torch.Generator().manual_seed(1)) < 0.6
    allowed[..., 0] = True                                     # every query sees some key (else: NaN either way)
    additive = torch.zeros(1, 1, w, length, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)
    causal = torch.arange(length)[None, :] <= torch.arange(w)[:, None] + (length - w)
    for given, meant in ((allowed, allowed), (additive, allowed), (None, causal[None, None])):
        out, weights = few_query_attention(MODULE, q, k, v, given)
        assert weights is None and out.shape == (1, w, heads, 16) and out.dtype == dtype
        torch.testing.assert_close(out.double(), _reference(q, k, v, meant), atol=tol, rtol=tol)


def test_many_cells_and_unsupported_arguments_go_to_sdpa(monkeypatch):
    seen = []
    monkeypatch.setattr(attention, "sdpa_attention_forward", lambda *a, **kw: seen.append(kw) or ("sdpa", None))
    q, k, v = _qkv(4, 2, 2, attention.FEW_QUERY_CELLS // 2 + 1, torch.float32)
    assert few_query_attention(MODULE, q, k, v, None)[0] == "sdpa"                        # too many cells
    q, k, v = _qkv(4, 2, 1, 8, torch.float32)
    assert few_query_attention(MODULE, q, k, v, None, dropout=0.1)[0] == "sdpa"
    assert few_query_attention(MODULE, q, k, v, None, softcap=30.0)[0] == "sdpa"
    per_head = torch.ones(1, 4, 1, 8, dtype=torch.bool)
    assert few_query_attention(MODULE, q, k, v, per_head)[0] == "sdpa"
    assert len(seen) == 4
    assert few_query_attention(MODULE, q, k, v, None, sliding_window=None)[0].shape == (1, 1, 4, 16)


def test_a_switched_model_computes_what_sdpa_computes():
    """Prefill, one-token decode and a tree verification with its mask: logits equal to the SDPA model's."""
    ref = tiny_model(0)
    fast = copy.deepcopy(ref)
    assert use_few_query_attention(fast) and fast.config._attn_implementation == FEW_QUERY
    assert ref.config._attn_implementation == "sdpa"
    tree = Tree((-1, 0, 0, 1, 1, 2))
    prompt, nodes = list(range(3, 20)), [5, 7, 9, 11, 13, 15]
    outs = []
    with torch.no_grad():
        for model in (ref, fast):
            from transformers import DynamicCache

            cache = DynamicCache(config=model.config)
            pre = model(torch.tensor([prompt]), past_key_values=cache, use_cache=True).logits
            one = model(torch.tensor([[4]]), past_key_values=cache, use_cache=True).logits
            mask = verify_mask(tree, len(prompt) + 1, torch.float32, "cpu")
            wide = model(torch.tensor([nodes]), past_key_values=cache, attention_mask=mask,
                         position_ids=tree.position_ids(len(prompt) + 1)[None], use_cache=True).logits
            outs.append((pre, one, wide))
    for a, b in zip(*outs):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_greedy_decoding_with_the_switched_pair_equals_the_target_alone():
    target = tiny_model(0)
    draft = perturbed(target, 0.5, 1)
    expected = _hf_greedy(target, [3, 4, 5, 6, 7], 24)                # SDPA target, Hugging Face generate
    for model in (target, draft):
        use_few_query_attention(model)
    pair = make_pair(draft, target, target.config.vocab_size)
    for name in ("sequoia", "chain"):
        records = SpeculativeEngine(pair).generate([3, 4, 5, 6, 7], make_method(name, budget=6),
                                                   GenerationConfig(max_new_tokens=24, stop_at_eos=False))
        assert [t for r in records for t in r.new_tokens] == expected
    assert _hf_greedy(target, [3, 4, 5, 6, 7], 24) == expected        # generate on the switched target too


def test_only_cpu_sdpa_models_are_switched():
    eager = tiny_model(0)
    eager.set_attn_implementation("eager")
    assert not use_few_query_attention(eager) and eager.config._attn_implementation == "eager"
    model = tiny_model(0)
    assert use_few_query_attention(model) and not use_few_query_attention(model)     # once


def test_the_switch_is_per_model_and_the_registration_idempotent(monkeypatch):
    """transformers' name table is the process's: registering is idempotent, a name taken by another function is
    refused, and switching one model leaves every other model's attention as it was."""
    model, other = tiny_model(0), tiny_model(0)
    assert use_few_query_attention(model)
    assert other.config._attn_implementation == "sdpa"
    attention._register()                                                           # again: nothing changes
    assert AttentionInterface._global_mapping[FEW_QUERY] is few_query_attention
    monkeypatch.setitem(AttentionInterface._global_mapping, FEW_QUERY, lambda *a, **k: None)
    with pytest.raises(RuntimeError, match="is taken"):
        attention._register()
