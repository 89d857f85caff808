"""Compare tab: the methods a user picks, on one prompt, one after another.

The target alone (always: the reference), chain, SpecInfer, Sequoia (static,
auto when a hardware profile is loaded, dynamic), the n-gram methods (copies
from the context alone, and copied branches in the dynamic tree) and Hugging
Face's two kinds of drafting (assisted generation with the draft model, prompt
lookup) run with the same settings: all three kinds of drafting on one prompt.
Where the server offers it (:attr:`AppContext.offers_reference`), the same
target on llama.cpp, as its shipped GGUF, runs alone as a reference row: what a
CPU user would run instead of any of them.
The tab opens on a short run a class can wait for (:data:`DEFAULT_METHODS`,
:data:`DEFAULT_TOKENS`); "Full comparison" runs every method
(:data:`FULL_METHODS`, :data:`FULL_TOKENS`), as the ``/compare`` API does.
The bars and the table come from :mod:`components.compare_view`; their rows
are named as the checkboxes are.  At temperature 0 every lossless method must
reproduce the target alone's output token for token, which the "identical"
column checks.  Every method runs through
:func:`sequoia.runtime.timing.iter_run` after one short untimed warm-up run of
its own (the bench's rule: the whole call is timed, prefill included).  The
handler streams: a line says what loads, warms up or runs (row k of n), the
bars and table grow as each method finishes, and Stop closes the running
decode between two steps.
"""

# No ``from __future__ import annotations``: gr.api reads the return annotation.

import functools
import time
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass, field, replace
from types import SimpleNamespace

import gradio as gr

from sequoia._meta import ProgressFn
from sequoia.runtime.exactness import is_exact
from sequoia.runtime.timing import RunResult, iter_run, run_method, warmup

from . import compare_view, divergence_view, serving, validation
from .context import MODEL_WORK, AppContext
from .decode_inputs import COMPARE_FIELDS, DecodeInputs, compare_handler
from .acceptance_choice import acceptance_catalogue, default_acceptance_label, follow_temperature
from .exact_compare import after_comparison
from .frames import FRAME_S, Throttle


@dataclass(frozen=True)
class CompareMethod:
    """One method the tab can run."""

    label: str          # the checkbox's label and the row's name in the bars and the table (colours:
                        # components.method_color); for engine methods also the live tab's method label
    key: str            # its name in the /compare API's rows
    hf: str = ""        # a Hugging Face baseline's runner name (sequoia.runtime.timing.HF_METHODS), else ""
    runtime: str = ""   # "llamacpp": the target alone on that runtime (AppContext.reference_context), else ""


#: Every method the tab offers, in run order; the first is the reference and always runs.
METHODS = (
    CompareMethod(compare_view.REFERENCE, "target only"),
    CompareMethod(compare_view.LLAMACPP_REFERENCE, "llama.cpp target only", runtime="llamacpp"),
    CompareMethod("Chain", "chain"),
    CompareMethod("SpecInfer", "specinfer"),
    CompareMethod("Sequoia (budget & depth)", "sequoia"),
    CompareMethod("Sequoia (auto)", "sequoia-auto"),
    CompareMethod("Sequoia (dynamic)", "sequoia-dynamic"),
    CompareMethod("Sequoia + n-gram copies", "sequoia-ngram"),
    CompareMethod("n-gram copies only", "ngram"),
    CompareMethod("HF assisted", "hf assisted", hf="hf-assisted"),
    CompareMethod("HF prompt lookup", "hf prompt lookup", hf="hf-prompt-lookup"),
)
_BY_LABEL = {m.label: m for m in METHODS}
#: Labels accepted from scripts besides the checkboxes' ("Target only": the request parser's alias too).
_ALIASES = {"Target only": compare_view.REFERENCE}
#: The API's method names by row label.
API_KEYS = {m.label: m.key for m in METHODS}
#: The full comparison ("Full comparison", and the /compare API): the tree shapes and each kind of drafting
#: (draft model, copies, both), on FULL_TOKENS tokens.
FULL_METHODS = ("Target alone", "llama.cpp target alone", "Chain", "SpecInfer", "Sequoia (budget & depth)",
                "Sequoia (auto)", "Sequoia (dynamic)", "Sequoia + n-gram copies", "HF assisted", "HF prompt lookup")
