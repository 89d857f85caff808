"""Loading a draft/target pair: devices, dtypes, the int8 CPU draft, tokenizer checks.

``"embedded"`` names the offline default pair (Qwen2.5-Coder 0.5B draft, 1.5B
target, see :mod:`sequoia.runners.embedded`); anything else is a Hugging Face hub id or
a local directory.  Nothing is loaded at import time.
"""

from __future__ import annotations

import gc
import socket
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import torch
from huggingface_hub import constants
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from ..core.config import MAX_PROMPT_TOKENS
from .attention import use_few_query_attention
from ..runners.embedded import EMBEDDED, ProgressFn, default_cache_dir, ensure_converted, is_converted
from .fingerprint import cpu_facts
from .kernels import block_weights, check_scheme, default_draft_scheme, quantize_weights, route_single_rows

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
    draft_int8: bool                    # the draft's Linear layers hold int8 weights (draft_quant == "int8")
    eos_token_ids: tuple[int, ...]      # any of these ends a generation (Qwen: <|im_end|> and <|endoftext|>)
    draft_dtype: torch.dtype = field(default=torch.float32)  # the draft's activations (and its masks)
    draft_quant: str = "none"           # weight-only quantization of the draft: "none" | "int8" | "int4"
    target_quant: str = "none"          # of the target (every baseline runs this same loaded target)

    @property
    def vocab_size(self) -> int:
        """Tokens the tokenizer knows; embedding matrices may be padded beyond it."""
        return len(self.tokenizer)

    def encode_prompt(self, prompt: str, chat: bool = True) -> list[int]:
        """Token ids of ``prompt``, wrapped in the chat template when ``chat`` and the tokenizer has one."""
        return encode_prompt(self.tokenizer, prompt, chat)


def shared_vocab(pair) -> int:
    """Logit columns both models share (embedding matrices are often padded beyond the tokenizer)."""
    return min(int(m.config.vocab_size) for m in (pair.draft, pair.target))


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
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    kwargs = {"device_map": str(dev)} if dev.type == "cuda" else {}
    model = _from_pretrained(AutoModelForCausalLM, name_or_path, "model", dtype=dt,
                             attn_implementation="sdpa", **kwargs)
    if dev.type == "cpu":  # on CUDA device_map already placed it; moving a dispatched model can raise
        model = model.to(dev)
    model.eval().requires_grad_(False)
    plain_head_rows(model)
    return model


def plain_head_rows(model) -> None:
    """Give the output head its input rows with plain strides; a no-op for heads that are not ``nn.Linear``.

    Why: ``logits_to_keep=1`` (a prefill that wants one row of logits) hands the
    head ``hidden[:, -1:, :]``, a [1, 1, H] view whose batch stride is still
    L * H.  torch (2.13, CPU) multiplies such a 3-D input through a batched
    matmul that first copies the whole transposed weight: on the embedded target
    (1536 x 151936 bf16) 1.3 s instead of 26 ms, on every prompt, whatever its
    length (measured on a 2-vCPU AVX-512-BF16 EPYC; the same rows as a 2-D view
    take the fast path).  ``Tensor.contiguous`` and ``clone`` keep the odd stride,
    a 2-D view does not.  Hugging Face ``generate`` prefills the same way, so
    every method run on the loaded model, baselines included, gets the fix.
    """
    head = model.get_output_embeddings()
    if isinstance(head, torch.nn.Linear):
        head.register_forward_pre_hook(_plain_rows)


def _plain_rows(module, args):
    x = args[0]
    return (x.reshape(-1, x.shape[-1]).view(x.shape),) + tuple(args[1:])   # [..., H], standard strides


def load_tokenizer(name_or_path: str | Path) -> PreTrainedTokenizerBase:
    return _from_pretrained(AutoTokenizer, name_or_path, "tokenizer")


def _from_pretrained(auto_class, name_or_path: str | Path, what: str, **kwargs):
    """Local directory, else the local hub cache, else the hub; one short error for every failure.

    Trying the cache first and probing the hub host once keeps an offline
    machine from spending half a minute in the hub client's retries.
    """
    name = str(name_or_path)
    local = Path(name).expanduser()
    looks_local = isinstance(name_or_path, Path) or name.startswith((".", "/", "~")) or name.count("/") > 1
    if looks_local and not local.is_dir():
        raise ModelLoadError(f"could not load {what} {name!r}: no such directory")

    def load(**extra):
        return auto_class.from_pretrained(str(local) if local.is_dir() else name, trust_remote_code=False,
                                          **kwargs, **extra)

    errors = (OSError, ValueError, KeyError, ImportError)
    if local.is_dir():
        try:
            return load()
        except errors as exc:
            raise ModelLoadError(_load_message(name, exc, what)) from exc
    try:
        return load(local_files_only=True)
    except errors:
        pass  # not cached: ask the hub
    if not _hub_reachable():
        raise ModelLoadError(f"could not load {what} {name!r}: it is not in the local Hugging Face cache and "
                             f"the hub cannot be reached; offline? use '{EMBEDDED_NAME}' for the bundled pair")
    try:
        return load()
    except errors as exc:
        raise ModelLoadError(_load_message(name, exc, what)) from exc


