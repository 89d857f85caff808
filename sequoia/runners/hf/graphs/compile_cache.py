"""The draft's forward compiled with inductor under the graphs, without a cold compile at every start.

Why: the 0.5B draft's forward replayed as one CUDA graph costs 3.4 ms on an
H100, the same forward compiled before capture 1.8 ms (inductor fuses the
norms, rotary and activations a small model's graph is bound by), but compiling
took 104 s, at every start.  torch's "mega-cache" holds what a compile produced
(inductor's graphs, triton's kernels, autotuning): ``save_cache_artifacts()``
after the compile, ``load_cache_artifacts(bytes)`` before the next one, and the
next start compiles nothing.  The artifacts are valid for one torch, one
triton and one GPU kind only, so they are stored under a key of all three
(:class:`CompileKey`) in the app's cache (``<cache>/compiled/<key>.bin``).

Where compilation is unavailable the forward runs uncompiled under the same
graphs (:func:`unavailable_reason` says why): off CUDA, without triton, and
on ZeroGPU (``SPACES_ZERO_GPU`` set), which supports no ``torch.compile``
(ahead-of-time compilation only) and runs the eager runner anyway.

The compile itself happens at the forward's first call, i.e. in the graph
runner's warm-up (:func:`sequoia.runners.hf.graphs.capture.warm_up`), which reports
it as progress and keeps its duration in :class:`CompileStatus`.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import torch

log = logging.getLogger("sequoia")
SUBDIR = "compiled"
ZERO_GPU_ENV = "SPACES_ZERO_GPU"


@dataclass(frozen=True)
class CompileKey:
    """What compiled artifacts are valid for."""

    torch: str          # torch.__version__
    triton: str         # triton's version ("none": not installed)
    gpu: str            # the device's name
    capability: str     # "sm_90"

    def slug(self) -> str:
        """A file name of the key: safe characters only."""
        text = f"torch-{self.torch}_triton-{self.triton}_{self.gpu}_{self.capability}"
        return re.sub(r"[^A-Za-z0-9._+-]+", "-", text).strip("-")


def triton_version() -> str | None:
    if importlib.util.find_spec("triton") is None:
        return None
    import triton   # noqa: PLC0415 - optional: only asked when a compile is planned

    return str(triton.__version__)


def compile_key(device: torch.device) -> CompileKey:
    """The key of ``device`` (a CUDA device) with this process's torch and triton."""
    name = torch.cuda.get_device_name(device)
    major, minor = torch.cuda.get_device_capability(device)
    return CompileKey(torch.__version__, triton_version() or "none", name, f"sm_{major}{minor}")


def unavailable_reason(device: torch.device, env: Mapping[str, str] = os.environ,
                       triton: str | None | bool = True) -> str | None:
    """Why the forward cannot be compiled here (None: it can).  ``triton`` True: look it up."""
    if device.type != "cuda":
        return "not on CUDA"
    if env.get(ZERO_GPU_ENV):
        return "ZeroGPU supports no torch.compile (ahead-of-time compilation only)"
    if (triton_version() if triton is True else triton) is None:
        return "triton is not installed"
    return None


def artifacts_path(cache_dir: str | Path, key: CompileKey) -> Path:
    return Path(cache_dir) / SUBDIR / f"{key.slug()}.bin"


