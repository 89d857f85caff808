"""Running a comparison: a warm-up round, then interleaved timed rounds (A B C A B C ...).

A table of single runs, one method after another, printed noise (issue 42: the target alone read 18.0, 12.6
and 12.3 tokens/s in three runs, and methods doing its very work read 1.21x-1.42x).  So every comparison, on
the page and through ``/compare``, runs:

1. a **warm-up round**: each method once, a few tokens, untimed (first-call costs land on no row; the
   llama.cpp reference loads here, on its first use); a method already warmed up on this pair by an earlier
   comparison skips it (those costs are paid once per process: ``AppContext.warmed``);
2. **R timed rounds**: each method once in turn, every round in the same order, so a machine's drift between
   rounds lands on all of them and each round's runs pair up (:mod:`sequoia.core.statistics.rounds`: the ratio of a
   method to the target alone is the median of its per-round ratios, its band their range).

Every run goes through :func:`sequoia.runtime.measuring.timing.iter_run`, the bench's rule (the whole call timed,
prefill included).  Rows grow as each run finishes: after round 1 every row shows one round, after round k
k rounds; the state says which round runs ("round k of R").
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass, field, replace

from sequoia.runtime.checks.exactness import is_exact
from sequoia.runtime.measuring.timing import RunResult, iter_run, run_method, warmup

from components.app_state import target_rate, validation
from components.app_state.context import AppContext
from components.app_state.decode_inputs import DecodeInputs
from components.compare import compare_view
from components.compare.compare_methods import ALIASES, METHODS, CompareMethod, choose_methods

#: Timed rounds when none is asked: three rounds give a median and a band whose ends are real runs.
DEFAULT_ROUNDS = 3
#: The most rounds one request may ask (each one is a run of every method).
MAX_ROUNDS = 10
#: Tokens of the untimed warm-up run of each method (first-call costs then land on none of the rounds).
WARMUP_TOKENS = 2
_HF_ERRORS = (ValueError, RuntimeError, NotImplementedError, TypeError)
#: What the progress line says loads before the llama.cpp reference's warm-up.
_LOADING_REFERENCE = "the llama.cpp reference (the target's shipped GGUF)"


@dataclass
class CompareState:
    """Where a comparison stands; :func:`iter_comparison` yields it whenever that changes."""

    total: int                                                  # methods to run
    max_tokens: int                                             # new tokens each run goes to
    rounds: int = DEFAULT_ROUNDS                                # timed rounds
    rows: list[compare_view.CompareRow] = field(default_factory=list)   # one per method with runs, identical set
    notes: list[str] = field(default_factory=list)              # e.g. why a Hugging Face baseline was skipped
    phase: str = "loading"                                      # "loading", "warming", "running" or "done"
    running: str | None = None                                  # method now warming up or running (None: done)
    round: int = 0                                              # the timed round now running, 1-based (0: warm-up)
    row: int = 0                                                # the method's place in its round, 1-based
    tokens: int | None = 0                                      # its tokens so far (None: it reports no steps)
    runs: int = 0                                               # timed runs finished so far
    plan: list = field(default_factory=list, repr=False)        # (method, context, engine inputs), warmed up
    shared: str = ""                                            # how long other programs held the cores meanwhile
    alone_decode: str = ""                                      # the target alone's decode rate in these rounds

    @property
    def fraction(self) -> float:
        if not self.running:
            return 1.0
        return max((self.round - 1) * self.total + self.row - 1, 0) / max(self.rounds * self.total, 1)

    def line(self) -> str:
        """The progress line (components.compare.compare_view.progress)."""
        return compare_view.progress(self.phase, self.running or "", self.row, self.total, self.tokens,
                                     self.max_tokens, self.round, self.rounds)


def _why_no_reference(ctx: AppContext) -> str:
    if ctx.loaded and ctx.pair().backend == "llamacpp":
        return "the pair runs on llama.cpp already, so the target alone is that reference"
    if ctx.loaded and is_exact(ctx.pair()):
        return "exact mode compares one runtime, its float32 target"
    return "this server has no GGUF of its target or no llama-cpp-python"


def row_of(label: str, runs: list[RunResult]) -> compare_view.CompareRow:
    """One method's row from its timed runs: medians of the times, every round's rate, the first run's output
    (at a fixed seed every round makes the same tokens)."""
    first = runs[0]
    return compare_view.CompareRow(
        label, tokens=first.new_tokens, seconds=statistics.median(r.seconds for r in runs),
        target_calls=first.target_calls, token_ids=first.tokens,
        first_token_s=statistics.median(r.first_token_s for r in runs) if first.first_token_s is not None else None,
        rates=tuple(r.tokens_per_s for r in runs),
        reference_work=all(r.new_tokens == r.target_calls for r in runs))


def _warmed(run_ctx: AppContext, m: CompareMethod, req) -> bool:
    """``m`` already warmed up on this pair (an earlier comparison in this process)."""
    return _warm_key(m, req) in run_ctx.warmed.get(run_ctx.pair(), ())


def _warm_up(run_ctx: AppContext, m: CompareMethod, req) -> None:
    """A short untimed greedy run of ``m`` on the prompt, as the bench does before timing; remembered on the
    pair when it worked."""
    pair = run_ctx.pair()
    runs = [(m.hf, None)] if m.hf else [(req.proposer.name, req.proposer)]
    try:
        warmup(run_ctx.engine(), pair, req.prompt_ids, runs, min(WARMUP_TOKENS, req.config.max_new_tokens))
    except _HF_ERRORS:
        if not m.hf:
            raise   # a Hugging Face baseline's row says why when it runs
        return
    run_ctx.warmed.setdefault(pair, set()).add(_warm_key(m, req))


def _warm_key(m: CompareMethod, req) -> tuple:
    """What a warm-up warms: the method, the shape of a fixed tree (a runtime may capture per size) and whether
    it samples."""
    tree = getattr(req.proposer, "tree", None)
    return (m.label, getattr(tree, "size", None), getattr(tree, "depth", None),
            req.config.sampling.temperature > 0)


def _prepare(ctx: AppContext, inputs: DecodeInputs, include_hf: bool, methods) -> tuple[list, object, dict, list]:
    """(chosen methods, the parsed request, engine inputs by label, notes): the request parsed once, one
    proposer per method; ValueError on bad input before anything runs."""
    chosen = choose_methods(ctx, methods, include_hf)
    base = validation.parse_inputs(ctx, replace(inputs, method=validation.COMPARE_METHOD))
    reqs = {m.label: validation.engine_inputs(ctx, base.for_method(m.label))
            for m in chosen if not m.hf and not m.runtime}
    wanted = [ALIASES.get(m, m) for m in methods or ()]
    skipped = [f"{m.label} was not run: {_why_no_reference(ctx)}"
               for m in METHODS if m.runtime and m.label in wanted and m not in chosen]
    return chosen, base, reqs, skipped


def _warm_up_all(ctx: AppContext, state: CompareState, chosen, base, reqs) -> Iterator[CompareState]:
    """The warm-up round: each method's context and inputs (the llama.cpp reference loaded on first use) and
    one short untimed run; appends (method, context, inputs) to ``state``'s plan."""
    ref = reqs[METHODS[0].label]   # Hugging Face baselines take the reference's prompt ids and settings
    for state.row, m in enumerate(chosen, start=1):
        run_ctx, req = ctx, reqs.get(m.label, ref)
        if m.runtime:
            state.phase, state.running = "loading", _LOADING_REFERENCE
            yield state
            try:
                run_ctx = ctx.reference_context()
                req = validation.engine_inputs(run_ctx, base.for_method(METHODS[0].label))
            except (OSError, RuntimeError, ValueError) as exc:   # a reference that cannot load costs its row only
                state.notes.append(f"{m.label} was not run: {exc}")
                continue
        if not _warmed(run_ctx, m, req):
            state.phase, state.running, state.tokens = "warming", m.label, 0
            yield state
            _warm_up(run_ctx, m, req)
        state.plan.append((m, run_ctx, req))


