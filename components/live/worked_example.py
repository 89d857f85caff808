"""One rejection worked by hand: a five-token vocabulary, the test, the residual and the resampled token.

The inspector shows verification on a real model's distributions, over tens of thousands of tokens and eight
bars at a time; this is the same rule small enough to check with a pencil.  The numbers come from the
project's own functions (:mod:`sequoia.core.verification.sampling`: ``sample_children`` draws the draft's child,
``verify_children`` tests it and forms the residual, ``sample_token`` draws from the residual), driven by one
seeded ``torch.Generator``, so they are what the engine's rule gives, never a second copy of it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import plotly.graph_objects as go
import torch

from sequoia.core.verification.sampling import (ChildTest, acceptance_probability, sample_children, sample_token,
                                                verify_children)

from components import COLORS

#: The context and its five possible next words (the whole vocabulary of the example).
CONTEXT = "The cat sat on the"
VOCAB = ("mat", "sofa", "floor", "roof", "bed")
#: The target (p) likes "sofa" and "mat"; the draft (q) bets on "floor", which the target finds unlikely.
P = (0.30, 0.35, 0.10, 0.15, 0.10)
Q = (0.05, 0.10, 0.70, 0.10, 0.05)
#: A seed whose draws give the lesson's case: the draft proposes "floor", the target rejects it, and the
#: residual gives "sofa" (tests/components/test_worked_example.py holds this).
SEED = 9
_P, _Q, _R = "#1f77b4", "#ff7f0e", "#9467bd"   # the inspector's colours for p, q and the residual


@dataclass(frozen=True)
class WorkedExample:
    """One child drawn from q, tested against p, rejected or not, and the token the target emits."""

    vocab: tuple[str, ...]        # [V] the words
    p: tuple[float, ...]          # [V] target distribution
    q: tuple[float, ...]          # [V] draft distribution
    child: int                    # the draft's proposal, drawn from q
    u: float                      # the uniform draw of the test
    chance: float                 # min(1, p(child) / q(child))
    accepted: bool
    residual: tuple[float, ...]   # [V] norm(max(p - q, 0)); () when the child was accepted
    emitted: int                  # the child if accepted, else the token drawn from the residual
    seed: int


def work(p: Sequence[float] = P, q: Sequence[float] = Q, vocab: Sequence[str] = VOCAB,
         seed: int = SEED) -> WorkedExample:
    """Draw one child from ``q``, verify it against ``p`` and emit a token, with the engine's functions."""
    if not len(p) == len(q) == len(vocab):
        raise ValueError(f"p, q and vocab need one entry per token, got {len(p)}, {len(q)}, {len(vocab)}")
    p_t, q_t = torch.tensor(p, dtype=torch.float32), torch.tensor(q, dtype=torch.float32)   # [V] each
    gen = torch.Generator().manual_seed(seed)
    child = int(sample_children(q_t[None], 1, "without_replacement", gen)[0, 0])
    events: list[ChildTest] = []
    accepted, after = verify_children(p_t, q_t, [child], "without_replacement", gen, events)
    test = events[0]
    emitted = child if accepted is not None else sample_token(after, gen)
    residual = () if test.residual is None else tuple(float(x) for x in test.residual)
    return WorkedExample(tuple(vocab), tuple(float(x) for x in p), tuple(float(x) for x in q), child, test.u,
                         float(acceptance_probability(float(p_t[child]), float(q_t[child]))), test.accepted,
                         residual, emitted, seed)


