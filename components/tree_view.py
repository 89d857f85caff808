"""The speculated token tree of one decoding step, drawn top-down in Plotly.

``figure(record)`` is the pure view: one :class:`~sequoia.core.trace.StepRecord`
in, one Plotly figure out.  Node colours follow the status vocabulary of
:mod:`sequoia.core.trace` (accepted / rejected / unreached); the bonus token the
target sampled after the accepted path is drawn as an extra node hanging off
the last accepted node, and the accepted path's edges are highlighted.

Methods that reshape a static tree per step (dynamic pruning) may annotate
``record.extra`` with ``"added"`` (indices of nodes in this tree that the
static tree lacks) and ``"pruned"`` (a count, or a list, of static-tree nodes
left out); ``figure(..., overlay=True)`` rings the added nodes and reports
the pruned count in the title.

The layout is a tidy layered tree: leaves are spread left to right in
depth-first order (siblings in sampling order, so rank 0 is leftmost) and
every parent sits above the middle of its children.  It needs no graphviz.
"""

from __future__ import annotations

import html
from collections.abc import Sequence

import networkx as nx
import plotly.graph_objects as go

from sequoia.core.trace import ACCEPTED, REJECTED, UNREACHED, StepRecord
from sequoia.core.tree import Tree

from . import COLORS

#: Above this many nodes token labels are hidden (hover still shows them).
MAX_LABELS = 64

_VISIBLE = {" ": "\u2423", "\n": "\u21b5", "\t": "\u21e5", "\r": "\u240d"}
_SYMBOLS = {"root": "square", "bonus": "diamond"}
_GROUP_ORDER = ("root", ACCEPTED, REJECTED, UNREACHED, "bonus")


def escape_token(text: str, max_len: int = 12) -> str:
    """Token text made visible and safe inside Plotly's HTML-ish labels.

    Whitespace becomes visible glyphs (space -> ␣, newline -> ↵, tab -> ⇥),
    the empty string becomes ∅, long tokens are cut with an ellipsis.
    """
    if text == "":
        return "\u2205"
    shown = "".join(_VISIBLE.get(ch, ch) for ch in text)
    if len(shown) > max_len:
        shown = shown[: max_len - 1] + "\u2026"
    return html.escape(shown)


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
) -> go.Figure:
    """Generic tree drawing: one scatter trace per node group, edges underneath.

    ``groups[i]`` names node i's legend group (its colour comes from
    ``colors``), ``labels`` are shown beside nodes unless there are more than
    :data:`MAX_LABELS`, ``hovers`` are HTML hover texts, ``highlight`` holds
    (parent, child) edges drawn thick, ``ring`` node indices get an outline
    marker on top (trace ``"added vs static"``).
    """
    n = len(parents)
    if not len(groups) == len(labels) == len(hovers) == n:
        raise ValueError(f"need one group, label and hover per node ({n} nodes)")
    colors = {**COLORS, **(colors or {})}
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
            name="added vs static", customdata=list(ring), hoverinfo="skip",
            marker=dict(size=24, color="rgba(0,0,0,0)", line=dict(width=3, color=colors["added"])),
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


def _style(fig: go.Figure, pos, title: str) -> None:
    depth = int(-min(y for _, y in pos.values()))
    width = max(x for x, _ in pos.values())
    fig.update_layout(
        title=dict(text=title, x=0.01), height=max(260, 90 * (depth + 1) + 80),
        margin=dict(l=10, r=10, t=50, b=10), plot_bgcolor="white", hovermode="closest",
        legend=dict(orientation="h", y=-0.02, yanchor="top"),
    )
    fig.update_xaxes(visible=False, range=[-0.8, width + 0.8])
    fig.update_yaxes(visible=False, range=[-depth - 0.6, 0.5])


# --------------------------------------------------------------- step records
def _node_hover(record: StepRecord, i: int) -> str:
    tree = record.tree
    tok = html.escape(repr(record.texts[i]))
    head = "root (last committed token)" if i == 0 else f"node {i}"
    return (f"<b>{head}</b><br>token {tok} (id {record.tokens[i]})"
            f"<br>depth {tree.depths[i]} · rank {tree.ranks[i]}"
            f"<br>q (draft) = {record.q[i]:.4f}<br>p (target) = {record.p[i]:.4f}"
            f"<br>status: {record.status[i]}")


def _overlay(record: StepRecord) -> tuple[list[int], str]:
    added = [int(i) for i in record.extra.get("added", ()) if 0 < int(i) < record.tree.n_nodes]
    pruned = record.extra.get("pruned", ())
    n_pruned = pruned if isinstance(pruned, int) else len(pruned)
    note = f" · +{len(added)} added / −{n_pruned} pruned vs static" if (added or n_pruned) else ""
    return added, note


def figure(record: StepRecord, overlay: bool = True) -> go.Figure:
    """Tree of one step: accepted path highlighted, bonus token appended."""
    tree = record.tree
    if len(record.status) != tree.n_nodes or len(record.texts) != tree.n_nodes:
        raise ValueError("record.status and record.texts need one entry per tree node")
    last = record.accepted[-1]
    parents = list(tree.parents) + [last]
    bonus = tree.n_nodes
    groups = ["root"] + list(record.status[1:]) + ["bonus"]
    labels = [escape_token(t) for t in record.texts] + [escape_token(record.bonus_text)]
    hovers = [_node_hover(record, i) for i in range(tree.n_nodes)]
    hovers.append(f"<b>bonus token</b> (sampled from the target)<br>token "
                  f"{html.escape(repr(record.bonus_text))} (id {record.bonus})"
                  f"<br>depth {len(record.accepted)}")
    path = list(record.accepted) + [bonus]
    highlight = set(zip(path[:-1], path[1:]))
    ring, note = _overlay(record) if overlay else ([], "")
    title = (f"step {record.step} · {record.method} · {tree.size} drafted, "
             f"{record.n_accepted} accepted + 1 bonus{note}")
    return draw_tree(parents, groups, labels, hovers, highlight, title=title, ring=ring)


def shape_figure(tree: Tree, acceptance: Sequence[float] | None = None, title: str = "") -> go.Figure:
    """A tree shape without tokens (e.g. a DP-optimal tree), coloured by rank.

    With an acceptance vector (``acceptance[k]`` = chance that the rank-k
    child of an accepted node is the one accepted, the Sequoia paper's p_{k+1})
    each node shows the probability that the whole path to it is accepted.
    """
    reach = _reach_probs(tree, acceptance) if acceptance is not None else None
    groups = ["root"] + [f"rank {r}" for r in tree.ranks[1:]]
    labels = ["" if i == 0 else (f"{reach[i]:.2f}" if reach else str(i)) for i in range(tree.n_nodes)]
    hovers = []
    for i in range(tree.n_nodes):
        h = f"node {i}<br>depth {tree.depths[i]} · rank {tree.ranks[i]}"
        if reach:
            h += f"<br>P(path accepted) = {reach[i]:.4f}"
        hovers.append(h)
    palette = ["#2ca02c", "#1f77b4", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22"]
    colors = {f"rank {r}": palette[r % len(palette)] for r in set(tree.ranks)}
    return draw_tree(tree.parents, groups, labels, hovers, colors=colors, title=title)


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