def iter_comparison(ctx: AppContext, inputs: DecodeInputs, include_hf=True, methods=None,
                    rounds: int = DEFAULT_ROUNDS) -> Iterator[CompareState]:
    """Run the chosen methods (:func:`~components.compare.compare_methods.choose_methods`) on one request's raw inputs
    (its method is ignored: each row runs its own): the warm-up round, then ``rounds`` timed rounds; ValueError
    on bad input before anything runs.  Yields the state at every change of phase and every step.

    Closing this generator (Stop) closes the running engine generator and frees its caches.
    """
    if not 1 <= int(rounds) <= MAX_ROUNDS:
        raise ValueError(f"rounds: give 1 to {MAX_ROUNDS}, got {rounds}")
    chosen, base, reqs, skipped = _prepare(ctx, inputs, include_hf, methods)
    state = CompareState(total=len(chosen), max_tokens=reqs[METHODS[0].label].config.max_new_tokens,
                         rounds=int(rounds), notes=skipped)
    yield from _warm_up_all(ctx, state, chosen, base, reqs)
    state.total, runs, failed = len(state.plan), {m.label: [] for m, _, _ in state.plan}, set()
    # Whether other programs held the cores during the timed rounds (a browser drawing the page among them):
    # every row's rate is slower by it alike, and a rate measured on a quieter machine is another condition.
    threads, start = target_rate.thread_times(), time.perf_counter()
    for state.round in range(1, state.rounds + 1):
        for state.row, (m, run_ctx, req) in enumerate(state.plan, start=1):
            if m.label in failed:
                continue
            state.phase, state.running, state.tokens = "running", m.label, None if m.hf else 0
            yield state
            run = _hf_run(state, run_ctx, m, req) if m.hf else (yield from _engine_run(state, m, run_ctx, req))
            if run is None:
                failed.add(m.label)
                continue
            runs[m.label].append(run)
            state.runs += 1
            state.rows = compare_view.mark_identical([row_of(label, rs) for label, rs in runs.items() if rs])
    cores = target_rate.core_wait(threads, target_rate.thread_times(), time.perf_counter() - start)
    state.shared = target_rate.drawing_words(cores, None, drawn=False, what="this comparison's timed rounds")
    _remember_target_rate(state, runs.get(METHODS[0].label))
    state.phase, state.running = "done", None
    yield state


