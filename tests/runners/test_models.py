"""Model plumbing: local loading, dtypes, the int8 draft, tokenizer checks, embedded part assembly.

Everything except the ``embedded`` tests runs on tiny random-weight models and
word-level tokenizers built here; nothing is downloaded.
"""

from __future__ import annotations

import hashlib
import os

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import DynamicCache, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from sequoia.runners import embedded
from sequoia.runners.embedded import EmbeddedModelError, Part
from sequoia.runners.hf import kernels
from sequoia.runners.hf import loading as L
from sequoia.runners.hf.attention import FEW_QUERY
from sequoia.runners.hf.convert import ensure_converted
from sequoia.runners.hf.kernels import default_draft_scheme
from sequoia.runners.hf.lean import head_rows, model_forward, plain_head_rows
from sequoia.runtime import models as M
from sequoia.runtime.measuring.fingerprint import cpu_facts, machine_fingerprint, onednn_bf16

# "<|endoftext|>" is there because transformers loads a tokenizer saved beside a qwen2 config as a
# Qwen2Tokenizer, which adds that pad token when it is missing.
WORDS = ["hello", "world", "def", "return", "x", "y", "user", "assistant", "+", "(", ")", ":", "<|endoftext|>"]
CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }} {{ m['content'] }} {% endfor %}"
                 "{% if add_generation_prompt %}assistant {% endif %}")


def word_tokenizer(words=WORDS, vocab_size: int = 1000, chat: bool = True) -> PreTrainedTokenizerFast:
    """A word-level tokenizer: [UNK], <eos>, then ``words``, padded with filler words to ``vocab_size``."""
    names = ["[UNK]", "<eos>", *words]
    names += [f"w{i}" for i in range(vocab_size - len(names))]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(names)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", eos_token="<eos>")
    if chat:
        fast.chat_template = CHAT_TEMPLATE
    return fast


def tiny_qwen(seed: int, vocab: int = 1000) -> Qwen2ForCausalLM:
    cfg = Qwen2Config(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      tie_word_embeddings=False, eos_token_id=[1, 0])
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(cfg).eval()


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory):
    """Two tiny models (draft, target) saved with the same word-level tokenizer."""
    root = tmp_path_factory.mktemp("tiny")
    dirs = {}
    for role, seed in (("draft", 1), ("target", 2)):
        d = root / role
        tiny_qwen(seed).save_pretrained(d)
        word_tokenizer().save_pretrained(d)
        dirs[role] = d
    return dirs


# ------------------------------------------------------------------ devices, dtypes, loading
def test_resolve_dtype_and_device():
    cpu = torch.device("cpu")
    assert M.resolve_dtype("auto", cpu) == torch.bfloat16
    assert M.resolve_dtype("fp32", cpu) == torch.float32
    assert M.resolve_dtype("BF16", cpu) == torch.bfloat16
    assert M.resolve_dtype("fp16", cpu) == torch.float16
    assert M.resolve_dtype(torch.float32, cpu) == torch.float32
    for bad in ("int4", "", "float64", None):
        with pytest.raises(ValueError, match="unknown dtype"):
            M.resolve_dtype(bad, cpu)
    assert M.resolve_device("cpu") == cpu
    assert M.resolve_device(None).type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ValueError, match="unknown device"):
        M.resolve_device("toaster")


@pytest.mark.parametrize("dtype, expected", [("fp32", torch.float32), ("bf16", torch.bfloat16)])
def test_load_model_from_local_dir(tiny_dirs, dtype, expected):
    model = L.load_model(tiny_dirs["target"], "cpu", dtype)
    assert model.dtype == expected and model.device.type == "cpu"
    assert not model.training
    assert not any(p.requires_grad for p in model.parameters())
    assert model.config._attn_implementation == "sdpa"


