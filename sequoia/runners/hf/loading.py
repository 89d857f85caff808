"""Loading a transformers model as an :class:`~sequoia.runners.hf.runner.HFRunner`: device, dtype, kernels.

Every CPU speed choice is made here, once, and kept on the runner (never as a flag
on the model read back elsewhere): weight-only int8/int4 linears
(:mod:`~sequoia.runners.hf.kernels`), oneDNN-blocked copies for many-row products,
few-query attention, the lean draft forward and the one-row kernel.  ``plain=True``
makes none of them: the model's own forward with a tree mask, what a GPU runs.
"""

from __future__ import annotations

import socket
from pathlib import Path
from urllib.parse import urlsplit

import torch
from huggingface_hub import constants
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from ..base import RunnerInfo
from .attention import use_few_query_attention
from .cpu import MULTI_ROW_BLOCKED, SINGLE_ROW_BLOCKED, cpu_facts, single_row_kernel
from .kernels import block_weights, check_scheme, default_draft_scheme, describe, quantize_weights
from .graphs.compile_cache import CompilePlan
from .graphs.graph_runner import GraphRunner
from .lean import draft_forward, model_forward
from .runner import HFRunner

EMBEDDED_NAME = "embedded"
GRAPHS = "cuda-graphs"   # the kernel facts of a graph runner (its costs are not the eager runner's)

_DTYPES = {
    "fp32": torch.float32, "float32": torch.float32,
    "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
    "fp16": torch.float16, "float16": torch.float16,
}
DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


class ModelLoadError(RuntimeError):
    """A model or tokenizer could not be loaded (unknown id, missing directory, no network)."""


def load_runner(name_or_path: str | Path, display: str, device: torch.device, dtype: torch.dtype,
                quant: str = "none", role: str = "target", blocked_weights: bool = True,
                plain: bool = False, graphs: bool | None = None, compile: bool | None = None,
                cache_dir: str | Path | None = None) -> HFRunner | GraphRunner:
    """A model as a runner.  ``role`` "draft" takes the lean forward where the model allows it; ``plain``
    (forced on CUDA) keeps the model's own forward and torch's own kernels; ``graphs`` (default: on CUDA)
    runs it on :class:`~sequoia.runners.hf.graphs.graph_runner.GraphRunner` (static cache, CUDA graphs);
    ``compile`` and ``cache_dir`` as in :func:`wrap_model`."""
    if (plain or device.type != "cpu") and quant != "none":
        raise ValueError(f"a {quant} model needs the CPU kernels; plain (GPU-path) runners take quant='none'")
    model = quantize_weights(load_model(name_or_path, device, dtype), check_scheme(quant), dtype)
    return wrap_model(model, display, role, plain, quant, blocked_weights, graphs, compile, cache_dir)


def wrap_model(model, name: str = "", role: str = "target", plain: bool = True, quant: str = "none",
               blocked_weights: bool = False, graphs: bool | None = None, compile: bool | None = None,
               cache_dir: str | Path | None = None) -> HFRunner | GraphRunner:
    """A runner over a model already in memory.  ``plain`` (the default here, and always off the CPU): the
    model's own forward with a tree mask and torch's own kernels; else the CPU choices :func:`load_runner`
    makes (few-query attention, blocked weights, the lean draft forward, the one-row kernel).  On CUDA
    ``graphs`` (None: yes) takes the graph runner; False keeps the eager runner (e.g. ZeroGPU, where the
    GPU is attached per call and captured graphs would not outlive it).  On the graph runner ``compile``
    (None: the draft wherever compilation is available) compiles the forward before capture, with its
    artifacts kept under ``cache_dir`` (:mod:`~sequoia.runners.hf.graphs.compile_cache`; None: not kept)."""
    device = next(model.parameters()).device
    dtype = getattr(model, "dtype", torch.float32)
    if device.type == "cuda" and graphs is not False:
        info = _info(model, device, quant, GRAPHS, GRAPHS)
        plan = compile_plan(device, role, compile, cache_dir)
        kernels = ("compiled, " if plan.enabled else "") + "cuda graphs"
        return GraphRunner(model, name, RunnerInfo(**{**info.__dict__, "kernels": kernels}), compile=plan)
    if plain or device.type != "cpu":
        return HFRunner(model, name, _info(model, device, quant, "", ""))
    one_row = single_row_kernel(device.type, dtype)
    blocked = block_weights(model, one_row == SINGLE_ROW_BLOCKED) if blocked_weights else False
    if one_row == SINGLE_ROW_BLOCKED and not blocked:   # no blocked copies: oneDNN on the plain weight
        one_row = ""
    use_few_query_attention(model)
    forward = draft_forward(model) if role == "draft" else model_forward
    info = _info(model, device, quant, one_row, MULTI_ROW_BLOCKED if blocked else "")
    return HFRunner(model, name, info, forward_fn=forward, single_row_kernel=one_row)


def compile_plan(device: torch.device, role: str, compile: bool | None,
                 cache_dir: str | Path | None) -> CompilePlan:
    """Whether a graph runner compiles its forward: by default the draft's (the launch-bound one) wherever
    compilation is available; an explicit True or False decides."""
    if compile is False or (compile is None and role != "draft"):
        return CompilePlan(False, "not asked" if compile is False else "only the draft is compiled by default")
    plan = CompilePlan.for_draft(device, cache_dir)
    if compile and not plan.enabled:
        raise ValueError(f"compile=True: {plan.reason}")
    return plan


def _info(model, device: torch.device, quant: str, one_row: str, many_row: str) -> RunnerInfo:
    dtype = getattr(model, "dtype", torch.float32)
    kernels = describe(model) if quant != "none" else ""
    return RunnerInfo(runtime="hf", weights=dtype_name(dtype), device=str(device), threads=torch.get_num_threads(),
                      kernels=kernels, quant=quant, single_row_kernel=one_row, multi_row_kernel=many_row)


def dtype_name(dtype) -> str:
    return DTYPE_NAMES.get(dtype, str(dtype).removeprefix("torch."))


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
    return model


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


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the model hub answers (a connection within ``timeout`` s; never when HF_HUB_OFFLINE is set)."""
    return _hub_reachable(timeout)


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
