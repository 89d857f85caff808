"""Weight-only quantized linears: close to the float layer, same shapes, dense path for many rows, clear errors."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from conftest import make_pair, tiny_model
from transformers import DynamicCache, Qwen2Config, Qwen2ForCausalLM

from sequoia.core.config import GenerationConfig
from sequoia.runners.hf import cpu, kernels, onednn
from sequoia.runners.hf.kernels import FusedProjections, Int4Linear, Int8Linear, ProjectionPart, quantize_weights
from sequoia.runners.hf.loading import wrap_model
from sequoia.runtime.engine import SpeculativeEngine
from sequoia.runtime.measuring.fingerprint import onednn_bf16
from sequoia.runtime.methods import make_method

needs_int4 = pytest.mark.skipif(not kernels.int4_available(), reason="this torch has no CPU int4 kernel")

# oneDNN-blocked bf16 weights are used only where oneDNN has bf16 kernels; elsewhere they are not built.
needs_onednn_bf16 = pytest.mark.skipif(not onednn_bf16(), reason="oneDNN has no bf16 kernels on this CPU")


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


@needs_onednn_bf16
@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_a_blocked_copy_replaces_the_plain_one_from_fewer_rows(scheme):
    if scheme == "int4" and not kernels.int4_available():
        pytest.skip("no int4 kernel in this torch")
    lin = torch.nn.Linear(64, 48)
    q = (Int4Linear if scheme == "int4" else Int8Linear).from_linear(lin, dense_rows=32)
    x = torch.randn(16, 64, dtype=torch.bfloat16)
    wide, few = torch.nn.functional.linear(x, q.dense) + q.bias, q(x[:4])   # the plain copy's product; the kernel's
    assert q.block_copy(rows=8) and q.dense is None and q.dense_rows == 8
    assert torch.equal(q(x), wide)                   # 16 rows: the blocked copy, equal to the plain one bit for bit
    assert torch.equal(q(x[:4]), few)                # 4 rows: still the quantized kernel
    assert not q.block_copy()                        # no plain copy left to block
    bare = (Int4Linear if scheme == "int4" else Int8Linear).from_linear(lin, dense_rows=None)
    assert not bare.block_copy() and bare(x).shape == (16, 48)


@needs_onednn_bf16
def test_block_weights_blocks_a_quantized_models_copies(monkeypatch):
    monkeypatch.setattr(kernels, "multi_row_kernel", lambda device_type, dtype: kernels.MULTI_ROW_BLOCKED)
    model = quantize_weights(tiny_model(0), "int8")
    plain = quantize_weights(tiny_model(0), "int8", dense_rows=kernels.BLOCKED_ROWS)   # plain copies from 8 rows
    assert kernels.block_weights(model)
    quant = [m for m in model.modules() if isinstance(m, (Int8Linear, Int4Linear))]
    assert quant and all(m.dense is None and m._blocked and m.dense_rows == kernels.BLOCKED_ROWS for m in quant)
    with torch.no_grad():
        for n in (12, 3):      # 12 rows: the bf16 copies (blocked = plain, bit for bit); 3 rows: the int8 kernel
            ids = torch.tensor([list(range(3, 3 + n))])
            assert torch.equal(model(input_ids=ids).logits, plain(input_ids=ids).logits)


def test_unknown_scheme_and_misfit_group_are_refused():
    with pytest.raises(ValueError, match="unknown weight quantization"):
        quantize_weights(_tiny(), "int3")


@needs_int4
def test_a_misfit_int4_group_is_refused_and_a_model_falls_back_to_int8_there():
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


SCHEMES = ["int8", pytest.param("int4", marks=needs_int4)]


def _logits_by_step(model, ids: torch.Tensor) -> list[torch.Tensor]:
    """Logits of a prefill of 40 rows (the dense path), then steps of 1 and 3 rows (the kernels) on its cache."""
    cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        out = [model(ids[:, :40], past_key_values=cache, use_cache=True).logits]
        out.append(model(ids[:, 40:41], past_key_values=cache, use_cache=True).logits)
        out.append(model(ids[:, 41:44], past_key_values=cache, use_cache=True).logits)
    return out


@pytest.mark.parametrize("scheme", SCHEMES)
def test_fused_projections_give_the_separate_layers_numbers_bit_for_bit(scheme):
    assert kernels.DENSE_ROWS <= 40  # the prefill below takes the dense path, the steps the kernels
    fused, separate = quantize_weights(_tiny(), scheme), quantize_weights(_tiny(), scheme, fuse=False)
    attn, mlp = fused.model.layers[0].self_attn, fused.model.layers[0].mlp
    assert isinstance(attn.qkv_proj, FusedProjections) and attn.qkv_proj.sizes == (64, 32, 32)
    assert isinstance(mlp.gate_up_proj, FusedProjections) and mlp.gate_up_proj.sizes == (128, 128)
    assert all(isinstance(m, ProjectionPart) for m in (attn.q_proj, attn.k_proj, attn.v_proj, mlp.up_proj))
    assert attn.qkv_proj.fused.bias is not None and mlp.gate_up_proj.fused.bias is None   # Qwen2: q, k, v biased
    assert kernels.describe(fused) == kernels.describe(separate)
    ids = torch.randint(0, 1000, (1, 44), generator=torch.Generator().manual_seed(1))
    for a, b in zip(_logits_by_step(fused, ids), _logits_by_step(separate, ids), strict=True):
        assert torch.equal(a, b)
    assert attn.qkv_proj._held is None and mlp.gate_up_proj._held is None   # nothing held between calls


def test_a_part_called_with_another_input_recomputes():
    lins = [torch.nn.Linear(64, 32), torch.nn.Linear(64, 16)]
    group = FusedProjections(Int8Linear.from_linear(kernels.stack_linears(lins)), (32, 16))
    first, second = ProjectionPart(group, 0), ProjectionPart(group, 1)
    x, y = torch.randn(2, 64, dtype=torch.bfloat16), torch.randn(2, 64, dtype=torch.bfloat16)
    own = [Int8Linear.from_linear(lin) for lin in lins]
    assert torch.equal(first(x), own[0](x))
    assert torch.equal(second(y), own[1](y))          # not x's cached product
    x.mul_(2)                                         # changed in place: the version counter tells
    assert torch.equal(first(x), own[0](x))
    assert torch.equal(second(x), own[1](x)) and group._held is None


def test_decodes_on_several_threads_sharing_a_fused_model_get_their_own_products():
    model = quantize_weights(_tiny(), "int8")
    inputs = [torch.randint(0, 1000, (1, 3), generator=torch.Generator().manual_seed(s)) for s in range(24)]

    def logits(ids: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            return model(ids).logits

    alone = [logits(ids) for ids in inputs]
    with ThreadPoolExecutor(4) as pool:
        together = list(pool.map(logits, inputs))
    assert all(torch.equal(a, b) for a, b in zip(alone, together, strict=True))


def test_groups_that_would_change_scheme_or_shape_stay_separate():
    model = torch.nn.Module()
    model.gate_proj, model.up_proj = torch.nn.Linear(64, 32, bias=False), torch.nn.Linear(64, 32, bias=True)
    quantize_weights(model, "int8")
    assert isinstance(model.gate_proj, Int8Linear) and not hasattr(model, "gate_up_proj")   # bias differs


@needs_int4
def test_an_int4_group_whose_members_fall_back_to_int8_stays_int8_fused():
    model = torch.nn.Module()
    model.gate_proj, model.up_proj = torch.nn.Linear(64, 8), torch.nn.Linear(64, 8)   # 8 rows: int8 each
    quantize_weights(model, "int4")
    assert isinstance(model.gate_up_proj.fused, Int8Linear)   # stacked 16 rows would fit int4: kept int8


@pytest.mark.parametrize("scheme", SCHEMES)
def test_a_fused_quantized_draft_decodes_to_the_target_greedy(scheme):
    target = tiny_model(0)
    draft = quantize_weights(tiny_model(0), scheme)
    assert isinstance(draft.model.layers[0].self_attn.qkv_proj, FusedProjections)
    prompt = [1, 5, 9, 3, 7]
    with torch.no_grad():
        expected = target.generate(torch.tensor([prompt]), max_new_tokens=30, do_sample=False,
                                   eos_token_id=None, pad_token_id=0)[0, len(prompt):].tolist()
    pair = make_pair(draft, target, target.config.vocab_size)
    records = list(SpeculativeEngine(pair).generate(prompt, make_method("sequoia", budget=16, depth=5),
                                                    GenerationConfig(max_new_tokens=30)))
    assert [t for r in records for t in r.new_tokens] == expected
    assert sum(r.n_accepted for r in records) > 0   # the quantized copy of the target is accepted


# ---------------------------------------------------------------------------- one-token forwards
def _onednn_seen(model):
    """Record torch.backends.mkldnn.enabled as the first decoder layer sees it, on every forward."""
    seen = []
    model.model.layers[0].register_forward_pre_hook(lambda m, a: seen.append(torch.backends.mkldnn.enabled))
    return seen


def test_one_token_forwards_run_without_onednn_and_wider_ones_with_it():
    """Code that calls the model itself (Hugging Face generate) gets the one-row kernel inside the scope only."""
    model = tiny_model(0).to(torch.bfloat16)
    plain = tiny_model(0).to(torch.bfloat16)
    seen = _onednn_seen(model)
    before = torch.backends.mkldnn.enabled
    ids = torch.tensor([[3, 5, 7]])
    with torch.no_grad(), onednn.single_rows_routed(model, cpu.SINGLE_ROW_ATEN):
        wide = model(input_ids=ids).logits
        one = model(ids[:, :1]).logits                              # positional input_ids too
        model(inputs_embeds=model.model.embed_tokens(ids[:, :1]))
    assert seen == [before, False, False]
    assert torch.backends.mkldnn.enabled == before
    with torch.no_grad():
        model(ids[:, :1])                                           # outside the scope: hooks removed
    assert seen[-1] == before
    with torch.no_grad():   # the same model: same numbers within bf16 rounding (here the kernels agree exactly)
        torch.testing.assert_close(wide, plain(input_ids=ids).logits, atol=0.05, rtol=0.05)
        torch.testing.assert_close(one, plain(ids[:, :1]).logits, atol=0.05, rtol=0.05)


def test_onednn_comes_back_after_a_failed_one_token_forward():
    model = tiny_model(0).to(torch.bfloat16)
    before = torch.backends.mkldnn.enabled

    def fail(module, args):
        raise RuntimeError(f"out of memory (oneDNN enabled: {torch.backends.mkldnn.enabled})")

    model.model.layers[1].register_forward_pre_hook(fail)
    with pytest.raises(RuntimeError, match="enabled: False"), torch.no_grad(), \
            onednn.single_rows_routed(model, cpu.SINGLE_ROW_ATEN):
        model(input_ids=torch.tensor([[3]]))
    assert torch.backends.mkldnn.enabled == before


def test_overlapping_one_token_forwards_restore_onednn_once_the_last_ends():
    switch = onednn._OneDnnSwitch()
    before = torch.backends.mkldnn.enabled
    first, second = switch.off(), switch.off()
    first.__enter__()
    second.__enter__()                      # a second thread's one-token forward begins inside the first
    first.__exit__(None, None, None)        # the first ends: the second still runs without oneDNN
    assert torch.backends.mkldnn.enabled is False
    second.__exit__(None, None, None)
    assert torch.backends.mkldnn.enabled == before


def test_one_row_scopes_in_many_threads_leave_onednn_as_they_found_it():
    """Forwards on several threads enter and leave the switch in any order; none sees oneDNN on while inside."""
    before = torch.backends.mkldnn.enabled
    inside = threading.Barrier(4)

    def forward(_):
        with onednn.single_row_scope(cpu.SINGLE_ROW_ATEN, 1):
            inside.wait(timeout=10)                 # all four inside at once
            return torch.backends.mkldnn.enabled

    with ThreadPoolExecutor(4) as pool:
        assert list(pool.map(forward, range(4))) == [False] * 4
    assert torch.backends.mkldnn.enabled == before


def test_one_row_scope_is_the_runners_and_changes_nothing_else():
    before = torch.backends.mkldnn.enabled
    with onednn.single_row_scope(cpu.SINGLE_ROW_ATEN, 1):
        assert torch.backends.mkldnn.enabled is False
    assert torch.backends.mkldnn.enabled == before
    for kernel, rows in ((cpu.SINGLE_ROW_ATEN, 2), ("", 1)):   # a wider forward, a runner without the choice
        with onednn.single_row_scope(kernel, rows):
            assert torch.backends.mkldnn.enabled == before


def test_only_bf16_models_on_cpus_with_onednn_bf16_are_routed(monkeypatch):
    assert cpu.single_row_kernel("cpu", torch.float32) == ""    # fp32: torch's own kernels
    monkeypatch.setattr("sequoia.runners.hf.cpu.onednn_bf16", lambda: False)
    assert cpu.single_row_kernel("cpu", torch.bfloat16) == ""   # an AVX2-only CPU: nothing to skip
    assert wrap_model(tiny_model(0).to(torch.bfloat16), plain=False).single_row_kernel == ""
    monkeypatch.setattr("sequoia.runners.hf.cpu.onednn_bf16", lambda: True)
    monkeypatch.setattr("sequoia.runners.hf.cpu.cpu_facts", lambda: ("EPYC", ("avx2", "avx512f", "avx512_bf16")))
    assert cpu.single_row_kernel("cpu", torch.bfloat16) == cpu.SINGLE_ROW_ATEN
    assert cpu.single_row_kernel("cuda", torch.bfloat16) == ""
    assert wrap_model(tiny_model(0).to(torch.bfloat16), plain=False).single_row_kernel == cpu.SINGLE_ROW_ATEN
    assert wrap_model(tiny_model(0).to(torch.bfloat16), plain=True).single_row_kernel == ""   # the GPU path
    # with AMX one row goes through the blocked copies (where there are none: oneDNN on the plain weight)
    assert cpu.single_row_kernel("cpu", torch.bfloat16, ("avx512_bf16", "amx_bf16")) == cpu.SINGLE_ROW_BLOCKED
    monkeypatch.setattr("sequoia.runners.hf.cpu.cpu_facts", lambda: ("Xeon", ("avx512_bf16", "amx_tile", "amx_bf16")))
    assert cpu.single_row_kernel("cpu", torch.bfloat16) == cpu.SINGLE_ROW_BLOCKED
    assert cpu.single_row_kernel("cpu", torch.float32) == ""
    runner = wrap_model(tiny_model(0).to(torch.bfloat16), plain=False, blocked_weights=True)
    assert runner.single_row_kernel == cpu.SINGLE_ROW_BLOCKED
    assert all(m.one_row for m in onednn.blocked_copies(runner.model))
    assert wrap_model(tiny_model(0).to(torch.bfloat16), plain=False).single_row_kernel == ""   # no blocked copies


@needs_onednn_bf16
def test_one_row_through_the_blocked_copy_is_padded_and_matches_the_plain_product(monkeypatch):
    """single_row_kernel "onednn-blocked": one row multiplies from the blocked copy, padded; never a plain F.linear,
    and the same sums as the plain weight's product up to bf16 rounding of a differently ordered reduction."""
    layer = torch.nn.Linear(64, 48).to(torch.bfloat16)
    blocked, plain_row = onednn.BlockedLinear(layer, one_row=True), onednn.BlockedLinear(layer)
    x = torch.randn(1, 1, 64, dtype=torch.bfloat16)
    calls, linear = [], torch.nn.functional.linear
    want = linear(x, layer.weight, layer.bias)
    monkeypatch.setattr(onednn.F, "linear", lambda *a, **k: calls.append("plain") or linear(*a, **k))
    got = blocked(x)
    assert calls == [] and got.shape == (1, 1, 48)
    assert torch.allclose(got.float(), want.float(), atol=0.05)
    assert torch.equal(got[0], blocked(torch.cat([x[0], torch.zeros(1, 64, dtype=torch.bfloat16)]))[:1])  # a padded row
    plain_row(x)
    assert calls == ["plain"]