def test_runner_forward_gives_the_head_plain_strides_and_keeps_its_logits(tiny_dirs):
    """A prefill that keeps one row of logits would hand the head rows with a stale batch stride (torch's slow
    path on CPU); the runner's forward asks for them by index, so the head sees plain rows, the logits are those
    of the full forward, and the loaded model carries no hooks."""
    model = L.load_model(tiny_dirs["target"], "cpu", "fp32")
    head = model.get_output_embeddings()
    assert not head._forward_pre_hooks and not head._forward_hooks
    seen = []
    handle = head.register_forward_pre_hook(lambda mod, args: seen.append(args[0].stride()))
    ids = torch.arange(1, 12)[None]                                       # [1, 11]
    pos = torch.arange(11)[None]
    with torch.no_grad():
        full = model(input_ids=ids).logits[0, -1]
        last = model_forward(model, ids, pos, None, DynamicCache(config=model.config), keep=1)[0, -1]
    handle.remove()
    hidden = model.config.hidden_size
    assert seen[-1] == (hidden, hidden, 1)            # a count would give (11 * hidden, hidden, 1)
    torch.testing.assert_close(last, full)
    assert head_rows(0, 11) == 0 and head_rows(11, 11) == 11 and head_rows(2, 11).tolist() == [9, 10]
    seen.clear()
    with torch.no_grad(), plain_head_rows(model):          # code that calls the model with a count (generate)
        handle = head.register_forward_pre_hook(lambda mod, args: seen.append(args[0].stride()))   # runs after
        assert torch.equal(model(input_ids=ids, logits_to_keep=1).logits[0, -1], last)
        handle.remove()
    assert seen == [(hidden, hidden, 1)] and not head._forward_pre_hooks   # the span's hook is gone


def test_load_model_bad_dtype_and_missing_dir(tiny_dirs, tmp_path):
    with pytest.raises(ValueError, match="unknown dtype"):
        L.load_model(tiny_dirs["target"], "cpu", "int3")
    with pytest.raises(M.ModelLoadError, match="no such directory"):
        L.load_model(tmp_path / "nowhere", "cpu", "fp32")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(M.ModelLoadError, match=r"could not load model .*offline\? use 'embedded'"):
        L.load_model(empty, "cpu", "fp32")


def test_unknown_hub_id_offline_is_one_clear_error(monkeypatch):
    monkeypatch.setattr(L, "_hub_reachable", lambda timeout=3.0: False)
    with pytest.raises(M.ModelLoadError, match=r"could not load model 'nobody-here/no-such-model'.*'embedded'"):
        L.load_model("nobody-here/no-such-model", "cpu", "fp32")


def test_encode_prompt_chat_plain_and_errors(monkeypatch):
    tok = word_tokenizer()
    vocab = tok.get_vocab()
    chat = M.encode_prompt(tok, "hello world")
    assert chat == [vocab[w] for w in ("user", "hello", "world", "assistant")]
    assert M.encode_prompt(tok, "hello world", chat=False) == [vocab["hello"], vocab["world"]]
    assert M.encode_prompt(word_tokenizer(chat=False), "hello world") == [vocab["hello"], vocab["world"]]
    for bad in ("", "   \n\t"):
        with pytest.raises(ValueError, match="empty"):
            M.encode_prompt(tok, bad)
    monkeypatch.setattr(M, "MAX_PROMPT_TOKENS", 3)
    with pytest.raises(ValueError, match="4 tokens long; the maximum is 3"):
        M.encode_prompt(tok, "hello world")


def test_eos_token_ids_merge_generation_config_and_tokenizer():
    assert M.eos_token_ids(word_tokenizer(), tiny_qwen(0)) == (1, 0)
    assert M.eos_token_ids(word_tokenizer()) == (1,)