FULL_TOKENS = 64
#: Ticked when the tab opens: a run a class can wait for on a 2-vCPU CPU (issue 37: 90 s on an AVX2-only EPYC,
#: where the full run took 853 s): the target alone, the llama.cpp reference where offered, the automatic methods
#: and one fixed tree, on DEFAULT_TOKENS tokens.  The arithmetic, from that machine's rates (T=0: target alone 1.19
#: tokens/s on the Hugging Face runtime, 5.12 on llama.cpp) and the ratios this default measured on llama.cpp (one
#: thread, CPU-time clocks, a busy 2-vCPU Zen 4: Sequoia 32/8 0.31x the target alone, auto 1.01x, dynamic 1.00x;
#: the whole run 37% over its rows' sum: warm-ups, the tree's DP): on llama.cpp, the runtime that machine runs
#: fastest, 32 tokens take 32/5.12 = 6.3 s alone, 20 s on the 32/8 tree, 6.3 s each automatic method: 39 s, 53 s in
#: all.  On the Hugging Face runtime the same rows take 27 s alone, 6 s on the reference (and its load), 32 s each
#: automatic method (0.85x there), 77 s the tree (0.35x): about 180 s (about 100 s without the fixed tree).
DEFAULT_METHODS = ("Target alone", "llama.cpp target alone", "Sequoia (budget & depth)", "Sequoia (auto)",
                   "Sequoia (dynamic)")
DEFAULT_TOKENS = 32
#: The fixed tree's budget and depth when the tab opens ("Sequoia (budget & depth)").
DEFAULT_BUDGET, DEFAULT_DEPTH = 32, 8
#: Tokens of the untimed warm-up run before each method's row (first-call costs then land on none of them).
WARMUP_TOKENS = 2
_HF_ERRORS = (ValueError, RuntimeError, NotImplementedError, TypeError)
#: What the progress line says loads before the llama.cpp reference's first row.
_LOADING_REFERENCE = "the llama.cpp reference (the target's shipped GGUF)"


#: The runtimes each Hugging Face baseline runs on: ``generate`` needs the target (and assisted the draft) in torch.
_HF_RUNTIMES = {"hf-assisted": ("hf",), "hf-prompt-lookup": ("hf", "mixed")}


def offered(ctx: AppContext) -> list[str]:
    """The checkbox labels: Sequoia (auto) only with a hardware profile (without one it is the target alone), the
    llama.cpp reference only where the server offers it, the Hugging Face baselines only where the pair's runtime
    (the one it will load on, before it is loaded) runs them."""
    started = ctx.hardware.runtime
    backend = ctx.pair().backend if ctx.loaded else started.backend if started is not None else "hf"
    return [m.label for m in METHODS if (m.key != "sequoia-auto" or ctx.profile is not None)
            and (not m.runtime or ctx.offers_reference) and (not m.hf or backend in _HF_RUNTIMES[m.hf])]


def ticked(ctx: AppContext, full: bool = False) -> list[str]:
    """The checkboxes :data:`DEFAULT_METHODS` (``full``: :data:`FULL_METHODS`) that this server offers."""
    return [m for m in (FULL_METHODS if full else DEFAULT_METHODS) if m in offered(ctx)]


def choose_methods(ctx: AppContext, methods=None, include_hf: bool = True) -> list[CompareMethod]:
    """The methods to run, in run order, the reference first; ValueError on an unknown label.

    ``methods``: checkbox labels (None: :data:`FULL_METHODS` that this server offers);
    ``include_hf=False`` drops the Hugging Face baselines.
    """
    if methods is None:
        methods = ticked(ctx, full=True)
    methods = [_ALIASES.get(m, m) for m in methods]
    unknown = [m for m in methods if m not in _BY_LABEL]
    if unknown:
        raise ValueError(f"unknown method(s) {', '.join(map(str, unknown))}; choose from {', '.join(_BY_LABEL)}")
    picked = set(methods) | {METHODS[0].label}
    return [m for m in METHODS if m.label in picked and (include_hf or not m.hf)
            and (not m.runtime or ctx.offers_reference)]


def _row(name: str, run: RunResult) -> compare_view.CompareRow:
    return compare_view.CompareRow(name, tokens=run.new_tokens, seconds=run.seconds,
                                   target_calls=run.target_calls, token_ids=run.tokens,
                                   first_token_s=run.first_token_s)


