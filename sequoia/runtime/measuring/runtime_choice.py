"""Which runtime this machine runs the pair fastest on, chosen from measured costs.

:func:`decide` is the rule, a pure function of what it is given:

1. Models named as Hugging Face ids or folders load on ``hf`` only; two ``.gguf`` files on ``llamacpp``, a
   ``.gguf`` draft beside another target on ``mixed``.  The rest applies to the embedded pair.
2. On a GPU: ``hf``, which runs both models on the graph runner (llama.cpp is built for the CPU here).
3. Without llama-cpp-python: ``hf``, the only runtime installed.
4. Every installed runtime has a profile for this CPU kind: the one whose best method (the target alone or
   the optimizer's best tree, :func:`sequoia.core.trees.optimizer.choose_tree`) predicts the most tokens/s.
5. Torch and llama.cpp are not both profiled, and their targets alone were timed here
   (:mod:`sequoia.runtime.measuring.target_probe`, a few seconds each): the one whose target alone ran
   fastest (on the 2-vCPU Xeon with AMX, llama.cpp at 1.8x torch with two threads: docs/data/race-xeon-amx-quiet.json);
   another than llama.cpp only where its slowest step beats llama.cpp's fastest (else the same within noise).
   At start torch gets a bound instead; a bound never outranks a timed rate (it is timed in the background
   after the served pair is ready: :mod:`sequoia.runtime.measuring.background_probe`).
6. Some have none, llama.cpp among them, and the CPU has no bf16 matrix kernels (no AVX-512-BF16 or AMX):
   ``llamacpp``.  There torch's bf16 target was measured at a quarter of llama.cpp's rate (docs/benchmarks.md,
   AVX2 EPYC, code prompts: 2.3 against 9.5 tokens/s end to end), and no tree paid on either runtime.
7. Otherwise: the fastest of those measured; none measured (a probe failed): ``llamacpp``, whose target alone
   was the faster on every CPU kind measured (docs/benchmarks.md).

:func:`choose_runtime` gathers the facts (device, CPU features, whether llama-cpp-python imports) and the
profiles (:mod:`sequoia.runtime.measuring.finder`: cached or shipped for this machine's fingerprint, else a shipped one
of the same CPU kind measured with another thread count) and calls :func:`decide`.  An explicit backend
(``SEQUOIA_BACKEND``, ``--backend``) still wins: :meth:`RuntimeDecision.overridden`.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import torch

from ..._meta import ASSETS
from ...core.profiles.fingerprint import Fingerprint
from ...core.profiles.profile import HardwareProfile
from ...core.profiles.runtimes import (BACKENDS, FoundProfile, Machine, RuntimeDecision, RuntimeEstimate,  # noqa: F401
                                       TargetProbe, display_name)
from ...core.trees.optimizer import choose_tree
from ...runners.hf.cpu import cpu_facts
from ...runners.hf.kernels import default_draft_scheme
from ...runners.hf.loading import EMBEDDED_NAME, resolve_device, resolve_dtype
from .finder import find_acceptance, find_profile
from .fingerprint import expected_fingerprint
from .target_probe import PROBED, assemble_draft, probe_key, probe_runtimes

#: The largest tree and depth the choice considers (the Hardware tab's defaults).
MAX_BUDGET, MAX_DEPTH = 128, 12


# ------------------------------------------------------------------------------------------- the rule
def decide(machine: Machine, profiles: Mapping[str, FoundProfile], acceptance: Sequence[float],
           max_budget: int = MAX_BUDGET, max_depth: int = MAX_DEPTH,
           probes: Mapping[str, TargetProbe] | None = None) -> RuntimeDecision:
    """The runtime to serve on (see the module doc for the rule); ``profiles``: backend -> its profile here;
    ``probes``: backend -> its target alone timed here (:func:`needs_probes` says when they are wanted)."""
    open_ = needs_probes(machine, profiles)   # probes rank the runtimes only where the profiles do not
    probes = {b: p for b, p in (probes or {}).items() if b in open_}
    runtimes = tuple(replace(_estimate(b, machine, profiles.get(b), acceptance, max_budget, max_depth),
                             probe=probes.get(b)) for b in BACKENDS)
    backend, reason = _rule(machine, runtimes)
    return RuntimeDecision(backend, reason, runtimes, machine=machine)


def needs_probes(machine: Machine, profiles: Mapping[str, FoundProfile]) -> tuple[str, ...]:
    """The runtimes whose target alone should be timed before choosing: torch's and llama.cpp's, where both are
    installed for the embedded pair on a CPU and the profiles do not rank the two (empty otherwise)."""
    if machine.fixed_by_models or machine.device_kind != "cpu" or not machine.llamacpp_installed:
        return ()
    return () if all(b in profiles for b in PROBED) else PROBED


def _rule(machine: Machine, runtimes: tuple[RuntimeEstimate, ...]) -> tuple[str, str]:
    if machine.fixed_by_models:
        return machine.fixed_by_models, _MODELS_REASON[machine.fixed_by_models]
    if machine.device_kind == "cuda":
        return "hf", "on a GPU the Hugging Face runtime runs both models on the graph runner (CUDA graphs)"
    if not machine.llamacpp_installed:
        return "hf", "llama-cpp-python is not installed, so the Hugging Face runtime is the only one here"
    installed = [r for r in runtimes if r.installed]
    measured = sorted((r for r in installed if r.measured), key=lambda r: -r.tokens_per_s)
    if measured and len(measured) == len(installed):
        return measured[0].backend, _fastest_reason(measured)
    missing = " and ".join(display_name(r.backend) for r in installed if not r.measured) + " not measured here"
    # a bound is no rate: the timed rank first, and a bound above them waits for its background timing
    probed = sorted((r for r in installed if r.probe is not None), key=lambda r: (r.probe.bound, -r.probe.tokens_per_s))
    if len(probed) >= 2 and not probed[0].probe.bound:
        best, plain = probed[0], next((r for r in probed if r.backend == "llamacpp" and not r.probe.bound), None)
        if best.backend != "llamacpp" and plain is not None and best.probe.low <= plain.probe.high:
            return "llamacpp", _tied_reason(best, plain)   # not proven faster: no conversion for noise
        return best.backend, _probed_reason(probed)
    llamacpp_measured = any(r.backend == "llamacpp" for r in measured)
    if not machine.bf16_kernels and not llamacpp_measured:
        return "llamacpp", (f"this CPU has no bf16 matrix kernels (no AVX-512-BF16 or AMX), where torch's bf16 "
                            f"target runs at about a quarter of llama.cpp's rate (measured on an AVX2 EPYC); "
                            f"{missing}")
    if measured:
        return measured[0].backend, _fastest_reason(measured) + f"; {missing}"
    return "llamacpp", ("no runtime is measured on this CPU kind; llama.cpp's target alone was the faster on "
                        "every CPU kind measured, bf16 matrix kernels or not (2-vCPU Zen 4 with AVX-512-BF16: 22-24 "
                        "against torch's 8.1-8.8 tokens/s; 2-vCPU Xeon with AMX: 10.2 against 5.6; AVX2 EPYC: 9.5 "
                        "against 2.3)")


_MODELS_REASON = {
    "hf": "the models are named as Hugging Face ids or folders, which only the Hugging Face runtime loads",
    "llamacpp": "both models are .gguf files, which llama.cpp reads as they are",
    "mixed": "the draft is a .gguf file beside a Hugging Face target",
}


def _fastest_reason(measured: Sequence[RuntimeEstimate]) -> str:
    best, rest = measured[0], measured[1:]
    text = f"{display_name(best.backend)} predicts {best.tokens_per_s:.1f} tokens/s here ({best.method})"
    if rest:
        text += " against " + " and ".join(f"{r.tokens_per_s:.1f} on {display_name(r.backend)}" for r in rest)
    return text + ", from the profiles measured for this CPU kind"


def _probed_reason(probed: Sequence[RuntimeEstimate]) -> str:
    best, rest = probed[0], probed[1:]
    against = " and ".join(f"{r.probe.text} on {display_name(r.backend)}" if r.probe.bound else
                           f"{r.probe.tokens_per_s:.1f} ({r.probe.low:.1f}-{r.probe.high:.1f}) on "
                           f"{display_name(r.backend)}" for r in rest)
    when = "at an earlier start or in its background" if best.probe.cached else "at start"
    ratio = "" if rest[0].probe.bound else f", {best.probe.tokens_per_s / max(rest[0].probe.tokens_per_s, 1e-9):.1f}x"
    later = [display_name(r.backend) for r in rest if r.probe.bound and r.probe.tokens_per_s >= best.probe.tokens_per_s]
    waits = (f"; {' and '.join(later)} could be faster by that bound and is timed in the background once the "
             f"models are ready (the banner offers it if it proves faster)") if later else ""
    return (f"its target alone decoded {best.probe.text} on one thread here against {against}{ratio} "
            f"(timed {when}, CPU time){waits}; no profile ranks the runtimes on this CPU kind yet")


def _tied_reason(best: RuntimeEstimate, plain: RuntimeEstimate) -> str:
    """llama.cpp kept where another's median is higher but the steps' rates overlap (the background timing's
    banner says the same): a switch to torch costs its bf16 conversion, a minute or more."""
    when = "at an earlier start or in its background" if plain.probe.cached else "at start"
    return (f"its target alone decoded {plain.probe.text} on one thread here against {best.probe.text} on "
            f"{display_name(best.backend)}: the same within noise (their steps' rates overlap), and llama.cpp loads "
            f"without a conversion (timed {when}, CPU time); no profile ranks the runtimes on this CPU kind yet")


def _estimate(backend: str, machine: Machine, found: FoundProfile | None, acceptance: Sequence[float],
              max_budget: int, max_depth: int) -> RuntimeEstimate:
    installed = backend == "hf" or machine.llamacpp_installed
    if found is None:
        return RuntimeEstimate(backend, installed)
    prof = found.profile
    choice = choose_tree(acceptance, prof, max_budget=min(max_budget, prof.max_tokens - 1), max_depth=max_depth)
    method = f"Sequoia n={choice.budget} d={choice.depth}" if choice.budget else "target alone"
    models = _stored(prof.fingerprint) if prof.fingerprint else ""
    return RuntimeEstimate(backend, installed, 1000.0 / choice.ms_per_token, 1000.0 / choice.baseline_ms, method,
                           found.source, models)


def _stored(fp: Fingerprint) -> str:
    """How the two models are stored, e.g. "target bf16, draft int4" or "target Q4_K_M, draft Q4_K_M"."""
    def one(dtype: str, quant: str) -> str:
        return quant if quant != "none" else dtype or "unknown"
    return f"target {one(fp.target_dtype, fp.target_quant)}, draft {one(fp.draft_dtype, fp.draft_quant)}"


# ------------------------------------------------------------------------------------ the facts here
def runtime_fixed_by(draft: str, target: str) -> str:
    """The runtime the model names leave: "" for the embedded pair (any), else hf, llamacpp or mixed."""
    if draft == EMBEDDED_NAME and target == EMBEDDED_NAME:
        return ""
    gguf = [str(name).lower().endswith(".gguf") for name in (draft, target)]
    return "llamacpp" if all(gguf) else "mixed" if gguf[0] else "hf"


def machine_here(device: str | None = None, draft: str = EMBEDDED_NAME, target: str = EMBEDDED_NAME) -> Machine:
    """This machine's facts for a pair named ``draft`` / ``target`` loading on ``device`` (None: cuda if any)."""
    try:
        kind = resolve_device(device).type
    except ValueError:   # e.g. cuda asked for and absent: the loader fails with its own message, on the page
        kind = "cuda" if str(device).startswith("cuda") else "cpu"
    return Machine(device_kind=kind, cpu_features=cpu_facts()[1],
                   llamacpp_installed=importlib.util.find_spec("llama_cpp") is not None,
                   fixed_by_models=runtime_fixed_by(draft, target))