# ---------------------------------------------------------------------------- many-row forwards
@needs_onednn_bf16
def test_blocked_linears_equal_plain_ones_bit_for_bit(monkeypatch):
    """Two or more rows through oneDNN's blocked copy, one row through the plain weight: the same numbers."""
    monkeypatch.setattr(kernels, "multi_row_kernel", lambda device_type, dtype: kernels.MULTI_ROW_BLOCKED)
    model = tiny_model(0).to(torch.bfloat16)
    plain = tiny_model(0).to(torch.bfloat16)
    head = model.lm_head.weight
    assert kernels.block_weights(model) and not kernels.block_weights(model)     # installed once
    blocked = [m for m in model.modules() if isinstance(m, onednn.BlockedLinear)]
    assert len(blocked) == sum(isinstance(m, torch.nn.Linear) for m in plain.modules())
    assert model.lm_head.weight is head                                        # parameters kept (tied stays tied)
    assert model.state_dict().keys() == plain.state_dict().keys()
    ids = torch.tensor([[3, 5, 7, 2, 9]])
    with torch.no_grad():
        for rows in (ids, ids[:, :1], ids[:, :2]):
            assert torch.equal(model(input_ids=rows).logits, plain(input_ids=rows).logits)
        x = torch.randn(2, 3, model.lm_head.in_features, dtype=torch.bfloat16)   # any leading shape
        assert torch.equal(model.lm_head(x), plain.lm_head(x))


