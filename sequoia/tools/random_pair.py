"""Random-weight draft/target folders in Hugging Face format, at real shapes, from a seed; nothing downloaded.

A forward's cost does not depend on the weights' values, so a GPU machine that
cannot receive the real checkpoints (1.6 GB of GGUF against a 64 MiB transfer)
still runs the app and its checks at the real shapes with these.  Each folder
holds ``config.json``, ``generation_config.json``, ``model.safetensors`` (sharded
past 5 GB) and the tokenizer files, so ``SEQUOIA_DRAFT`` / ``SEQUOIA_TARGET``
load it as any local model folder.

Pairs (:data:`PAIRS`): "embedded" (Qwen2.5-Coder 0.5B -> 1.5B shapes), "7b"
(0.5B -> Qwen2.5-7B shapes), "tiny" (a few-MB stand-in the CPU tests write in
a second).  The tokenizer is copied from a folder holding one (default: the
converted embedded target in the app's cache, when present), or else a
byte-level tokenizer with Qwen's chat tokens is built here (259 tokens; random
weights decode to noise either way).  The same seed on the same device gives
the same bytes.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from ..runners.embedded import EMBEDDED, converted_dir, default_cache_dir, is_converted
from .gpucheck.models import CPU_DRAFT, CPU_TARGET, DRAFT_05B, TARGET_7B, TARGET_15B, Shape, random_model

#: The files a tokenizer folder is made of (those present are copied).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                   "vocab.json", "merges.txt", "added_tokens.json")
#: Qwen's chat turn markup (the byte-level tokenizer's chat template).
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


@dataclass(frozen=True)
class PairShapes:
    """The draft's and the target's shapes of one pair."""

    name: str
    draft: Shape
    target: Shape


#: Qwen2.5-Coder 0.5B and 1.5B tie their input and output embeddings; Qwen2.5-7B does not.
PAIRS = {
    "embedded": PairShapes("embedded", replace(DRAFT_05B, tied=True), replace(TARGET_15B, tied=True)),
    "7b": PairShapes("7b", replace(DRAFT_05B, tied=True), TARGET_7B),
    "tiny": PairShapes("tiny", CPU_DRAFT, CPU_TARGET),
}


def embedded_tokenizer_dir(cache_dir: Path | None = None) -> Path | None:
    """The converted embedded target's folder (it holds the pair's tokenizer), or None before conversion."""
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    spec = EMBEDDED["target"]
    return converted_dir(spec, cache) if is_converted(spec, cache) else None


def byte_tokenizer():
    """A byte-level BPE tokenizer with no merges (256 byte tokens) plus Qwen's three chat tokens."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    core = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens(list(SPECIALS))
    tok = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tok.chat_template = CHAT_TEMPLATE
    return tok


def write_tokenizer(folder: Path, source: Path | None) -> str:
    """The tokenizer files into ``folder``: copied from ``source``, else the byte-level one.  Says which."""
    if source is not None:
        copied = [f for f in TOKENIZER_FILES if (source / f).is_file()]
        if "tokenizer.json" not in copied:
            raise ValueError(f"tokenizer: {source} holds no tokenizer.json")
        for f in copied:
            shutil.copyfile(source / f, folder / f)
        return f"copied from {source}"
    byte_tokenizer().save_pretrained(folder)
    return "byte-level, 259 tokens (built here)"


def write_model(shape: Shape, folder: Path, seed: int, device: torch.device, dtype: torch.dtype,
                eos_ids: tuple[int, ...]) -> None:
    """Random weights at ``shape`` (built on ``device``, seeded) saved as safetensors with their config."""
    model = random_model(shape, device, dtype, seed=seed)
    model.config.dtype = dtype
    model.generation_config.eos_token_id = list(eos_ids) or None
    model.generation_config.bos_token_id = None
    model.save_pretrained(folder, safe_serialization=True, max_shard_size="5GB")
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _eos_ids(folder: Path) -> tuple[int, ...]:
    tok = AutoTokenizer.from_pretrained(str(folder))
    vocab = tok.get_vocab()
    return tuple(vocab[t] for t in ("<|im_end|>", "<|endoftext|>") if t in vocab)


def make_pair(out: Path, pair: str = "embedded", seed: int = 0, device: str | torch.device = "cpu",
              dtype: torch.dtype = torch.bfloat16, tokenizer: Path | None | str = "auto",
              log=lambda msg: None) -> dict:
    """Write ``out/draft`` and ``out/target`` for ``pair`` (a :data:`PAIRS` key); returns what was written.

    ``tokenizer``: a folder to copy from, "auto" (the embedded target's when converted, else byte-level; the
    byte-level one always for "tiny", whose vocabulary is 512) or None (byte-level).  The draft's weights come
    from ``seed``, the target's from ``seed + 1``.
    """
    if pair not in PAIRS:
        raise ValueError(f"pair: unknown {pair!r}; use one of {', '.join(PAIRS)}")
    shapes, out, dev = PAIRS[pair], Path(out), torch.device(device)
    if tokenizer == "auto":
        tokenizer = None if pair == "tiny" else embedded_tokenizer_dir()
    source = Path(tokenizer) if tokenizer is not None else None
    written = {"pair": pair, "seed": seed, "device": str(dev), "dtype": str(dtype).removeprefix("torch."),
               "models": {}}
    for k, (role, shape) in enumerate((("draft", shapes.draft), ("target", shapes.target))):
        folder = out / role
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
        written["tokenizer"] = write_tokenizer(folder, source)
        log(f"{role}: {shape.name}, {shape.params_b * 1e3:.1f}M parameters, seed {seed + k} -> {folder}")
        write_model(shape, folder, seed + k, dev, dtype, _eos_ids(folder))
        written["models"][role] = {"folder": str(folder), "shape": shape.name, "params_b": round(shape.params_b, 3)}
    (out / "random_pair.json").write_text(json.dumps(written, indent=1) + "\n")
    return written
