"""The runtime the server runs and why, and every runtime of this machine beside it.

``pair_words``         the runtime, weights and device of the loaded pair (the banner's pair line);
``banner_html``        one line under the loading banner: the runtime and the reason it was chosen;
``runtimes_markdown``  the Hardware tab's table: each runtime installed or not, its predicted rate or
                       "not measured here", and a "fastest" line that says the same as the choice.

Both are pure functions of a :class:`sequoia.runtime.measuring.runtime_choice.RuntimeDecision`.
"""

from __future__ import annotations

import html

from sequoia.core.profiles.runtimes import NOT_MEASURED, START_MEMORY_GB, RuntimeDecision, RuntimeEstimate, display_name
from sequoia.runners.base import RunnerInfo


def pair_words(target: RunnerInfo, draft: RunnerInfo) -> str:
    """The runtime, the weights and the device a pair runs on, as the runners report them: "llama.cpp, Q4_K_M,
    CPU"; "Hugging Face (torch), target bf16, draft int8, CPU" when the two differ.

    From the runners, never the pair's activation dtype: a GGUF target's logits are float32 whatever its weights
    (the banner said "cpu (torch.float32)" beside a Q4_K_M model)."""
    t, d = _weights(target), _weights(draft)
    weights = t if t == d else f"target {t}, draft {d}"
    device = "CPU" if target.device == "cpu" else target.device
    runtime = display_name(target.runtime) if target.runtime == draft.runtime else \
        f"target on {display_name(target.runtime)}, draft on {display_name(draft.runtime)}"
    return f"{runtime}, {weights}, {device}"


def _weights(info: RunnerInfo) -> str:
    """The weights as loaded: the quantisation of the linears when there is one (hf int8), else the type."""
    return info.quant if info.quant not in ("", "none") else info.weights


def banner_html(decision: RuntimeDecision | None, measured_since: bool = False) -> str:
    """The banner's runtime line: which runtime serves, named or chosen, and why.  ``measured_since``: this
    server measured its runtime's profile after the choice, so the choice's "… not measured here" is history
    and the line says what changed instead (issue 51: it read "not measured here" after the measurement)."""
    if decision is None:
        return ""
    how = "named" if decision.explicit else "chosen"
    reason = decision.reason
    if measured_since:
        parts = reason.split("; ")
        reason = "; ".join(p for p in parts if not p.endswith("not measured here")) or reason
        reason += ("; since then this server measured this machine's profile: the Hardware tab compares every "
                   "runtime with it")
        how = "chosen at start"
    return (f'<div class="sq-status sq-status-runtime"><small>Runtime: <b>{html.escape(display_name(decision.backend))}'
            f"</b>, {how}: {html.escape(reason)}. The Hardware tab lists every runtime here.</small></div>")


def runtimes_markdown(decision: RuntimeDecision, running: str | None = None,
                      started: RuntimeDecision | None = None, room_gb: float | None = None) -> str:
    """A table of every runtime (installed, how its models are stored and where its costs come from, the target
    alone and the best method's predicted rate, or "not measured here") and which is fastest.  ``decision`` is for the tab's acceptance
    vector and limits; ``running`` the loaded pair's runtime, ``started`` the choice the server made at start,
    ``room_gb`` the memory a restarted server would have (None: unknown): :func:`switch_lines`."""
    lines = ["| runtime | installed | target alone | best method | predicted |", "|---|---|---|---|---|"]
    lines += [_row(r, r.backend == decision.backend) for r in decision.runtimes]
    lines.append("\n" + fastest_line(decision))
    lines.append(_running_line(decision, running, started))
    lines += switch_lines(decision, running, room_gb)
    return "\n".join(line for line in lines if line)


def switch_lines(decision: RuntimeDecision, running: str | None, room_gb: float | None) -> list[str]:
    """How to serve on each other installed runtime (a restart with ``SEQUOIA_BACKEND``), where its measured
    start-up memory fits ``room_gb``; one that would not fit says so instead of being offered."""
    lines = []
    for r in decision.runtimes:
        if not r.installed or r.backend == running:
            continue
        need = START_MEMORY_GB.get(r.backend)
        size = f"about {need:.1f} GB after start" if need is not None else "its memory not measured here"
        if need is not None and room_gb is not None and need > room_gb:
            lines.append(f"- {display_name(r.backend)}: does not fit here ({size}; this server has "
                         f"{room_gb:.1f} GB).")
            continue
        lines.append(f"- Serve on {display_name(r.backend)}: restart with `SEQUOIA_BACKEND={r.backend} python app.py` "
                     f"({size}).")
    return (["", "**The other runtimes** (one pair is served at a time):"] + lines) if lines else []


def fastest_line(decision: RuntimeDecision) -> str:
    """What is fastest here, in the words of the choice: the measured best, or the rule that chose without it."""
    best = decision.fastest()
    chosen = decision.estimate(decision.backend)
    if decision.explicit:
        if best is None:
            return "**No runtime is measured on this machine**, so none is known to be fastest here."
        return (f"**Fastest here: {best.method} on {display_name(best.backend)}, {best.rate_text}** (predicted from "
                "the measured costs).")
    if chosen is not None and chosen.measured and best is not None and best.backend == chosen.backend:
        unmeasured = [display_name(r.backend) for r in decision.runtimes if r.installed and not r.measured]
        rest = f"; {' and '.join(unmeasured)} not measured here" if unmeasured else ""
        return (f"**Fastest here: {chosen.method} on {display_name(chosen.backend)}, {chosen.rate_text}** "
                f"(predicted from the costs measured for this CPU kind{rest}).")
    return f"**Fastest here: {display_name(decision.backend)}**, by rule: {decision.reason}."


def _running_line(decision: RuntimeDecision, running: str | None, started: RuntimeDecision | None) -> str:
    if running is None:
        return ""
    if started is not None and started.explicit:
        return f"This server runs {display_name(running)}: {started.reason}."
    if running == decision.backend:
        return f"This server runs {display_name(running)}."
    why = f" (chosen at start for code prompts at T=0: {started.reason})" if started is not None else ""
    return f"This server runs {display_name(running)}{why}."


def _row(r: RuntimeEstimate, chosen: bool) -> str:
    name = ("★ " if chosen else "") + display_name(r.backend)
    if not r.installed:
        return f"| {name} | no (needs llama-cpp-python) | | | |"
    if not r.measured:
        return f"| {name} | yes | {NOT_MEASURED} | | {NOT_MEASURED} |"
    detail = "<br><small>" + html.escape("; ".join(filter(None, (r.models, f"costs: {r.source}")))) + "</small>"
    gain = r.tokens_per_s / r.alone_tokens_per_s
    return (f"| {name}{detail} | yes | {r.alone_tokens_per_s:.1f} tok/s | {r.method} | "
            f"{r.tokens_per_s:.1f} tok/s ({gain:.2f}×) |")
