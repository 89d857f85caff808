"""Live decoding tab: stream one generation step by step.

The handler is a generator: every :class:`~sequoia.core.trace.StepRecord` the
engine yields updates the marked-up text, the tree of the newest step and
(throttled) the statistics panel.  A step slider revisits any step's tree
afterwards.  Request checking lives in :func:`make_request`, a plain function
shared with the API endpoint and the Compare tab.
"""

# No ``from __future__ import annotations`` here: gr.api reads the endpoint's
# return annotation with inspect.signature, which would see a plain string.

import time
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass, field

import gradio as gr

from sequoia.core.config import MAX_NEW_TOKENS, GenerationConfig, SamplingConfig, check_budget
from sequoia.core.trace import StepRecord

from . import stats_view, text_view, tree_view
from .context import LIGHT_WORK, MODEL_WORK, AppContext, acceptance_catalogue, parse_acceptance

#: UI label -> sequoia.runtime.methods name.
METHODS = {
    "Sequoia (auto)": "sequoia-auto",
    "Sequoia (budget & depth)": "sequoia",
    "Sequoia (dynamic)": "sequoia-dynamic",
    "Chain": "chain",
    "SpecInfer": "specinfer",
    "Target only": "ar",
}
# While streaming, update the page at most this often.  A browser re-rendering Plotly figures for every
# step of a fast method (target only: ~10 steps/s) falls behind and stops answering clicks, Stop included.
FRAME_S = 0.2         # the text and the summary line
_TREE_EVERY_S = 0.5    # the tree (with the step slider and the outlined step, which follow it)
_STATS_EVERY_S = 2.0   # the six-panel statistics


@dataclass
class LiveSession:
    """Per-browser-session state (kept in ``gr.State``)."""

    records: list[StepRecord] = field(default_factory=list)
    prompt: str = ""


@dataclass(frozen=True)
class Request:
    prompt_ids: list[int]
    proposer: object
    config: GenerationConfig
    note: str = ""            # e.g. a fallback that was taken, shown as a warning


def _as_int(name: str, value, lo: int, hi: int | None = None) -> int:
    if value is None or isinstance(value, bool) or float(value) != int(float(value)):
        raise ValueError(f"{name} must be a whole number, got {value!r}")
    v = int(float(value))
    if v < lo or (hi is not None and v > hi):
        raise ValueError(f"{name} must be in {lo}..{hi}, got {v}" if hi is not None
                         else f"{name} must be >= {lo}, got {v}")
    return v


def make_config(temperature, top_p, max_new_tokens, seed) -> GenerationConfig:
    """Validated generation settings (ValueError with a readable message otherwise)."""
    sampling = SamplingConfig(temperature=float(temperature), top_p=float(top_p))
    return GenerationConfig(max_new_tokens=_as_int("max new tokens", max_new_tokens, 1, MAX_NEW_TOKENS),
                            sampling=sampling, seed=_as_int("seed", seed, 0))


