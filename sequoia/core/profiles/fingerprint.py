"""What a hardware profile's costs depend on: the machine, the runtime and how each model is stored.

A :class:`Fingerprint` names the device kind, the CPU features or GPU that
change matmul cost, the thread count, the kernels chosen, and each model's
dtype and weight quantization.  A profile
(:class:`~sequoia.core.profiles.profile.HardwareProfile`) is meant for the machines
whose fingerprint matches it on those fields (:meth:`Fingerprint.mismatches`).
This machine's fingerprint is read by :mod:`sequoia.runtime.measuring.fingerprint`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, fields

from ..._meta import optional_number, require

#: CPU flags that change what a matmul costs, weakest first (as /proc/cpuinfo names them).
CPU_FEATURES = ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16")


@dataclass(frozen=True)
class Fingerprint:
    """What a profile's costs depend on: the machine and how each model is stored.

    Dtypes are short names ("bf16", "fp32", "fp16"); quantizations are "none",
    "int8" or "int4" (weight-only).  ``cpu_model`` and ``torch_version`` are
    kept for the reader but do not decide a match: the same features and
    threads cost the same whatever the marketing name, and patch releases do
    not change kernels enough to matter.
    """

    device_kind: str                        # "cpu" or "cuda"
    cpu_model: str                          # /proc/cpuinfo "model name"
    cpu_features: tuple[str, ...]           # those of CPU_FEATURES present, in that order
    onednn_bf16: bool                       # oneDNN has native bf16 kernels here
    threads: int                            # torch.get_num_threads() when measured
    gpu_name: str = ""
    gpu_memory_gb: float = 0.0
    gpu_capability: str = ""                # e.g. "9.0"
    torch_version: str = ""
    target_dtype: str = ""
    target_quant: str = "none"
    draft_dtype: str = ""
    draft_quant: str = "none"
    pair: str = ""
    # "aten": the target's one-token forwards skip oneDNN (bf16 on a CPU whose oneDNN has bf16 kernels, where
    # that is ~1.6x faster; see sequoia.runners.hf.kernels); "": torch's own choice.  It sets the target-alone cost.
    single_row_kernel: str = ""
    # "onednn-blocked": the target's many-row products (verification, prefill) read oneDNN's blocked weight
    # copies (0.6-0.9x the plain cost for 2-32 tokens there); "": plain weights.  It sets the verification cost.
    multi_row_kernel: str = ""
    # The runtime the models run on: "hf" (transformers / torch), "llamacpp", or "draft+target" when they differ.
    # Profiles written before runtimes were named are Hugging Face ones.
    runtime: str = "hf"

    def __post_init__(self) -> None:
        if self.device_kind not in ("cpu", "cuda"):
            raise ValueError(f"device_kind must be 'cpu' or 'cuda', got {self.device_kind!r}")
        unknown = set(self.cpu_features) - set(CPU_FEATURES)
        if unknown:
            raise ValueError(f"unknown cpu_features {sorted(unknown)}; known: {', '.join(CPU_FEATURES)}")
        # One order, so equal feature sets compare (and hash) equal.
        object.__setattr__(self, "cpu_features", tuple(f for f in CPU_FEATURES if f in self.cpu_features))
        if not isinstance(self.threads, int) or self.threads < 1:
            raise ValueError(f"threads must be a positive integer, got {self.threads!r}")

    def _decisive(self) -> dict:
        """The fields that decide a match (and the cache key): see :meth:`mismatches`."""
        out = {"device_kind": self.device_kind}
        if self.runtime != "hf":   # keys of Hugging Face profiles stay those they had before runtimes were named
            out["runtime"] = self.runtime
        if self.device_kind == "cpu":
            out.update(cpu_features=list(self.cpu_features), onednn_bf16=self.onednn_bf16, threads=self.threads,
                       single_row_kernel=self.single_row_kernel, multi_row_kernel=self.multi_row_kernel)
        else:   # a graph-captured runner's costs are not the eager one's ("cuda-graphs" vs "")
            out.update(gpu_name=self.gpu_name, gpu_capability=self.gpu_capability)
            if self.multi_row_kernel:
                out["multi_row_kernel"] = self.multi_row_kernel
        out.update(target_dtype=self.target_dtype, target_quant=self.target_quant,
                   draft_dtype=self.draft_dtype, draft_quant=self.draft_quant, pair=self.pair)
        return out

    def mismatches(self, other: "Fingerprint") -> list[str]:
        """Readable differences that change costs ("threads: 2 here, 8 in the profile"); [] when they match.

        ``self`` is read as the profile's fingerprint and ``other`` as the machine's.
        ``pair`` counts only when both name one.
        """
        if self.device_kind != other.device_kind:
            return [f"device: {other.device_kind} here, {self.device_kind} in the profile"]
        if self.runtime != other.runtime:
            return [f"runtime: {other.runtime} here, {self.runtime} in the profile"]
        mine, theirs = self._decisive(), other._decisive()
        if not (self.pair and other.pair):
            mine.pop("pair"), theirs.pop("pair")
        return [f"{_LABELS[k]}: {_show(theirs[k])} here, {_show(mine[k])} in the profile"
                for k in mine if mine[k] != theirs[k]]

    def matches(self, other: "Fingerprint") -> bool:
        return not self.mismatches(other)

    def key(self) -> str:
        """Short stable hash of the deciding fields, for cache file names."""
        text = json.dumps(self._decisive(), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    def describe(self) -> str:
        """One line, e.g. "cpu AMD EPYC 7B13, avx512_bf16, oneDNN bf16, 2 threads; target bf16, draft int8"."""
        if self.device_kind == "cuda":
            mem = f", {self.gpu_memory_gb:.0f} GB" if self.gpu_memory_gb else ""
            cap = f", sm {self.gpu_capability}" if self.gpu_capability else ""
            machine = f"cuda {self.gpu_name or 'GPU'}{mem}{cap}"
        else:
            best = self.cpu_features[-1] if self.cpu_features else "no avx2"
            bf16 = "oneDNN bf16" if self.onednn_bf16 else "no oneDNN bf16"
            kernels = [f"{what}: {k}" for what, k in (("one-token forwards", self.single_row_kernel),
                                                        ("wider ones", self.multi_row_kernel)) if k]
            if kernels:
                bf16 += f" ({', '.join(kernels)})"
            machine = f"cpu {self.cpu_model or 'unknown model'}, {best}, {bf16}, {self.threads} threads"
        models = [f"{role} {_precision(dtype, quant)}" for role, dtype, quant in
                  (("target", self.target_dtype, self.target_quant), ("draft", self.draft_dtype, self.draft_quant))
                  if dtype or quant != "none"]
        runtime = "" if self.runtime == "hf" else f" ({self.runtime})"
        return machine + ("; " + ", ".join(models) + runtime if models else runtime)

    def to_dict(self) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, data: dict, what: str = "fingerprint") -> "Fingerprint":
        if not isinstance(data, dict):
            raise ValueError(f"{what}: field 'fingerprint' must be an object, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        extra = set(data) - known
        if extra:
            raise ValueError(f"{what}: unknown fingerprint fields {sorted(extra)}")
        features = require(data, "cpu_features", list, what)
        return cls(
            device_kind=require(data, "device_kind", str, what),
            cpu_model=require(data, "cpu_model", str, what),
            cpu_features=tuple(str(f) for f in features),
            onednn_bf16=require(data, "onednn_bf16", bool, what),
            threads=require(data, "threads", int, what),
            gpu_memory_gb=optional_number(data, "gpu_memory_gb", what),
            **{k: require(data, k, str, what) for k in known - _REQUIRED - {"gpu_memory_gb"} if k in data},
        )


_REQUIRED = {"device_kind", "cpu_model", "cpu_features", "onednn_bf16", "threads"}
_LABELS = {
    "device_kind": "device", "cpu_features": "CPU features", "onednn_bf16": "oneDNN bf16", "threads": "threads",
    "gpu_name": "GPU", "gpu_capability": "compute capability", "target_dtype": "target dtype",
    "target_quant": "target quantization", "draft_dtype": "draft dtype", "draft_quant": "draft quantization",
    "pair": "model pair", "single_row_kernel": "one-token forwards' kernel",
    "multi_row_kernel": "many-token forwards' kernel", "runtime": "runtime",
}


def _show(value) -> str:
    if isinstance(value, list):
        return ", ".join(value) if value else "none"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value) if value != "" else "unknown"


def _precision(dtype: str, quant: str) -> str:
    """How a model's weights are stored: the quantization when there is one, else the dtype."""
    return quant if quant != "none" else dtype