@needs_onednn_bf16
def test_a_blocked_head_takes_a_prefills_last_row_without_a_batched_matmul():
    """logits_to_keep=1 hands the head hidden[:, -1:, :], whose batch stride is the prompt's: a 3-D matmul
    of it copies the whole weight first (1.3 s on the embedded target), a 2-D one does not."""
    head = onednn.BlockedLinear(torch.nn.Linear(64, 256, bias=False).to(torch.bfloat16).requires_grad_(False))
    hidden = torch.randn(1, 9, 64, dtype=torch.bfloat16)
    last = hidden[:, -1:, :]
    with torch.profiler.profile() as prof:
        got = head(last)
    assert got.shape == (1, 1, 256) and torch.equal(got, torch.nn.functional.linear(last.clone(), head.weight))
    assert "aten::bmm" not in {e.key for e in prof.key_averages()}
    with torch.profiler.profile() as prof:   # what the 3-D view costs where nothing flattens it
        torch.nn.functional.linear(last, head.weight)
    assert "aten::bmm" in {e.key for e in prof.key_averages()}


@needs_onednn_bf16
def test_blocked_linears_run_while_a_one_token_forward_has_onednn_off(monkeypatch):
    """Concurrent decodes share the process's oneDNN flag; a blocked product does not depend on it."""
    layer = torch.nn.Linear(64, 48).to(torch.bfloat16)
    blocked = onednn.BlockedLinear(layer)
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    want = blocked(x)
    monkeypatch.setattr(torch.backends.mkldnn, "enabled", False)
    assert torch.equal(blocked(x), want)


def test_only_bf16_cpu_models_get_blocked_weights(monkeypatch):
    assert not kernels.block_weights(tiny_model(0))                           # fp32: plain weights
    with pytest.raises(ValueError, match="bf16 CPU"):
        onednn.BlockedLinear(torch.nn.Linear(4, 4))
    monkeypatch.setattr("sequoia.runners.hf.cpu.onednn_bf16", lambda: False)
    assert kernels.multi_row_kernel("cpu", torch.bfloat16) == ""              # an AVX2-only CPU: not measured
    assert not kernels.block_weights(tiny_model(0).to(torch.bfloat16))
    monkeypatch.setattr("sequoia.runners.hf.cpu.onednn_bf16", lambda: True)
    assert kernels.multi_row_kernel("cpu", torch.bfloat16) == kernels.MULTI_ROW_BLOCKED
    assert kernels.multi_row_kernel("cuda", torch.bfloat16) == ""
    assert kernels.multi_row_kernel("cpu", torch.float32) == ""
