"""The "Distribution check" tab: at T > 0, do a method's tokens follow the target's distribution?

One forward of each model gives p and q after the prompt; then each rule (Sequoia, SpecInfer, chain and a
broken teaching foil) runs one verification step N times and its first emitted tokens are tested against
p (:mod:`sequoia.core.verification.distribution`, :mod:`sequoia.runtime.checks.distribution_check`).  Stop ends the check
between two chunks of trials (:class:`CheckSession`), keeping the verdicts so far.
"""

# No ``from __future__ import annotations``: gradio reads handler annotations.

import functools
from dataclasses import dataclass

import gradio as gr

from sequoia.core.config import SamplingConfig
from sequoia.core.requests.fields import Errors, RequestError, whole
from sequoia.core.requests.request import (SEED_MAX, Limits, check_chat, check_prompt, check_prompt_ids,
                                           check_temperature, check_top_p)
from sequoia.core.verification.distribution import DEFAULT_CHILDREN, DEFAULT_TRIALS, FOIL_FACTOR, RULES
from sequoia.runtime.checks.distribution_check import MAX_CHILDREN, MAX_TRIALS, iter_check

from components.app_state import serving, validation
from components.app_state.context import MODEL_WORK
from components.app_state.pair_room import LoadedPair
from components.app_state.run_flags import Redraw, RunFlags, stop_after_frame, stop_lands_last
from components.distribution import distribution_view

#: Trials the tab opens with.  tests/core/test_distribution.py checks the verdicts at DEFAULT_TRIALS (5000: the
#: foil caught in 99 of 100 LM-like cases); on the embedded pair at T=1, top-p 0.95, a haiku prompt, the foil
#: slipped through at 5000 (p = 0.08) and was caught at 20000 (p = 5e-7), the whole check 22 s there.
PAGE_TRIALS = max(DEFAULT_TRIALS, 20000)
#: Fewest trials the tab takes: below this a chi-square test has too few counts in its bins to say anything.
MIN_TRIALS = 100

HOW_TO_READ = f"""\
At temperature > 0 a speculative method's text differs from the target alone's run to run; what must match is the
*distribution* of every token. This check takes the prompt's next position, computes the target's exact distribution
p and the draft's q there (one forward each), then runs one verification step N times with each method's real rule
(the functions the engine calls) and compares how often each token came out with p: grey bars p, green bars the
share of the N trials. Each panel's title has the χ² goodness-of-fit p-value and the verdict.
The red panel is a **deliberately broken verifier** (a teaching foil, never used to decode): it accepts a draft token
when u·q < {FOIL_FACTOR}·p, which over-emits the tokens the draft likes more than the target. With enough trials the
test catches it, while the three real rules pass (each fails by chance 1% of the time).
The far tails of p and q (1e-3 of their mass) are cut before the trials so that a step costs less; the test is
against the cut p.
"""


#: The check's inputs in the order of the button's event.
FIELDS = ("prompt", "temperature", "top_p", "trials", "children", "seed", "chat")


def parse(prompt, temperature, top_p, trials, children, seed, chat, limits: Limits = Limits()
          ) -> tuple[str, SamplingConfig, int, int, int, bool]:
    """(prompt, sampling, trials, children, seed, chat) from the tab's raw values, under this server's ``limits``
    (the prompt's length and the temperature, as a decode request's); RequestError naming every bad field."""
    e = Errors()
    text = e.check("prompt", check_prompt, prompt, limits)
    t = e.check("temperature", _temperature, temperature, limits)
    p = e.check("top_p", check_top_p, top_p)
    n = e.check("trials", whole, "trials N per rule", trials, MIN_TRIALS, MAX_TRIALS)
    k = e.check("children", whole, "children", children, 1, MAX_CHILDREN)
    s = e.check("seed", whole, "seed", seed, 0, SEED_MAX)
    c = e.check("chat", check_chat, chat)
    e.raise_any()
    return text, SamplingConfig(temperature=t, top_p=p), n, k, s, c


def _temperature(value, limits: Limits) -> float:
    t = check_temperature(value, limits)
    if t <= 0:
        raise ValueError("the distribution check needs a temperature above 0 (at 0 the output is the argmax)")
    return t


def validator(prompt, temperature, top_p, trials, children, seed, chat, session=None, *, limits: Limits = Limits()):
    """Before the check queues: each bad field's message on its input (as the Live and Compare tabs); the
    session state is the last input."""
    return validation.answer((*FIELDS, None), lambda: parse(prompt, temperature, top_p, trials, children, seed, chat,
                                                            limits))


@dataclass
class CheckSession(RunFlags):
    """One browser session's check (kept in ``gr.State``; :mod:`components.app_state.run_flags`): the run ends between two
    chunks of trials once Stop is pressed."""

    done: str = ""             # the verdicts so far, as the page shows them


def begin_check(prompt, temperature, top_p, trials, children, seed, chat, session: CheckSession | None, *,
                limits: Limits = Limits()):
    """A click's first, light event: (session, refusal line): a fresh session for the check that follows (Stop
    finds it while the check waits in the queue), the line under the buttons hidden.  A refused request leaves
    the session as is and the line says why (:func:`validation.refusal_line`); a click while a check is on (and
    not stopped) changes nothing."""
    if session is not None and session.on and not session.stopped:
        return gr.skip(), gr.skip()
    try:
        parse(prompt, temperature, top_p, trials, children, seed, chat, limits)
    except ValueError as exc:
        return gr.skip(), validation.refusal_line(exc, "Not run")
    return CheckSession(waiting=True), validation.refusal_line(None)


