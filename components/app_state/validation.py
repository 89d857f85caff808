"""The page's request path: one parse per request, before it queues; the handlers get the parsed request.

**Parse once.**  :func:`parse_inputs` turns the raw values of the Live and
Compare tabs and of the ``/decode`` and ``/compare`` endpoints (their fields
defined once: :class:`components.app_state.decode_inputs.DecodeInputs`) into a frozen
:class:`sequoia.core.requests.request.DecodeRequest` (the one parser,
:func:`sequoia.core.requests.request.parse_decode`, then the prompt's token ids), and
:func:`dp_request` does the same for ``/dp``.  Each remembers the last
requests by their raw values and this server's limits: Gradio runs an event's
``validator`` when the request arrives, before it joins the queue, and that
call parses; the handler's call with the same values gets the same object
back.  Nothing else is built before the queue (no proposer, no DP solve):
:func:`engine_inputs` builds the proposer once, in the handler, with
:func:`sequoia.runtime.methods.make_method`.

**Refusals name the field.**  Each validator answers with one ``gr.validate``
per input; a bad field's message sits on that field's input (so
``gradio_client`` reports ``- budget: budget must be ...``) and starts with its
label.  ``gr.api`` takes no ``validator=`` argument, so
:func:`attach_validators` sets it on each endpoint's function record.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import gradio as gr

from sequoia.core.config import GenerationConfig
from sequoia.core.requests.request import (METHOD_OF_LABEL, DecodeRequest, DPRequest, Limits, MethodSpec, RequestError,
                                           parse_decode, parse_dp)
from sequoia.runtime.drafter import Proposer
from sequoia.runtime.methods import make_method
from sequoia.runtime.models import PromptTooLong
from sequoia.runtime.proposers.ngram_proposer import NgramSettings

from components.app_state.acceptance_choice import acceptance_catalogue
from components.app_state.context import AppContext
from components.app_state.decode_inputs import (API_FIELDS, COMPARE_FIELDS, PAGE_FIELDS, DecodeInputs, api_signature,
                                                compare_handler, page_handler)
from components.app_state.memo import RequestMemo, raw_key

#: Fields of each endpoint's inputs, in order (None: an input the request parser does not read).
INPUT_FIELDS = {
    "decode": API_FIELDS,
    "decode_stream": (*PAGE_FIELDS, None),     # then the page's session state
    "compare": ("prompt", "budget", "depth", "temperature", "top_p", "max_new_tokens", "seed", None),
    "compare_stream": (*COMPARE_FIELDS[:-1], None, None),   # then the methods ticked and the tab's session state
    "dp": ("acceptance", "budget", "depth"),
}
#: The method a comparison's request is parsed (and its budget checked) with; each row then takes its own.
COMPARE_METHOD = "Sequoia (budget & depth)"


def memo(ctx: AppContext) -> RequestMemo:
    """This server's parsed decode requests (one memo per pair: see AppContext.requests)."""
    return ctx.requests


def decode_request(ctx: AppContext, *values, **named) -> DecodeRequest:
    """The parsed request of raw values given as :class:`DecodeInputs`' fields (:func:`parse_inputs`)."""
    return parse_inputs(ctx, DecodeInputs(*values, **named))


def page_request(ctx: AppContext, inputs: DecodeInputs) -> DecodeRequest:
    """The parsed request of the Live tab's inputs, whose acceptance is a catalogue label (an unknown one: the
    method's default vector)."""
    vector = acceptance_catalogue(ctx.assets_dir).get(inputs.acceptance)
    return parse_inputs(ctx, replace(inputs, acceptance=vector))


def parse_inputs(ctx: AppContext, inputs: DecodeInputs) -> DecodeRequest:
    """The parsed, tokenized request of these raw values (parsed once for the same values on this server).

    ``inputs.acceptance``: None, a vector, or text such as ``"0.8, 0.1"``.  Raises RequestError naming the bad
    fields, or ModelsNotReady (a ValueError) while the pair loads.
    """
    lim = ctx.limits
    raw = inputs.values()

    def parse() -> DecodeRequest:
        req = parse_decode(*raw, limits=lim)
        pair = ctx.pair()
        try:
            ids = pair.encode_prompt(req.prompt, chat=req.chat)
        except PromptTooLong as exc:   # over any request's tokens: named against this request's own cap
            check_context(req, exc.n_tokens, pair.target.max_context, lim)
            raise
        check_context(req, len(ids), pair.target.max_context, lim)
        return req.tokenized(ids, lim)

    return memo(ctx).get_or_parse(raw_key(*raw, lim), parse)


