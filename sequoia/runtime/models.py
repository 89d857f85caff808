"""Loading a draft/target pair: devices, dtypes, the int8 CPU draft, tokenizer checks.

``"embedded"`` names the offline default pair (Qwen2.5-Coder 0.5B draft, 1.5B
target, see :mod:`sequoia.runners.embedded`); anything else is a Hugging Face hub id or
a local directory.  Nothing is loaded at import time.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import torch
from huggingface_hub import snapshot_download
from transformers import PreTrainedTokenizerBase

from ..core.config import MAX_PROMPT_TOKENS
from ..core.profiles.runtimes import BACKENDS  # noqa: F401  (the runtimes load_pair takes; callers import it from here too)
from ..core.trees.tree import Tree
from ..runners.base import Runner
from ..runners.embedded import EMBEDDED, ProgressFn, converted_dir, default_cache_dir, ensure_gguf, is_converted
from ..runners.hf.graphs.capture import warm_up_pair
from ..runners.hf.convert import ensure_converted, tokenizer_from_gguf
from ..runners.hf.kernels import check_scheme
from ..runners.hf.loading import (EMBEDDED_NAME, ModelLoadError, load_runner, load_tokenizer,  # noqa: F401
                                  resolve_device, resolve_draft_quant, resolve_dtype)
from ..runners.offload.checkpoint import Checkpoint
from ..runners.offload.runner import load_streamed_runner
from .lease import ModelLease

#: The weight type of the embedded draft on the "mixed" runtime: llama.cpp requantizes the shipped Q4_K_M once
#: (its one-token step on 2 Zen 4 cores: 12.5 ms, against 18.5 for Q4_K_M and 24 for torch's int4 draft).
MIXED_DRAFT_TYPE = "Q4_0"


@dataclass
class ModelPair:
    """A draft (q) and target (p) runner sharing one tokenizer, ready for the engine.

    The tokenizer lives here, at the edge: runners and the engine see token ids only.
    """

    draft: Runner
    target: Runner
    tokenizer: PreTrainedTokenizerBase
    draft_name: str
    target_name: str
    device: torch.device
    dtype: torch.dtype                  # the target's activations (float32 for a GGUF target)
    draft_int8: bool                    # the draft's Linear layers hold int8 weights (draft_quant == "int8")
    eos_token_ids: tuple[int, ...]      # any of these ends a generation (Qwen: <|im_end|> and <|endoftext|>)
    draft_dtype: torch.dtype = field(default=torch.float32)  # the draft's activations (and its masks)
    draft_quant: str = "none"           # weight-only quantization of the draft: "none" | "int8" | "int4"
    target_quant: str = "none"          # of the target (every baseline runs this same loaded target)
    backend: str = "hf"                 # the target's runtime ("hf" | "llamacpp")
    target_streamed: bool = False       # the target's layers stream from host memory (runners/offload)
    # The one owner of model work on the pair (sequoia.runtime.lease): requests' generations (the engine), the
    # background profiler and lazy graph captures run on different threads over the same runners.
    lock: ModelLease = field(default_factory=ModelLease, repr=False, compare=False)

    @property
    def vocab_size(self) -> int:
        """Tokens the tokenizer knows; embedding matrices may be padded beyond it."""
        return len(self.tokenizer)

    def encode_prompt(self, prompt: str, chat: bool = True) -> list[int]:
        """Token ids of ``prompt``, wrapped in the chat template when ``chat`` and the tokenizer has one."""
        return encode_prompt(self.tokenizer, prompt, chat)


# ------------------------------------------------------------------ tokenizers
def check_tokenizers_match(draft_tok, target_tok, draft_model: Runner | None = None,
                           target_model: Runner | None = None) -> None:
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
        size = getattr(model, "vocab_size", None)
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


class PromptTooLong(ValueError):
    """A prompt of more tokens than any request may hold; ``n_tokens`` lets a caller name its own, lower cap."""

    def __init__(self, n_tokens: int) -> None:
        super().__init__(f"the prompt is {n_tokens} tokens long; the maximum is {MAX_PROMPT_TOKENS}")
        self.n_tokens = n_tokens


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
        raise PromptTooLong(len(ids))
    return list(ids)


# ------------------------------------------------------------------ the pair
def load_pair(draft: str = EMBEDDED_NAME, target: str = EMBEDDED_NAME, device: str | None = None,
              dtype: str = "auto", draft_int8: bool | None = None, cache_dir: str | Path | None = None,
              progress: ProgressFn | None = None, draft_quant: str | None = None,
              target_quant: str = "none", blocked_weights: bool = True, plain: bool = False,
              backend: str = "hf", graphs: bool | None = None, threads: int | None = None,
              warm_trees: Sequence[Tree] = (), offload: bool | None = None,
              compile: bool | None = None) -> ModelPair:
    """Load and check a draft/target pair of Hugging Face runners.

    ``draft_quant`` ("none" | "int8" | "int4", see :mod:`sequoia.runners.hf.kernels`) defaults to the
    fastest draft measured for this kind of machine (:func:`~sequoia.runners.hf.kernels.default_draft_scheme`);
    ``draft_int8`` True / False is the older spelling of "int8" / "none".  ``target_quant`` quantizes
    the target the same way (off by default: verification of many tokens is dearer through the int
    kernels).  Quantized weights run on CPU only, with bf16 activations.  ``cache_dir`` holds the
    converted embedded models; None means :func:`sequoia.runners.embedded.default_cache_dir`.
    ``blocked_weights`` gives bf16 CPU models oneDNN-blocked weight copies for many-row products where
    oneDNN has bf16 kernels (:func:`~sequoia.runners.hf.kernels.block_weights`: verification 0.6-0.9x the
    cost, for a second copy of the weights in memory); False keeps one copy.  ``plain`` runs both models
    through their own forward with no CPU kernel choice (what a GPU runs; the draft unquantized).
    ``graphs`` (CUDA only; None: yes) runs both models on the graph runner (a slot cache and one CUDA graph
    per forward size, :mod:`sequoia.runners.hf.graphs.graph_runner`); False keeps the eager runner (ZeroGPU).
    ``threads`` is the CPU threads of the llama.cpp runners (None: every core); torch's own are the caller's
    ``torch.set_num_threads``.  A bench timing with the process's CPU time runs both on one thread: a second
    llama.cpp thread would add its time (and its spinning while torch runs) to every step's.
    ``warm_trees``: static trees whose whole-draft graphs the graph runner captures at load, beside every
    forward shape (the trees a server's defaults draft), so that no first request pays their capture.
    ``offload`` (backend "offload" says True) streams the target's layers from host memory
    (:mod:`sequoia.runners.offload`); None: only on CUDA where its weights exceed the device's free memory.
    ``compile`` (graph runner only): the draft's forward compiled before capture; None: wherever compilation is
    available (:func:`~sequoia.runners.hf.loading.compile_plan`), False: never, True: required.
    """
    if backend == "offload":
        backend, offload = "hf", True
    if threads is not None and (not isinstance(threads, int) or threads < 1):
        raise ValueError(f"threads must be a positive integer or None, got {threads!r}")
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}: use one of {', '.join(BACKENDS)}")
    if backend == "llamacpp":
        return _load_llamacpp_pair(draft, target, cache_dir, progress, threads)
    if backend == "mixed":
        return _load_mixed_pair(draft, target, device, dtype, target_quant, cache_dir, progress, blocked_weights, plain,
                                threads)
    return _load_hf_pair(draft, target, device, dtype, draft_int8, cache_dir, progress, draft_quant, target_quant,
                         blocked_weights, plain, graphs=graphs, warm_trees=warm_trees, offload=offload,
                         compile=compile)


def _load_hf_pair(draft, target, device, dtype, draft_int8, cache_dir, progress, draft_quant, target_quant,
                  blocked_weights, plain, gguf_draft: Runner | None = None, graphs: bool | None = None,
                  warm_trees: Sequence[Tree] = (), offload: bool | None = None,
                  compile: bool | None = None) -> ModelPair:
    """:func:`load_pair` on the Hugging Face runtime; ``gguf_draft``: a loaded draft on llama.cpp to pair the
    target with instead (``draft`` is then only its path, and no Hugging Face draft is loaded)."""
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    dq = "none" if plain and draft_quant is None and draft_int8 is None else \
        resolve_draft_quant(dev, draft_int8, draft_quant)
    tq = check_scheme(target_quant)
    if tq != "none" and (dev.type != "cpu" or dt != torch.bfloat16):
        raise ValueError("a quantized target runs on CPU in bf16 only (dtype='bf16')")
    report = progress or (lambda frac, desc: None)
    paths = _resolve_paths(draft, target, cache_dir, report)
    report(0.85, "loading the tokenizer")
    tok = load_tokenizer(paths["target"])
    same = gguf_draft is not None or paths["draft"] == paths["target"] or \
        _same_tokenizer_files(paths["draft"], paths["target"])
    draft_tok = tok if same else load_tokenizer(paths["draft"])
    names = {"draft": _display_name(draft, "draft") + (f" ({dq})" if dq != "none" else ""),
             "target": _display_name(target, "target") + (f" ({tq})" if tq != "none" else "")}
    report(0.88, "loading the target")
    compiled = Path(cache_dir) if cache_dir is not None else default_cache_dir()   # the draft's compile artifacts
    streamed = streams_target(offload, paths["target"], dev, dt)
    if streamed and tq != "none":
        raise ValueError("a streamed target runs unquantized (target_quant='none')")
    target_runner = load_streamed_runner(local_folder(paths["target"]), names["target"], dev, dt) if streamed else \
        load_runner(paths["target"], names["target"], dev, dt, tq, "target", blocked_weights, plain, graphs,
                    cache_dir=compiled)
    if gguf_draft is not None:
        dq, draft_dt, draft_runner, names["draft"] = "none", torch.float32, gguf_draft, gguf_draft.name
    else:
        report(0.95, "loading the draft")
        # The int kernels are fast with bf16 activations only, so a quantized draft runs in bf16 even beside an
        # fp32 target: the draft's precision affects speed and acceptance, never the output distribution.
        draft_dt = torch.bfloat16 if dq != "none" else dt
        draft_runner = load_runner(paths["draft"], names["draft"], dev, draft_dt, dq, "draft", blocked_weights,
                                   plain, graphs, compile=compile, cache_dir=compiled)
    check_tokenizers_match(draft_tok, tok, draft_runner, target_runner)
    lock = ModelLease()   # the pair's (ModelPair.lock): its captures are model work like any other
    with lock:
        warm_up_pair(draft_runner, target_runner, lambda f, d: report(0.96 + 0.04 * f, d), trees=warm_trees)
    report(1.0, "models ready")
    return ModelPair(
        draft=draft_runner, target=target_runner, tokenizer=tok,
        draft_name=names["draft"], target_name=names["target"],
        device=dev, dtype=dt, draft_int8=dq == "int8",
        eos_token_ids=eos_token_ids(tok, target_runner.model),
        draft_dtype=draft_dt, draft_quant=dq, target_quant=tq, backend="hf" if gguf_draft is None else "mixed",
        target_streamed=streamed,
        lock=lock,
    )


def streams_target(offload: bool | None, target: str | Path, device: torch.device, dtype: torch.dtype) -> bool:
    """Whether the target streams from host memory: as asked, else (None) on CUDA only, where its weights at
    ``dtype`` exceed the device's free memory (a target that does not fit cannot be loaded otherwise)."""
    if offload is not None:
        return bool(offload)
    if device.type != "cuda":
        return False
    free, _ = torch.cuda.mem_get_info(device)
    return target_bytes(local_folder(target), dtype) > free


def target_bytes(folder: Path, dtype: torch.dtype) -> int:
    """The checkpoint's floating-point weights at ``dtype`` (what loading it resident would take)."""
    entries = Checkpoint(folder).entries.values()
    return sum(e.nbytes // e.dtype.itemsize * (dtype.itemsize if e.dtype.is_floating_point else e.dtype.itemsize)
               for e in entries)


def local_folder(name: str | Path) -> Path:
    """A model's folder on disk: a local directory as it is, a hub id's snapshot (downloaded if not cached)."""
    if Path(name).expanduser().is_dir():
        return Path(name).expanduser()
    return Path(snapshot_download(str(name), allow_patterns=["*.json", "*.safetensors", "*.txt", "*.jinja"]))


def _load_llamacpp_pair(draft: str, target: str, cache_dir, progress: ProgressFn | None,
                        threads: int | None = None) -> ModelPair:
    """Two GGUF files on llama.cpp: the embedded pair as shipped (no conversion) or two local ``.gguf`` paths.

    The tokenizer is the Hugging Face one read from the target's GGUF (cached beside it after the first
    time), so texts, chat templates and stop strings are handled as on the Hugging Face runtime.
    """
    # Imported here: llama-cpp-python is a native build that the rest of the library does not need.
    from ..runners import llamacpp

    report = progress or (lambda frac, desc: None)
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    options = llamacpp.LlamaCppOptions(n_threads=threads)
    if (draft == EMBEDDED_NAME) != (target == EMBEDDED_NAME):
        raise ValueError("on the llamacpp backend give both models as .gguf paths, or neither (the embedded pair)")
    embedded = target == EMBEDDED_NAME
    gguf = ensure_gguf(EMBEDDED["target"], cache, lambda f, d: report(0.35 * f, d)) if embedded else Path(target)
    converted = converted_dir(EMBEDDED["target"], cache) if embedded and is_converted(EMBEDDED["target"], cache) \
        else None
    # The tokenizer is read from the target's GGUF while llama.cpp loads the models: on a busy 2-vCPU Xeon the
    # two took 5 s each one after the other (a fresh cache, load average 10), and two threads get more of
    # the shared cores than one.
    with ThreadPoolExecutor(1, thread_name_prefix="sequoia-tokenizer") as pool:
        reading = pool.submit(gguf_tokenizer, gguf, cache, converted)
        if embedded:
            runners = llamacpp.load_embedded_llamacpp(cache, options, progress=lambda f, d: report(0.7 * f, d))
        else:
            runners = {role: llamacpp.load_llamacpp_runner(path, options)
                       for role, path in (("draft", draft), ("target", target))}
        report(0.75, "loading the tokenizer")
        tok = reading.result()
    check_tokenizers_match(tok, tok, runners["draft"], runners["target"])
    if runners["draft"].vocab_size != runners["target"].vocab_size:
        raise ValueError(f"draft and target GGUF vocabularies differ ({runners['draft'].vocab_size} vs "
                         f"{runners['target'].vocab_size} tokens); speculative decoding needs one shared vocabulary")
    report(1.0, "models ready")
    eos = tuple(dict.fromkeys(eos_token_ids(tok) + tuple(runners["target"].end_tokens)))
    return ModelPair(draft=runners["draft"], target=runners["target"], tokenizer=tok,
                     draft_name=runners["draft"].name, target_name=runners["target"].name,
                     device=torch.device("cpu"), dtype=torch.float32, draft_int8=False, eos_token_ids=eos,
                     draft_dtype=torch.float32, backend="llamacpp")


def _load_mixed_pair(draft: str, target: str, device, dtype, target_quant, cache_dir, progress, blocked_weights,
                     plain, threads: int | None = None) -> ModelPair:
    """The Hugging Face target (as :func:`load_pair` loads it) with the draft on llama.cpp: the embedded draft
    requantized to :data:`MIXED_DRAFT_TYPE`, or a ``.gguf`` path.  The two runtimes share nothing but token ids,
    so any draft GGUF whose vocabulary is the target tokenizer's will do."""
    # Imported here: llama-cpp-python is a native build that the rest of the library does not need.
    from ..runners.llamacpp import LlamaCppOptions, load_llamacpp_runner, requantize

    report = progress or (lambda frac, desc: None)
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    if draft == EMBEDDED_NAME:
        spec = EMBEDDED["draft"]
        shipped = ensure_gguf(spec, cache, lambda f, d: report(0.15 * f, d))
        report(0.15, f"requantizing the draft to {MIXED_DRAFT_TYPE} with llama.cpp (once)")
        gguf, name = requantize(shipped, MIXED_DRAFT_TYPE), f"{spec.name} ({MIXED_DRAFT_TYPE}, llama.cpp)"
    elif str(draft).endswith(".gguf"):
        gguf, name = Path(draft), None
    else:
        raise ValueError(f"on the mixed backend the draft runs on llama.cpp: give it as a .gguf path, not {draft!r}")
    draft_runner = load_llamacpp_runner(gguf, LlamaCppOptions(n_threads=threads), name=name)
    try:
        return _load_hf_pair(str(gguf), target, device, dtype, None, cache, lambda f, d: report(0.2 + 0.8 * f, d),
                             None, target_quant, blocked_weights, plain, gguf_draft=draft_runner)
    except BaseException:
        draft_runner.close()
        raise


def gguf_tokenizer(gguf: Path, cache: Path, converted: Path | None = None) -> PreTrainedTokenizerBase:
    """The Hugging Face tokenizer of a GGUF file: from ``converted`` (a directory holding it) when given, else
    read from the GGUF once (:func:`~sequoia.runners.hf.convert.tokenizer_from_gguf`, seconds) and kept in
    ``cache`` under the file's name."""
    if converted is not None:
        return load_tokenizer(converted)
    keep = cache / f"{gguf.stem}.tokenizer"
    if (keep / "tokenizer_config.json").is_file():
        return load_tokenizer(keep)
    tok = tokenizer_from_gguf(gguf)
    tmp = keep.with_name(keep.name + f".tmp-{os.getpid()}")
    tok.save_pretrained(tmp)
    os.replace(tmp, keep)
    return tok


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
