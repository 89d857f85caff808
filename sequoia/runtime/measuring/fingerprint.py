"""This machine's :class:`~sequoia.core.profiles.fingerprint.Fingerprint`: what its costs depend on.

Read without measuring anything: CPU model and flags from ``/proc/cpuinfo``
(only those torch's kernels may use: see :func:`cpu_facts`), whether oneDNN has
bf16 kernels, torch's thread count, the GPU's properties when the pair runs on
CUDA, each model's dtype and weight quantization, and the kernel of the
target's one-token forwards (:func:`single_row_kernel`).
"""

from __future__ import annotations

import os
from dataclasses import replace
from types import SimpleNamespace

import torch

from ..._meta import pair_name
from ...core.profiles.fingerprint import Fingerprint
from ...runners.hf import cpu
from ...runners.hf.cpu import cpu_facts, onednn_bf16  # noqa: F401  (re-exported: the fingerprint's facts)
from ...runners.hf.loading import DTYPE_NAMES, dtype_name  # noqa: F401  (re-exported)
from ..models import MIXED_DRAFT_TYPE



def machine_fingerprint(pair=None) -> Fingerprint:
    """The fingerprint of this machine, and of ``pair``'s models when given (dtypes, quantization, name).

    ``pair`` is a :class:`~sequoia.runtime.models.ModelPair` or anything with
    ``device``, ``dtype``, ``draft`` and ``target``; the device kind is its
    device's (CPU without a pair).
    """
    model, features = cpu.cpu_facts()
    device = torch.device(getattr(pair, "device", None) or "cpu") if pair is not None else torch.device("cpu")
    gpu = _gpu_facts(device) if device.type == "cuda" else {}
    models = _model_facts(pair) if pair is not None else {}
    # A runtime with threads of its own (llama.cpp) says how many it runs; torch's count is for torch.
    threads = getattr(getattr(getattr(pair, "target", None), "info", None), "threads", None) or \
        getattr(pair, "threads", None) or torch.get_num_threads()
    return Fingerprint(device_kind=device.type, cpu_model=model, cpu_features=features,
                       onednn_bf16=cpu.onednn_bf16(), threads=threads,
                       torch_version=torch.__version__, **gpu, **models)


def expected_fingerprint(device: torch.device, dtype: torch.dtype, draft_quant: str, target_quant: str = "none",
                         blocked_weights: bool = True, backend: str = "hf") -> Fingerprint:
    """This machine's fingerprint with a pair as ``load_pair`` would load it, without loading it.

    The pair's name is left out (it is known only once loaded), so it does not decide a match.
    """
    # As load_pair stores them: a quantized draft runs with bf16 activations; llama.cpp runs all cores.
    stand_in = SimpleNamespace(device=device, dtype=dtype,
                               draft_dtype=torch.bfloat16 if draft_quant != "none" else dtype,
                               draft_quant=draft_quant, target_quant=target_quant, name="not loaded",
                               blocked_weights=blocked_weights, backend=backend,
                               threads=os.cpu_count() if backend == "llamacpp" else None)
    return replace(machine_fingerprint(stand_in), pair="")


def _gpu_facts(device: torch.device) -> dict:
    props = torch.cuda.get_device_properties(device)
    return dict(gpu_name=props.name, gpu_memory_gb=round(props.total_memory / 2**30, 1),
                gpu_capability=f"{props.major}.{props.minor}")


def _model_facts(pair) -> dict:
    """The runtime, dtypes and weight quantization of both models, and the target's kernel choices.

    A loaded pair says it through its runners' :class:`~sequoia.runners.base.RunnerInfo`; a stand-in (models
    not loaded yet: ``dtype``, ``draft_quant``, ... and no runners) is predicted for the Hugging Face runtime.
    """
    target, draft = getattr(pair, "target", None), getattr(pair, "draft", None)
    t_info, d_info = getattr(target, "info", None), getattr(draft, "info", None)
    if t_info is not None and d_info is not None:
        runtime = t_info.runtime if t_info.runtime == d_info.runtime else f"{d_info.runtime}+{t_info.runtime}"
        return dict(runtime=runtime, target_dtype=t_info.weights, target_quant=t_info.quant,
                    single_row_kernel=t_info.single_row_kernel, multi_row_kernel=t_info.multi_row_kernel,
                    draft_dtype=d_info.weights, draft_quant=d_info.quant, pair=pair_name(pair))
    if getattr(pair, "backend", "hf") == "llamacpp":   # GGUF files: their own weight types, no torch kernels
        weights = getattr(pair, "gguf_weights", ("Q4_K_M", "Q4_K_M"))
        return dict(runtime="llamacpp", target_dtype=weights[1], draft_dtype=weights[0], pair=pair_name(pair))
    draft_quant = getattr(pair, "draft_quant", None) or ("int8" if getattr(pair, "draft_int8", False) else "none")
    target_dtype = getattr(pair, "dtype", None)
    device_type = torch.device(getattr(pair, "device", None) or "cpu").type
    many = cpu.multi_row_kernel(device_type, target_dtype) if getattr(pair, "blocked_weights", True) else ""
    one = cpu.single_row_kernel(device_type, target_dtype)
    facts = dict(
        runtime=getattr(pair, "backend", "hf"),
        target_dtype=dtype_name(target_dtype),
        single_row_kernel="" if one == cpu.SINGLE_ROW_BLOCKED and not many else one,   # as load_runner decides
        multi_row_kernel=many, target_quant=getattr(pair, "target_quant", None) or "none",
        draft_dtype=dtype_name(getattr(pair, "draft_dtype", None) or target_dtype),
        draft_quant=draft_quant,
        pair=pair_name(pair),
    )
    if facts["runtime"] == "mixed":   # the Hugging Face target, the draft a GGUF on llama.cpp (as loaded: draft+target)
        facts.update(runtime="llamacpp+hf", draft_dtype=MIXED_DRAFT_TYPE, draft_quant="none")
    return facts
