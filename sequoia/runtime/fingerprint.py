"""This machine's :class:`~sequoia.core.profile.Fingerprint`: what its costs depend on.

Read without measuring anything: CPU model and flags from ``/proc/cpuinfo``
(only those torch's kernels may use: see :func:`cpu_facts`), whether oneDNN has
bf16 kernels, torch's thread count, the GPU's properties when the pair runs on
CUDA, each model's dtype and weight quantization, and the kernel of the
target's one-token forwards (:func:`single_row_kernel`).
"""

from __future__ import annotations

from pathlib import Path

import torch

from .._meta import pair_name
from ..core.profile import CPU_FEATURES, Fingerprint

CPUINFO = Path("/proc/cpuinfo")
#: Short dtype names used in fingerprints and file names.
DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


def machine_fingerprint(pair=None) -> Fingerprint:
    """The fingerprint of this machine, and of ``pair``'s models when given (dtypes, quantization, name).

    ``pair`` is a :class:`~sequoia.runtime.models.ModelPair` or anything with
    ``device``, ``dtype``, ``draft`` and ``target``; the device kind is its
    device's (CPU without a pair).
    """
    model, features = cpu_facts()
    device = torch.device(getattr(pair, "device", None) or "cpu") if pair is not None else torch.device("cpu")
    gpu = _gpu_facts(device) if device.type == "cuda" else {}
    models = _model_facts(pair) if pair is not None else {}
    return Fingerprint(device_kind=device.type, cpu_model=model, cpu_features=features,
                       onednn_bf16=onednn_bf16(), threads=torch.get_num_threads(),
                       torch_version=torch.__version__, **gpu, **models)


#: The flags of CPU_FEATURES that torch's CPU kernels may use under each ATen capability (what
#: ``torch.backends.cpu.get_cpu_capability()`` says); a capability not named here limits nothing.
_CAPABILITY_FLAGS = {"DEFAULT": (), "AVX2": ("avx2",)}


def cpu_facts(cpuinfo: str | None = None, capability: str | None = None) -> tuple[str, tuple[str, ...]]:
    """(model name, matmul-relevant flags the kernels may use): from /proc/cpuinfo text ("" and () unreadable).

    A flag the CPU has but torch's kernels are told not to use does not change a
    matmul's cost, so it is left out: ``capability`` is ATen's CPU capability
    ("AVX512", "AVX2", "DEFAULT"; None: this process's, which ``ATEN_CPU_CAPABILITY=avx2``
    lowers).  With ``ONEDNN_MAX_CPU_ISA=AVX2`` too, an AVX-512 machine runs the
    kernels of an AVX2-only one and fingerprints as one (oneDNN bf16 then reads
    as unavailable: :func:`onednn_bf16`).
    """
    if capability is None:
        capability = torch.backends.cpu.get_cpu_capability()
    if cpuinfo is None:
        try:
            cpuinfo = CPUINFO.read_text()
        except OSError:  # not Linux: the features stay unknown, so no shipped CPU profile matches
            return "", ()
    model, flags = "", set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and not model:
            model = value.strip()
        elif key == "flags" and not flags:
            flags = set(value.split())
    usable = _CAPABILITY_FLAGS.get(capability.upper(), CPU_FEATURES)
    return model, tuple(f for f in CPU_FEATURES if f in flags and f in usable)


def onednn_bf16() -> bool:
    """Whether oneDNN reports native bf16 kernels (False where torch lacks the query)."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # a private op: absent on some builds
        return False


#: What the fingerprint calls one-row bf16 forwards that skip oneDNN
#: (see :func:`sequoia.runtime.kernels.route_single_rows`).
SINGLE_ROW_ATEN = "aten"


def _onednn_bf16_model(device_type: str, dtype: torch.dtype) -> bool:
    """A bf16 model on a CPU whose oneDNN has bf16 kernels: where both kernel choices below were measured."""
    return device_type == "cpu" and dtype == torch.bfloat16 and onednn_bf16()


def single_row_kernel(device_type: str, dtype: torch.dtype) -> str:
    """The kernel a one-token forward of a ``dtype`` model on ``device_type`` gets here: "aten" or "" (torch's
    own choice).  "aten" on CPUs whose oneDNN has bf16 kernels, for bf16 models."""
    return SINGLE_ROW_ATEN if _onednn_bf16_model(device_type, dtype) else ""


#: What the fingerprint calls many-row bf16 products from oneDNN's blocked weight copies
#: (see :func:`sequoia.runtime.kernels.block_weights`).
MULTI_ROW_BLOCKED = "onednn-blocked"


def multi_row_kernel(device_type: str, dtype: torch.dtype) -> str:
    """How a bf16 model's many-row products (verification, prefill) run here: "onednn-blocked" or "" (plain
    weights).  Blocked on CPUs whose oneDNN has bf16 kernels, for bf16 models (the only place measured)."""
    return MULTI_ROW_BLOCKED if _onednn_bf16_model(device_type, dtype) else ""


def dtype_name(dtype) -> str:
    return DTYPE_NAMES.get(dtype, str(dtype).removeprefix("torch."))


def _gpu_facts(device: torch.device) -> dict:
    props = torch.cuda.get_device_properties(device)
    return dict(gpu_name=props.name, gpu_memory_gb=round(props.total_memory / 2**30, 1),
                gpu_capability=f"{props.major}.{props.minor}")


def _model_facts(pair) -> dict:
    """Dtypes and weight quantization of both models, and the kernel of the target's one-token forwards.

    ``draft_quant`` / ``target_quant`` when the pair names them ("int8", "int4",
    "none"), else the older ``draft_int8`` flag.
    """
    draft_quant = getattr(pair, "draft_quant", None) or ("int8" if getattr(pair, "draft_int8", False) else "none")
    target_dtype = getattr(pair, "dtype", None) or pair.target.dtype
    target = getattr(pair, "target", None)
    # A loaded target says what its one-row forwards get; a stand-in (models not loaded yet) is predicted.
    device_type = torch.device(getattr(pair, "device", None) or "cpu").type
    kernel = getattr(target, "_single_row_kernel", "") if target is not None else \
        single_row_kernel(device_type, target_dtype)
    many = getattr(target, "_multi_row_kernel", "") if target is not None else \
        multi_row_kernel(device_type, target_dtype) if getattr(pair, "blocked_weights", True) else ""
    return dict(
        target_dtype=dtype_name(target_dtype), single_row_kernel=kernel, multi_row_kernel=many,
        target_quant=getattr(pair, "target_quant", None) or "none",
        draft_dtype=dtype_name(getattr(pair, "draft_dtype", None) or pair.draft.dtype),
        draft_quant=draft_quant,
        pair=pair_name(pair),
    )
