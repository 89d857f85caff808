"""The speculated token tree of one decoding step, drawn top-down in Plotly.

``figure(record)`` is the pure view: one :class:`~sequoia.core.statistics.trace.StepRecord`
in, one Plotly figure out.  Node colours follow the status vocabulary of
:mod:`sequoia.core.statistics.trace` (accepted / rejected / unreached); the bonus token the
target sampled after the accepted path is drawn as an extra node hanging off
the last accepted node, and the accepted path's edges are highlighted.

A dynamic tree's step carries ``record.dynamic`` (a
:class:`~sequoia.core.statistics.trace.DynamicInfo`: nodes added to and pruned from the
static tree of the same size); ``figure(..., overlay=True)`` rings the added
nodes and reports the pruned count in the title, and why the price gate
(:mod:`sequoia.runtime.proposers.price`) drafted a small tree or none.

Nodes copied from the context (``record.sources``, :data:`~sequoia.core.statistics.trace.NGRAM`)
keep their status colour and get an outline diamond on top (legend
"copied from the context"), here and in the DP explorer's trees.

The layout is a tidy layered tree: leaves are spread left to right in
depth-first order (siblings in sampling order, so the first child, the one
p_1 is about, is leftmost) and every parent sits above the middle of its
children.  Labels shorten as the tree widens (hover carries the whole token),
so a 32-leaf tree stays legible.  It needs no graphviz.

Token text is escaped once, for Plotly (which decodes ``&amp; &lt; &gt;``
but not ``&quot;``), and whitespace is drawn visibly: ␣ space, ↵ newline,
⇥ tab; a piece of a multi-byte character shows as ▯.
"""

from __future__ import annotations

import html
from collections.abc import Sequence

import networkx as nx
import plotly.graph_objects as go

from sequoia.core.statistics.trace import ACCEPTED, NGRAM, REJECTED, UNREACHED, StepRecord
from sequoia.core.statistics.words import counted
from sequoia.core.trees.tree import Tree

from sequoia.core.statistics.stats import dropped_nodes, kept

from components import COLORS, method_label

#: Above this many nodes token labels are hidden (hover still shows them).
MAX_LABELS = 64

#: Whitespace drawn visibly; the byte-level BPE stand-ins (GPT-2's Ġ Ċ ĉ) mean the same characters.
_VISIBLE = {" ": "\u2423", "\n": "\u21b5", "\t": "\u21e5", "\r": "\u240d",
            "\u0120": "\u2423", "\u010a": "\u21b5", "\u0109": "\u21e5", "\ufffd": "\u25af"}
DROPPED = "dropped"        # accepted, but cut by the length limit or a stop condition
TARGET_TOKEN = "target token"  # the one token of a target-alone step (not a "bonus": nothing was drafted)
_SYMBOLS = {"root": "square", "bonus": "diamond", TARGET_TOKEN: "diamond", DROPPED: "circle-x-open"}
_GROUP_ORDER = ("root", ACCEPTED, REJECTED, UNREACHED, DROPPED, "bonus", TARGET_TOKEN)
COPIED = "copied from the context"  # legend name of the copied-node marker
COPIED_SYMBOL = "diamond-open"       # drawn over the status colour, so both read at once
_COPIED_COLOR = "#222222"
_COPY_GROUP = "copied token (c_j)"   # shape_figure's group (fill colour) of a copied chain's nodes
_PLOT_PX = 720             # width a tree figure gets on the page, for sizing labels
_CHAR_PX = 8               # one label character at Plotly's default font


def visible(text: str) -> str:
    """Token text with whitespace and byte pieces made visible (not escaped); ∅ for the empty string."""
    if text == "":
        return "\u2205"
    return "".join(_VISIBLE.get(ch, ch if ch.isprintable() else f"\\x{ord(ch):02x}") for ch in text)


def escape_token(text: str, max_len: int = 12) -> str:
    """Token text made visible and escaped once for Plotly's HTML-ish labels; long tokens end in …."""
    shown = visible(text)
    if len(shown) > max_len:
        shown = shown[: max_len - 1] + "\u2026"
    return html.escape(shown, quote=False)


