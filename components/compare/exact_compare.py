"""What the Compare tab adds after a run at T=0: exact mode's certificate, or where the outputs part.

Kept apart from ``compare_tab`` so that the tab's request path stays as it is; this module only reads the
finished rows and asks the target (:mod:`sequoia.runtime.checks.exactness`, :mod:`sequoia.runtime.checks.divergence`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import gradio as gr

from sequoia.runners.base import shared_vocab
from sequoia.runtime.checks.divergence import explain_all
from sequoia.runtime.checks.exactness import certify
from sequoia.runtime.engine import model_lock

from components.compare.compare_view import REFERENCE, CompareRow, mark_near_ties, table
from components.widgets import divergence_view


def after_comparison(ctx, prompt: str, chat: bool, rows: Sequence[CompareRow], temperature: float, exact: bool,
                     render: Callable[[Sequence[CompareRow]], str]) -> Iterator[tuple]:
    """Yield (bars, table, notes) updates (``render(rows)``: the notes): at T=0, in exact mode, the run's margin
    certificate; when a method differs, its first divergence with the target's top-2 margins there, and the
    rows that part at a kernel near-tie say so in the table."""
    ref = next((r for r in rows if r.method == REFERENCE), None)
    if float(temperature) != 0 or ref is None:
        return
    differing = {r.method: r.token_ids for r in rows if r.identical is False}
    notes = render(rows)
    if not exact and not differing:
        return
    pair = ctx.pair()
    ids = pair.encode_prompt(prompt, chat=bool(chat))
    vocab = shared_vocab(pair)
    extra = []
    if exact:
        yield gr.skip(), gr.skip(), notes + "\n\n*Checking the target's margins along its path (one more replay)…*"
        with model_lock(pair):   # the replays share the runners with the background profiler (engine.model_lock)
            gap = None if differing else certify(pair.target, ids, ref.token_ids, vocab)
        extra.append(divergence_view.exact_markdown(not differing, gap))
    if differing:
        yield gr.skip(), gr.skip(), notes + "\n\n*Finding where the outputs part (replaying the prefix)…*"
        with model_lock(pair):
            found = explain_all(pair.target, pair.tokenizer, ids, ref.token_ids, differing, vocab)
        if not exact:   # in exact mode a difference is never a rounding near-tie
            rows = mark_near_ties(rows, {d.method: d.position + 1 for d in found if d.near_tie})
        extra.append(divergence_view.markdown(found))
    yield gr.skip(), table(rows), render(rows) + "\n\n" + "\n\n".join(extra)
