"""Side-by-side benchmark of every decoding method on one pair, in one process.

Methods run *interleaved*: for each prompt and temperature every method runs
once before the next prompt starts (their order rotates from prompt to
prompt), so slow drift of a shared machine (thermal state, other processes)
lands on all methods alike instead of on whichever ran last.  With
``rounds`` R > 1 each prompt gets R such rounds back to back (A B C A B C),
as the Compare tab runs them: the report pairs each run with the target
alone's of the same round and shows the round-to-round spread of each ratio
beside its median (:mod:`sequoia.core.statistics.rounds`).

Each run goes through :func:`sequoia.runtime.measuring.timing.run_method`, whose rule
the app and the scripts share: the whole call is timed (prefill included, for
the engine as for Hugging Face) on the engine's clock, after one untimed
warm-up run of every method (:func:`sequoia.runtime.measuring.timing.warmup`).  A run
records the generated tokens, the target forwards (prefill included), the
mean tree size each step drafted, and for engine methods the draft / verify /
other split summed from their step records.  At temperature 0 each output is
compared token for token with target-only greedy decoding (``hf-generate``,
else the engine's ``ar``).  Summaries are medians over the prompts of one
prompt set (:mod:`sequoia.tools.bench_report`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from .._meta import Progress, ProgressFn, now_iso, pair_name
from ..core.config import GenerationConfig, SamplingConfig
from ..core.ngrams.ngram_acceptance import NgramAcceptance
from ..core.trees.tree import Tree
from ..runtime.drafter import StaticTreeProposer
from ..runtime.engine import SpeculativeEngine
from ..runtime.measuring.acceptance import load_prompts
from ..runtime.measuring.profiling import describe_device
from ..runtime.measuring.timing import RunResult, run_method, warmup
from ..runtime.methods import make_method
from ..runtime.proposers.dynamic import DynamicTreeProposer

#: Methods in the order the report lists them: the target alone, Hugging Face's two kinds of drafting (the
#: draft model, copies from the prompt), the engine's trees, then the n-gram ones (copies only; copies + draft).
BENCH_METHODS = ("hf-generate", "ar", "hf-assisted", "hf-prompt-lookup", "chain", "specinfer", "sequoia",
                 "sequoia-auto", "sequoia-dynamic", "ngram", "sequoia-ngram")
#: The engine methods priced per workload like ``sequoia-dynamic`` (its profile, acceptance prior and
#: calibration, from the ``dynamic`` proposers given to :func:`run_bench`).  ``sequoia-auto`` is the optimizer's
#: tree under the price gate, as the page runs it (``sequoia``: the same tree without the gate).
WORKLOAD_METHODS = ("sequoia-auto", "sequoia-dynamic", "ngram", "sequoia-ngram")
#: Target-only greedy references, best first: outputs at T=0 are compared with the first one run.
REFERENCES = ("hf-generate", "ar")
#: The most timed rounds per prompt a bench may ask.
MAX_ROUNDS = 10


@dataclass(frozen=True)
class PromptSet:
    name: str                     # e.g. "code", or a JSONL file's stem
    prompts: tuple[str, ...]      # texts (chat-templated by the pair) or token-id tuples


@dataclass(frozen=True)
class BenchConfig:
    max_new_tokens: int = 128
    temperatures: tuple[float, ...] = (0.0, 0.6)
    methods: tuple[str, ...] = BENCH_METHODS
    seed: int = 0
    chain_budget: int = 5
    specinfer_width: int = 3
    specinfer_depth: int = 4
    warmup_tokens: int = 8        # one untimed run of every method first (0: none)
    rounds: int = 1               # timed rounds per prompt and temperature, every method once a round

    def __post_init__(self) -> None:
        unknown = [m for m in self.methods if m not in BENCH_METHODS]
        if unknown or not self.methods:
            raise ValueError(f"unknown bench method(s) {unknown}; choose from {', '.join(BENCH_METHODS)}")
        if len(set(self.methods)) != len(self.methods):
            raise ValueError("each bench method may be listed once")
        if not self.temperatures:
            raise ValueError("give at least one temperature")
        for t in self.temperatures:
            SamplingConfig(temperature=t)  # same validation as everywhere else
        GenerationConfig(max_new_tokens=self.max_new_tokens, seed=self.seed)
        if self.warmup_tokens < 0:
            raise ValueError("warmup_tokens must be >= 0")
        if not 1 <= self.rounds <= MAX_ROUNDS:
            raise ValueError(f"rounds must be in 1..{MAX_ROUNDS}, got {self.rounds}")


@dataclass(frozen=True)
class TreeChoice:
    """The Sequoia tree used for one (prompt set, temperature), and why."""

    prompt_set: str
    temperature: float
    tree: Tree
    acceptance: tuple[float, ...]     # [W] the vector the optimizer was given
    acceptance_source: str            # file path, or "default"
    predicted_speedup: float          # the optimizer's prediction over the target alone
    expected_tokens: float            # per step, predicted

    def to_dict(self) -> dict:
        return {"prompt_set": self.prompt_set, "temperature": self.temperature, "budget": self.tree.size,
                "depth": self.tree.depth, "parents": list(self.tree.parents), "acceptance": list(self.acceptance),
                "acceptance_source": self.acceptance_source, "predicted_speedup": self.predicted_speedup,
                "expected_tokens": self.expected_tokens}


@dataclass
class BenchResult:
    config: BenchConfig
    pair: str
    device: str
    runs: list[RunResult] = field(default_factory=list)
    trees: list[TreeChoice] = field(default_factory=list)
    profile: dict | None = None       # the hardware profile the optimizer used
    profile_reason: str = ""          # which profile that is and why (sequoia.runtime.measuring.finder)
    clock: str = "wall"               # "wall", or "process" (CPU time of this process, one thread)
    started: str = ""
    seconds: float = 0.0              # whole bench, warm-up included (wall time)


# ---------------------------------------------------------------------------- prompts
def load_prompt_sets(spec: str, assets_dir: str | Path, limit: int | None = None) -> list[PromptSet]:
    """``spec`` is a comma-separated list of shipped set names (``code``, ``chat``) or JSONL paths."""
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    sets = []
    for item in (s.strip() for s in spec.split(",")):
        if not item:
            continue
        shipped = Path(assets_dir) / f"{item}.jsonl"
        path = shipped if shipped.is_file() and not item.endswith(".jsonl") else Path(item)
        if not path.is_file():
            raise ValueError(f"no prompt set {item!r}: not a shipped set ({shipped.parent}) nor a JSONL file")
        sets.append(PromptSet(path.stem, tuple(load_prompts(path)[:limit])))
    if not sets:
        raise ValueError("no prompt sets given")
    if len({s.name for s in sets}) != len(sets):
        raise ValueError("two prompt sets share a name")
    return sets


# ---------------------------------------------------------------------------- running
def run_bench(
    pair,
    prompt_sets: Sequence[PromptSet],
    config: BenchConfig,
    sequoia_trees: Sequence[TreeChoice] = (),
    progress: ProgressFn | None = None,
    checkpoint: Callable[[BenchResult], None] | None = None,
    dynamic: Mapping[tuple[str, float], object] | None = None,
    clock: Callable[[], float] = time.perf_counter,
    copies: Mapping[tuple[str, float], NgramAcceptance | None] | None = None,
) -> BenchResult:
    """Run every method on every prompt and temperature, interleaved; see the module docstring.

    ``checkpoint`` is called with the result so far after every (prompt, temperature) group.
    ``dynamic`` maps (prompt set, temperature) to the ``sequoia-dynamic`` proposer to run there
    (see :func:`sequoia.tools.bench_trees.dynamic_proposers`); ``ngram`` and ``sequoia-ngram`` are built
    from its settings (:func:`make_proposers`).  ``clock`` times every run and the
    engine's step split (e.g. :func:`sequoia.runtime.measuring.timing.process_clock`); the bench's own duration is wall time.
    """
    proposers = make_proposers(config, prompt_sets, sequoia_trees, dynamic, copies)
    engine = SpeculativeEngine(pair, clock=clock)
    encoded = [(s.name, i, encode(pair, p)) for s in prompt_sets for i, p in enumerate(s.prompts)]
    if not encoded:
        raise ValueError("the prompt sets hold no prompts")
    result = BenchResult(config=config, pair=pair_name(pair), device=_describe(pair), trees=list(sequoia_trees),
                         started=now_iso())
    start = time.perf_counter()
    first_set, _, first_ids = encoded[0]
    warmup(engine, pair, first_ids, [(m, proposers.get((m, first_set, config.temperatures[0])))
                                     for m in config.methods], tokens=config.warmup_tokens, seed=config.seed)
    tick = Progress(len(encoded) * len(config.temperatures) * len(config.methods) * config.rounds, progress, "bench")
    try:
        for n, (set_name, index, ids) in enumerate(encoded):
            for temp in config.temperatures:
                gen = GenerationConfig(max_new_tokens=config.max_new_tokens,
                                       sampling=SamplingConfig(temperature=temp), seed=config.seed + index)
                for rnd in range(config.rounds):   # the same order every round: its runs pair up
                    group = []
                    for method in _rotated(config.methods, n):
                        run = run_method(engine, pair, method, ids, gen, proposers.get((method, set_name, temp)))
                        group.append(_label(run, set_name, index, rnd))
                        where = f" round {rnd + 1}/{config.rounds}" if config.rounds > 1 else ""
                        tick(f"{set_name}#{index} T={temp:g}{where} {method}: {run.tokens_per_s:.2f} tok/s")
                    result.runs.extend(_compare_with_reference(group) if temp == 0 else group)
                if checkpoint is not None:
                    result.seconds = time.perf_counter() - start
                    checkpoint(result)
    finally:
        tick.close()
    result.seconds = time.perf_counter() - start
    return result


def make_proposers(config: BenchConfig, prompt_sets: Sequence[PromptSet],
                   sequoia_trees: Sequence[TreeChoice], dynamic: Mapping | None = None,
                   copies: Mapping | None = None) -> dict:
    """(method, prompt set, temperature) -> proposer, for the engine methods.

    The :data:`WORKLOAD_METHODS` of one (prompt set, temperature) share the ``sequoia-dynamic`` proposer's
    plumbing: the same hardware profile, acceptance prior, calibration, budget and depth, so the n-gram
    methods are priced exactly as the dynamic tree they are compared with (``sequoia-auto``: its profile and
    acceptance, within the optimizer's own budget and depth limits, as the page runs it).
    """
    fixed = {
        "ar": make_method("ar"),
        "chain": make_method("chain", budget=config.chain_budget),
        "specinfer": make_method("specinfer", width=config.specinfer_width, depth=config.specinfer_depth),
    }
    trees = {(t.prompt_set, t.temperature): t.tree for t in sequoia_trees}
    out = {}
    for s in prompt_sets:
        for temp in config.temperatures:
            for method in config.methods:
                if method in fixed:
                    out[(method, s.name, temp)] = fixed[method]
                elif method == "sequoia":
                    if (s.name, temp) not in trees:
                        raise ValueError(f"no Sequoia tree given for prompt set {s.name!r} at T={temp:g}")
                    out[(method, s.name, temp)] = StaticTreeProposer(trees[(s.name, temp)], name="sequoia")
                elif method in WORKLOAD_METHODS:
                    if (s.name, temp) not in (dynamic or {}):
                        raise ValueError(f"no dynamic proposer given for prompt set {s.name!r} at T={temp:g} "
                                         f"(needed by {method})")
                    out[(method, s.name, temp)] = _like_dynamic(method, dynamic[(s.name, temp)],
                                                                   (copies or {}).get((s.name, temp)))
    return out


def _like_dynamic(method: str, dyn: DynamicTreeProposer, copy_acceptance: NgramAcceptance | None = None):
    """``method`` with the settings of the ``sequoia-dynamic`` proposer ``dyn`` (``dyn`` itself for that one);
    copied tokens priced by ``copy_acceptance`` (None: the prior)."""
    if method == "sequoia-dynamic":
        return dyn
    if method == "sequoia-auto":   # the optimizer's own budget and depth limits, as on the page
        return make_method("sequoia-auto", acceptance=dyn.acceptance, profile=dyn.profile)
    if method == "ngram":  # no draft model: only the profile prices its copies (its own copy budget)
        return make_method("ngram", profile=dyn.profile, depth=dyn.max_depth, copy_acceptance=copy_acceptance)
    return make_method(method, acceptance=dyn.acceptance, profile=dyn.profile, budget=dyn.budget,
                       depth=dyn.max_depth, calibration=dyn.calibration, copy_acceptance=copy_acceptance)


def encode(pair, prompt: str | Sequence[int]) -> list[int]:
    """A text prompt through the pair's chat template; token ids pass through."""
    if isinstance(prompt, str):
        return pair.encode_prompt(prompt)
    ids = [int(t) for t in prompt]
    if not ids:
        raise ValueError("a prompt has no tokens")
    return ids


def _rotated(methods: tuple[str, ...], n: int) -> tuple[str, ...]:
    k = n % len(methods)
    return methods[k:] + methods[:k]


def _label(run: RunResult, set_name: str, index: int, rnd: int = 0) -> RunResult:
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return replace(run, prompt_set=set_name, prompt_index=index, load1=load, round=rnd)


def _compare_with_reference(group: list[RunResult]) -> list[RunResult]:
    """At T=0: flag every run whose tokens differ from target-only greedy decoding of the same prompt."""
    by_method = {r.method: r for r in group}
    ref_name = next((m for m in REFERENCES if m in by_method), None)
    if ref_name is None:
        return group
    ref = by_method[ref_name].tokens
    out = []
    for r in group:
        if r.method == ref_name:
            out.append(r)
            continue
        prefix = next((i for i, (a, b) in enumerate(zip(r.tokens, ref)) if a != b), min(len(r.tokens), len(ref)))
        out.append(replace(r, reference=ref_name, matches_reference=r.tokens == ref, agree_prefix=prefix))
    return out


def _describe(pair) -> str:
    return describe_device(torch.device(pair.device))