def tree_positions(method: MethodSpec) -> int:
    """Most positions one step of ``method`` may ask the target to verify, root included: at least the engine's
    ``proposer.max_nodes`` (equal for every shape but the DP's, whose tree may use fewer than the budget), known
    from the request alone, before the queue and without building the proposer."""
    info, b, d = method.info, method.budget, method.depth
    if info.shape == "root":
        return 1
    if info.shape == "chain":
        return min(b, d) + 1
    if info.shape == "chains":
        return max(1, b // d) * d + 1
    if info.shape == "kary":
        return 2 ** (d + 1) - 1
    copied = NgramSettings().budget if info.copies and info.shape == "dynamic" else 0   # copied branches beside
    return b + copied + 1


def widest_tree(method: MethodSpec) -> int:
    """The most positions any page method takes at this budget and depth: a comparison runs several."""
    return max(tree_positions(MethodSpec(name, method.budget, method.depth)) for name in METHOD_OF_LABEL.values())


def context_cap(req: DecodeRequest, max_context: int | None, limits: Limits, tree: int | None = None) -> int:
    """Most prompt tokens this request may have here: the server's per-request cap, or less where its new tokens
    and its tree (``tree`` positions; None: its method's) would run past the target's context (``max_context``;
    None: no known limit)."""
    if not max_context:
        return limits.max_prompt_tokens
    tree = tree_positions(req.method) if tree is None else tree
    return min(limits.max_prompt_tokens, max_context - req.max_new_tokens - tree)


def check_context(req: DecodeRequest, n_prompt: int, max_context: int | None, limits: Limits,
                  tree: int | None = None) -> None:
    """RequestError on the prompt field when ``n_prompt`` tokens are more than :func:`context_cap` lets this
    request have, naming the cap that binds: the one limit, checked before the queue, that the engine would
    otherwise meet after the request started (a toast, not a word beside the prompt)."""
    cap = context_cap(req, max_context, limits, tree)
    if n_prompt <= cap:
        return
    new, tree = req.max_new_tokens, tree_positions(req.method) if tree is None else tree
    room = (f"at most {cap} prompt tokens fit these settings" if cap > 0 else "no prompt fits these settings")
    fits = f"{room} (fewer new tokens or a smaller budget leave more)"
    if n_prompt > limits.max_prompt_tokens:
        tail = "" if cap == limits.max_prompt_tokens else (
            f", and with {new} new tokens and a tree of up to {tree} positions the target's context of "
            f"{max_context} leaves room for fewer: {fits}")
        raise RequestError({"prompt": f"prompt has {n_prompt} tokens; this server takes at most "
                                      f"{limits.max_prompt_tokens} per request on {limits.device}{tail}"})
    raise RequestError({"prompt": f"prompt has {n_prompt} tokens; with {new} new tokens and a tree of up to {tree} "
                                  f"positions it needs {n_prompt + new + tree} positions, which exceeds the "
                                  f"target's context of {max_context}: {fits}"})


def dp_request(memo: RequestMemo, acceptance, budget, depth) -> DPRequest:
    """The parsed DP request of these raw values (parsed once for the same values: ``memo`` is the app's,
    :attr:`components.app_state.lanes.WorkLanes.dp_requests`)."""
    return memo.get_or_parse(raw_key(acceptance, budget, depth), lambda: parse_dp(acceptance, budget, depth))


def check_dp_request(memo: RequestMemo, acceptance, budget, depth) -> None:
    """Everything ``/dp`` checks before solving: the vector, its length, the budget, depth and DP work."""
    dp_request(memo, acceptance, budget, depth)


# ------------------------------------------------------------------ engine inputs
@dataclass(frozen=True)
class EngineInputs:
    """What the engine takes for one parsed request: prompt ids, proposer, settings."""

    prompt_ids: list[int]
    proposer: Proposer
    config: GenerationConfig
    inspect: bool = False     # record what verification saw (the live tab's inspector)


def engine_inputs(ctx: AppContext, req: DecodeRequest) -> EngineInputs:
    """The proposer of a parsed request (built here once, by the one factory) with the server's profile,
    calibration and copy acceptance where the method uses them."""
    state = ctx.method_state(req.method.info, req.sampling.temperature)
    # Where this server learns its acceptance, a tree built from a vector gets the picked one updated with it
    acceptance = ctx.acceptance_for(req.acceptance, req.sampling.temperature) if req.method.info.solves_dp \
        else req.acceptance
    proposer = make_method(req.method, acceptance=acceptance, **state)
    return EngineInputs(list(req.prompt_ids), proposer, req.config)


# ------------------------------------------------------------------ validators
def answer(fields: tuple[str | None, ...], check: Callable[[], object]) -> list[dict]:
    """One gr.validate per input: each bad field's message on its input; an error about no field (the models
    still loading) on the first input."""
    try:
        check()
    except RequestError as exc:
        bad = {i: exc.errors[f] for i, f in enumerate(fields) if f in exc.errors}
        if not bad:
            bad = {0: str(exc)}
        return [gr.validate(i not in bad, bad.get(i, "")) for i in range(len(fields))]
    except ValueError as exc:
        return [gr.validate(i != 0, str(exc) if i == 0 else "") for i in range(len(fields))]
    return [gr.validate(True, "") for _ in fields]


def validators(ctx: AppContext) -> dict[str, Callable[..., list[dict]]]:
    """api_name -> validator with the endpoint's signature; each parses (and so remembers) the request."""
    def decode(*values, **named):
        return answer(API_FIELDS, lambda: decode_request(ctx, *values, **named))

    def decode_stream(inputs: DecodeInputs, session=None):   # session: the page's state, not the request's
        return answer(INPUT_FIELDS["decode_stream"], lambda: page_request(ctx, inputs))

    def compare(prompt, budget=32, depth=8, temperature=0.0, top_p=1.0, max_new_tokens=64, seed=0,
                include_hf=True):
        return answer(INPUT_FIELDS["compare"], lambda: check_compared(ctx, decode_request(
            ctx, prompt, COMPARE_METHOD, budget, depth, temperature, top_p, max_new_tokens, seed)))

    def compare_stream(inputs: DecodeInputs, methods: list[str], session=None):   # session: the tab's state
        return answer(INPUT_FIELDS["compare_stream"], lambda: check_compared(ctx, page_request(ctx, inputs)))

    def dp(acceptance, budget=32, depth=8):
        return answer(INPUT_FIELDS["dp"], lambda: dp_request(ctx.lanes.dp_requests, acceptance, budget, depth))

    stream = compare_handler(compare_stream, COMPARE_METHOD, ("session",))
    return {"decode": api_signature(decode, list), "decode_stream": page_handler(decode_stream, ("session",)),
            "compare": compare, "compare_stream": stream, "compare_full": stream,   # compare_full: Compare's full run
            "dp": dp}


def check_compared(ctx: AppContext, req: DecodeRequest) -> None:
    """A comparison's context check: its prompt with the widest tree any of its rows may verify."""
    check_context(req, len(req.prompt_ids), ctx.pair().target.max_context, ctx.limits, widest_tree(req.method))


def refusal_line(exc: ValueError | None, what: str = "Not decoded") -> gr.Markdown:
    """Why a click ran nothing (``what``: the tab's words), drawn by the server under the tab's buttons by the
    click's first, light event.  The validator's message beside each bad field says it too, but Gradio redraws
    every field's status whenever any event of the page answers, which wipes those messages: on a page whose
    banner polls (the models loading, the background profile measuring: once a second) a refusal showed for
    under a second, and one shown while the page's first events still ran went when they ended.  This line stays
    until the next click; hidden (no room taken) when ``exc`` is None, a request taken."""
    return gr.Markdown(f"**{what}:** {exc}" if exc else "", visible=exc is not None)


def attach_validators(demo: gr.Blocks, ctx: AppContext) -> list[str]:
    """Check requests to the named endpoints before they queue; returns the endpoints guarded."""
    found = validators(ctx)
    guarded = []
    for fn in demo.fns.values():
        if fn.api_name in found and fn.validator is None:
            fn.validator = found[fn.api_name]
            guarded.append(fn.api_name)
    return guarded


# ------------------------------------------------------------------ sliders
def say_when_clamped(slider: gr.Slider, name: str) -> None:
    """Warn when a value typed into ``slider``'s box lies outside its range: the browser then sets the nearest
    end without a word (and the server only ever sees that).  The raw value reaches this handler unchecked
    (``preprocess=False``: the slider's own check would answer with an error toast instead)."""
    lo, hi = slider.minimum, slider.maximum

    def check(raw) -> None:
        try:
            value = float(raw)
        except (TypeError, ValueError):
            return
        if value < lo or value > hi:
            gr.Warning(f"{name} {value:g} is outside {lo:g}..{hi:g}: it was set to {min(max(value, lo), hi):g}.")

    slider.input(check, slider, None, preprocess=False, api_visibility="private", show_progress="hidden",
                 concurrency_limit=None)