def load_artifacts(path: Path) -> int:
    """Load saved artifacts into torch's compile caches; bytes loaded (0: none saved, or unreadable)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return 0
    except OSError as exc:
        log.warning("compiled artifacts %s unreadable (%s): compiling from cold", path, exc)
        return 0
    try:
        torch.compiler.load_cache_artifacts(data)
    except Exception as exc:   # noqa: BLE001 - a stale or damaged file: compile from cold and overwrite it
        log.warning("compiled artifacts %s not loaded (%s): compiling from cold", path, exc)
        return 0
    return len(data)


def save_artifacts(path: Path) -> int:
    """Save what this process compiled to ``path`` (written whole, then renamed); bytes saved (0: nothing)."""
    result = torch.compiler.save_cache_artifacts()
    if result is None:
        return 0
    data = bytes(result[0])
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return len(data)


@dataclass(frozen=True)
class CompilePlan:
    """Whether a runner compiles its forward, why, and where its artifacts live (built at the edge)."""

    enabled: bool
    reason: str = ""                 # why not, when not enabled
    artifacts: Path | None = None    # None: compile without persisting

    @classmethod
    def for_draft(cls, device: torch.device, cache_dir: str | Path | None,
                  env: Mapping[str, str] = os.environ) -> "CompilePlan":
        """The default of a draft on the graph runner: compiled wherever compilation is available."""
        reason = unavailable_reason(device, env)
        if reason is not None:
            return cls(False, reason)
        return cls(True, artifacts=artifacts_path(cache_dir, compile_key(device)) if cache_dir else None)


@dataclass(frozen=True)
class CompileStatus:
    """What became of a runner's compile: off (and why), pending its first call, warm, cold or failed."""

    state: str                       # "off" | "pending" | "warm" | "cold" | "failed"
    detail: str = ""
    seconds: float | None = None     # the compile's: the forward's first calls, before any capture
    loaded_bytes: int = 0
    saved_bytes: int = 0
    path: str = ""

    @classmethod
    def off(cls, reason: str) -> "CompileStatus":
        return cls("off", reason)

    def line(self) -> str:
        """One line for the page and the log."""
        if self.state == "off":
            return f"forward not compiled ({self.detail}): the uncompiled forward runs under the graphs"
        if self.state == "pending":
            return "forward compiled at its first call (" + ("saved artifacts loaded)" if self.loaded_bytes
                                                             else "cold: no saved artifacts)")
        if self.state == "failed":
            return f"compile failed ({self.detail}): the uncompiled forward runs under the graphs"
        took = f" in {self.seconds:.1f} s" if self.seconds is not None else ""
        if self.state == "warm":
            return f"forward compiled{took} from saved artifacts ({self.loaded_bytes / 2**20:.1f} MiB)"
        saved = f"; artifacts saved ({self.saved_bytes / 2**20:.1f} MiB)" if self.saved_bytes else ""
        return f"forward compiled cold{took}{saved}"


def compile_forward(model, plan: CompilePlan):
    """(forward, status): ``model`` compiled per ``plan`` after loading its saved artifacts, or itself."""
    if not plan.enabled:
        return model, CompileStatus.off(plan.reason or "not asked")
    loaded = load_artifacts(plan.artifacts) if plan.artifacts is not None else 0
    status = CompileStatus("pending", loaded_bytes=loaded, path=str(plan.artifacts or ""))
    # dynamic: rows and key window symbolic from the first compile.  Left to torch's automatic dynamic shapes,
    # each new bucket and window of the warm-up compiled again (six compiles traced at a cold start); now one
    # compile for a single row (torch specialises sizes of 1) and one for everything wider (capture._first_call).
    return torch.compile(model, dynamic=True), status


def finish(status: CompileStatus, seconds: float) -> CompileStatus:
    """After the first calls that ran the compile (``seconds``): warm (artifacts were loaded) or cold (and
    saved now)."""
    if status.state != "pending":
        return status
    saved = save_artifacts(Path(status.path)) if status.path else 0
    state = "warm" if status.loaded_bytes else "cold"
    out = replace(status, state=state, seconds=seconds, saved_bytes=saved)
    log.info("%s", out.line())
    return out


def resave(status: CompileStatus) -> CompileStatus:
    """The artifacts saved again after the captures (a compiled forward with a path only): what compiled since
    the first calls is persisted too."""
    if status.state not in ("cold", "warm") or not status.path:
        return status
    return replace(status, saved_bytes=save_artifacts(Path(status.path)))


def failed(status: CompileStatus, exc: BaseException) -> CompileStatus:
    out = replace(status, state="failed", detail=f"{type(exc).__name__}: {str(exc)[:200]}")
    log.warning("%s", out.line())
    return out

