"""The verification inspector: why one node of a step's tree was accepted or rejected.

Pure views of a :class:`~sequoia.core.statistics.trace.StepRecord` recorded with
``generate(..., inspect=True)`` (its ``checks``).  For a node the figure has
one row per sibling tested before it and one for the node itself: bars of
the target p and the draft q over the parent's most likely tokens at that
moment, the residual norm(max(p - q, 0)) left after a rejection, and beside
them the uniform draw u against the acceptance chance min(1, p/q).  For the
bonus node it shows the distribution the bonus was drawn from.

Children are named by their place in sampling order, 1-based, as the DP's
acceptance vector is: the first child is the one p_1 is about.

A child copied from the context (``record.source(node) == NGRAM``) is a fixed
proposal, a point mass, so its test is u against min(1, p/1) = p (exact match
at T=0), and the draft's siblings after it were drawn from q without the
copied tokens (see :mod:`sequoia.core.verification.sampling`, "Mixed sources").
"""

from __future__ import annotations

import math
import textwrap

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from sequoia.core.statistics.stats import dropped_nodes, kept
from sequoia.core.statistics.trace import NGRAM, NodeCheck, StepRecord
from sequoia.core.statistics.words import counted

from components import COLORS
from components.widgets.tree_view import BADGE_PX, escape_token, visible

#: At most this many sibling rows (the latest ones) in one figure.
MAX_ROWS = 4
_P, _Q, _R = "#1f77b4", "#ff7f0e", "#9467bd"


def node_choices(record: StepRecord) -> list[tuple[str, int]]:
    """(label, node) pairs for a picker: every verified node, then the bonus."""
    tested = {c.node for c in record.checks}
    out = []
    for i in range(1, record.tree.n_nodes):
        if i in tested:
            out.append((f"node {i} · {visible(record.texts[i]) if record.texts else record.tokens[i]}"
                        f" · {record.status[i]}", i))
    bonus = record.tree.n_nodes
    out.append((f"bonus · {visible(record.bonus_text)}", bonus))
    return out


def default_node(record: StepRecord) -> int:
    """The node a picker preselects: the step's first rejected node (the interesting test), else the bonus."""
    rejected = [n for _, n in node_choices(record) if n < record.tree.n_nodes and record.status[n] == "rejected"]
    return rejected[0] if rejected else record.tree.n_nodes


def _check(record: StepRecord, node: int) -> NodeCheck | None:
    return next((c for c in record.checks if c.node == node), None)


def _siblings(record: StepRecord, check: NodeCheck) -> list[NodeCheck]:
    """The checks of ``check``'s parent up to and including it, in verification order."""
    out = []
    for c in record.checks:
        if c.parent == check.parent and c.node != record.tree.n_nodes:
            out.append(c)
        if c is check:
            break
    return out


def child_name(record: StepRecord, node: int) -> str:
    """'child 2 (p_2)' style name of a node among its siblings; 'the bonus token' for the bonus."""
    if node == record.tree.n_nodes:
        return "the bonus token"
    k = record.tree.ranks[node] + 1
    return f"child {k} (copied)" if copied(record, node) else f"child {k} (p_{k})"


def copied(record: StepRecord, node: int) -> bool:
    """Whether ``node`` was copied from the context (a fixed proposal) rather than drawn by the draft."""
    return 0 < node < record.tree.n_nodes and record.source(node) == NGRAM


def _chance(c: NodeCheck) -> float:
    return 1.0 if c.q_token <= 0 else min(1.0, c.p_token / c.q_token)


def significant(x: float, digits: int) -> str:
    """``x`` with ``digits`` significant digits, positional (0.000287, never 2.87e-04); zero is "0" (a "0.00"
    reads as a rounded number, and a test printed with it cannot be redone by hand)."""
    x = float(x)
    if x == 0:
        return "0"
    decimals = digits - 1 - (math.floor(math.log10(abs(x))) if x else 0)
    return f"{x:.{max(decimals, 0)}f}"


def rule_numbers(p: float, q: float, u: float | None = None) -> tuple[str, str, str, str]:
    """(p, q, min(1, p/q), u) as a test is printed, each to the digits that let a reader redo it by hand: the
    chance computed from the printed p and q rounds to the printed chance (3 significant digits, more where
    p/q needs them), and the printed u and chance differ and compare as the test did."""
    chance = 1.0 if q <= 0 else min(1.0, p / q)
    c_digits = 3
    if u is not None:   # u and the chance to as many digits as it takes to tell them apart, as the test did
        while c_digits < 9 and (significant(u, c_digits) == significant(chance, c_digits) or
                                (float(significant(u, c_digits)) < float(significant(chance, c_digits)))
                                != (u < chance)):
            c_digits += 1
    shown = significant(chance, c_digits)
    digits = 3
    while digits < 9:
        ps, qs = significant(p, digits), significant(q, digits)
        by_hand = 1.0 if float(qs) <= 0 else min(1.0, float(ps) / float(qs))
        if significant(by_hand, c_digits) == shown:
            break
        digits += 1
    return (significant(p, digits), significant(q, digits), shown,
            "" if u is None else significant(u, c_digits))