def label_length(n_leaves: int) -> int:
    """Characters a label may take so neighbours on a row of ``n_leaves`` leaves do not overlap."""
    return max(1, min(12, _PLOT_PX // (_CHAR_PX * max(n_leaves, 1)) - 1))


def tree_graph(parents: Sequence[int]) -> nx.DiGraph:
    """Directed graph of a parent list; children keep their listed order."""
    if not parents or parents[0] != -1:
        raise ValueError("parents[0] must be -1 (the root)")
    g = nx.DiGraph()
    g.add_nodes_from(range(len(parents)))
    g.add_edges_from((parents[i], i) for i in range(1, len(parents)))
    return g


def tree_positions(parents: Sequence[int]) -> dict[int, tuple[float, float]]:
    """Tidy top-down layout: ``{node: (x, y)}`` with ``y = -depth``.

    ``parents`` only needs every parent to precede its child (a BFS-ordered
    :class:`Tree` plus extra appended nodes, such as the bonus, qualifies).
    """
    g = tree_graph(parents)
    depth = {0: 0}
    for i in range(1, len(parents)):
        depth[i] = depth[parents[i]] + 1
    x: dict[int, float] = {}
    next_leaf = 0.0
    # Post-order so children are placed before their parent.
    for node in nx.dfs_postorder_nodes(g, 0):
        kids = list(g.successors(node))
        if kids:
            x[node] = (x[kids[0]] + x[kids[-1]]) / 2
        else:
            x[node] = next_leaf
            next_leaf += 1.0
    return {n: (x[n], -float(depth[n])) for n in g.nodes}


def draw_tree(
    parents: Sequence[int],
    groups: Sequence[str],
    labels: Sequence[str],
    hovers: Sequence[str],
    highlight: set[tuple[int, int]] = frozenset(),
    colors: dict[str, str] | None = None,
    title: str = "",
    ring: Sequence[int] = (),
    copied: Sequence[int] = (),
    ring_name: str = "added vs static",
) -> go.Figure:
    """Generic tree drawing: one scatter trace per node group, edges underneath.

    ``groups[i]`` names node i's legend group (its colour comes from
    ``colors``), ``labels`` are shown beside nodes unless there are more than
    :data:`MAX_LABELS`, ``hovers`` are HTML hover texts, ``highlight`` holds
    (parent, child) edges drawn thick, ``ring`` node indices get an outline
    marker on top (trace ``ring_name``), ``copied`` node indices get
    the :data:`COPIED_SYMBOL` outline (trace :data:`COPIED`).
    """
    n = len(parents)
    if not len(groups) == len(labels) == len(hovers) == n:
        raise ValueError(f"need one group, label and hover per node ({n} nodes)")
    colors = {**COLORS, TARGET_TOKEN: COLORS["bonus"], **(colors or {})}
    pos = tree_positions(parents)
    fig = go.Figure()
    _add_edges(fig, parents, pos, highlight)
    show_text = n <= MAX_LABELS
    order = [g for g in _GROUP_ORDER if g in groups] + sorted(set(groups) - set(_GROUP_ORDER))
    for group in order:
        idx = [i for i in range(n) if groups[i] == group]
        fig.add_trace(go.Scatter(
            x=[pos[i][0] for i in idx], y=[pos[i][1] for i in idx],
            mode="markers+text" if show_text else "markers",
            text=[labels[i] for i in idx], textposition="bottom center",
            hovertext=[hovers[i] for i in idx], hoverinfo="text",
            customdata=idx, name=group,
            marker=dict(size=16 if show_text else 9, color=colors.get(group, "#999999"),
                        symbol=_SYMBOLS.get(group, "circle"), line=dict(width=1, color="white")),
        ))
    if ring:
        fig.add_trace(go.Scatter(
            x=[pos[i][0] for i in ring], y=[pos[i][1] for i in ring], mode="markers",
            name=ring_name, customdata=list(ring), hoverinfo="skip",
            marker=dict(size=24, color="rgba(0,0,0,0)", line=dict(width=3, color=colors["added"])),
        ))
    if copied:
        fig.add_trace(go.Scatter(
            x=[pos[i][0] for i in copied], y=[pos[i][1] for i in copied], mode="markers",
            name=COPIED, customdata=list(copied), hoverinfo="skip",
            marker=dict(size=26 if show_text else 15, symbol=COPIED_SYMBOL, color=_COPIED_COLOR,
                        line=dict(width=2, color=_COPIED_COLOR)),
        ))
    _style(fig, pos, title)
    return fig


def _add_edges(fig: go.Figure, parents, pos, highlight) -> None:
    plain_x, plain_y, hi_x, hi_y = [], [], [], []
    for child in range(1, len(parents)):
        parent = parents[child]
        xs, ys = (hi_x, hi_y) if (parent, child) in highlight else (plain_x, plain_y)
        xs += [pos[parent][0], pos[child][0], None]
        ys += [pos[parent][1], pos[child][1], None]
    fig.add_trace(go.Scatter(x=plain_x, y=plain_y, mode="lines", name="edges", hoverinfo="skip",
                             line=dict(color="#cccccc", width=1.2), showlegend=False))
    fig.add_trace(go.Scatter(x=hi_x, y=hi_y, mode="lines", name="accepted path", hoverinfo="skip",
                             line=dict(color=COLORS[ACCEPTED], width=4)))


#: The tallest a tree figure gets: a 16-deep chain at 90 px a level was 1,600 px, more than a screen.
MAX_HEIGHT = 640
#: Pixels at the top of a figure that the page's label badge covers (gr.Plot's label sits over the figure).
BADGE_PX = 30
#: Characters of a title line; longer titles break at a " · " (Plotly neither wraps nor shrinks titles).
TITLE_LINE = 72
#: How far Plotly lifts a title of several lines above the top it is anchored at (measured in Chromium: the first
#: line's top sits 13 px above the anchor, one line's 3 px, whatever the number of lines): unallowed for, the
#: first line of a two-line title sat half under the page's badge.
TITLE_LIFT_PX = 10


def wrap_title(title: str, width: int = TITLE_LINE) -> str:
    """``title`` with "<br>" in place of the " · " separators that would run a line past ``width``."""
    parts = title.split(" · ")
    lines = [parts[0]]
    for part in parts[1:]:
        if len(lines[-1]) + 3 + len(part) > width:
            lines.append(part)
        else:
            lines[-1] += " · " + part
    return "<br>".join(lines)


def _style(fig: go.Figure, pos, title: str) -> None:
    depth = int(-min(y for _, y in pos.values()))
    width = max(x for x, _ in pos.values())
    text = wrap_title(title)
    lines = text.count("<br>") + 1
    lift = TITLE_LIFT_PX if lines > 1 else 0
    top = BADGE_PX + lift + 12 + 20 * lines
    height = min(MAX_HEIGHT, max(260, 90 * (depth + 1) + 80))
    fig.update_layout(
        title=dict(text=text, x=0.01, y=1 - (BADGE_PX + lift) / height, yanchor="top", font=dict(size=14)),
        height=height,
        margin=dict(l=10, r=10, t=top, b=10), plot_bgcolor="white", hovermode="closest",
        legend=dict(orientation="h", y=-0.02, yanchor="top"),
    )
    fig.update_xaxes(visible=False, range=[-0.8, width + 0.8])
    fig.update_yaxes(visible=False, range=[-depth - 0.6, 0.5])


# --------------------------------------------------------------- step records
def _node_hover(record: StepRecord, i: int, dropped: bool = False) -> str:
    tree = record.tree
    tok = html.escape(visible(record.texts[i]), quote=False)
    if i == 0:
        return f"<b>root</b> (last committed token)<br>token {tok} (id {record.tokens[i]})"
    status = record.status[i] + (", then dropped by the length limit" if dropped else "")
    # A copy is a fixed proposal: no q drew it (StepRecord.q holds at most what the draft thought of it).
    source = (f"<br><b>{_copied_words(record, i)}</b> (a fixed proposal, not drawn from q)"
              if record.source(i) == NGRAM else f"<br>q (draft) = {record.q[i]:.4f}")
    return (f"<b>node {i}</b>: token {tok} (id {record.tokens[i]})"
            f"<br>depth {tree.depths[i]} · child {tree.ranks[i] + 1} of its parent (p_{tree.ranks[i] + 1})"
            f"{source}<br>p (target) = {record.p[i]:.4f}"
            f"<br>status: {status}")


def _copied_words(record: StepRecord, i: int) -> str:
    """'copied (n-gram match of length n)' when the record kept the match length, else 'copied from the context'."""
    n = record.match_len[i] if record.match_len else 0
    return f"copied (n-gram match of length {n})" if n > 0 else COPIED


#: What ends a generation inside a step, by ``StepRecord.finish_reason`` (the step title says what it kept).
_CUT_BY = {"length": "the length limit", "stop": "a stop string", "eos": "the end-of-text token"}


def step_title(record: StepRecord, note: str = "") -> str:
    """What one step committed, in words that agree with ``record.new_tokens``."""
    name = method_label(record.method)
    if record.prompt_tokens:
        return f"step {record.step} · {name} · the prompt's forward ({counted(record.prompt_tokens, 'token')}) " \
               f"gives the first token (nothing drafted){note}"
    if record.tree.size == 0:
        return f"step {record.step} · {name} · 1 token from the target (nothing drafted){note}"
    # What the step did, in the order it happened; then, apart, what a limit cut of it (never one count "of"
    # another: "1 kept (1 accepted) of 5 accepted + 1 bonus" read as five accepted out of one).
    head = f"step {record.step} · {name} · {record.tree.size} drafted, {record.n_accepted} accepted, +1 bonus"
    n_kept, bonus_kept = kept(record)
    if n_kept == record.n_accepted and bonus_kept:
        return head + note
    cut = f" · {_CUT_BY.get(record.finish_reason, 'a stop condition')} kept {counted(record.n_new, 'token')}"
    return head + cut + note


def _overlay(record: StepRecord) -> tuple[list[int], str]:
    info = record.dynamic
    if info is None:
        return [], ""
    added = [i for i in info.added if 0 < i < record.tree.n_nodes]
    n_pruned = len(info.pruned)
    note = f" · +{len(added)} added / −{n_pruned} pruned vs static" if (added or n_pruned) else ""
    if info.gate in ("small", "plain"):  # the price gate backed off (or is measuring): say when and why
        note += f" · price gate: {info.gate_note}"
    return added, note


def figure(record: StepRecord, overlay: bool = True) -> go.Figure:
    """Tree of one step: accepted path highlighted, bonus token appended."""
    tree = record.tree
    if len(record.status) != tree.n_nodes or len(record.texts) != tree.n_nodes:
        raise ValueError("record.status and record.texts need one entry per tree node")
    last = record.accepted[-1]
    parents = list(tree.parents) + [last]
    bonus = tree.n_nodes
    dropped = set(dropped_nodes(record))
    bonus_group = TARGET_TOKEN if tree.size == 0 else "bonus"
    groups = ["root"] + [DROPPED if i in dropped else record.status[i] for i in range(1, tree.n_nodes)]
    groups.append(bonus_group if kept(record)[1] else DROPPED)
    width = label_length(sum(1 for i in range(len(parents)) if i not in set(parents)))
    labels = [escape_token(t, width) for t in record.texts] + [escape_token(record.bonus_text, width)]
    hovers = [_node_hover(record, i, i in dropped) for i in range(tree.n_nodes)]
    what = ("<b>target token</b> (the target alone, nothing drafted)" if tree.size == 0
            else "<b>bonus token</b> (sampled from the target after the accepted path)")
    hovers.append(f"{what}<br>token {html.escape(visible(record.bonus_text), quote=False)} (id {record.bonus})"
                  f"<br>depth {len(record.accepted)}" + ("" if kept(record)[1] else "<br>dropped by the length limit"))
    path = list(record.accepted) + [bonus]
    highlight = set(zip(path[:-1], path[1:]))
    ring, note = _overlay(record) if overlay else ([], "")
    copied = copied_nodes(record)
    if copied:
        note += f" · {len(copied)} copied from the context"
    return draw_tree(parents, groups, labels, hovers, highlight, title=step_title(record, note), ring=ring,
                     copied=copied)


def copied_nodes(record: StepRecord) -> list[int]:
    """Nodes of the step that were copied from the context (NGRAM), in index order."""
    return [i for i in range(1, record.tree.n_nodes) if record.source(i) == NGRAM]


def shape_figure(tree: Tree, acceptance: Sequence[float] | None = None, title: str = "",
                 sources: Sequence[str] = (), copies: Sequence[float] = ()) -> go.Figure:
    """A tree shape without tokens (e.g. a DP-optimal tree), coloured by sibling position.

    With an acceptance vector (``acceptance[k - 1]`` = p_k, the chance that the
    k-th child of an accepted node is the one accepted, as in the Sequoia paper)
    each node shows the probability that the whole path to it is accepted.
    ``sources`` ([n_nodes], as :attr:`StepRecord.sources`) marks a copied chain
    under the root (:func:`sequoia.core.trees.dp.optimal_tree_with_copies`); its
    nodes' chances come from ``copies`` (c_j), and the draft's nodes count
    only when the first copy is rejected, as that DP assumes.
    """
    copied = [i for i, src in enumerate(sources) if src == NGRAM]
    if acceptance is None:
        reach = None
    elif copied:
        reach = _mixed_reach(tree, sources, acceptance, copies)
    else:
        reach = _reach_probs(tree, acceptance)
    n_copied_kids = sum(1 for c in tree.children[0] if c in set(copied))
    groups = ["root"] + [_rank_group(tree.ranks[i] - (n_copied_kids if tree.depths[i] == 1 else 0))
                         if i not in set(copied) else _COPY_GROUP for i in range(1, tree.n_nodes)]
    labels = ["" if i == 0 else (f"{reach[i]:.2f}" if reach else str(i)) for i in range(tree.n_nodes)]
    hovers = []
    for i in range(tree.n_nodes):
        h = f"node {i}<br>depth {tree.depths[i]}"
        if groups[i] == _COPY_GROUP:
            h += f" · copied token {tree.depths[i]} (c_{tree.depths[i]}): {COPIED}"
        elif i:
            h += f" · {groups[i]}"
        if reach:
            h += f"<br>P(path accepted) = {reach[i]:.4f}"
        hovers.append(h)
    palette = ["#2ca02c", "#1f77b4", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22"]
    colors = {_rank_group(r): palette[r % len(palette)] for r in set(tree.ranks)}
    colors[_COPY_GROUP] = "#bbbbbb"
    return draw_tree(tree.parents, groups, labels, hovers, colors=colors, title=title, copied=copied)


def _rank_group(r: int) -> str:
    return f"child {r + 1} (p_{r + 1})"


def _mixed_reach(tree: Tree, sources: Sequence[str], acceptance: Sequence[float],
                 copies: Sequence[float]) -> list[float]:
    # sequoia.core.trees.dp.optimal_tree_with_copies: the copied chain's j-th node is reached with
    # prod_{i<=j} c_i; a draft node under the root counts only when the first copy is rejected,
    # with the draft's p_k indexed by its rank among the draft's own children (p unchanged, the DP's assumption).
    out = [1.0] * tree.n_nodes
    copied_kids = [c for c in tree.children[0] if sources[c] == NGRAM]
    miss = 1.0 - float(copies[0]) if copied_kids and copies else 1.0
    for i in range(1, tree.n_nodes):
        parent = tree.parents[i]
        if sources[i] == NGRAM:
            j = tree.depths[i] - 1
            out[i] = out[parent] * (float(copies[j]) if j < len(copies) else 0.0)
            continue
        r = tree.ranks[i] - (len(copied_kids) if parent == 0 else 0)
        p_r = float(acceptance[r]) if 0 <= r < len(acceptance) else 0.0
        out[i] = out[parent] * p_r * (miss if parent == 0 else 1.0)
    return out


def _reach_probs(tree: Tree, acceptance: Sequence[float]) -> list[float]:
    # Positional acceptance assumption (Sequoia §3.1): whether the rank-k child
    # of an accepted node is accepted depends only on k, so P(node on the
    # accepted path) = prod over the path of acceptance[rank]; the expected
    # tokens per step is the sum of these over all nodes.
    out = [1.0] * tree.n_nodes
    for i in range(1, tree.n_nodes):
        r = tree.ranks[i]
        out[i] = out[tree.parents[i]] * (float(acceptance[r]) if r < len(acceptance) else 0.0)
    return out
