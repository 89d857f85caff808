"""Request checks that run before a request joins the queue.

Gradio runs an event's ``validator`` when the request arrives, before it
joins the model queue, so a bad request is refused in milliseconds instead of
after the job in front of it (``gradio_client`` raises a ValidationError with
the message).  ``gr.api`` takes no ``validator=`` argument, so
:func:`attach_validators` sets it on each endpoint's function record.  Each
validator runs the same checks as its handler (``live_tab.make_request``,
:func:`check_dp_request`) and answers with one ``gr.validate`` per input.
"""

from __future__ import annotations

from collections.abc import Callable

import gradio as gr

from sequoia.core.config import check_acceptance_length, check_budget, check_dp_work

from . import live_tab
from .context import AppContext, acceptance_catalogue, parse_acceptance


def check_dp_request(acceptance: str, budget, depth) -> None:
    """Everything ``/dp`` checks before solving: the vector, its length, the budget, depth and DP work."""
    values = parse_acceptance(acceptance)
    check_acceptance_length(values)
    budget, depth = live_tab._as_int("budget", budget, 1), live_tab._as_int("depth", depth, 1)
    check_budget(budget, depth)
    check_dp_work(budget, depth, len(values))


def _answer(n_inputs: int, check: Callable[[], object], where: int = 0) -> list[dict]:
    """One gr.validate per input: all valid, or the check's message on input ``where``."""
    try:
        check()
    except ValueError as exc:
        return [gr.validate(i != where, str(exc) if i == where else "") for i in range(n_inputs)]
    return [gr.validate(True, "") for _ in range(n_inputs)]


def validators(ctx: AppContext) -> dict[str, Callable[..., list[dict]]]:
    """api_name -> validator with the endpoint's signature."""
    def decode(prompt, method="sequoia", budget=32, depth=8, temperature=0.0, top_p=1.0, max_new_tokens=64,
               seed=0, chat=True, acceptance=""):
        def check():
            vec = parse_acceptance(acceptance) if str(acceptance or "").strip() else None
            live_tab.make_request(ctx, prompt, method, budget, depth, temperature, top_p, max_new_tokens, seed,
                                  vec, chat)
        return _answer(10, check)

    def decode_stream(prompt, method, budget, depth, temperature, top_p, max_new_tokens, seed, acceptance_name,
                      chat):
        def check():
            vec = acceptance_catalogue(ctx.assets_dir).get(acceptance_name)
            live_tab.make_request(ctx, prompt, method, budget, depth, temperature, top_p, max_new_tokens, seed,
                                  vec, chat)
        return _answer(10, check)

    def compare(prompt, budget=32, depth=8, temperature=0.0, top_p=1.0, max_new_tokens=64, seed=0,
                include_hf=True):
        return _answer(8, lambda: live_tab.make_request(ctx, prompt, "Sequoia (budget & depth)", budget, depth,
                                                        temperature, top_p, max_new_tokens, seed))

    def compare_stream(prompt, budget, depth, temperature, top_p, max_new_tokens, seed, acceptance_name, chat,
                       include_hf):
        def check():
            vec = acceptance_catalogue(ctx.assets_dir).get(acceptance_name)
            live_tab.make_request(ctx, prompt, "Sequoia (budget & depth)", budget, depth, temperature, top_p,
                                  max_new_tokens, seed, vec, chat)
        return _answer(10, check)

    def dp(acceptance, budget=32, depth=8):
        return _answer(3, lambda: check_dp_request(acceptance, budget, depth))

    return {"decode": decode, "decode_stream": decode_stream, "compare": compare, "compare_stream": compare_stream,
            "dp": dp}


def attach_validators(demo: gr.Blocks, ctx: AppContext) -> list[str]:
    """Check requests to the named endpoints before they queue; returns the endpoints guarded."""
    found = validators(ctx)
    guarded = []
    for fn in demo.fns.values():
        if fn.api_name in found and fn.validator is None:
            fn.validator = found[fn.api_name]
            guarded.append(fn.api_name)
    return guarded