#: Characters of a token in a tick label: eight labels side by side fit the Live tab's column at 1280 px.
TICK_CHARS = 8
#: Characters of a line of a row title (at 20 px in the projector view, ~45 fit the column at 1280 px).
ROW_TITLE_CHARS = 45


def figure(record: StepRecord, node: int) -> go.Figure:
    """Bars of p, q (and the residual) over the parent's top tokens, per tested sibling, and u vs p/q."""
    check = _check(record, node)
    if check is None:
        return _empty(_why_not(record, node))
    bonus = node == record.tree.n_nodes
    rows = [check] if bonus else _siblings(record, check)[-MAX_ROWS:]
    titles = []
    for c in rows:
        rule = "min(1, p/1)" if copied(record, c.node) else "min(1, p/q)"
        titles += [_row_title(record, c), "" if bonus else (f"u vs {rule}" if c.u is not None else "T=0: argmax")]
    fig = make_subplots(rows=len(rows), cols=2, column_widths=[0.8, 0.2], subplot_titles=titles,
                        horizontal_spacing=0.08, vertical_spacing=min(0.15, 0.5 / len(rows)))
    for r, c in enumerate(rows, start=1):
        _bars(fig, c, _token(record, c), r, first=r == 1, tested=not bonus)
        if not bonus:
            _gauge(fig, c, r, "min(1, p/1)" if copied(record, c.node) else "min(1, p/q)")
    _lay_out(fig, _headline(record, check), len(rows))
    return fig


def _lay_out(fig: go.Figure, headline: str, n_rows: int) -> None:
    """Headline on top, legend at the bottom, row titles from each row's left edge: the legend used to sit
    where the headline was, and centred row titles ran off the left ("nus token…")."""
    height = 170 + 210 * n_rows
    fig.update_layout(height=height, barmode="group", plot_bgcolor="white",
                      margin=dict(l=40, r=70, t=BADGE_PX + 70, b=90),
                      legend=dict(orientation="h", yref="container", y=0, yanchor="bottom", x=0, xanchor="left"),
                      title=dict(text=headline, x=0.01, y=1 - BADGE_PX / height, yanchor="top"))
    for ann in fig.layout.annotations:
        if ann.xref == "paper" and ann.yref == "paper" and ann.text and ann.x < 0.5:  # the left column's titles
            ann.update(x=0.0, xanchor="left", align="left", font=dict(size=12))   # grows rightwards at 20 px
    fig.update_yaxes(range=[0, 1.05], gridcolor="#eee")
    # Level labels of two short lines: Plotly tilted the long one-line labels, and the first ran into the row
    # title below it (or off the left edge), unreadable.
    fig.update_xaxes(tickangle=0, tickfont=dict(size=10), automargin=True)


def _row_title(record: StepRecord, c: NodeCheck) -> str:
    if c.node == record.tree.n_nodes:   # long: lines of a width the projector view's 20 px still fits
        text = f"the bonus token {escape_token(record.bonus_text)} was drawn from {_bonus_source(record)}"
        return "<br>".join(textwrap.wrap(text, ROW_TITLE_CHARS, break_long_words=False))
    verdict = "accepted" if c.accepted else "rejected"
    tok = escape_token(record.texts[c.node]) if record.texts else str(record.tokens[c.node])
    return f"{child_name(record, c.node)} · node {c.node} {tok}: {verdict}"


def _token(record: StepRecord, c: NodeCheck) -> int:
    """The token a check is about: the child's draft token, or the bonus."""
    return record.bonus if c.node == record.tree.n_nodes else record.tokens[c.node]


