"""The targets alone of torch and llama.cpp, timed in the background once the served pair is ready.

Where no profile ranks the two runtimes (a CPU kind the project never measured), the app's start serves by the
rule backed by every CPU kind measured (llama.cpp, whose target alone was the faster on all of them) and times
nothing: on the busy 2-vCPU Xeon with AMX a start took 41 s with the targets timed and 23 s without, against the
30 s goal (docs/data/fresh-start-xeon-amx.json).  Here, after the profile, each runtime's target alone is timed,
the served one first, each in a child process of its own at the lowest priority: torch's 3 GB placeholder model
is freed when the child exits, its one torch thread never changes the server's, and the server's decodes go
first for the cores.  The rate is CPU time of one thread, so sharing the cores slows the probe's wall time, not
its figure.  The results join the cache's ``runtime-probe.json``, so a later start chooses by them, and
:func:`switch_offer` says whether another runtime proved faster than the one serving, with the bands apart.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from ...core.profiles.runtimes import RuntimeDecision, TargetProbe, display_name
from ..memory import cgroup_available_bytes, machine_available_bytes
from .target_probe import CACHE_NAME, PROBED, _read, _write

#: Seconds a child probe may take (the 2-vCPU Xeon with AMX: 11 s of CPU; at the lowest priority beside other
#: processes' load of 11-19, 410 s of wall time).
CHILD_TIMEOUT_S = 900.0
#: Memory a child probe needs free, by runtime: torch's held 3.8 GB resident on the Xeon with AMX (its 3.1 GB
#: placeholder model, torch, transformers), llama.cpp's about 1 GB (the mapped Q4_K_M target); with a margin.
CHILD_NEED_BYTES = {"hf": 4_500_000_000, "llamacpp": 1_500_000_000}


def free_bytes() -> int | None:
    """What this machine or container can still give (the smaller where both say; None where neither does)."""
    known = [b for b in (machine_available_bytes(), cgroup_available_bytes()) if b is not None]
    return min(known) if known else None


def pending(decision: RuntimeDecision | None) -> tuple[str, ...]:
    """The runtimes to time in the background, the served one first: every installed one of torch and
    llama.cpp, where no profile ranks them and the start had no timed probe of each (from an earlier
    start's cache); empty otherwise (a GPU, models that fix the runtime, a runtime named, both ranked, the
    timing switched off: SEQUOIA_PROBE=0)."""
    m = decision.machine if decision is not None else None
    if decision is None or decision.explicit or not decision.timed_later or m is None or m.device_kind != "cpu" \
            or m.fixed_by_models or not m.llamacpp_installed:
        return ()
    ours = [r for r in decision.runtimes if r.backend in PROBED and r.installed]
    if all(r.measured for r in ours) or all(r.probe is not None and not r.probe.bound for r in ours):
        return ()
    return tuple(sorted((r.backend for r in ours), key=lambda b: b != decision.backend))


def time_in_child(backend: str, cache_dir: str | Path, timeout_s: float = CHILD_TIMEOUT_S,
                  free=free_bytes) -> TargetProbe:
    """``backend``'s target alone timed by ``python -m sequoia.runtime.measuring.target_probe`` in a child
    process at the lowest priority (RuntimeError naming its last output when it fails).  Not started where
    ``free()`` says the memory it needs is not there (RuntimeError saying so): a child the kernel kills for
    memory might take the server with it."""
    need, have = CHILD_NEED_BYTES.get(backend, 0), free()
    if have is not None and have < need:
        raise RuntimeError(f"not timed: it needs about {need / 1e9:.1f} GB free and {have / 1e9:.1f} GB are")
    nice = ["nice", "-n", "19"] if shutil.which("nice") else []
    cmd = nice + [sys.executable, "-m", "sequoia.runtime.measuring.target_probe", backend, str(cache_dir)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s,
                          cwd=Path(__file__).resolve().parents[3])
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise RuntimeError(f"the {backend} probe exited with {done.returncode}: {tail[0]}")
    return TargetProbe(**json.loads(lines[-1]))


def record(cache_dir: str | Path, key: str, probe: TargetProbe) -> None:
    """Put ``probe`` into the cache's probes under ``key`` (the start's own, so a later start reads it)."""
    path = Path(cache_dir) / CACHE_NAME
    kept = {b: replace(p, cached=False) for b, p in _read(path, key).items()}
    _write(path, key, {**kept, probe.backend: probe})


def start_key(cache_dir: str | Path, decision: RuntimeDecision, fallback: str) -> str:
    """The key the start kept its probes under, where the cache still holds the served runtime's probe as the
    decision read it (the server's torch threads may have changed since, and with them a key built now);
    ``fallback`` otherwise."""
    served = decision.estimate(decision.backend)
    try:
        data = json.loads((Path(cache_dir) / CACHE_NAME).read_text())
        kept = data["probes"][decision.backend]["tokens_per_s"]
    except (OSError, ValueError, KeyError, TypeError):
        return fallback
    same = served is not None and served.probe is not None and kept == served.probe.tokens_per_s
    return data.get("key", fallback) if same else fallback


def with_probes(decision: RuntimeDecision, probes: dict[str, TargetProbe]) -> RuntimeDecision:
    """``decision`` with ``probes`` in place of the start's for the same runtimes (its choice and reason kept)."""
    runtimes = tuple(replace(r, probe=probes.get(r.backend, r.probe)) for r in decision.runtimes)
    return replace(decision, runtimes=runtimes)


def served_probe(decision: RuntimeDecision, probes: dict[str, TargetProbe]) -> TargetProbe | None:
    """The served runtime's target alone: as re-timed in the background beside the others where it was, else as
    timed at start (None where neither timed it)."""
    served = decision.estimate(decision.backend)
    mine = probes.get(decision.backend) or (served.probe if served is not None else None)
    return None if mine is None or mine.bound else mine


def switch_offer(decision: RuntimeDecision, probes: dict[str, TargetProbe]) -> tuple[str, str] | None:
    """(backend, sentence) where a runtime timed in the background decoded its target alone faster than the
    served one, every step of it: its slowest step's rate above the served one's fastest (the bands apart, not
    only the medians: on the busy Xeon a start's llama.cpp probe once spread 0.1-5.6 tokens/s, median 1.6,
    under memory pressure, and torch's 1.9 would have been offered); None where none did.  The sentence gives
    both rates, their ratio and how."""
    mine = served_probe(decision, probes)
    if mine is None:
        return None
    timed = sorted((p for b, p in probes.items() if b != decision.backend and not p.bound),
                   key=lambda p: -p.tokens_per_s)
    if not timed or timed[0].low <= mine.high:
        return None
    best = timed[0]
    return best.backend, (
        f"{display_name(best.backend)} proved faster here: its target alone decoded {best.text} on one thread "
        f"against {display_name(decision.backend)}'s {mine.text}, {best.tokens_per_s / mine.tokens_per_s:.1f}x "
        f"(CPU time, timed in the background after start). Serve it: restart with "
        f"SEQUOIA_BACKEND={best.backend} python app.py, or just restart: the next start reads this result and "
        f"chooses it")


def outcome(decision: RuntimeDecision, probes: dict[str, TargetProbe]) -> str:
    """One sentence on what the background timing found (the switch offer, or why the served runtime stays)."""
    offer = switch_offer(decision, probes)
    if offer is not None:
        return offer[1]
    mine = served_probe(decision, probes)
    timed = [p for b, p in probes.items() if b != decision.backend and not p.bound]
    if not timed or mine is None:
        return ""
    others = " and ".join(f"{display_name(p.backend)}'s {p.text}" for p in timed)
    name = display_name(decision.backend)
    verdict = f"{name} stays the faster" if all(p.high < mine.low for p in timed) else \
        f"the same within noise (their steps' rates overlap), so {name} stays"
    return (f"Timed in the background since start: {others} against {name}'s {mine.text} (one thread, CPU "
            f"time): {verdict}")