def _remember_target_rate(state: CompareState, alone: list[RunResult] | None) -> None:
    """The target alone's decode rates over the rounds, as the page's measured target rate for this prompt and
    settings (the Live tab's ratio, the Hardware tab's measured rate: components.app_state.target_rate)."""
    plan = next((p for p in state.plan if p[0] is METHODS[0]), None)
    if not alone or plan is None:
        return
    _, run_ctx, req = plan
    rate = target_rate.from_rounds([r.decode_tokens_per_s or 0.0 for r in alone],
                                   f"measured by Compare ({len(alone)} rounds of {state.max_tokens} tokens, not drawn)")
    if rate is not None:
        run_ctx.target_rates.put(target_rate.rate_key(run_ctx.pair(), req.prompt_ids, req.config), rate)
        state.alone_decode = decode_note(rate, statistics.median(r.tokens_per_s for r in alone))


def decode_note(rate: target_rate.TargetRate, end_to_end: float) -> str:
    """The target alone's decode rate in Compare's rounds beside its end-to-end rate in the table: the figure of
    the definition the Live tab's ratio and the Hardware tab's Measure use, and what the gap between them is."""
    gap = f", {rate.tokens_per_s / end_to_end:.2f}× its end-to-end {end_to_end:.1f} tokens/s in the table" \
        if end_to_end > 0 else ""
    return (f"The target alone's decode rate in these rounds, after the prompt's forward (as the Live tab's ratio and "
            f"the Hardware tab's Measure time it): **{rate.band_text()}**{gap}: the difference is the prompt's "
            "forward, alike for every method.")


def _hf_run(state: CompareState, ctx: AppContext, m: CompareMethod, req) -> RunResult | None:
    """A Hugging Face baseline with the same pair, or None and a note saying why it failed."""
    try:
        return run_method(ctx.engine(), ctx.pair(), m.hf, req.prompt_ids, req.config)
    except _HF_ERRORS as exc:
        state.notes.append(f"{m.label} failed: {exc}")
        return None


def _engine_run(state: CompareState, m: CompareMethod, run_ctx: AppContext, req) -> Iterator[CompareState]:
    """Run one method on the engine, yielding ``state`` after every step; returns its timed result."""
    with closing(iter_run(run_ctx.engine(), run_ctx.pair(), m.key, req.prompt_ids, req.config,
                          req.proposer)) as steps:
        while True:
            try:
                state.tokens += next(steps).n_new
            except StopIteration as done:
                return done.value
            yield state