def _why_no_reference(ctx: AppContext) -> str:
    if ctx.loaded and ctx.pair().backend == "llamacpp":
        return "the pair runs on llama.cpp already, so the target alone is that reference"
    if ctx.loaded and is_exact(ctx.pair()):
        return "exact mode compares one runtime, its float32 target"
    return "this server has no GGUF of its target or no llama-cpp-python"


def _reference_inputs(ctx: AppContext, base) -> tuple[AppContext, object]:
    """The llama.cpp reference's context (its runner loaded on first use) and its target-alone inputs."""
    ref_ctx = ctx.reference_context()
    return ref_ctx, validation.engine_inputs(ref_ctx, base.for_method(METHODS[0].label))


@dataclass
class CompareState:
    """Where a comparison stands; :func:`iter_comparison` yields it whenever that changes."""

    total: int                                                  # methods to run
    max_tokens: int                                             # new tokens each row runs to
    rows: list[compare_view.CompareRow] = field(default_factory=list)   # finished, identical flags set
    notes: list[str] = field(default_factory=list)              # e.g. why a Hugging Face baseline was skipped
    phase: str = "loading"                                      # "loading", "warming", "running" or "done"
    running: str | None = None                                  # method now warming up or running (None: done)
    row: int = 0                                                # its place in the run, 1-based
    tokens: int | None = 0                                      # its tokens so far (None: it reports no steps)

    @property
    def fraction(self) -> float:
        return max(self.row - 1, 0) / self.total if self.running else 1.0

    def line(self) -> str:
        """The progress line (components.compare_view.progress)."""
        return compare_view.progress(self.phase, self.running or "", self.row, self.total, self.tokens,
                                     self.max_tokens)


def _warm_up(run_ctx: AppContext, m: CompareMethod, req) -> None:
    """A short untimed greedy run of ``m`` on the prompt, as the bench does before timing."""
    runs = [(m.hf, None)] if m.hf else [(req.proposer.name, req.proposer)]
    try:
        warmup(run_ctx.engine(), run_ctx.pair(), req.prompt_ids, runs, min(WARMUP_TOKENS, req.config.max_new_tokens))
    except _HF_ERRORS:
        if not m.hf:
            raise   # a Hugging Face baseline's row says why when it runs


def iter_comparison(ctx: AppContext, inputs: DecodeInputs, include_hf=True, methods=None) -> Iterator[CompareState]:
    """Run the chosen methods (:func:`choose_methods`) on one request's raw inputs (its method is ignored: each
    row runs its own) in turn, each after its own warm-up, the llama.cpp reference loaded when its row comes;
    ValueError on bad input before anything runs.  Yields the state at every change of phase and every step.

    Closing this generator (Stop) closes the running engine generator and frees its caches.
    """
    chosen = choose_methods(ctx, methods, include_hf)
    # Parsed once (by the validator when the request came through the queue), then one proposer per method.
    base = validation.parse_inputs(ctx, replace(inputs, method=validation.COMPARE_METHOD))
    reqs = {m.label: validation.engine_inputs(ctx, base.for_method(m.label))
            for m in chosen if not m.hf and not m.runtime}
    ref = reqs[METHODS[0].label]  # Hugging Face baselines take the reference's prompt ids and settings
    wanted = [_ALIASES.get(m, m) for m in methods or ()]
    skipped = [f"{m.label} was not run: {_why_no_reference(ctx)}"
               for m in METHODS if m.runtime and m.label in wanted and m not in chosen]
    state = CompareState(total=len(chosen), max_tokens=ref.config.max_new_tokens, notes=skipped)
    for state.row, m in enumerate(chosen, start=1):
        run_ctx, req = ctx, reqs.get(m.label, ref)
        if m.runtime:
            state.phase, state.running = "loading", _LOADING_REFERENCE
            yield state
            try:
                run_ctx, req = _reference_inputs(ctx, base)
            except (OSError, RuntimeError, ValueError) as exc:   # a reference that cannot load costs its row only
                state.notes.append(f"{m.label} was not run: {exc}")
                continue
        state.phase, state.running, state.tokens = "warming", m.label, 0
        yield state
        _warm_up(run_ctx, m, req)
        state.phase = "running"
        if m.hf:
            state.tokens = None
            yield state
            _hf_row(state, run_ctx, m, req)
            continue
        yield state
        yield from _engine_row(state, m, run_ctx, req)
    state.phase, state.running = "done", None
    yield state