def expected_fingerprint_for(backend: str, machine: Machine) -> Fingerprint:
    """This machine's fingerprint for the embedded pair on ``backend`` as it loads by default (no pair name)."""
    device = torch.device(machine.device_kind)
    return expected_fingerprint(device, resolve_dtype("auto", device),
                                default_draft_scheme(device.type, machine.cpu_features),
                                backend=backend)


def profiles_here(machine: Machine, cache_dir: str | Path | None = None, assets_dir: str | Path = ASSETS,
                  known: Mapping[str, FoundProfile] | None = None) -> dict[str, FoundProfile]:
    """backend -> its profile on this machine: ``known`` first (the loaded pair's own), else the finder's
    cached or shipped match, else a shipped profile of the same CPU kind measured with other threads.
    On a GPU only the Hugging Face runtime is looked up (llama.cpp is built for the CPU)."""
    out = dict(known or {})
    for backend in BACKENDS if machine.device_kind == "cpu" else ("hf",):
        if backend in out:
            continue
        fp = expected_fingerprint_for(backend, machine)
        choice = find_profile(fp, cache_dir=cache_dir, assets_dir=assets_dir)
        if choice.profile is not None:
            out[backend] = FoundProfile(choice.profile, choice.source)
        elif (kin := same_cpu_kind(fp, assets_dir)) is not None:
            out[backend] = kin
    return out