def stopped_summary(session: CheckSession) -> str:
    """What the verdicts say of a check Stop ended (the rules done keep their lines: a rule cut short is tested
    on the trials it ran, its count in the table)."""
    if not session.done:
        return "**Stopped** before a rule finished: nothing was tested."
    return "**Stopped**: the rules below are the ones that ran.\n\n" + session.done


def stop_check(session: CheckSession | None):
    """Stop's handler: (plot, verdicts) settled at once; sets the flag the check reads.  With no check on, it
    changes nothing."""
    if not stop_after_frame(session):   # the check's frame in flight lands first (run_flags)
        return gr.skip(), gr.skip()
    return gr.skip(), stopped_summary(session)


def on_check(models: LoadedPair, prompt, temperature, top_p, trials, children, seed, chat,
             session: CheckSession | None = None, *, limits: Limits = Limits()):
    """Generator handler: the verdicts and bars appear rule by rule.  ``session``: the page's, as its click's
    first event left it (:func:`begin_check`): stopped in the queue, nothing runs; one that is not waiting
    belongs to a check already on (the click is ignored).  None (scripts, tests): a session of its own."""
    if session is not None and (not session.waiting or session.stopped):
        yield Redraw((gr.skip(), gr.skip()))   # a generator that yields nothing would blank both outputs
        return
    session = session or CheckSession()
    session.waiting, session.running = False, True
    try:
        yield from _check(models, (prompt, temperature, top_p, trials, children, seed, chat), session, limits)
    finally:
        session.running = False


def _check(models: LoadedPair, raw: tuple, session: CheckSession, limits: Limits):
    try:
        prompt, sampling, trials, children, seed, chat = parse(*raw, limits)
        temperature, top_p = sampling.temperature, sampling.top_p
        pair = models.get()
        ids = pair.encode_prompt(prompt, chat=chat)
        check_prompt_ids(ids, limits)
        decode = lambda t: pair.tokenizer.decode([t])  # noqa: E731
        yield gr.skip(), "*Forwarding the prompt through both models…*"
        for state in iter_check(pair, ids, sampling, trials, children, seed, should_stop=lambda: session.stopped):
            title = f"first emitted token after the prompt, T={temperature:g}, top-p={float(top_p):g}"
            fig = distribution_view.figure(state.p, state.results, decode, title)
            md = distribution_view.summary(state.results, state.p, state.seconds if state.running is None else None)
            session.done = distribution_view.summary(state.results, state.p)   # Stop's words: no "finished in"
            if session.stopped:   # the rules done, drawn last: no frame of the check lands over Stop's words
                yield Redraw((fig, stopped_summary(session)))
                return
            if state.running is not None:
                label = next(r.label for r in RULES if r.name == state.running)
                md = f"*Running **{label}** ({len(state.results) + 1} of {len(RULES)}), {state.n} trials…*\n\n" + md
            yield fig, md
    except RequestError as exc:   # the validator answered these beside their fields; an API caller reads this
        raise gr.Error("; ".join(exc.errors.values()), title="Cannot run the check") from None
    except ValueError as exc:
        raise gr.Error(str(exc), title="Cannot run the check") from None


def build(models: LoadedPair, limits: Limits = Limits()) -> None:
    """Lay out the tab inside the current ``gr.Blocks`` and wire its events (it needs the pair and this server's
    request limits alone)."""
    with gr.Accordion("How to read this", open=False):
        gr.Markdown(HOW_TO_READ)
    with gr.Row():
        with gr.Column(scale=1, min_width=300):
            prompt = gr.Textbox(label="Prompt (short: its next token is tested)", lines=3,
                                value="Write a haiku about autumn leaves.")
            chat = gr.Checkbox(value=True, label="apply the chat template")
            with gr.Row():
                temperature = gr.Slider(0.05, 2, value=1.0, step=0.05, label="temperature")
                top_p = gr.Slider(0.05, 1, value=0.95, step=0.05, label="top-p")
            with gr.Row():
                # No minimum/maximum on the boxes: the validator refuses beside the field, naming it (Gradio's
                # own range check answers with a toast that names none).
                trials = gr.Number(PAGE_TRIALS, precision=0, label=f"trials N per rule ({MIN_TRIALS}..{MAX_TRIALS})")
                children = gr.Slider(1, MAX_CHILDREN, value=DEFAULT_CHILDREN, step=1, label="children at the root (k)")
                seed = gr.Number(0, precision=0, label="seed")
            with gr.Row():
                run_btn = gr.Button("Run the check", variant="primary")
                stop_btn = gr.Button("Stop", variant="stop", elem_id="sq-check-stop")
            refused = gr.Markdown("", elem_id="sq-check-refused", visible=False)   # validation.refusal_line
        with gr.Column(scale=2):
            verdicts = gr.Markdown(elem_id="sq-check-verdicts")
            plot = gr.Plot(label="target p vs emitted tokens")
    session = gr.State(CheckSession())

    @stop_lands_last   # Stop's words land after the check's frame in flight, and no older frame after them
    @functools.partial(serving.on_gpu, duration=lambda *a: 60)  # ZeroGPU only
    def handler(*args):
        yield from on_check(models, *args, limits=limits)

    inputs = [prompt, temperature, top_p, trials, children, seed, chat, session]
    light = dict(api_visibility="private", show_progress="hidden", concurrency_limit=None)
    # The click leaves a fresh session (light: never behind a run); the check follows it and reads its flag.  A
    # click while a stopped check ends its chunk: its check runs after that one ("always_last"; Gradio's default
    # "once" dropped it, issue 59).
    run_btn.click(functools.partial(begin_check, limits=limits), inputs, [session, refused], **light).then(
        handler, inputs, [plot, verdicts], api_visibility="private", trigger_mode="always_last",
        validator=functools.partial(validator, limits=limits), **MODEL_WORK)
    stop_btn.click(stop_check, session, [plot, verdicts], **light)