def _hf_row(state: CompareState, ctx: AppContext, m: CompareMethod, req) -> None:
    """A Hugging Face baseline with the same pair: its row joins ``state.rows``, or a note says why it failed."""
    try:
        run = run_method(ctx.engine(), ctx.pair(), m.hf, req.prompt_ids, req.config)
    except _HF_ERRORS as exc:
        state.notes.append(f"{m.label} failed: {exc}")
        return
    state.rows = compare_view.mark_identical([*state.rows, _row(m.label, run)])


def _engine_row(state: CompareState, m: CompareMethod, run_ctx: AppContext, req) -> Iterator[CompareState]:
    """Run one method on the engine, yielding ``state`` after every step; its row joins ``state.rows``."""
    with closing(iter_run(run_ctx.engine(), run_ctx.pair(), m.key, req.prompt_ids, req.config,
                          req.proposer)) as steps:
        while True:
            try:
                state.tokens += next(steps).n_new
            except StopIteration as done:
                run = done.value
                break
            yield state
    state.rows = compare_view.mark_identical([*state.rows, _row(m.label, run)])


def run_comparison(ctx: AppContext, prompt, budget, depth, temperature, top_p, max_new_tokens, seed,
                   acceptance=None, chat=True, include_hf=True,
                   progress: ProgressFn | None = None, methods=None):
    """All rows (reference first, identical flags set) and notes; ValueError on bad input.  The raw values by
    name, for scripts and tests (``acceptance``: None, a vector or text; ``methods`` None: the full set)."""
    inputs = DecodeInputs(prompt, validation.COMPARE_METHOD, budget, depth, temperature, top_p, max_new_tokens, seed,
                          chat, acceptance)
    shown = None
    for state in iter_comparison(ctx, inputs, include_hf, methods):
        if progress and (state.phase, state.running) != shown:
            shown = (state.phase, state.running)
            progress(state.fraction, state.line() if state.running else "done")
    return state.rows, state.notes


def _notes_markdown(rows, notes, temperature, checked: bool = True) -> str:
    """The notes under the table; ``checked=False``: the differing rows are not yet checked for near-ties."""
    lines = list(notes)
    if float(temperature) == 0:
        unchecked = [r.method for r in rows if r.identical is False and r.near_tie_at is None]
        lines.append(compare_view.verdict(rows) if checked or not unchecked else
                     f"*{', '.join(unchecked)}: the text parts from the target alone's; checking whether at a "
                     "kernel near-tie…*")
    else:
        lines.append("At temperature > 0 outputs differ by design; only their distribution matches the target's.")
    lines.append(compare_view.reference_note(rows))
    return "\n\n".join(line for line in lines if line)


def on_compare(ctx: AppContext, inputs: DecodeInputs, methods: list[str], exact: bool = False):
    """Generator handler of the tab's inputs (the acceptance a catalogue label): the bars and table grow as each
    method finishes; a line says what runs now.

    ``methods``: the ticked checkbox labels (:data:`METHODS`).  ``exact``: run on the exact-mode pair
    (:meth:`AppContext.exact_context`); at T=0 a differing output gets its first divergence explained.
    """
    temperature = inputs.temperature
    inputs = replace(inputs, acceptance=acceptance_catalogue(ctx.assets_dir).get(inputs.acceptance))
    seen, frame = (-1, "", None), Throttle(FRAME_S)   # (rows, phase, method) last shown
    try:
        if exact and not ctx.exact_loaded:
            yield gr.skip(), gr.skip(), divergence_view.LOADING
        run_ctx = ctx.exact_context() if exact else ctx
        for state in iter_comparison(run_ctx, inputs, methods=list(methods or ())):
            now = (len(state.rows), state.phase, state.running)
            if now == seen and not frame.due(time.monotonic()):
                continue  # only the "n tokens so far" line would change: at most once a frame
            grew, seen = now[0] != seen[0], now
            md = state.line() if state.running else _notes_markdown(state.rows, state.notes, temperature,
                                                                    checked=False)
            if grew:   # a row finished: the bars and the table show it at once
                yield compare_view.figure(state.rows), compare_view.table(state.rows), md
            else:
                yield gr.skip(), gr.skip(), md
        yield from after_comparison(run_ctx, inputs.prompt, inputs.chat, state.rows, temperature, exact,
                                    lambda rows: _notes_markdown(rows, state.notes, temperature))
    except ValueError as exc:
        raise gr.Error(str(exc), title="Cannot compare") from None
    except RuntimeError as exc:
        raise gr.Error(f"comparison failed: {exc}", title="Decoding error") from None


