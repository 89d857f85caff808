"""Side-by-side benchmark of every decoding method on one pair, in one process.

Methods run *interleaved*: for each prompt and temperature every method runs
once before the next prompt starts (their order rotates from prompt to
prompt), so slow drift of a shared machine (thermal state, other processes)
lands on all methods alike instead of on whichever ran last.

Per run the bench records the wall time of the whole call (prefill included,
for the engine as for Hugging Face), the generated tokens, and the number of
target forwards (a forward pre-hook counts them the same way for every
method, prefill included).  Engine methods also keep the draft / verify /
other split summed from their step records.  At temperature 0 each output is
compared token for token with target-only greedy decoding (``hf-generate``,
else the engine's ``ar``).  Summaries are medians over the prompts of one
prompt set (:mod:`sequoia.tools.bench_report`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .._meta import Progress, ProgressFn, now_iso, pair_name
from ..core.config import GenerationConfig, SamplingConfig
from ..core.tree import Tree
from ..runtime.baselines import count_forwards

#: Methods in the order the report lists them.
BENCH_METHODS = ("hf-generate", "ar", "hf-assisted", "chain", "specinfer", "sequoia", "sequoia-dynamic")
HF_METHODS = ("hf-generate", "hf-assisted")
#: Target-only greedy references, best first: outputs at T=0 are compared with the first one run.
REFERENCES = ("hf-generate", "ar")
#: The real wall clock, kept before :func:`process_clock` can swap ``time.perf_counter``.
_WALL_CLOCK = time.perf_counter


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


@dataclass(frozen=True)
class RunResult:
    method: str
    prompt_set: str
    prompt_index: int
    temperature: float
    prompt_tokens: int
    tokens: tuple[int, ...]           # generated tokens (prompt excluded, EOS kept)
    seconds: float                    # wall time of the whole call, prefill included
    target_calls: int                 # target forwards, prefill included
    steps: int | None = None          # engine step records (None: a Hugging Face method)
    tree_size: int | None = None      # draft tokens per step (engine methods)
    draft_s: float | None = None      # summed over steps (engine methods)
    verify_s: float | None = None
    other_s: float | None = None
    reference: str | None = None      # the target-only greedy run compared with (T=0)
    matches_reference: bool | None = None
    agree_prefix: int | None = None   # leading tokens equal to the reference's
    load1: float | None = None        # the OS 1-minute load average after the run (a shared machine shows here)
    wall_s: float | None = None       # wall time, when ``seconds`` is process CPU time (see process_clock)

    @property
    def new_tokens(self) -> int:
        return len(self.tokens)

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def tokens_per_call(self) -> float:
        return self.new_tokens / self.target_calls if self.target_calls else 0.0

    @property
    def outside_steps_s(self) -> float | None:
        """Wall time outside the step records: prefill and generator overhead (engine methods)."""
        if self.steps is None:
            return None
        return max(0.0, self.seconds - (self.draft_s + self.verify_s + self.other_s))

    def to_dict(self) -> dict:
        keys = ("method", "prompt_set", "prompt_index", "temperature", "prompt_tokens", "seconds", "target_calls",
                "steps", "tree_size", "draft_s", "verify_s", "other_s", "reference", "matches_reference",
                "agree_prefix", "load1", "wall_s")
        out = {k: getattr(self, k) for k in keys}
        out.update(new_tokens=self.new_tokens, tokens_per_s=self.tokens_per_s,
                   tokens_per_call=self.tokens_per_call, tokens=list(self.tokens))
        return out


@dataclass
class BenchResult:
    config: BenchConfig
    pair: str
    device: str
    runs: list[RunResult] = field(default_factory=list)
    trees: list[TreeChoice] = field(default_factory=list)
    profile: dict | None = None       # the hardware profile the optimizer used
    clock: str = "wall"               # "wall", or "process" (CPU time of this process, one thread)
    started: str = ""
    seconds: float = 0.0              # whole bench, warm-up included (wall time)


# ---------------------------------------------------------------------------- prompts
def load_prompt_sets(spec: str, assets_dir: str | Path, limit: int | None = None) -> list[PromptSet]:
    """``spec`` is a comma-separated list of shipped set names (``code``, ``chat``) or JSONL paths."""
    from ..runtime.acceptance import load_prompts

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
) -> BenchResult:
    """Run every method on every prompt and temperature, interleaved; see the module docstring.

    ``checkpoint`` is called with the result so far after every (prompt, temperature) group.
    ``dynamic`` maps (prompt set, temperature) to the ``sequoia-dynamic`` proposer to run there
    (see :func:`sequoia.tools.bench_trees.dynamic_proposers`).
    """
    from ..runtime.engine import SpeculativeEngine

    proposers = make_proposers(config, prompt_sets, sequoia_trees, dynamic)
    engine = SpeculativeEngine(pair)
    encoded = [(s.name, i, encode(pair, p)) for s in prompt_sets for i, p in enumerate(s.prompts)]
    if not encoded:
        raise ValueError("the prompt sets hold no prompts")
    result = BenchResult(config=config, pair=pair_name(pair), device=_describe(pair), trees=list(sequoia_trees),
                         started=now_iso())
    start = _WALL_CLOCK()
    if config.warmup_tokens:
        _warmup(engine, pair, encoded[0], config, proposers)
    tick = Progress(len(encoded) * len(config.temperatures) * len(config.methods), progress, "bench")
    try:
        for n, (set_name, index, ids) in enumerate(encoded):
            for temp in config.temperatures:
                gen = GenerationConfig(max_new_tokens=config.max_new_tokens,
                                       sampling=SamplingConfig(temperature=temp), seed=config.seed + index)
                group = []
                for method in _rotated(config.methods, n):
                    run = run_method(engine, pair, method, ids, gen, proposers.get((method, set_name, temp)))
                    group.append(_label(run, set_name, index))
                    tick(f"{set_name}#{index} T={temp:g} {method}: {run.tokens_per_s:.2f} tok/s")
                result.runs.extend(_compare_with_reference(group) if temp == 0 else group)
                if checkpoint is not None:
                    result.seconds = _WALL_CLOCK() - start
                    checkpoint(result)
    finally:
        tick.close()
    result.seconds = _WALL_CLOCK() - start
    return result


def make_proposers(config: BenchConfig, prompt_sets: Sequence[PromptSet],
                   sequoia_trees: Sequence[TreeChoice], dynamic: Mapping | None = None) -> dict:
    """(method, prompt set, temperature) -> proposer, for the engine methods."""
    from ..runtime.drafter import StaticTreeProposer
    from ..runtime.methods import make_method

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
                elif method == "sequoia-dynamic":
                    if (s.name, temp) not in (dynamic or {}):
                        raise ValueError(f"no dynamic proposer given for prompt set {s.name!r} at T={temp:g}")
                    out[(method, s.name, temp)] = dynamic[(s.name, temp)]
    return out


def run_method(engine, pair, method: str, ids: list[int], gen: GenerationConfig, proposer=None) -> RunResult:
    """One timed run of ``method`` on one prompt (prompt set and index are filled in by the caller)."""
    if method in HF_METHODS:
        from ..runtime.baselines import hf_generate

        wall = _WALL_CLOCK()
        with count_forwards(pair.target) as calls:
            base = hf_generate(pair, ids, gen, assisted=method == "hf-assisted")
        return RunResult(method=method, prompt_set="", prompt_index=0, temperature=gen.sampling.temperature,
                         prompt_tokens=len(ids), tokens=base.tokens, seconds=base.seconds, target_calls=calls[0],
                         wall_s=_WALL_CLOCK() - wall)
    if proposer is None:
        raise ValueError(f"method {method!r} needs a proposer")
    with count_forwards(pair.target) as calls:
        wall, start = _WALL_CLOCK(), time.perf_counter()
        records = list(engine.generate(ids, proposer, gen, with_texts=False))
        _sync(pair.device)
        seconds, wall = time.perf_counter() - start, _WALL_CLOCK() - wall
    return RunResult(
        method=method, prompt_set="", prompt_index=0, temperature=gen.sampling.temperature,
        prompt_tokens=len(ids), tokens=tuple(t for r in records for t in r.new_tokens), seconds=seconds,
        target_calls=calls[0], steps=len(records), tree_size=proposer.tree.size, wall_s=wall,
        draft_s=sum(r.draft_s for r in records), verify_s=sum(r.verify_s for r in records),
        other_s=sum(r.other_s for r in records),
    )


@contextmanager
def process_clock():
    """Within the block, ``time.perf_counter`` reports this process's CPU time.

    On a shared machine other processes steal the cores, and wall times then
    measure the neighbours as much as the method.  With ONE torch thread, CPU
    time is what the run would take on a core of its own (memory and cache
    contention aside), and every timer in the stack (the engine's step split,
    Hugging Face runs, hardware profiling) reads it alike.  With several
    threads CPU time sums them, so callers must pin torch to one thread.
    """
    if torch.get_num_threads() != 1:
        raise ValueError("the process clock needs exactly one torch thread (--threads 1)")
    saved = time.perf_counter
    time.perf_counter = time.process_time
    try:
        yield
    finally:
        time.perf_counter = saved


def _warmup(engine, pair, first, config: BenchConfig, proposers: dict) -> None:
    """One short untimed run of every method: first-call costs (allocator, kernels) stay out of the numbers."""
    set_name, _, ids = first
    gen = GenerationConfig(max_new_tokens=config.warmup_tokens, seed=config.seed)
    for method in config.methods:
        run_method(engine, pair, method, ids, gen, proposers.get((method, set_name, config.temperatures[0])))


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


def _label(run: RunResult, set_name: str, index: int) -> RunResult:
    from dataclasses import replace

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return replace(run, prompt_set=set_name, prompt_index=index, load1=load)


def _compare_with_reference(group: list[RunResult]) -> list[RunResult]:
    """At T=0: flag every run whose tokens differ from target-only greedy decoding of the same prompt."""
    from dataclasses import replace

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
    from ..runtime.profiling import describe_device

    return describe_device(torch.device(pair.device))


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
