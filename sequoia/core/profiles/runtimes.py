"""The runtimes a pair can be served on, and the typed answer to "which one here, and why".

Plain data, no model code: the page's views read these without importing a runtime.  The choice itself is
:mod:`sequoia.runtime.measuring.runtime_choice`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .profile import HardwareProfile

#: The runtimes a pair can be loaded on (``--backend``, ``SEQUOIA_BACKEND``): both models on Hugging Face
#: (torch), both on llama.cpp (GGUF files), or "mixed": the Hugging Face target with the draft on llama.cpp.
BACKENDS = ("hf", "llamacpp", "mixed")
#: CPU flags that give torch bf16 matrix kernels (oneDNN); without them a bf16 matmul runs ATen's fallback.
BF16_FLAGS = ("avx512_bf16", "amx_bf16")
NOT_MEASURED = "not measured here"
_NAMES = {"hf": "Hugging Face (torch)", "llamacpp": "llama.cpp", "mixed": "mixed (torch target, llama.cpp draft)"}


@dataclass(frozen=True)
class Machine:
    """What the choice depends on besides the profiles."""

    device_kind: str                     # "cpu" or "cuda": where the pair would load
    cpu_features: tuple[str, ...]        # as the fingerprint names them (sequoia.core.profiles.fingerprint.CPU_FEATURES)
    llamacpp_installed: bool             # llama-cpp-python imports
    fixed_by_models: str = ""            # the runtime the model names leave ("" : the embedded pair, any)

    @property
    def bf16_kernels(self) -> bool:
        return any(flag in self.cpu_features for flag in BF16_FLAGS)


@dataclass(frozen=True)
class FoundProfile:
    """A runtime's profile on this machine and where it comes from ("cached", "shipped", "in use", ...)."""

    profile: HardwareProfile
    source: str


@dataclass(frozen=True)
class TargetProbe:
    """The target alone timed on one runtime here, one token at a time, in seconds at start
    (:mod:`sequoia.runtime.measuring.target_probe`): what the choice reads where no profile ranks the runtimes."""

    backend: str
    tokens_per_s: float                  # the median step's rate
    low: float                           # the slowest step's rate
    high: float                          # the fastest step's
    steps: int                           # timed one-token steps
    seconds: float                       # the probe's wall time, loading included
    how: str                             # what was timed, e.g. "the Q4_K_M target as shipped"
    cached: bool = False                 # read from an earlier start's probe rather than timed now

    @property
    def bound(self) -> bool:
        """A ceiling worked out rather than timed (``how`` says from what): no steps were run."""
        return self.steps == 0

    @property
    def text(self) -> str:
        """e.g. "24.1 tokens/s (22.0-25.3 over 6 steps)", or "at most 3.9 tokens/s (...)" for a bound."""
        if self.bound:
            return f"at most {self.tokens_per_s:.1f} tokens/s ({self.how.removeprefix('at most: ')})"
        return f"{self.tokens_per_s:.1f} tokens/s ({self.low:.1f}-{self.high:.1f} over {self.steps} steps)"


@dataclass(frozen=True)
class RuntimeEstimate:
    """One runtime on this machine: installed or not, and its predicted decode rate where measured."""

    backend: str                         # one of BACKENDS
    installed: bool
    tokens_per_s: float | None = None    # the best method's predicted rate (None: not measured here)
    alone_tokens_per_s: float | None = None   # the target alone's
    method: str = ""                     # "target alone" or "Sequoia n=7 d=7" (the best method)
    source: str = ""                     # where its costs come from
    models: str = ""                     # how its models are stored, e.g. "target Q4_K_M, draft Q4_K_M"
    probe: TargetProbe | None = None     # its target alone timed at start, where no profile ranked the runtimes

    @property
    def measured(self) -> bool:
        return self.tokens_per_s is not None

    @property
    def rate_text(self) -> str:
        return f"{self.tokens_per_s:.1f} tokens/s" if self.tokens_per_s is not None else NOT_MEASURED


@dataclass(frozen=True)
class RuntimeDecision:
    """The runtime to serve on, why (one sentence), and every runtime's estimate beside it."""

    backend: str
    reason: str
    runtimes: tuple[RuntimeEstimate, ...]
    explicit: bool = False               # named by SEQUOIA_BACKEND / --backend rather than chosen
    machine: Machine | None = None       # what it was decided for (None: built by hand)
    timed_later: bool = True             # the background may time the runtimes no profile ranks (SEQUOIA_PROBE)

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {self.backend!r}")

    def estimate(self, backend: str) -> RuntimeEstimate | None:
        return next((r for r in self.runtimes if r.backend == backend), None)

    def fastest(self) -> RuntimeEstimate | None:
        """The installed runtime with the highest predicted rate (None: none is measured here)."""
        measured = [r for r in self.runtimes if r.installed and r.measured]
        return max(measured, key=lambda r: r.tokens_per_s, default=None)

    def overridden(self, backend: str, by: str) -> RuntimeDecision:
        """This decision with ``backend`` named explicitly by ``by`` (e.g. "SEQUOIA_BACKEND"); ValueError for an
        unknown one, naming ``by``."""
        if backend not in BACKENDS:
            raise ValueError(f"{by}={backend!r} is not a runtime; use one of {', '.join(BACKENDS)}")
        return replace(self, backend=backend, explicit=True,
                       reason=f"{by}={backend} names it (the measured choice here: {display_name(self.backend)})")

    def summary(self) -> str:
        """One line for the console and the page: the runtime and why."""
        how = "named" if self.explicit else "chosen"
        return f"runtime: {display_name(self.backend)} ({how}: {self.reason})"


def display_name(backend: str) -> str:
    return _NAMES.get(backend, backend)


#: Resident memory right after start with the embedded pair, by runtime (``scripts/page/memory_tour.py`` on 2-vCPU
#: machines: "hf" 8.5 GB on a Xeon with AMX, its target's blocked weight copy included; "llamacpp" 3.5 GB on a
#: Zen 4); None: not measured.  What serving on another runtime would need, before any request.
START_MEMORY_GB = {"hf": 8.5, "llamacpp": 3.5, "mixed": None}