def compare_api_fn(ctx: AppContext):
    def work(stop, prompt, budget, depth, temperature, top_p, max_new_tokens, seed, include_hf):
        inputs = DecodeInputs(prompt, validation.COMPARE_METHOD, budget, depth, temperature, top_p, max_new_tokens,
                              seed)
        states = iter_comparison(ctx, inputs, include_hf=include_hf)
        rows = serving.drain(states, stop)[-1].rows  # a cancelled request stops within a step
        return compare_view.records(rows, API_KEYS)

    gpu_work = serving.on_gpu(work, lambda stop, *a: serving.gpu_seconds(a[5], len(FULL_METHODS)))

    async def compare(prompt: str, budget: int = 32, depth: int = 8, temperature: float = 0.0, top_p: float = 1.0,
                      max_new_tokens: int = 64, seed: int = 0, include_hf: bool = True) -> list:
        """Run the full comparison on one prompt (:data:`FULL_METHODS`: all three kinds of drafting;
        ``include_hf=False``: no Hugging Face baselines); one object per method (method, label, tokens, seconds,
        speedup, identical…)."""
        args = (prompt, budget, depth, temperature, top_p, max_new_tokens, seed, include_hf)
        try:
            return await serving.run_cancellable(lambda stop: gpu_work(stop, *args))
        except ValueError as exc:
            raise gr.Error(str(exc)) from None
    return compare


HOW_TO_READ = """\
**Run comparison** runs a short default (the boxes ticked when the page opens, 32 tokens), **Full comparison** every method on 64 tokens (minutes on a CPU); each row shows as it finishes.
Every method decodes the same prompt with the same seed, one after the other, timed by the bench's runner (prefill included, after a short warm-up of its own).
**speedup** is tokens/s over the target alone; **tokens/call** is new tokens per target forward; **identical** says whether the text equals the target alone's (it must at temperature 0).
Above 0 the texts differ run to run, but each is a sample from exactly the target's distribution.
Three kinds of drafting: a draft model (Sequoia's trees, HF assisted), copies of n-grams already in the prompt or the text so far (n-gram copies only, HF prompt lookup: no draft cost, right where the answer quotes the input), and both in one tree (Sequoia + n-gram copies).
"""


def build(ctx: AppContext) -> None:
    """Lay out the tab inside the current ``gr.Blocks`` and wire its events."""
    with gr.Accordion("How to read this", open=False):
        gr.Markdown(HOW_TO_READ)
    with gr.Row():
        with gr.Column(scale=1, min_width=300):
            c = _controls(ctx)
        with gr.Column(scale=2):
            bars = gr.Plot(label="comparison", elem_id="sq-compare-bars")
            # Tall enough for every row of a full run: the table never hides rows in a scroll area of its own.
            table = gr.Dataframe(headers=compare_view.HEADERS, label="results", interactive=False,
                                 elem_id="sq-compare-table", wrap=True, column_widths=compare_view.COLUMN_WIDTHS,
                                 max_height=2000)
            notes = gr.Markdown(elem_id="sq-compare-notes")
    _wire(ctx, c, [bars, table, notes])


