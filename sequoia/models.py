"""Loading a draft/target pair: devices, dtypes, the int8 CPU draft, tokenizer checks.

``"embedded"`` names the offline default pair (Qwen2.5-Coder 0.5B draft, 1.5B
target, see :mod:`sequoia.embedded`); anything else is a Hugging Face hub id or
a local directory.  Nothing is loaded at import time, and transformers itself
is imported only when a model is.
"""

from __future__ import annotations

import gc
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from .config import MAX_PROMPT_TOKENS
from .embedded import EMBEDDED, ProgressFn, default_cache_dir, ensure_converted, is_converted

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

EMBEDDED_NAME = "embedded"

_DTYPES = {
    "fp32": torch.float32, "float32": torch.float32,
    "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
    "fp16": torch.float16, "float16": torch.float16,
}


class ModelLoadError(RuntimeError):
    """A model or tokenizer could not be loaded (unknown id, missing directory, no network)."""


@dataclass
class ModelPair:
    """A draft (q) and target (p) sharing one tokenizer, ready for the engine."""

    draft: PreTrainedModel
    target: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    draft_name: str
    target_name: str
    device: torch.device
    dtype: torch.dtype                  # the target's dtype
    draft_int8: bool                    # draft Linear layers are dynamic int8 (CPU); its activations are fp32
    eos_token_ids: tuple[int, ...]      # any of these ends a generation (Qwen: <|im_end|> and <|endoftext|>)
    draft_dtype: torch.dtype = field(default=torch.float32)  # dtype of the draft's activations and masks

    @property
    def vocab_size(self) -> int:
        """Tokens the tokenizer knows; embedding matrices may be padded beyond it."""
        return len(self.tokenizer)

    def encode_prompt(self, prompt: str, chat: bool = True) -> list[int]:
        """Token ids of ``prompt``, wrapped in the chat template when ``chat`` and the tokenizer has one."""
        return encode_prompt(self.tokenizer, prompt, chat)


# ------------------------------------------------------------------ devices and dtypes
def resolve_device(device: str | torch.device | None) -> torch.device:
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"unknown device {device!r}: use 'cpu', 'cuda' or 'cuda:N'") from exc
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} requested but CUDA is not available here")
    return dev


def resolve_dtype(dtype: str | torch.dtype, device: torch.device) -> torch.dtype:
    """``"auto"`` is bf16 everywhere: on these CPUs bf16 decoding is faster than fp32 (memory-bound)."""
    if isinstance(dtype, torch.dtype) and dtype in _DTYPES.values():
        return dtype
    if dtype == "auto":
        return torch.bfloat16
    if isinstance(dtype, str) and dtype.lower() in _DTYPES:
        return _DTYPES[dtype.lower()]
    raise ValueError(f"unknown dtype {dtype!r}: use 'auto', 'fp32', 'bf16' or 'fp16'")


# ------------------------------------------------------------------ loading
def load_model(name_or_path: str | Path, device: str | torch.device | None = None,
               dtype: str | torch.dtype = "auto") -> PreTrainedModel:
    """A causal LM from a hub id or local directory, in eval mode with gradients off."""
    from transformers import AutoModelForCausalLM

    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    _check_local(name_or_path)
    kwargs = {"device_map": str(dev)} if dev.type == "cuda" else {}
    try:
        model = AutoModelForCausalLM.from_pretrained(
            str(name_or_path), dtype=dt, trust_remote_code=False, attn_implementation="sdpa", **kwargs)
    except (OSError, ValueError, KeyError, ImportError) as exc:
        raise ModelLoadError(_load_message(name_or_path, exc)) from exc
    model = model.to(dev).eval()
    model.requires_grad_(False)
    return model


def load_tokenizer(name_or_path: str | Path) -> PreTrainedTokenizerBase:
    from transformers import AutoTokenizer

    _check_local(name_or_path)
    try:
        return AutoTokenizer.from_pretrained(str(name_or_path), trust_remote_code=False)
    except (OSError, ValueError, KeyError, ImportError) as exc:
        raise ModelLoadError(_load_message(name_or_path, exc, "tokenizer")) from exc


