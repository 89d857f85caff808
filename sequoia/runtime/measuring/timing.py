"""One way to decode and time a method, shared by the bench, the app and the scripts.

The rule, the same for every caller and every method:

* **The timed span is the whole call**: prefill of the prompt, every step,
  and for Hugging Face methods ``generate``'s own setup, read on the engine's
  clock (:class:`~sequoia.runtime.engine.SpeculativeEngine` ``clock``; wall time
  by default) after draining the GPU queue.  The engine's draft / verify /
  other split reads the same clock, so the split and the total agree.
* **The first output is timed too** (``first_token_s``): for engine methods the
  end of step 0 (the prompt's forward), for Hugging Face methods the first
  new tokens ``generate`` hands its streamer.  The decode rate after it
  (``decode_tokens_per_s``) is what a method does once the prompt is read.
* **Warm-up is the caller's job**: call :func:`warmup` once before timing (a
  short untimed greedy run of every method to be timed), so first-call costs
  (allocator growth, kernel selection, lazy initialisation) land on no method.

Target forwards are counted the same way for every method, prefill included:
the target runner's ``forward_calls`` for engine methods, a forward pre-hook on
the model for Hugging Face's ``generate``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass, replace

import torch

from ...core.config import GenerationConfig
from ...core.statistics.trace import StepRecord
from ..checks.baselines import hf_generate
from ..drafter import Proposer
from ..engine import SpeculativeEngine, model_lock, sync
from ..texts import stop_test

#: Hugging Face ``generate`` baselines timed here like an engine method.
HF_METHODS = ("hf-generate", "hf-assisted", "hf-prompt-lookup")


@dataclass(frozen=True)
class RunResult:
    method: str
    prompt_set: str                   # filled in by the bench ("" elsewhere)
    prompt_index: int
    temperature: float
    prompt_tokens: int
    tokens: tuple[int, ...]           # generated tokens (prompt excluded, EOS kept)
    seconds: float                    # the whole call on the engine's clock, prefill included
    target_calls: int                 # target forwards, prefill included
    steps: int | None = None          # engine step records (None: a Hugging Face method)
    tree_size: float | None = None    # mean draft tokens per step after step 0, from what each drafted (engine methods)
    draft_s: float | None = None      # summed over steps (engine methods)
    verify_s: float | None = None
    other_s: float | None = None
    reference: str | None = None      # the target-only greedy run compared with (T=0)
    matches_reference: bool | None = None
    agree_prefix: int | None = None   # leading tokens equal to the reference's
    load1: float | None = None        # the OS 1-minute load average after the run (a shared machine shows here)
    wall_s: float | None = None       # wall time of the call (differs from ``seconds`` on the process clock)
    first_token_s: float | None = None  # from the call to its first new tokens: the prompt's forward, mostly
    first_tokens: int = 0             # tokens out at that time (engine: 1; HF assisted: its first verified draft too)
    round: int = 0                    # the bench's timed round this run belongs to (0-based; 0 elsewhere)

    @property
    def new_tokens(self) -> int:
        return len(self.tokens)

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def decode_tokens_per_s(self) -> float | None:
        """Tokens after the first output over the time after it: the decode rate, without the prompt's forward
        (which every method pays alike, so on long prompts it shrinks every end-to-end ratio)."""
        if self.first_token_s is None:
            return None
        rest = self.seconds - self.first_token_s
        return (self.new_tokens - self.first_tokens) / rest if rest > 0 else None

    @property
    def ms_per_token(self) -> float:
        return 1000.0 * self.seconds / max(self.new_tokens, 1)

    @property
    def decode_ms_per_token(self) -> float:
        """ms a token after the prompt's forward (its first tokens out): what a profile's step costs predict.
        The whole call's :attr:`ms_per_token` where the first token's time was not recorded."""
        rest = self.new_tokens - self.first_tokens
        if self.first_token_s is None or rest <= 0:
            return self.ms_per_token
        return 1000.0 * max(self.seconds - self.first_token_s, 0.0) / rest

    @property
    def tokens_per_call(self) -> float:
        return self.new_tokens / self.target_calls if self.target_calls else 0.0

    @property
    def outside_steps_s(self) -> float | None:
        """Time outside the step records: the generator's own overhead (engine methods; the prompt's forward
        is step 0)."""
        if self.steps is None:
            return None
        return max(0.0, self.seconds - (self.draft_s + self.verify_s + self.other_s))

    def to_dict(self) -> dict:
        keys = ("method", "prompt_set", "prompt_index", "temperature", "prompt_tokens", "seconds", "target_calls",
                "steps", "tree_size", "draft_s", "verify_s", "other_s", "reference", "matches_reference",
                "agree_prefix", "load1", "wall_s", "first_token_s", "first_tokens", "round")
        out = {k: getattr(self, k) for k in keys}
        out.update(new_tokens=self.new_tokens, tokens_per_s=self.tokens_per_s,
                   decode_tokens_per_s=self.decode_tokens_per_s,
                   tokens_per_call=self.tokens_per_call, tokens=list(self.tokens))
        return out


def run_method(engine: SpeculativeEngine, pair, method: str, ids: list[int], gen: GenerationConfig,
               proposer: Proposer | None = None) -> RunResult:
    """One timed run of ``method`` on one prompt (see the module docstring for what is timed).

    ``method`` is one of :data:`HF_METHODS` or any engine method, whose ``proposer`` is then required.
    """
    return run_with_records(engine, pair, method, ids, gen, proposer)[1]


def run_with_records(engine: SpeculativeEngine, pair, method: str, ids: list[int], gen: GenerationConfig,
                     proposer: Proposer | None = None) -> tuple[list[StepRecord], RunResult]:
    """:func:`run_method` that keeps the step records (none for HF methods): for scripts that read each step."""
    steps = iter_run(engine, pair, method, ids, gen, proposer)
    records: list[StepRecord] = []
    while True:
        try:
            records.append(next(steps))
        except StopIteration as done:
            return records, done.value


def iter_run(engine: SpeculativeEngine, pair, method: str, ids: list[int], gen: GenerationConfig,
             proposer: Proposer | None = None) -> Generator[StepRecord, None, RunResult]:
    """:func:`run_method` that yields each step record as it comes (none for HF methods) and returns the result.

    Only the time inside the engine counts: pauses of whoever consumes the records are left out.
    Closing the generator ends the run between two steps and frees its caches.
    """
    clock = engine.clock
    if method not in HF_METHODS and proposer is None:
        raise ValueError(f"method {method!r} needs a proposer")
    records: list[StepRecord] = []
    seconds = wall = 0.0
    first_s, first_n = None, 0
    before = pair.target.forward_calls   # engine methods: every session forward of the target
    if method in HF_METHODS:
        # Under the pair's one model lock, as every engine step is: Hugging Face generate runs the target's
        # module outside the engine, and the background profiler or a graph capture may hold its runners.
        with model_lock(pair):
            w0, t0 = time.perf_counter(), clock()
            hf = hf_generate(pair, ids, gen, assisted=method == "hf-assisted",
                             prompt_lookup=method == "hf-prompt-lookup", clock=clock)
            sync(pair.device)
            seconds, wall = clock() - t0, time.perf_counter() - w0
        tokens, first_s, first_n = hf.tokens, hf.first_token_s, hf.first_tokens
        calls = hf.target_calls
    else:
        # Stop strings, as the Hugging Face baselines honour them (no texts: nothing here shows them).
        steps = engine.generate(ids, proposer, gen, stop=stop_test(pair.tokenizer, gen.stop_strings))
        try:
            while True:
                w0, t0 = time.perf_counter(), clock()
                rec = next(steps, None)  # the first record is the prompt's forward
                sync(pair.device)
                seconds, wall = seconds + clock() - t0, wall + time.perf_counter() - w0
                if rec is None:
                    break
                if not records:
                    first_s, first_n = seconds, len(rec.new_tokens)
                records.append(rec)
                yield rec
        finally:
            steps.close()
        tokens = tuple(t for r in records for t in r.new_tokens)
        calls = pair.target.forward_calls - before
    base = RunResult(method=method, prompt_set="", prompt_index=0, temperature=gen.sampling.temperature,
                     prompt_tokens=len(ids), tokens=tuple(tokens), seconds=seconds, target_calls=calls,
                     wall_s=wall, first_token_s=first_s, first_tokens=first_n)
    if method in HF_METHODS:
        return base
    drafting = [r for r in records if not r.prompt_tokens]   # the prompt's forward (step 0) drafts nothing
    return replace(base, steps=len(records), tree_size=sum(r.tree.size for r in drafting) / max(len(drafting), 1),
                   draft_s=sum(r.draft_s for r in records), verify_s=sum(r.verify_s for r in records),
                   other_s=sum(r.other_s for r in records))


def warmup(engine: SpeculativeEngine, pair, ids: list[int], runs: Iterable[tuple[str, Proposer | None]],
           tokens: int = 8, seed: int = 0) -> None:
    """One short untimed greedy run of every (method, proposer) on ``ids``: first-call costs stay out of the numbers."""
    if tokens < 1:
        return
    gen = GenerationConfig(max_new_tokens=tokens, seed=seed)
    for method, proposer in runs:
        run_method(engine, pair, method, ids, gen, proposer)


def process_clock() -> Callable[[], float]:
    """This process's CPU time, for a busy shared machine (pass it as the engine's ``clock``).

    Other processes stealing the cores then do not show in the numbers.  With
    ONE torch thread CPU time is what the run would take on a core of its own
    (memory and cache contention aside); with several it sums them, so it is refused.
    """
    if torch.get_num_threads() != 1:
        raise ValueError("the process clock needs exactly one torch thread (--threads 1)")
    return time.process_time