# ------------------------------------------------------------------ load_pair
def test_load_pair_from_local_dirs(tiny_dirs):
    pair = M.load_pair(str(tiny_dirs["draft"]), str(tiny_dirs["target"]), device="cpu")
    expected = default_draft_scheme("cpu", cpu_facts()[1])
    assert pair.draft_quant == expected and pair.dtype == torch.bfloat16 and pair.draft_dtype == torch.bfloat16
    assert kernels.describe(pair.draft.model) in (expected, "int4+int8") and f"({expected})" in pair.draft_name
    assert pair.target_quant == "none" and kernels.describe(pair.target.model) == "none"
    assert pair.vocab_size == 1000 and pair.eos_token_ids == (1, 0)
    assert pair.target.config._attn_implementation == pair.draft.config._attn_implementation == FEW_QUERY
    assert pair.encode_prompt("def x") == M.encode_prompt(pair.tokenizer, "def x")
    with pytest.raises(ValueError, match="empty"):
        pair.encode_prompt(" ")

    plain = M.load_pair(str(tiny_dirs["draft"]), str(tiny_dirs["target"]), device="cpu", dtype="fp32",
                        draft_int8=False)
    assert not plain.draft_int8 and plain.draft.model.dtype == plain.target.model.dtype == torch.float32
    assert plain.draft_quant == "none"
    int8 = M.load_pair(str(tiny_dirs["draft"]), str(tiny_dirs["target"]), device="cpu", draft_quant="int8",
                       target_quant="int8")
    assert int8.draft_int8 and kernels.describe(int8.draft.model) == kernels.describe(int8.target.model) == "int8"
    assert int8.target_name.endswith("(int8)")
    with pytest.raises(ValueError, match="contradicts"):
        M.load_pair(str(tiny_dirs["draft"]), str(tiny_dirs["target"]), device="cpu", draft_int8=True,
                    draft_quant="none")
    with pytest.raises(ValueError, match="bf16 only"):
        M.load_pair(str(tiny_dirs["draft"]), str(tiny_dirs["target"]), device="cpu", dtype="fp32",
                    target_quant="int4")
    with pytest.raises(ValueError, match="unknown dtype"):
        M.load_pair(str(tiny_dirs["draft"]), str(tiny_dirs["target"]), device="cpu", dtype="q4")


@pytest.mark.skipif(not onednn_bf16(), reason="oneDNN has no bf16 kernels on this CPU: nothing is blocked")
def test_blocked_weights_unless_switched_off(tiny_dirs):
    """bf16 CPU models get oneDNN-blocked copies where oneDNN has bf16 kernels, and the fingerprint says so."""
    dirs = (str(tiny_dirs["draft"]), str(tiny_dirs["target"]))
    pair = M.load_pair(*dirs, device="cpu", draft_quant="none")
    one = M.load_pair(*dirs, device="cpu", draft_quant="none", blocked_weights=False)
    assert any(isinstance(m, kernels.BlockedLinear) for m in pair.target.model.modules())
    assert not any(isinstance(m, kernels.BlockedLinear) for m in one.target.model.modules())
    assert machine_fingerprint(pair).multi_row_kernel == "onednn-blocked"
    assert machine_fingerprint(one).multi_row_kernel == ""
    ids = torch.tensor([[3, 5, 7, 9]])
    with torch.no_grad():   # the same numbers either way (same kernel family, same sums)
        assert torch.equal(pair.target.model(input_ids=ids).logits, one.target.model(input_ids=ids).logits)


def test_load_pair_refuses_mismatched_tokenizers(tiny_dirs, tmp_path):
    odd = tmp_path / "odd"
    tiny_qwen(4).save_pretrained(odd)
    word_tokenizer(words=list(reversed(WORDS))).save_pretrained(odd)
    with pytest.raises(ValueError, match="tokenizers differ"):
        M.load_pair(str(odd), str(tiny_dirs["target"]), device="cpu", draft_int8=False)


# ------------------------------------------------------------------ embedded: parts, cache
def _parts(tmp_path, chunks: list[bytes]) -> list[Part]:
    parts = []
    for i, data in enumerate(chunks, 1):
        path = tmp_path / f"part{i:02d}.bin"
        path.write_bytes(data)
        parts.append(Part(f"fake-part{i}", path, hashlib.sha256(data).hexdigest(), len(data)))
    return parts