def figure(ex: WorkedExample) -> go.Figure:
    """Bars of p, q and the residual over the five words, each with its number; the proposal and the emitted
    token marked; the test's numbers in the title."""
    fig = go.Figure()
    series = [("target p", ex.p, _P), ("draft q", ex.q, _Q)]
    if ex.residual:
        series.append(("residual norm(max(p − q, 0))", ex.residual, _R))
    for name, ys, color in series:
        fig.add_trace(go.Bar(x=list(ex.vocab), y=list(ys), name=name, marker_color=color,
                             text=[f"{y:.2f}" for y in ys], textposition="outside", cliponaxis=False,
                             hovertemplate=f"{name}: %{{y:.3f}}<extra>%{{x}}</extra>"))
    top = max(max(ex.p), max(ex.q), max(ex.residual, default=0.0))
    verdict = COLORS["accepted"] if ex.accepted else COLORS["rejected"]
    fig.add_annotation(x=ex.vocab[ex.child], y=top + 0.16, showarrow=False, font=dict(size=13, color=verdict),
                       text="▼ drafted, " + ("accepted" if ex.accepted else "rejected"))
    if not ex.accepted:
        fig.add_annotation(x=ex.vocab[ex.emitted], y=top + 0.16, showarrow=False,
                           font=dict(size=13, color=COLORS["bonus"]), text="★ drawn from the residual")
    fig.update_layout(title=dict(text=title(ex), x=0.01, font=dict(size=14)), barmode="group", height=420,
                      plot_bgcolor="white", margin=dict(l=40, r=20, t=90, b=40),
                      legend=dict(orientation="h", y=-0.12, yanchor="top"))
    fig.update_yaxes(range=[0, top + 0.25], gridcolor="#eee", title="probability")
    return fig


def title(ex: WorkedExample) -> str:
    """The test in numbers, then what was emitted."""
    word, pc, qc = ex.vocab[ex.child], ex.p[ex.child], ex.q[ex.child]
    test = (f"“{CONTEXT} …”: the draft proposes <b>{word}</b> (q = {qc:.2f}); the target gives it p = {pc:.2f}.<br>"
            f"Accept if u < min(1, p/q) = {ex.chance:.3f}; u = {ex.u:.3f}")
    if ex.accepted:
        return f"{test}: <b>accepted</b>, the target emits {word}."
    return f"{test}: <b>rejected</b>, the target draws <b>{ex.vocab[ex.emitted]}</b> from the residual."


def markdown(ex: WorkedExample) -> str:
    """The arithmetic under the figure: one row per word (p, q, p − q, max(0, p − q), the residual)."""
    if ex.accepted:
        return (f"The draft's **{ex.vocab[ex.child]}** passed its test (u = {ex.u:.3f} < {ex.chance:.3f}), so the "
                "target emits it and no residual is needed.")
    gaps = [max(0.0, a - b) for a, b in zip(ex.p, ex.q)]
    rows = [f"| {w} | {a:.2f} | {b:.2f} | {a - b:+.2f} | {g:.2f} | {r:.3f} |"
            for w, a, b, g, r in zip(ex.vocab, ex.p, ex.q, gaps, ex.residual)]
    word = ex.vocab[ex.child]
    return "\n".join([
        f"1. The draft drew **{word}** from q (seed {ex.seed}). The target accepts it with probability "
        f"min(1, p/q) = min(1, {ex.p[ex.child]:.2f} / {ex.q[ex.child]:.2f}) = {ex.chance:.3f}.",
        f"2. The uniform draw u = {ex.u:.3f} is not below {ex.chance:.3f}: **{word} is rejected**.",
        f"3. The target keeps what the draft under-offered: max(0, p − q), which sums to {sum(gaps):.2f}; divided "
        "by that sum it is the residual.",
        f"4. The emitted token is drawn from the residual: **{ex.vocab[ex.emitted]}**. Over many draws the "
        "emitted word is distributed exactly as p: min(p, q) + P(reject) × residual = p.",
        "",
        "| word | p | q | p − q | max(0, p − q) | residual |",
        "|---|---|---|---|---|---|",
        *rows,
        f"| sum | {sum(ex.p):.2f} | {sum(ex.q):.2f} | | {sum(gaps):.2f} | {sum(ex.residual):.3f} |",
    ])
