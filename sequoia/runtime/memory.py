"""Memory: what this process holds, what the machine can still give, and whether a load fits before it starts.

Why: a served app loads extra models on demand (exact mode's float32 target, 6.2 GB for the embedded
1.5B target; Compare's llama.cpp reference), and a 16 GB container is killed, not warned, when a load
goes past its limit.  So every such load is estimated first and planned against the room left.

Vocabulary (used by :class:`MemoryBudget` and :mod:`components.app_state.context`):

- **resident**: the bytes of this process in RAM (``VmRSS`` of ``/proc/self/status``), what an
  out-of-memory killer counts;
- **available**: the bytes the machine can still give without swapping (``MemAvailable`` of
  ``/proc/meminfo``), or the container's (its cgroup limit less its usage, reclaimable file cache not
  counted) where that is less;
- **cap**: a limit on resident memory set by the server's owner (``SEQUOIA_MEMORY_GB``, parsed once by
  :func:`parse_memory_gb` at the edge);
- **room**: what a load may add: available, and under the cap less resident;
- **holding**: something loaded on demand that can be freed and loaded again later, with its size.

Sizes are bytes; GB in messages are 10^9 bytes, as ``free -g`` does not but the issue reports do.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import json
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

GB = 10**9
#: Kept free beyond every estimate: allocator slack, activations, the Python heap growing meanwhile.
MARGIN = int(0.5 * GB)
#: cgroup limits at or above this mean "no limit" (cgroup v1 reports 2^63 rounded down to a page).
NO_LIMIT = 2**60
#: The smallest cap accepted: below it not even the embedded draft fits, so a smaller value is a typo.
MIN_CAP_GB = 1.0
#: A llama.cpp runner holds its GGUF twice (the file mapped and read whole, and the CPU backend's repacked
#: copy of its weights) plus this for its context and compute buffers (measured, docs/serving.md "Memory").
GGUF_RUNTIME_BYTES = int(0.3 * GB)
#: A float32 target holds its weights plus the plain forward's activations and KV cache (measured: see
#: docs/serving.md, "Memory").
FP32_RUNTIME_BYTES = int(0.1 * GB)

_SAFETENSORS_ITEM = {"F64": 8, "F32": 4, "BF16": 2, "F16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
                     "BOOL": 1}


# ------------------------------------------------------------------ reading /proc and /sys
def parse_kib_field(text: str, name: str) -> int | None:
    """Bytes of a ``Name:  1234 kB`` line of /proc/self/status or /proc/meminfo; None when absent."""
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key.strip() == name:
            parts = rest.split()
            return int(parts[0]) * 1024 if parts else None
    return None


def resident_bytes(status: Path = Path("/proc/self/status")) -> int:
    """This process's resident memory (VmRSS); 0 where /proc is not there (another OS)."""
    try:
        return parse_kib_field(status.read_text(), "VmRSS") or 0
    except OSError:
        return 0


def machine_available_bytes(meminfo: Path = Path("/proc/meminfo")) -> int | None:
    """MemAvailable (what the kernel can give without swapping); None where /proc is not there."""
    try:
        return parse_kib_field(meminfo.read_text(), "MemAvailable")
    except OSError:
        return None


def cgroup_available_bytes(root: Path = Path("/sys/fs/cgroup")) -> int | None:
    """The container's limit less its usage (inactive file cache counted as free, as the kernel reclaims it
    before killing); None without a limit.  cgroup v2 (``memory.max``) or v1 (``memory/memory.limit_in_bytes``)."""
    for limit_f, usage_f, stat_f, inactive in (("memory.max", "memory.current", "memory.stat", "inactive_file"),
                                               ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes",
                                                "memory/memory.stat", "total_inactive_file")):
        try:
            raw = (root / limit_f).read_text().strip()
            usage = int((root / usage_f).read_text().strip())
        except (OSError, ValueError):
            continue
        if raw == "max" or int(raw) >= NO_LIMIT:
            return None
        try:
            reclaimable = _stat_field((root / stat_f).read_text(), inactive)
        except OSError:
            reclaimable = 0
        return max(int(raw) - usage + reclaimable, 0)
    return None