def test_assemble_concatenates_and_checks(tmp_path):
    chunks = [b"alpha" * 1000, b"beta" * 777, b"gamma"]
    whole = b"".join(chunks)
    parts = _parts(tmp_path, chunks)
    seen = []
    out = embedded.assemble(parts, tmp_path / "out" / "model.gguf", hashlib.sha256(whole).hexdigest(),
                            len(whole), progress=lambda f, d: seen.append(f))
    assert out.read_bytes() == whole and seen[-1] == 1.0


@pytest.mark.parametrize("refuse_at", [None, 0, 2])
def test_assemble_copies_in_the_kernel_or_falls_back_to_writes(tmp_path, monkeypatch, refuse_at):
    """Chunks cross the parts' ends; the kernel's copy may be refused from the start or from a later part on
    (another file system): the file is the same concatenation either way."""
    monkeypatch.setattr(embedded, "_CHUNK", 1000)
    chunks = [bytes(range(256)) * 9, b"beta" * 777, b"gamma" * 3]
    whole = b"".join(chunks)
    calls, real = [], os.copy_file_range

    def copy_file_range(src, dst, count, offset_src=None, offset_dst=None):
        calls.append(count)
        if refuse_at is not None and len(calls) > refuse_at:
            raise OSError(18, "Invalid cross-device link")
        return real(src, dst, count, offset_src, offset_dst)

    monkeypatch.setattr(os, "copy_file_range", copy_file_range)
    out = embedded.assemble(_parts(tmp_path, chunks), tmp_path / "m.gguf", hashlib.sha256(whole).hexdigest(),
                            len(whole))
    assert out.read_bytes() == whole
    assert len(calls) == (refuse_at + 1 if refuse_at is not None else 3 + 4 + 1)


def test_assemble_refuses_a_wrong_sha_and_names_the_damaged_part(tmp_path):
    chunks = [b"a" * 100, b"b" * 100, b"c" * 100]
    expected = hashlib.sha256(b"".join(chunks)).hexdigest()
    parts = _parts(tmp_path, chunks)
    parts[1].path.write_bytes(b"B" * 100)  # same size, different bytes than its RECORD says
    dest = tmp_path / "model.gguf"
    with pytest.raises(EmbeddedModelError, match=r"sha256 .* expected .*refusing.*damaged: fake-part2"):
        embedded.assemble(parts, dest, expected, 300)
    assert not dest.exists() and not dest.with_name("model.gguf.partial").exists()
    # without RECORD hashes to compare, every package is named
    bare = [Part(p.package, p.path) for p in parts]
    with pytest.raises(EmbeddedModelError, match="reinstall the part packages: fake-part1, fake-part2, fake-part3"):
        embedded.assemble(bare, dest, expected, 300)


def test_assemble_refuses_a_wrong_size_or_missing_part(tmp_path):
    parts = _parts(tmp_path, [b"x" * 10, b"y" * 10])
    with pytest.raises(EmbeddedModelError, match="add up to 20 bytes, expected 21"):
        embedded.assemble(parts, tmp_path / "m.gguf", "0" * 64, 21)
    parts[0].path.unlink()
    with pytest.raises(EmbeddedModelError, match="fake-part1 is missing"):
        embedded.assemble(parts, tmp_path / "m.gguf", "0" * 64, 20)


def test_cache_dir_and_marker(tmp_path):
    assert embedded.default_cache_dir({"SEQUOIA_CACHE": str(tmp_path)}) == tmp_path
    assert embedded.default_cache_dir({}).name == "sequoia-studio"
    spec = embedded.DRAFT
    assert not embedded.is_converted(spec, tmp_path)
    d = embedded.converted_dir(spec, tmp_path)
    d.mkdir()
    (d / embedded.MARKER).write_text("f" * 64)  # a marker for other bytes does not count
    assert not embedded.is_converted(spec, tmp_path)
    (d / embedded.MARKER).write_text(spec.sha256 + "\n")
    assert embedded.is_converted(spec, tmp_path)


