"""Weight-only quantized linears: close to the float layer, same shapes, dense path for many rows, clear errors."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from sequoia.runtime import kernels
from sequoia.runtime.kernels import Int4Linear, Int8Linear, quantize_weights

needs_int4 = pytest.mark.skipif(not kernels.int4_available(), reason="this torch has no CPU int4 kernel")


def _tiny(seed: int = 3) -> Qwen2ForCausalLM:
    cfg = Qwen2Config(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      tie_word_embeddings=False)
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(cfg).eval()


@pytest.mark.parametrize("scheme", ["int8", pytest.param("int4", marks=needs_int4)])
def test_quantized_model_keeps_top1_of_a_tiny_model(scheme):
    ref = _tiny().to(torch.bfloat16)
    q = quantize_weights(_tiny(), scheme)
    assert all(not isinstance(m, torch.nn.Linear) for m in q.modules())
    assert kernels.describe(q) == ("int4+int8" if scheme == "int4" else scheme)  # lm_head: 1000 rows, not 16k
    ids = torch.randint(0, 1000, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        a, b = ref(ids).logits.float(), q(ids).logits.float()
    assert (a.argmax(-1) == b.argmax(-1)).float().mean() >= 0.85
    assert (a - b).abs().max() < 0.15


@pytest.mark.parametrize("make", [
    lambda lin: Int8Linear.from_linear(lin, torch.bfloat16),
    pytest.param(lambda lin: Int4Linear.from_linear(lin, 32), marks=needs_int4),
])
def test_linear_matches_float_linear_on_both_paths(make):
    lin = torch.nn.Linear(64, 48, bias=True)
    before = lin.weight.detach().clone()
    q = make(lin)
    assert torch.equal(lin.weight, before)  # quantizing must not touch the source layer
    for rows in (3, kernels.DENSE_ROWS + 5):  # the small kernel, then the dense path
        x = torch.randn(1, rows, 64)
        expected = lin(x)
        got = q(x.to(torch.bfloat16)).float()
        assert got.shape == (1, rows, 48)
        assert torch.allclose(got, expected, atol=0.05 * expected.abs().max().item())


def test_dense_path_only_past_dense_rows_and_only_with_a_copy():
    lin = torch.nn.Linear(64, 48)
    q = Int8Linear.from_linear(lin, torch.bfloat16, dense_rows=4)
    x = torch.randn(8, 64, dtype=torch.bfloat16)
    assert torch.equal(q(x), torch.nn.functional.linear(x, q.dense) + q.bias)          # 8 rows: dense
    small = torch._weight_int8pack_mm(x[:2].contiguous(), q.weight, q.scale) + q.bias
    assert torch.equal(q(x[:2]), small)                                                  # 2 rows: the kernel
    bare = Int8Linear.from_linear(lin, torch.bfloat16, dense_rows=None)
    assert bare.dense is None and torch.equal(bare(x), torch._weight_int8pack_mm(x, bare.weight, bare.scale) + bare.bias)


def test_unknown_scheme_and_misfit_group_are_refused():
    with pytest.raises(ValueError, match="unknown weight quantization"):
        quantize_weights(_tiny(), "int3")
    if kernels.int4_available():
        with pytest.raises(ValueError, match="multiple of the int4 group"):
            Int4Linear.from_linear(torch.nn.Linear(40, 8), 32)
        # a whole model with such a layer falls back to int8 there instead of failing
        model = torch.nn.Sequential(torch.nn.Linear(40, 64), torch.nn.Linear(64, 16))
        assert kernels.describe(quantize_weights(model, "int4")) == "int4+int8"


def test_none_leaves_the_model_alone():
    model = _tiny()
    assert quantize_weights(model, "none") is model and kernels.describe(model) == "none"


def test_default_draft_scheme_by_machine():
    assert kernels.default_draft_scheme("cuda", ("avx512_bf16",)) == "none"
    assert kernels.default_draft_scheme("cpu", ("avx2",)) == "int8"
    expected = "int4" if kernels.int4_available() else "int8"
    assert kernels.default_draft_scheme("cpu", ("avx2", "avx512f", "avx512_bf16")) == expected