def _stat_field(text: str, name: str) -> int:
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == name:
            return int(value)
    return 0


def release_freed() -> None:
    """Collect what was just unreferenced, then ask glibc to hand freed heap pages back to the kernel.

    Why ``malloc_trim``: torch frees a model's tensors into glibc's heap, which keeps large freed
    regions below its top mapped; the resident size then does not fall although nothing uses them.
    """
    gc.collect()
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)


def _libc():
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    return libc if libc is not None and hasattr(libc, "malloc_trim") else None


# ------------------------------------------------------------------ the cap
def parse_memory_gb(value: str | None, name: str = "SEQUOIA_MEMORY_GB") -> int | None:
    """The cap in bytes from its text (e.g. "14" or "14.5", gigabytes); None when unset or empty."""
    if value is None or not value.strip():
        return None
    try:
        gb = float(value)
    except ValueError:
        raise ValueError(f"{name} must be a number of gigabytes, e.g. 14; got {value!r}") from None
    if not gb >= MIN_CAP_GB or gb == float("inf"):
        raise ValueError(f"{name} must be at least {MIN_CAP_GB:g} (gigabytes) and finite; got {value!r}")
    return int(gb * GB)


# ------------------------------------------------------------------ estimates
def fp32_model_bytes(n_params: int) -> int:
    """A float32 model of ``n_params`` parameters, running (weights at 4 bytes plus activations and cache)."""
    return 4 * int(n_params) + FP32_RUNTIME_BYTES


def fp32_copy_bytes(runner) -> int:
    """A float32 copy of a runner's model (its ``model``; a runner without one, e.g. llama.cpp: 0)."""
    model = getattr(runner, "model", None)
    return fp32_model_bytes(sum(p.numel() for p in model.parameters()) if model is not None else 0)


def gguf_runner_bytes(gguf: Path) -> int:
    """A llama.cpp runner of one GGUF file: the file mapped, its repacked weights, context and buffers."""
    return gguf_size_bytes(Path(gguf).stat().st_size)


def gguf_size_bytes(file_size: int) -> int:
    """:func:`gguf_runner_bytes` from the file's size."""
    return 2 * int(file_size) + GGUF_RUNTIME_BYTES


def safetensors_params(directory: Path) -> int:
    """Parameters stored in a directory's ``*.safetensors`` files, read from their headers only."""
    total = 0
    for f in sorted(Path(directory).glob("*.safetensors")):
        with f.open("rb") as fh:
            (size,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(size))
        for key, entry in header.items():
            if key != "__metadata__":
                n = 1
                for d in entry["shape"]:
                    n *= int(d)
                total += n
    return total


def human(n: int) -> str:
    """Bytes as "6.2 GB"."""
    return f"{n / GB:.1f} GB"


# ------------------------------------------------------------------ planning a load
@dataclass(frozen=True)
class MemorySnapshot:
    """Memory now, as seen by this process."""

    resident: int                  # bytes (VmRSS)
    available: int                 # bytes the machine or container can still give
    cap: int | None = None         # SEQUOIA_MEMORY_GB in bytes; None: no cap

    @property
    def room(self) -> int:
        """What a load may add now."""
        room = self.available if self.cap is None else min(self.available, self.cap - self.resident)
        return max(room, 0)

    def describe(self) -> str:
        cap = f" of the {human(self.cap)} cap (SEQUOIA_MEMORY_GB)" if self.cap is not None else ""
        return f"{human(self.room)} free (this server holds {human(self.resident)}{cap})"


class NotEnoughMemory(ValueError):
    """A load refused before it started, as it would not fit; the message says what to free.  A ValueError,
    so a served app's handlers show it as they show a bad input."""


@dataclass(frozen=True)
class Holding:
    """Something loaded on demand that could be freed (and loaded again on its next use)."""

    key: str                       # the owner's name for it, e.g. "reference"
    name: str                      # as messages say it, e.g. "the llama.cpp reference target"
    size: int                      # bytes it frees, estimated