def same_cpu_kind(fp: Fingerprint, assets_dir: str | Path = ASSETS) -> FoundProfile | None:
    """A shipped profile whose fingerprint differs from ``fp`` in the thread count only: its costs rank the
    runtimes of this CPU kind, though the rates are those of its own thread count (the source says which)."""
    for path in sorted((Path(assets_dir) / "profiles").glob("*.json")):
        try:
            prof = HardwareProfile.load(path)
        except (ValueError, OSError):
            continue
        if prof.fingerprint is not None and prof.matches(replace(fp, threads=prof.fingerprint.threads)):
            return FoundProfile(prof, f"shipped {path.name}, measured with {prof.fingerprint.threads} threads")
    return None


def choose_runtime(device: str | None = None, draft: str = EMBEDDED_NAME, target: str = EMBEDDED_NAME,
                   cache_dir: str | Path | None = None, assets_dir: str | Path = ASSETS,
                   acceptance: Sequence[float] | None = None,
                   known: Mapping[str, FoundProfile] | None = None, probe: bool = False,
                   log: Callable[[str], None] | None = None, time_now: bool = False) -> RuntimeDecision:
    """:func:`decide` with this machine's facts and profiles; ``acceptance`` defaults to the code prompts'
    greedy vector (the Hardware tab's default), so the page's "fastest" line and this choice agree.
    ``probe``: where the profiles do not rank torch and llama.cpp, rank them by each one's target alone as
    timed here (kept in ``cache_dir``; :mod:`sequoia.runtime.measuring.target_probe`): read from the cache, and
    with ``time_now`` timed first where it holds none (a few seconds each).  The app's start does not time
    them: its background work does, once the models are ready (:mod:`.background_probe`), and a start
    at a load of 24 on the 2-vCPU Xeon took 41 s with them timed against 23 s without."""
    machine = machine_here(device, draft, target)
    if acceptance is None:
        acceptance = find_acceptance("code", 0.0, assets_dir).values
    profiles = profiles_here(machine, cache_dir, assets_dir, known)
    wanted = needs_probes(machine, profiles) if probe and cache_dir is not None else ()
    probes = probe_runtimes(wanted, cache_dir, probe_key(machine.cpu_features), log=log, time_now=time_now,
                            meanwhile=assemble_draft if draft == EMBEDDED_NAME else None) if wanted else {}
    return decide(machine, profiles, acceptance, probes=probes)


def decision_from(explicit: str | None, by: str, **kwargs) -> RuntimeDecision:
    """:func:`choose_runtime`, overridden by ``explicit`` when given (``by`` names where it came from)."""
    decision = choose_runtime(**kwargs)
    name = (explicit or "").strip().lower()
    return decision.overridden(name, by) if name else decision