def make_proposer(ctx: AppContext, method: str, budget, depth, acceptance,
                  temperature: float = 0.0) -> tuple[object, str]:
    """A proposer for a UI label or method name, checked against the server's budget cap."""
    from sequoia.runtime.methods import make_method

    name = METHODS.get(method, method)
    if name not in METHODS.values():
        raise ValueError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
    cap = ctx.budget_cap()
    budget = _as_int("budget", budget, 1)
    depth = _as_int("depth", depth, 1)
    if budget > cap:
        raise ValueError(f"budget {budget} is above this server's cap of {cap} draft tokens per step")
    check_budget(budget, depth)
    if name == "sequoia-auto" and ctx.profile is None:
        return (make_method("sequoia", budget=budget, depth=depth, acceptance=acceptance),
                "No hardware profile loaded: ran Sequoia with the given budget and depth instead of auto.")
    if name == "sequoia-auto":
        method = make_method(name, budget=budget, depth=depth, acceptance=acceptance, profile=ctx.profile)
        note = ("Under this machine's hardware profile no tree beats the target alone, so the optimizer chose "
                "the root-only tree: plain target steps. Pick Sequoia (budget & depth) to see trees."
                if method.tree.size == 0 else "")
        return method, note
    if name == "sequoia-dynamic":
        return _dynamic(ctx, budget, depth, acceptance, temperature)
    if name == "chain":
        return make_method("chain", budget=min(budget, depth)), ""
    if name == "specinfer":
        return make_method("specinfer", depth=depth, width=max(1, budget // depth)), ""
    if name == "ar":
        return make_method("ar"), ""
    return make_method("sequoia", budget=budget, depth=depth, acceptance=acceptance), ""


def _dynamic(ctx: AppContext, budget: int, depth: int, acceptance, temperature: float) -> tuple[object, str]:
    """The dynamic tree under the server's profile and the shipped calibration (identity without one)."""
    from sequoia.runtime.methods import make_method

    method = make_method("sequoia-dynamic", budget=budget, depth=depth, acceptance=acceptance,
                         profile=ctx.profile, calibration=ctx.calibration(temperature))
    notes = []
    if ctx.profile is None:
        notes.append("No hardware profile loaded: the dynamic tree is priced with built-in CPU figures.")
    if not method.can_pay:
        notes.append("Under this machine's profile no tree beats the target alone (verifying k tokens costs "
                     "about k times one), so the dynamic policy drafts nothing: every step is a plain target "
                     "step. Pick Sequoia (budget & depth) to see trees.")
    return method, " ".join(notes)


def make_request(ctx: AppContext, prompt: str, method: str, budget, depth, temperature, top_p,
                 max_new_tokens, seed, acceptance=None, chat: bool = True) -> Request:
    """Everything one decode needs, validated; raises ValueError with a readable message."""
    if not prompt or not prompt.strip():
        raise ValueError("the prompt is empty: type something to continue")
    config = make_config(temperature, top_p, max_new_tokens, seed)
    proposer, note = make_proposer(ctx, method, budget, depth, acceptance, config.sampling.temperature)
    prompt_ids = ctx.pair().encode_prompt(prompt, chat=bool(chat))
    return Request(list(prompt_ids), proposer, config, note)


def step_dict(r: StepRecord) -> dict:
    """A JSON-safe view of one step record (for the API)."""
    return {
        "step": r.step, "method": r.method, "parents": list(r.tree.parents), "tokens": list(r.tokens),
        "texts": list(r.texts), "q": list(r.q), "p": list(r.p), "accepted": list(r.accepted),
        "status": list(r.status), "bonus": r.bonus, "bonus_text": r.bonus_text,
        "new_tokens": list(r.new_tokens), "draft_s": r.draft_s, "verify_s": r.verify_s,
        "other_s": r.other_s, "finished": r.finished, "finish_reason": r.finish_reason,
    }


def generated_text(ctx: AppContext, records: list[StepRecord]) -> str:
    ids = [t for r in records for t in r.new_tokens]
    return ctx.pair().tokenizer.decode(ids, skip_special_tokens=True)


def run_decode(ctx: AppContext, req: Request) -> Iterator[StepRecord]:
    """The engine's step stream for a validated request."""
    return ctx.engine().generate(req.prompt_ids, req.proposer, req.config)


# ------------------------------------------------------------------ handlers
def _views(session: LiveSession, selected: int | None, stats: bool, tree: bool = True):
    recs = session.records
    html = text_view.html_view(recs, prompt=session.prompt, selected_step=selected)
    if not tree:
        tree_fig = gr.skip()
    else:
        tree_fig = tree_view.figure(recs[selected]) if recs and selected is not None else None
    stats_fig = stats_view.figure(recs) if stats else gr.skip()
    return html, tree_fig, stats_fig, stats_view.summary_markdown(recs)


def _slider(n_records: int) -> gr.Slider:
    return gr.Slider(minimum=0, maximum=max(n_records - 1, 1), value=max(n_records - 1, 0),
                     interactive=n_records > 1)


def decode_stream(ctx: AppContext, prompt, method, budget, depth, temperature, top_p, max_new_tokens,
                  seed, acceptance_name, chat):
    """Generator handler: yields (html, tree, stats, summary, slider, session) as steps arrive.

    Stop (or a closed page) closes this generator at a ``yield``; ``closing`` then closes the engine's
    generator at once, which frees its KV caches instead of leaving them to the garbage collector.
    """
    try:
        acceptance = acceptance_catalogue(ctx.assets_dir).get(acceptance_name)
        req = make_request(ctx, prompt, method, budget, depth, temperature, top_p, max_new_tokens,
                           seed, acceptance, chat)
    except ValueError as exc:
        raise gr.Error(str(exc), title="Cannot decode") from None
    if req.note:
        gr.Warning(req.note)
    session = LiveSession(prompt=prompt)
    try:
        with closing(run_decode(ctx, req)) as steps:
            yield from _stream_views(session, steps)
    except ValueError as exc:
        raise gr.Error(str(exc), title="Cannot decode") from None
    except RuntimeError as exc:
        raise gr.Error(f"decoding failed: {exc}", title="Decoding error") from None


@dataclass
class Throttle:
    """``due(now)`` is True at most once every ``period_s`` (and always the first time, or when forced)."""

    period_s: float
    last: float = float("-inf")

    def due(self, now: float, force: bool = False) -> bool:
        if force or now - self.last >= self.period_s:
            self.last = now
            return True
        return False


def _stream_views(session: LiveSession, steps: Iterator[StepRecord]):
    """The views, at most every FRAME_S (the tree and statistics less often); the last step in full."""
    frame, tree, stats = Throttle(FRAME_S), Throttle(_TREE_EVERY_S), Throttle(_STATS_EVERY_S)
    shown = None  # the step whose tree is on screen
    for rec in steps:
        session.records.append(rec)
        now = time.monotonic()
        if not frame.due(now, rec.finished):
            continue  # the engine keeps going; a Stop waits at most one frame
        new_tree = tree.due(now, rec.finished)
        if new_tree:
            shown = len(session.records) - 1
        slider = _slider(len(session.records)) if new_tree else gr.skip()
        yield (*_views(session, shown, stats.due(now, rec.finished), new_tree), slider, session)
    if session.records and not session.records[-1].finished:  # ended without a final record: show the end
        yield (*_views(session, len(session.records) - 1, True), _slider(len(session.records)), session)


def show_step(step, session: LiveSession):
    """Slider handler: the tree of one step and the text with that step outlined."""
    if session is None or not session.records:
        return None, gr.skip()
    i = min(max(int(step), 0), len(session.records) - 1)
    return (tree_view.figure(session.records[i]),
            text_view.html_view(session.records, prompt=session.prompt, selected_step=i))


def decode_api_fn(ctx: AppContext):
    """The typed function behind the ``/decode`` API endpoint."""
    def decode(prompt: str, method: str = "sequoia", budget: int = 32, depth: int = 8,
               temperature: float = 0.0, top_p: float = 1.0, max_new_tokens: int = 64,
               seed: int = 0, chat: bool = True, acceptance: str = "") -> tuple[str, list]:
        """Generate with one method; returns the text and one JSON object per step.

        ``acceptance`` (e.g. "0.8, 0.1, 0.05") sets the vector the Sequoia tree is built for.
        """
        try:
            vec = parse_acceptance(acceptance) if acceptance.strip() else None
            req = make_request(ctx, prompt, method, budget, depth, temperature, top_p, max_new_tokens,
                               seed, vec, chat)
            records = list(run_decode(ctx, req))
        except ValueError as exc:
            raise gr.Error(str(exc)) from None
        return generated_text(ctx, records), [step_dict(r) for r in records]
    return decode


# ------------------------------------------------------------------ layout
def build(ctx: AppContext) -> None:
    """Lay out the tab inside the current ``gr.Blocks`` and wire its events."""
    cap = ctx.budget_cap()
    choices = list(acceptance_catalogue(ctx.assets_dir))
    with gr.Row():
        with gr.Column(scale=1, min_width=300):
            prompt = gr.Textbox(label="Prompt", lines=5, elem_id="sq-prompt",
                                value="Write a Python function that checks whether a number is prime.")
            chat = gr.Checkbox(value=True, label="apply the chat template")
            method = gr.Dropdown(list(METHODS), value="Sequoia (budget & depth)", label="Method")
            with gr.Row():
                budget = gr.Slider(1, cap, value=min(32, cap), step=1, label="budget (draft tokens / step)")
                depth = gr.Slider(1, 32, value=8, step=1, label="depth")
            gr.Markdown("<small>Sequoia: tree size and depth limit · auto: the largest it may pick · chain: "
                        "length min(budget, depth) · SpecInfer: (budget ÷ depth) chains of depth tokens</small>")
            with gr.Row():
                temperature = gr.Slider(0, 2, value=0, step=0.05, label="temperature (0 = greedy)")
                top_p = gr.Slider(0.05, 1, value=1, step=0.05, label="top-p")
            with gr.Row():
                max_new = gr.Slider(1, 1024, value=128, step=1, label="max new tokens")
                seed = gr.Number(0, precision=0, minimum=0, label="seed")
            acceptance = gr.Dropdown(choices, value=choices[0], label="acceptance vector (for the DP tree)")
            with gr.Row():
                go_btn = gr.Button("Decode", variant="primary")
                stop_btn = gr.Button("Stop", variant="stop")
        with gr.Column(scale=2):
            text = gr.HTML(text_view.html_view([]), label="Generated text", elem_id="sq-text")
            summary = gr.Markdown(stats_view.summary_markdown([]), elem_id="sq-summary")
            step = gr.Slider(0, 1, value=0, step=1, label="step (tree shown below)", interactive=False)
            tree = gr.Plot(label="Speculated tree", elem_id="sq-tree")
    stats = gr.Plot(label="Statistics", elem_id="sq-stats")
    session = gr.State(LiveSession())

    def handler(*args):
        yield from decode_stream(ctx, *args)

    event = go_btn.click(handler, [prompt, method, budget, depth, temperature, top_p, max_new, seed, acceptance, chat],
                         [text, tree, stats, summary, step, session], api_name="decode_stream", **MODEL_WORK)
    # Cancelling closes the handler's generator, and with it the engine's (see decode_stream).
    stop_btn.click(None, None, None, cancels=[event], api_visibility="private")
    # input (user moves only, not the updates streamed during decoding); always_last drops stale drags.
    step.input(show_step, [step, session], [tree, text], api_visibility="private", trigger_mode="always_last",
               **LIGHT_WORK)
    gr.api(decode_api_fn(ctx), api_name="decode", **MODEL_WORK)