def _check_local(name_or_path: str | Path) -> None:
    text = str(name_or_path)
    looks_local = isinstance(name_or_path, Path) or text.startswith((".", "/", "~")) or text.count("/") > 1
    if looks_local and not Path(text).expanduser().is_dir():
        raise ModelLoadError(f"could not load model {text!r}: no such directory")


def _load_message(name: str | Path, exc: BaseException, what: str = "model") -> str:
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return (f"could not load {what} {str(name)!r}: {first[:300]}; "
            f"offline? use '{EMBEDDED_NAME}' for the bundled Qwen2.5-Coder pair")


def quantize_int8(model: PreTrainedModel) -> PreTrainedModel:
    """Dynamic per-output-channel int8 for every ``nn.Linear`` (lm_head included); CPU only.

    Weights become int8 with one fp32 scale per output row; activations are
    quantized on the fly, so the rest of the model must run in fp32.  On a
    memory-bound CPU decode step this is ~2.5x faster than bf16 (the untied
    lm_head alone is a fifth of the 0.5B draft).
    """
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    model = model.float()
    with warnings.catch_warnings():
        # torch 2.13 flags torch.ao quantization as deprecated in favour of torchao, which is not a dependency.
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        warnings.filterwarnings("ignore", category=UserWarning, message=".*deprecated.*")
        warnings.filterwarnings("ignore", category=FutureWarning)
        quantize_dynamic(model, {torch.nn.Linear: per_channel_dynamic_qconfig}, dtype=torch.qint8, inplace=True)
    return model.eval()


# ------------------------------------------------------------------ tokenizers
def check_tokenizers_match(draft_tok, target_tok, draft_model=None, target_model=None) -> None:
    """Raise ``ValueError`` unless draft and target share one vocabulary.

    Embedding matrices may be padded past the tokenizer (Qwen 0.5B and 7B pad
    differently); the engine compares only the shared columns, so only a model
    with *fewer* logits than the tokenizer has tokens is refused.
    """
    if draft_tok is not target_tok:
        dv, tv = draft_tok.get_vocab(), target_tok.get_vocab()
        if dv != tv:
            raise ValueError(_vocab_difference(dv, tv))
        for attr in ("bos_token", "eos_token", "unk_token"):
            d, t = getattr(draft_tok, attr, None), getattr(target_tok, attr, None)
            if d is not None and t is not None and str(d) != str(t):
                raise ValueError(f"draft and target tokenizers disagree on {attr}: {str(d)!r} vs {str(t)!r}; "
                                 "speculative decoding needs one shared tokenizer")
    n = len(target_tok)
    for role, model in (("draft", draft_model), ("target", target_model)):
        size = getattr(getattr(model, "config", None), "vocab_size", None)
        if size is not None and int(size) < n:
            raise ValueError(f"the {role} model has {size} output logits but the tokenizer has {n} tokens")


def _vocab_difference(dv: dict[str, int], tv: dict[str, int]) -> str:
    only_d, only_t = dv.keys() - tv.keys(), tv.keys() - dv.keys()
    moved = [t for t in dv.keys() & tv.keys() if dv[t] != tv[t]]
    parts = [f"draft has {len(dv)} tokens, target {len(tv)}"]
    if only_d:
        parts.append(f"{len(only_d)} only in the draft (e.g. {sorted(only_d)[0]!r})")
    if only_t:
        parts.append(f"{len(only_t)} only in the target (e.g. {sorted(only_t)[0]!r})")
    if moved:
        t = sorted(moved)[0]
        parts.append(f"{len(moved)} with different ids (e.g. {t!r}: {dv[t]} vs {tv[t]})")
    return ("draft and target tokenizers differ (" + "; ".join(parts) + "); speculative decoding needs "
            "a draft from the same model family, sharing the target's tokenizer")