def _bars(fig: go.Figure, c: NodeCheck, token: int, row: int, first: bool, tested: bool = True) -> None:
    names = [escape_token(t, TICK_CHARS) if t else str(i)
             for t, i in zip(c.top_texts or [""] * len(c.top_ids), c.top_ids)]
    x = [f"{n}<br>({i})" for n, i in zip(names, c.top_ids)]  # ids keep two tokens with the same text apart
    series = [("target p", c.top_p, _P)]
    if c.top_q:
        series.append(("draft q", c.top_q, _Q))
    if c.residual:
        series.append(("residual after rejection", c.residual, _R))
    for name, ys, color in series:
        fig.add_trace(go.Bar(x=x, y=list(ys), name=name, marker_color=color, legendgroup=name, showlegend=first,
                             hovertemplate=f"{name}: %{{y:.3f}}<extra>%{{x}}</extra>"), row=row, col=1)
    if token in c.top_ids:  # mark the tested (or drawn) token
        k = c.top_ids.index(token)
        top = max(c.top_p[k], c.top_q[k] if c.top_q else 0.0, c.residual[k] if c.residual else 0.0)
        color = COLORS["accepted"] if c.accepted else COLORS["rejected"]
        fig.add_annotation(x=x[k], y=min(top, 1.0) + 0.08, text="▼ tested" if tested else "▼ drawn",
                           showarrow=False, font=dict(color=color, size=12), row=row, col=1)


def _gauge(fig: go.Figure, c: NodeCheck, row: int, rule: str = "min(1, p/q)") -> None:
    if c.u is None:  # T=0: accepted iff the token is the target's argmax
        fig.add_trace(go.Bar(x=["argmax?"], y=[1.0 if c.accepted else 0.0], showlegend=False,
                             marker_color=COLORS["accepted"] if c.accepted else COLORS["rejected"],
                             hovertemplate="T=0: accepted only if it is the target's most likely token<extra></extra>"),
                      row=row, col=2)
        return
    chance = _chance(c)
    fig.add_trace(go.Bar(x=[rule], y=[chance], showlegend=False, marker_color="#c9ecc9",
                         hovertemplate="accepted with probability %{y:.3f}<extra></extra>"), row=row, col=2)
    fig.add_trace(go.Scatter(x=[rule], y=[c.u], mode="markers+text", text=[f"u = {c.u:.3f}"],
                             textposition="middle right", showlegend=False, hoverinfo="skip", cliponaxis=False,
                             marker=dict(symbol="line-ew-open", size=40, line=dict(width=3, color=(
                                 COLORS["accepted"] if c.accepted else COLORS["rejected"])))), row=row, col=2)


def _headline(record: StepRecord, check: NodeCheck) -> str:
    if check.node == record.tree.n_nodes:
        return f"step {record.step} · bonus token"
    return f"step {record.step} · node {check.node} · {'accepted' if check.accepted else 'rejected'}"


def _bonus_source(record: StepRecord) -> str:
    last = record.accepted[-1]
    tested = [c for c in record.checks if c.parent == last and c.node != record.tree.n_nodes]
    if not record.tree.children[last]:
        return "the target's p (the last accepted node had no children to test)"
    if tested and tested[0].u is None:
        return "the target's most likely token (T=0: no children matched it)"
    return "the residual left after every child was rejected"


def _why_not(record: StepRecord, node: int) -> str:
    if not record.checks:
        return "This step was recorded without the inspector (decode again with it on)."
    if node == 0:
        return "The root is the last committed token: its children are tested, not the root itself."
    if 0 < node < record.tree.n_nodes and record.status[node] == "unreached":
        return (f"Node {node} was never tested: an ancestor was rejected, or an earlier sibling was accepted "
                "first, so the target never had to look at it.")
    return f"No verification recorded for node {node}."


def _empty(text: str) -> go.Figure:
    fig = go.Figure()
    fig.add_annotation(text=text, x=0.5, y=0.5, xref="paper", yref="paper", showarrow=False,
                       font=dict(size=14, color="#666"))
    fig.update_layout(height=200, xaxis=dict(visible=False), yaxis=dict(visible=False), plot_bgcolor="white")
    return fig


# ------------------------------------------------------------------ words
def explain(record: StepRecord, node: int) -> str:
    """Markdown: which step and node (the picker's), then why it was accepted or rejected (or where the bonus
    came from), in plain words."""
    return f"**{heading(record, node)}**\n\n{_explain(record, node)}"


def heading(record: StepRecord, node: int) -> str:
    """'step 7 · node 3' or 'step 7 · bonus': names what the inspector shows, as the picker does."""
    return f"step {record.step} · " + ("bonus" if node == record.tree.n_nodes else f"node {node}")