def _hub_reachable(timeout: float = 3.0) -> bool:
    if constants.HF_HUB_OFFLINE:
        return False
    url = urlsplit(constants.ENDPOINT)
    try:
        socket.create_connection((url.hostname, url.port or 443), timeout=timeout).close()
    except OSError:
        return False
    return True


def _load_message(name: str, exc: BaseException, what: str) -> str:
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return (f"could not load {what} {name!r}: {first[:300]}; "
            f"offline? use '{EMBEDDED_NAME}' for the bundled Qwen2.5-Coder pair")


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
              progress: ProgressFn | None = None, draft_quant: str | None = None,
              target_quant: str = "none", blocked_weights: bool = True) -> ModelPair:
    """Load and check a draft/target pair.

    ``draft_quant`` ("none" | "int8" | "int4", see :mod:`sequoia.runtime.kernels`) defaults to the
    fastest draft measured for this kind of machine (:func:`~sequoia.runtime.kernels.default_draft_scheme`);
    ``draft_int8`` True / False is the older spelling of "int8" / "none".  ``target_quant`` quantizes
    the target the same way (off by default: verification of many tokens is dearer through the int
    kernels).  Quantized weights run on CPU only, with bf16 activations.  ``cache_dir`` holds the
    converted embedded models; None means :func:`sequoia.runners.embedded.default_cache_dir`.
    ``blocked_weights`` gives bf16 CPU models oneDNN-blocked weight copies for many-row products where
    oneDNN has bf16 kernels (:func:`~sequoia.runtime.kernels.block_weights`: verification 0.6-0.9x the
    cost, for a second copy of the weights in memory); False keeps one copy.
    """
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    dq = resolve_draft_quant(dev, draft_int8, draft_quant)
    tq = check_scheme(target_quant)
    if tq != "none" and (dev.type != "cpu" or dt != torch.bfloat16):
        raise ValueError("a quantized target runs on CPU in bf16 only (dtype='bf16')")
    report = progress or (lambda frac, desc: None)
    paths = _resolve_paths(draft, target, cache_dir, report)
    report(0.85, "loading the tokenizer")
    tok = load_tokenizer(paths["target"])
    same = paths["draft"] == paths["target"] or _same_tokenizer_files(paths["draft"], paths["target"])
    draft_tok = tok if same else load_tokenizer(paths["draft"])
    report(0.88, "loading the target")
    target_model = quantize_weights(load_model(paths["target"], dev, dt), tq, dt)
    report(0.95, "loading the draft")
    # The int kernels are fast with bf16 activations only, so a quantized draft runs in bf16 even beside an
    # fp32 target: the draft's precision affects speed and acceptance, never the output distribution.
    draft_dt = torch.bfloat16 if dq != "none" else dt
    draft_model = quantize_weights(load_model(paths["draft"], dev, draft_dt), dq, draft_dt)
    check_tokenizers_match(draft_tok, tok, draft_model, target_model)
    for model in (target_model, draft_model):   # faster CPU kernels for few and many rows (kernels.py, attention.py)
        route_single_rows(model)
        if blocked_weights:
            block_weights(model)
        use_few_query_attention(model)
    report(1.0, "models ready")
    return ModelPair(
        draft=draft_model, target=target_model, tokenizer=tok,
        draft_name=_display_name(draft, "draft") + (f" ({dq})" if dq != "none" else ""),
        target_name=_display_name(target, "target") + (f" ({tq})" if tq != "none" else ""),
        device=dev, dtype=dt, draft_int8=dq == "int8", eos_token_ids=eos_token_ids(tok, target_model),
        draft_dtype=draft_dt, draft_quant=dq, target_quant=tq,
    )


def resolve_draft_quant(device: torch.device, draft_int8: bool | None, draft_quant: str | None) -> str:
    """The draft's weight quantization from the two ways of asking for it (see :func:`load_pair`)."""
    if draft_quant is not None:
        dq = check_scheme(draft_quant)
        if draft_int8 is not None and draft_int8 != (dq == "int8"):
            raise ValueError(f"draft_int8={draft_int8} contradicts draft_quant={draft_quant!r}")
    elif draft_int8 is not None:
        dq = "int8" if draft_int8 else "none"
    else:
        dq = default_draft_scheme(device.type, cpu_facts()[1])
    if dq != "none" and device.type != "cpu":
        raise ValueError(f"the {dq} draft runs on CPU only; pass draft_quant='none' on CUDA")
    return dq


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


def _same_tokenizer_files(a: str | Path, b: str | Path) -> bool:
    """Two local directories whose tokenizer files are byte-identical (the embedded pair's are)."""
    files = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
    da, db = Path(a), Path(b)
    if not ((da / files[0]).is_file() and (db / files[0]).is_file()):
        return False

    def read(d: Path, f: str) -> bytes | None:
        return (d / f).read_bytes() if (d / f).is_file() else None

    return all(read(da, f) == read(db, f) for f in files)


def _display_name(name: str, role: str) -> str:
    return EMBEDDED[role].name if name == EMBEDDED_NAME else str(name)