def eos_token_ids(tokenizer, model=None) -> tuple[int, ...]:
    """End-of-sequence ids: the model's generation_config (Qwen lists several) plus the tokenizer's."""
    ids: list[int] = []
    gen = getattr(model, "generation_config", None)
    for value in (getattr(gen, "eos_token_id", None), getattr(tokenizer, "eos_token_id", None)):
        if isinstance(value, int):
            ids.append(value)
        elif value is not None:
            ids.extend(int(v) for v in value)
    return tuple(dict.fromkeys(ids))


def encode_prompt(tokenizer, prompt: str, chat: bool = True) -> list[int]:
    if not isinstance(prompt, str) or not prompt.strip():
        raise ValueError("the prompt is empty")
    if chat and getattr(tokenizer, "chat_template", None):
        # tokenize=False, then encode: apply_chat_template(tokenize=True) returns a BatchEncoding in 5.x.
        text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}],
                                             add_generation_prompt=True, tokenize=False)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    else:
        ids = tokenizer(prompt)["input_ids"]
    if len(ids) > MAX_PROMPT_TOKENS:
        raise ValueError(f"the prompt is {len(ids)} tokens long; the maximum is {MAX_PROMPT_TOKENS}")
    return list(ids)


# ------------------------------------------------------------------ the pair
def load_pair(draft: str = EMBEDDED_NAME, target: str = EMBEDDED_NAME, device: str | None = None,
              dtype: str = "auto", draft_int8: bool | None = None, cache_dir: str | Path | None = None,
              progress: ProgressFn | None = None) -> ModelPair:
    """Load and check a draft/target pair.

    ``draft_int8`` defaults to True on CPU and False on CUDA (where it is refused).
    ``cache_dir`` holds the converted embedded models; None means
    :func:`sequoia.embedded.default_cache_dir`.
    """
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    int8 = dev.type == "cpu" if draft_int8 is None else bool(draft_int8)
    if int8 and dev.type != "cpu":
        raise ValueError("the int8 draft runs on CPU only; pass draft_int8=False on CUDA")
    report = progress or (lambda frac, desc: None)
    paths = _resolve_paths(draft, target, cache_dir, report)
    report(0.85, "loading the tokenizer")
    tok = load_tokenizer(paths["target"])
    draft_tok = tok if paths["draft"] == paths["target"] else load_tokenizer(paths["draft"])
    report(0.88, "loading the target")
    target_model = load_model(paths["target"], dev, dt)
    report(0.95, "loading the draft")
    draft_model = load_model(paths["draft"], dev, torch.float32 if int8 else dt)
    if int8:
        draft_model = quantize_int8(draft_model)
        gc.collect()
    check_tokenizers_match(draft_tok, tok, draft_model, target_model)
    report(1.0, "models ready")
    return ModelPair(
        draft=draft_model, target=target_model, tokenizer=tok,
        draft_name=_display_name(draft, "draft") + (" (int8)" if int8 else ""),
        target_name=_display_name(target, "target"),
        device=dev, dtype=dt, draft_int8=int8, eos_token_ids=eos_token_ids(tok, target_model),
        draft_dtype=torch.float32 if int8 else dt,
    )


def _resolve_paths(draft: str, target: str, cache_dir, report: ProgressFn) -> dict[str, str | Path]:
    """Hub ids stay as they are; "embedded" becomes the converted directory (converting first if needed)."""
    names = {"draft": draft, "target": target}
    wanted = [role for role, name in names.items() if name == EMBEDDED_NAME]
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    todo = [role for role in wanted if not is_converted(EMBEDDED[role], cache)]
    paths: dict[str, str | Path] = dict(names)
    for role in wanted:
        k = todo.index(role) if role in todo else 0
        lo, hi = 0.85 * k / max(len(todo), 1), 0.85 * (k + 1) / max(len(todo), 1)
        paths[role] = ensure_converted(EMBEDDED[role], cache, lambda f, d, lo=lo, hi=hi: report(lo + (hi - lo) * f, d))
        gc.collect()  # conversion peaks at several GB; free it before the next model
    return paths


def _display_name(name: str, role: str) -> str:
    return EMBEDDED[role].name if name == EMBEDDED_NAME else str(name)
