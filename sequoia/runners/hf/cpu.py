"""What this CPU and torch build offer the torch runtime, and which kernel each kind of forward gets.

Read without measuring: model name and matmul-relevant flags from ``/proc/cpuinfo``
(:func:`cpu_facts`), whether oneDNN has bf16 kernels (:func:`onednn_bf16`), and
from those the kernel choices the Hugging Face runner makes for one-row and
many-row forwards (:func:`single_row_kernel`, :func:`multi_row_kernel`).
"""

from __future__ import annotations

from pathlib import Path

import torch

from ...core.profiles.fingerprint import CPU_FEATURES

CPUINFO = Path("/proc/cpuinfo")


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
#: (see :func:`sequoia.runners.hf.onednn.single_row_scope`).
SINGLE_ROW_ATEN = "aten"


def _onednn_bf16_model(device_type: str, dtype: torch.dtype) -> bool:
    """A bf16 model on a CPU whose oneDNN has bf16 kernels: where both kernel choices below were measured."""
    return device_type == "cpu" and dtype == torch.bfloat16 and onednn_bf16()


#: What the fingerprint calls one-row bf16 forwards through oneDNN's blocked weight copies, the row padded as
#: few-row products are (see :class:`sequoia.runners.hf.onednn.BlockedLinear`).
SINGLE_ROW_BLOCKED = "onednn-blocked"


def single_row_kernel(device_type: str, dtype: torch.dtype, features: tuple[str, ...] | None = None) -> str:
    """The kernel a one-token forward of a ``dtype`` model on ``device_type`` gets here: "aten", "onednn-blocked"
    or "" (torch's own choice), for bf16 models on CPUs whose oneDNN has bf16 kernels: "onednn-blocked" where the
    CPU has AMX (``features``: :func:`cpu_facts`'s, None: this CPU's), "aten" elsewhere.  Measured, whole 1.5B
    target, one token at a 128-token context, 2 threads: on a 2-vCPU AVX-512-BF16 EPYC aten 128-147 ms against
    213-229 through oneDNN (146-157 padded to 4 rows); on a 2-vCPU Xeon with AMX aten 236 ms (230-250), oneDNN
    on the plain weight 200 ms, the blocked copy padded to 4 rows 172 ms (169-175), median of 12 interleaved."""
    if not _onednn_bf16_model(device_type, dtype):
        return ""
    return SINGLE_ROW_BLOCKED if "amx_bf16" in (cpu_facts()[1] if features is None else features) \
        else SINGLE_ROW_ATEN


#: What the fingerprint calls many-row bf16 products from oneDNN's blocked weight copies
#: (see :func:`sequoia.runners.hf.kernels.block_weights`).
MULTI_ROW_BLOCKED = "onednn-blocked"


def multi_row_kernel(device_type: str, dtype: torch.dtype) -> str:
    """How a bf16 model's many-row products (verification, prefill) run here: "onednn-blocked" or "" (plain
    weights).  Blocked on CPUs whose oneDNN has bf16 kernels, for bf16 models (the only place measured)."""
    return MULTI_ROW_BLOCKED if _onednn_bf16_model(device_type, dtype) else ""