@dataclass(frozen=True)
class LoadPlan:
    """What to do before loading ``what``: free ``free`` (in order) then load, or refuse."""

    what: str
    need: int                      # bytes the load adds, estimated
    snapshot: MemorySnapshot
    free: tuple[Holding, ...]      # to free first (empty when it fits as it is, or when refused)
    fits: bool
    hints: tuple[str, ...] = ()    # what else would make room that the server cannot do itself
    margin: int = 0                # bytes kept free beyond the estimate

    def message(self) -> str:
        """Why it was refused, and what to free, in a sentence or two."""
        kept = f" (plus {human(self.margin)} kept free)" if self.margin else ""
        head = (f"not enough memory for {self.what}: it needs about {human(self.need)}{kept} and this server has "
                f"{self.snapshot.describe()}")
        return head + "; " + "; or ".join(self.hints) + "." if self.hints else head + "."


def plan_load(what: str, need: int, snapshot: MemorySnapshot, freeable: Sequence[Holding] = (),
              hints: Sequence[str] = (), margin: int = MARGIN) -> LoadPlan:
    """Fit a load of ``need`` bytes: as it is, or after freeing the first of ``freeable`` that make room; else
    refuse, freeing nothing (the server stays as it was) and naming what would make room.

    ``hints``: what the visitor or owner could do besides (e.g. "restart with SEQUOIA_BLOCKED_WEIGHTS=0").
    """
    wanted = need + margin
    room, free = snapshot.room, []
    for holding in freeable:
        if room >= wanted:
            break
        free.append(holding)
        room += holding.size
    if room >= wanted:
        return LoadPlan(what, need, snapshot, tuple(free), True)
    named = [f"free {h.name} (about {human(h.size)})" for h in freeable]
    if freeable:
        named = [f"even freeing {_and(h.name for h in freeable)} (about {human(sum(h.size for h in freeable))}) "
                 "would not make room"]
    return LoadPlan(what, need, snapshot, (), False, tuple(named) + tuple(hints), margin)


def _and(names) -> str:
    names = list(names)
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


@dataclass
class MemoryBudget:
    """This server's memory: read it (``probe``, the real /proc and /sys files unless a test gives one), plan
    loads against it (:func:`plan_load`) under the owner's ``cap``."""

    cap: int | None = None                                   # bytes, from SEQUOIA_MEMORY_GB; None: none
    margin: int = MARGIN
    probe: Callable[[], tuple[int, int]] | None = field(default=None, repr=False)   # () -> (resident, available)

    def snapshot(self) -> MemorySnapshot:
        resident, available = self.probe() if self.probe is not None else _probe()
        return MemorySnapshot(resident, available, self.cap)

    def plan(self, what: str, need: int, freeable: Sequence[Holding] = (), hints: Sequence[str] = ()) -> LoadPlan:
        return plan_load(what, need, self.snapshot(), freeable, hints, self.margin)

    def make_room(self, what: str, need: int, freeable: Sequence[Holding], free: Callable[[Holding], object],
                  hints: Sequence[str] = ()) -> LoadPlan:
        """Call ``free`` on what the plan frees, so that ``need`` bytes fit; or raise NotEnoughMemory having freed
        nothing.  After freeing, the resident size is read again: freed pages that did not go back to the
        kernel make a refusal then, not an out-of-memory kill later."""
        plan = self.plan(what, need, freeable, hints)
        if not plan.fits:
            raise NotEnoughMemory(plan.message())
        for holding in plan.free:
            free(holding)
        if plan.free:
            release_freed()
            after = self.plan(what, need, (), hints)
            if not after.fits:
                raise NotEnoughMemory(after.message())
        return plan


def _probe() -> tuple[int, int]:
    machine = machine_available_bytes()
    container = cgroup_available_bytes()
    known = [v for v in (machine, container) if v is not None]
    return resident_bytes(), min(known) if known else 1 << 62    # nothing known (another OS): no limit seen