def test_ensure_converted_trusts_only_the_marker(tmp_path):
    spec = embedded.EmbeddedSpec("draft", "Fake-Model", ("sequoia-no-such-part-package",), "1.0", 1, "ab" * 32)
    with pytest.raises(EmbeddedModelError, match="sequoia-no-such-part-package"):
        ensure_converted(spec, tmp_path)  # no marker: it must assemble, and the parts are missing
    done = embedded.converted_dir(spec, tmp_path)
    done.mkdir()
    (done / embedded.MARKER).write_text(spec.sha256)
    assert ensure_converted(spec, tmp_path) == done  # marker present: nothing else is touched


def test_locate_parts_of_the_installed_packages():
    for spec in embedded.EMBEDDED.values():
        try:
            parts = embedded.locate_parts(spec)
        except EmbeddedModelError as exc:
            pytest.skip(f"embedded parts not installed: {exc}")
        assert [p.package for p in parts] == list(spec.packages)
        assert [p.path.name for p in parts] == [f"part{i:02d}.bin" for i in range(1, len(spec.packages) + 1)]
        assert sum(p.path.stat().st_size for p in parts) == spec.size


def test_locate_parts_names_a_missing_package():
    spec = embedded.EmbeddedSpec("draft", "Nope", ("sequoia-no-such-part-package",), "1.0", 1, "0" * 64)
    with pytest.raises(EmbeddedModelError, match=r"sequoia-no-such-part-package==1.0.*pip install -r requirements"):
        embedded.locate_parts(spec)


# ------------------------------------------------------------------ the real embedded pair
@pytest.mark.embedded
def test_embedded_pair_loads_and_agrees_on_code(embedded_pair_fp32):
    pair = embedded_pair_fp32  # conftest's session fixture: load_pair(dtype="fp32", draft_int8=True)
    assert pair.vocab_size == 151936 and pair.draft_int8
    assert set(pair.eos_token_ids) >= {151645, 151643}  # <|im_end|>, <|endoftext|>
    ids = pair.encode_prompt("Write a Python function that returns the sum of a list.")
    text = pair.tokenizer.decode(ids)
    assert text.startswith("<|im_start|>system") and text.endswith("<|im_start|>assistant\n")
    code = pair.encode_prompt("def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + ",
                              chat=False)
    with torch.no_grad():
        p = pair.target.model(torch.tensor([code])).logits[0].float()  # [L, V]
        q = pair.draft.model(torch.tensor([code])).logits[0].float()
    assert p[-1].argmax() == q[-1].argmax()  # both continue "fibonacci(n - 2)"
    assert pair.tokenizer.decode([int(p[-1].argmax())]).strip() == "fibonacci"
    agree = (p[4:].argmax(-1) == q[4:].argmax(-1)).float().mean()
    assert agree >= 0.6, f"draft/target greedy agreement {agree:.2f} on code"


def test_llamacpp_threads_are_the_callers(monkeypatch):
    """``load_pair(threads=)`` reaches every llama.cpp runner it loads: a bench timing with the process's CPU time
    runs one thread, and a second llama.cpp thread would add its time (and its spinning) to every step."""
    with pytest.raises(ValueError, match="threads must be a positive integer"):
        M.load_pair(backend="llamacpp", threads=0)
    pytest.importorskip("llama_cpp")
    from sequoia.runners import llamacpp

    seen = []

    class Stop(Exception):
        pass

    def fake_load(path, options=None, name=None):
        seen.append(options.n_threads)
        raise Stop

    monkeypatch.setattr(llamacpp, "load_llamacpp_runner", fake_load)
    with pytest.raises(Stop):
        M.load_pair("a.gguf", "b.gguf", backend="llamacpp", threads=1)
    with pytest.raises(Stop):
        M.load_pair("a.gguf", "embedded", backend="mixed", threads=1)
    assert seen == [1, 1]
