"""Views of the Sequoia dynamic program.

``heatmap(table)``   expected tokens per step for every (size n, depth d) cell
                     of the DP table, the selected cell outlined;
``tree_figure``      the optimal tree of one cell, each node labelled with the
                     probability that its path is accepted;
``curves``           expected tokens per step against tree size, Sequoia vs
                     the fixed shapes (chain, k chains, binary);
``copies_tree_figure``  the best tree holding a copied chain at the root
                     (:func:`sequoia.core.trees.dp.optimal_tree_with_copies`), the
                     copied nodes marked as the tree view marks them;
``copies_markdown``  that variant's expected tokens for every chain length m;
``sglang_tree_figure`` / ``sglang_markdown``  the best SGLang launch of a cell
                     (:func:`sequoia.core.trees.sglang_family.best_launch`): its
                     tree, and its expected tokens beside the Sequoia tree's.

All three take plain data (a numpy table, a Tree, a dict of curves) so they
are tested without running the DP.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go

from sequoia.core.statistics.words import counted
from sequoia.core.trees.dp import CopiesResult
from sequoia.core.trees.sglang_family import SGLangChoice
from sequoia.core.trees.tree import Tree

from components import method_color
from components.widgets.tree_view import shape_figure

#: Display names of the curve keys of :func:`sequoia.core.trees.dp.baseline_curves`.
CURVE_NAMES = {"sequoia": "Sequoia (DP)", "chain": "chain", "k_chains": "best of k chains", "binary": "binary tree"}


def heatmap(table: np.ndarray, selected: tuple[int, int] | None = None, title: str = "",
            zlabel: str = "tokens/step", colorscale: str = "Viridis") -> go.Figure:
    """Heatmap of ``table[n, d]``, sizes on y, depths on x; ``selected`` = (n, d) is outlined.

    table: [budget+1, depth+1], expected tokens/step by default; the optimizer's
    predicted ms/token grid uses ``zlabel="ms/token"`` and a reversed scale.
    """
    table = np.asarray(table, dtype=float)
    if table.ndim != 2:
        raise ValueError(f"table must be 2-D [budget+1, depth+1], got shape {table.shape}")
    sizes, depths = np.arange(table.shape[0]), np.arange(table.shape[1])
    fig = go.Figure(go.Heatmap(
        z=table, x=depths, y=sizes, colorscale=colorscale, name=zlabel,
        colorbar=dict(title=dict(text=zlabel)),
        hovertemplate="size n=%{y}, depth d=%{x}<br>%{z:.3f} " + zlabel + "<extra></extra>",
    ))
    if selected is not None:
        n, d = selected
        fig.add_shape(type="rect", x0=d - 0.5, x1=d + 0.5, y0=n - 0.5, y1=n + 0.5,
                      line=dict(color="#ff2d2d", width=3))
        # The cell can be one pixel tall on a large table: a marker keeps it findable.
        fig.add_trace(go.Scatter(x=[d], y=[n], mode="markers", name="selected", showlegend=False,
                                 hoverinfo="skip", marker=dict(symbol="x-thin-open", size=16,
                                                               line=dict(width=3, color="#ff2d2d"))))
        title = title or f"selected n={n}, d={d}: {table[n, d]:.3f} {zlabel}"
    fig.update_layout(title=dict(text=title, x=0.01), height=460, margin=dict(l=50, r=20, t=50, b=45),
                      xaxis_title="depth limit d", yaxis_title="tree size n (draft tokens)")
    return fig


def tree_figure(tree: Tree, acceptance: Sequence[float], value: float | None = None) -> go.Figure:
    """The optimal tree of one cell; ``value`` (expected tokens/step) goes in the title."""
    head = f"optimal tree: {counted(tree.size, 'node')}, depth {tree.depth}"
    if value is not None:
        head += f" · {value:.3f} tokens/step"
    return shape_figure(tree, acceptance, title=head)


def copies_tree_figure(result: CopiesResult, acceptance: Sequence[float], copies: Sequence[float]) -> go.Figure:
    """The variant's tree: m copied nodes first under the root, the draft's DP tree beside them."""
    tree = result.tree
    head = (f"with a copied chain: {result.n_copied} copied + {counted(tree.size - result.n_copied, 'draft node')}, "
            f"depth {tree.depth} · {result.value:.3f} tokens/step")
    return shape_figure(tree, acceptance, title=head, sources=result.sources, copies=copies)


def copies_markdown(result: CopiesResult) -> str:
    """Expected tokens per step for every copied-chain length m, the chosen one in bold."""
    rows = ["| copied nodes m | expected tokens/step |", "|---:|---:|"]
    for m, value in enumerate(result.value_by_copies):
        cell = f"**{value:.3f}**" if m == result.n_copied else f"{value:.3f}"
        rows.append(f"| {'**' + str(m) + '**' if m == result.n_copied else m} | {cell} |")
    return "\n".join(rows)


def sglang_tree_figure(choice: SGLangChoice, acceptance: Sequence[float]) -> go.Figure:
    """The tree SGLang verifies with the chosen steps, top-k and draft tokens."""
    a, fam = choice.args, choice.family
    head = (f"SGLang: {counted(a.steps, 'step')}, top-{a.topk}, num-draft-tokens {a.num_draft_tokens} (the root "
            f"included: {fam.tree.size} drafted) · {fam.expected_tokens:.3f} tokens/step")
    return shape_figure(fam.tree, acceptance, title=head)


def sglang_markdown(choice: SGLangChoice) -> str:
    """The launch's expected tokens per step beside the optimal Sequoia tree of the same size."""
    a, fam, seq = choice.args, choice.family, choice.sequoia_tree
    share = (fam.expected_tokens - 1) / (choice.sequoia_tokens - 1) if choice.sequoia_tokens > 1 else 1.0
    return "\n".join([
        "| tree | draft tokens | depth | expected tokens/step |", "|---|---:|---:|---:|",
        f"| SGLang {a.algorithm}: {counted(a.steps, 'step')}, top-{a.topk}, num-draft-tokens "
        f"{a.num_draft_tokens} (SGLang counts the root too) "
        f"| {fam.tree.size} | {fam.tree.depth} | **{fam.expected_tokens:.3f}** |",
        f"| Sequoia DP (depth ≤ {min(choice.depth, a.budget)}) | {seq.size} | {seq.depth} "
        f"| **{choice.sequoia_tokens:.3f}** |",
        "", f"The SGLang tree keeps {share:.0%} of the Sequoia tree's accepted draft tokens; best within "
        f"{choice.budget} draft tokens, {choice.depth} steps and top-k ≤ {choice.max_topk}."])


