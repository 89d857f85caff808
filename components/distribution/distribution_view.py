"""The distribution check, drawn: each rule's first emitted tokens against the target's p.

``figure(p, results, texts)`` is one bar panel per rule: for the most likely
tokens under p (and "other" for the rest), the target's probability next to
the share of the N trials that emitted it, with the test's p-value and verdict
in the panel title.  ``summary(...)`` is the same in Markdown.  Pure functions
of :class:`sequoia.core.verification.distribution.RuleResult` values; no Gradio, no model.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence

import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from sequoia.core.verification.distribution import ALPHA, FOIL_FACTOR, RuleResult, total_variation

#: Tokens drawn one by one in each panel (the rest is one "other" bar).
TOP_TOKENS = 10
TARGET_COLOR, EMPIRICAL_COLOR, FOIL_COLOR = "#7f7f7f", "#2ca02c", "#d62728"


def bars(p: torch.Tensor, counts: torch.Tensor, top: Sequence[int]) -> tuple[list[float], list[float]]:
    """(target probabilities, empirical shares) of the ``top`` tokens and, last, of all the others.  p, counts: [V]"""
    p = p.double() / p.double().sum()
    emp = counts.double() / max(int(counts.sum()), 1)
    idx = torch.tensor(list(top), dtype=torch.long)
    tp, te = p[idx].tolist(), emp[idx].tolist()
    return tp + [max(0.0, 1.0 - sum(tp))], te + [max(0.0, 1.0 - sum(te))]


def top_tokens(p: torch.Tensor, n: int = TOP_TOKENS) -> list[int]:
    return torch.topk(p, min(n, int((p > 0).sum()))).indices.tolist()


def _verdict(res: RuleResult) -> str:
    mark = "✓ follows p" if res.passed else "✗ does not follow p"
    return f"{mark} (p-value {res.fit.p_value:.3g})"


def figure(p: torch.Tensor, results: Sequence[RuleResult], decode: Callable[[int], str] = str,
           title: str = "") -> go.Figure:
    """One panel per rule: target p (grey) beside the empirical share of the trials (green; red for the foil)."""
    n = max(len(results), 1)
    fig = make_subplots(rows=n, cols=1, shared_xaxes=False, vertical_spacing=0.12 / n + 0.04,
                        subplot_titles=[f"{r.rule.label}, k={r.k}: {_verdict(r)}" for r in results] or [""])
    fig.update_layout(height=230 * n + 60, barmode="group", plot_bgcolor="white", margin=dict(l=50, r=20, t=70, b=40),
                      title=dict(text=title, x=0.01), legend=dict(orientation="h", y=1.0 + 0.25 / n, x=0.99,
                                                                  xanchor="right"))
    if not results:
        fig.add_annotation(text="no check run yet", x=0.5, y=0.5, xref="paper", yref="paper", showarrow=False,
                           font=dict(size=16, color="#888"))
        return fig
    top = top_tokens(p)
    labels = [repr(decode(t)) for t in top] + ["other"]
    for row, res in enumerate(results, start=1):
        target, empirical = bars(p, res.counts, top)
        fig.add_trace(go.Bar(x=labels, y=target, name="target p", marker_color=TARGET_COLOR,
                             showlegend=row == 1, hovertemplate="%{x}: p = %{y:.4f}<extra></extra>"), row=row, col=1)
        fig.add_trace(go.Bar(x=labels, y=empirical, name=f"emitted, share of N={res.fit.n}",
                             marker_color=EMPIRICAL_COLOR if res.rule.lossless else FOIL_COLOR, showlegend=row == 1,
                             hovertemplate="%{x}: %{y:.4f} of trials<extra></extra>"), row=row, col=1)
    fig.update_yaxes(gridcolor="#eee", tickformat=".0%")
    return fig


def summary(results: Sequence[RuleResult], p: torch.Tensor, seconds: float | None = None) -> str:
    """Markdown: one line per rule (verdict, p-value, chi-square, distance from p) and how to read it."""
    if not results:
        return ""
    lines = ["| rule | children | trials | χ² (dof) | p-value | total variation from p | verdict |",
             "|---|---|---|---|---|---|---|"]
    for r in results:
        verdict = ("✓ follows p" if r.passed else "✗ does **not** follow p") + ("" if r.as_expected else " (!)")
        lines.append(f"| {html.escape(r.rule.label)} | {r.k} | {r.fit.n} | {r.fit.statistic:.1f} ({r.fit.dof}) | "
                     f"{r.fit.p_value:.3g} | {total_variation(r.counts, p):.3f} | {verdict} |")
    wrong = [r.rule.label for r in results if not r.as_expected]
    lines.append("")
    lines.append(
        f"Verdict: a rule *follows p* when the χ² test of its emitted tokens against the target's p gives a "
        f"p-value ≥ {ALPHA} (a lossless rule fails by chance 1 time in {round(1 / ALPHA)}). The broken verifier "
        f"is a **teaching foil** that accepts a draft token when u·q < {FOIL_FACTOR}·p: it over-emits what the "
        f"draft likes more than the target, which this many trials usually exposes. Total variation includes "
        f"sampling noise (about √(tokens / N) even for an exact rule).")
    if wrong:
        lines.append(f"\n(!) Against the theory this time: {', '.join(wrong)}; a lossless rule fails at rate "
                     f"{ALPHA} by chance, and the foil can slip through where the draft is close to the target.")
    if seconds is not None:
        lines.append(f"\nFinished in {seconds:.1f} s.")
    return "\n".join(lines)