def _explain(record: StepRecord, node: int) -> str:
    check = _check(record, node)
    if check is None:
        return _why_not(record, node)
    if node == record.tree.n_nodes:
        return _explain_bonus(record, check)
    lines = []
    earlier = _siblings(record, check)[:-1]
    for c in earlier:
        after = (" What the target still wants is the residual norm(max(p − q, 0)): its tokens lose what the "
                 "draft already offered." if c.u is not None else "")
        lines.append(f"- {child_name(record, c.node)}, {_quoted(record, c.node)}, was tested first and "
                     f"rejected{_numbers(record, c)}.{after}")
    if not copied(record, node) and any(copied(record, c.node) for c in earlier):
        lines.append("- The draft's children of this node were drawn from q *without the copied tokens* "
                     "(renormalised), so none repeats a copy the target already turned down; the q shown is that q.")
    lines.append(_verdict(record, check))
    if node in dropped_nodes(record):
        lines.append(f"- The target accepted it, but the length limit cut the step after "
                     f"{counted(kept(record)[0], 'token')}, so it was dropped from the output.")
    return "\n".join(lines)


def _quoted(record: StepRecord, node: int) -> str:
    return f"`{visible(record.texts[node])}`" if record.texts else f"token {record.tokens[node]}"


def _numbers(record: StepRecord, c: NodeCheck) -> str:
    if c.u is None:
        return f" (target p = {c.p_token:.3f}, not the target's most likely token)"
    if copied(record, c.node):
        p, _, _, u = rule_numbers(c.p_token, 1.0, c.u)
        return f" (copied: a fixed proposal, chance min(1, p/1) = p = {p}, draw u = {u})"
    p, q, chance, u = rule_numbers(c.p_token, c.q_token, c.u)
    return f" (p = {p}, q = {q}, chance min(1, p/q) = {chance}, draw u = {u}{zero_p(c.p_token)})"


def zero_p(p: float) -> str:
    """Why a printed p of exactly 0 ("" otherwise): the token is outside what the target may sample."""
    return ("; p is exactly 0: after the temperature and top-p the target gives this token no chance, so no draw "
            "accepts it") if p == 0 else ""


def _verdict(record: StepRecord, c: NodeCheck) -> str:
    who = f"- {child_name(record, c.node)}, {_quoted(record, c.node)}"
    if copied(record, c.node):
        return _verdict_copied(who, c)
    if c.u is None:
        if c.accepted:
            return (f"{who}, is the target's most likely token (p = {c.p_token:.3f} at T=1), so at temperature 0 "
                    "it is accepted: greedy verification keeps a draft exactly when it matches the target's argmax.")
        return (f"{who}, is not the target's most likely token (p = {c.p_token:.3f}, q = {c.q_token:.3f}), "
                "so at temperature 0 it is rejected.")
    p, q, chance, u = rule_numbers(c.p_token, c.q_token, c.u)
    rule = (f"It is accepted when the uniform draw u falls below min(1, p/q) = {chance} "
            f"(p = {p} target, q = {q} draft, both after the earlier siblings).")
    if c.accepted:
        return f"{who}: {rule} u = {u} did, so it is **accepted** and its own children are tested next."
    return (f"{who}: {rule} u = {u} did not, so it is **rejected**; the next sibling (if any) is tested "
            "against the residual, which is how the output stays distributed exactly as the target's.")


def _verdict_copied(who: str, c: NodeCheck) -> str:
    what = (f"{who}, was **copied from the context** (an n-gram match), not drawn from the draft: a fixed "
            "proposal, a point mass, so q(x) = 1 for it.")
    if c.u is None:
        verdict = "**accepted**" if c.accepted else "**rejected**"
        return (f"{what} At temperature 0 it is accepted exactly when it is the target's most likely token "
                f"(p = {c.p_token:.3f} at T=1): it is {verdict}.")
    p, _, _, u = rule_numbers(c.p_token, 1.0, c.u)
    rule = (f" It is accepted when u falls below min(1, p(x)/1) = p(x) = {p} (p after any earlier "
            "copied sibling).")
    if c.accepted:
        return f"{what}{rule} u = {u} did, so it is **accepted** and its own children are tested next."
    return (f"{what}{rule} u = {u} did not, so it is **rejected**; the target's residual is p with this "
            "token removed, and the draft's children (if any) were drawn from q without the copied tokens.")


def _explain_bonus(record: StepRecord, c: NodeCheck) -> str:
    last = record.accepted[-1]
    where = "the root" if last == 0 else f"node {last}"
    text = (f"- After the accepted path ended at {where}, the target drew one more token, "
            f"`{visible(record.bonus_text)}` (probability {c.p_token:.3f}), from {_bonus_source(record)}. "
            "Every step commits at least this one token.")
    if record.tree.size == 0:
        text = (f"- Nothing was drafted this step, so the target simply sampled its next token, "
                f"`{visible(record.bonus_text)}` (probability {c.p_token:.3f}).")
    if not kept(record)[1]:
        text += " The length limit cut the step before it, so it was dropped."
    return text