def curves(sizes: Sequence[int], series: dict[str, Sequence[float]], title: str = "") -> go.Figure:
    """Expected tokens/step vs tree size, one line per shape family."""
    fig = go.Figure()
    for key, ys in series.items():
        if len(ys) != len(sizes):
            raise ValueError(f"curve {key!r} has {len(ys)} points for {len(sizes)} sizes")
        sequoia = key == "sequoia"
        fig.add_trace(go.Scatter(
            x=list(sizes), y=list(ys), mode="lines+markers", name=CURVE_NAMES.get(key, key),
            line=dict(color=method_color(key), width=3 if sequoia else 1.8, dash=None if sequoia else "dash"),
            hovertemplate="n=%{x}: %{y:.3f} tokens/step<extra>" + CURVE_NAMES.get(key, key) + "</extra>",
        ))
    fig.update_layout(title=dict(text=title or "expected tokens per step vs tree size", x=0.01),
                      height=420, margin=dict(l=50, r=20, t=50, b=45), plot_bgcolor="white",
                      xaxis_title="tree size n (draft tokens)", yaxis_title="expected tokens / step",
                      legend=dict(orientation="h", y=-0.18))
    log = len(sizes) > 1 and max(sizes) / max(1, min(sizes)) >= 32
    fig.update_xaxes(type="log" if log else "linear", tickvals=list(sizes) if log else None, gridcolor="#eee")
    fig.update_yaxes(gridcolor="#eee")
    return fig


def curve_sizes(budget: int) -> list[int]:
    """Sizes at which to evaluate the curves: powers of two up to ``budget``, plus ``budget``."""
    if budget < 1:
        raise ValueError(f"budget must be >= 1, got {budget}")
    out, n = [], 1
    while n < budget:
        out.append(n)
        n *= 2
    return out + [budget]