def _controls(ctx: AppContext) -> SimpleNamespace:
    """The request's fields (named as components.decode_inputs.COMPARE_FIELDS) and the buttons (the left column)."""
    cap, choices = ctx.budget_cap(), list(acceptance_catalogue(ctx.assets_dir))
    c = SimpleNamespace()
    c.prompt = gr.Textbox(label="Prompt", lines=4, value="Write a Python function that reverses a linked list.")
    c.chat = gr.Checkbox(value=True, label="apply the chat template")
    with gr.Row():
        c.budget = gr.Slider(1, cap, value=min(DEFAULT_BUDGET, cap), step=1, label="budget")
        c.depth = gr.Slider(1, 32, value=DEFAULT_DEPTH, step=1, label="depth")
    with gr.Row():
        # A number box, as on the Live tab: a slider would set -1 to 0 without a word.
        c.temperature = gr.Number(0, step=0.05, label="temperature (0 = greedy)")
        c.top_p = gr.Slider(0.05, 1, value=1, step=0.05, label="top-p")
    with gr.Row():
        # A number box, not a slider: a slider clamps 100000 to its maximum silently, while the
        # request check answers with the server's cap (before the request queues).
        new_cap = ctx.limits.max_new_tokens
        c.max_new_tokens = gr.Number(min(DEFAULT_TOKENS, new_cap), precision=0, minimum=1,
                                     label=f"max new tokens (at most {new_cap} here)", elem_classes="sq-max-new")
        c.seed = gr.Number(0, precision=0, minimum=0, label="seed")
    c.acceptance = gr.Dropdown(choices, value=default_acceptance_label("code", 0.0, ctx.assets_dir),
                               label="acceptance vector (Sequoia tree)")
    c.methods = gr.CheckboxGroup(offered(ctx), value=ticked(ctx), label="methods", elem_id="sq-compare-methods",
                                 info="Target alone always runs: the others are compared with it. HF: Hugging Face "
                                 "generate with the draft model (assisted) or with copies from the prompt (prompt "
                                 "lookup).")
    with gr.Row():
        c.run_btn = gr.Button("Run comparison", variant="primary")
        c.stop_btn = gr.Button("Stop", variant="stop")
    c.full_btn = gr.Button(f"Full comparison (every method, {FULL_TOKENS} tokens: minutes on a CPU)", size="sm",
                           elem_id="sq-compare-full")
    c.exact_btn = gr.Button("Run in exact mode (float32 target: T=0 outputs identical)", size="sm",
                            elem_id="sq-compare-exact")
    return c


def _gpu_seconds(runs_per_method: int):
    """ZeroGPU's duration for a Compare handler: ``runs_per_method`` decodes of every ticked method and the
    reference."""
    def seconds(*values) -> int:
        named = dict(zip(COMPARE_FIELDS, values))
        return serving.gpu_seconds(named["max_new_tokens"], runs_per_method * (len(named["methods"] or ()) + 1))
    return seconds


def _wire(ctx: AppContext, c: SimpleNamespace, outputs: list) -> None:
    """Run, exact mode and Stop; the ``/compare`` endpoint.  The handlers take the page's named parameters: a
    refusal before the queue names the input it is about (components.validation)."""
    inputs = [getattr(c, name) for name in COMPARE_FIELDS]
    method = validation.COMPARE_METHOD
    handler = compare_handler(functools.partial(on_compare, ctx), method)
    exact_handler = compare_handler(functools.partial(on_compare, ctx, exact=True), method)
    event = c.run_btn.click(serving.on_gpu(handler, _gpu_seconds(1)), inputs, outputs, api_name="compare_stream",
                            api_visibility="private", **MODEL_WORK)  # the name: components.validation finds it
    exact_event = c.exact_btn.click(serving.on_gpu(exact_handler, _gpu_seconds(2)), inputs, outputs,
                                    api_visibility="private", **MODEL_WORK)
    # The full run: tick every method and set the tokens where the visitor sees them, then run as Run does.
    full_tokens = min(FULL_TOKENS, ctx.limits.max_new_tokens)
    full_event = c.full_btn.click(lambda: (ticked(ctx, full=True), full_tokens), None, [c.methods, c.max_new_tokens],
                                  queue=False, api_visibility="private").then(
        serving.on_gpu(handler, _gpu_seconds(1)), inputs, outputs, api_name="compare_full",
        api_visibility="private", **MODEL_WORK)
    c.stop_btn.click(None, None, None, cancels=[event, exact_event, full_event], api_visibility="private")
    gr.api(compare_api_fn(ctx), api_name="compare", **MODEL_WORK)
    follow_temperature(c.temperature, c.acceptance, ctx.assets_dir)
    for slider, name in ((c.budget, "budget"), (c.depth, "depth")):
        validation.say_when_clamped(slider, name)
