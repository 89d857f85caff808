"""Statistics of a decoding run, from its step records alone.

``figure(records)`` is a 2x3 panel: tokens per step (histogram and over
time), how often the accepted path reached each depth, acceptance by child rank
(the empirical acceptance vector p_k of :mod:`sequoia.core.stats`), tokens per second over the run, and each step's time
split into draft / verify / other.  ``summary_markdown(records)`` is the
one-paragraph version for a status line.
"""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from sequoia.core.stats import RunStats, summarize
from sequoia.core.trace import StepRecord

from . import COLORS

_TITLES = ("tokens per step", "tokens per step over the run", "acceptance by depth",
           "acceptance by child rank", "tokens / s (cumulative)", "time per step")
_STEP_AXES = ((1, 2), (2, 2), (2, 3))  # (row, col) of the panels whose x axis is the step


def figure(records: Sequence[StepRecord]) -> go.Figure:
    """The six-panel statistics figure; an empty run gives an annotated empty figure."""
    fig = make_subplots(rows=2, cols=3, subplot_titles=_TITLES,
                        horizontal_spacing=0.08, vertical_spacing=0.18)
    fig.update_layout(height=580, margin=dict(l=40, r=20, t=50, b=60), showlegend=True, barmode="stack",
                      legend=dict(orientation="h", x=1, xanchor="right", y=-0.1, yanchor="top"),
                      plot_bgcolor="white")
    if not records:
        fig.add_annotation(text="no steps yet", x=0.5, y=0.5, xref="paper", yref="paper",
                           showarrow=False, font=dict(size=16, color="#888"))
        return fig
    s = summarize(records)
    steps = [r.step for r in records]
    _tokens_panels(fig, s, steps)
    _acceptance_panels(fig, s)
    _time_panels(fig, s, records)
    fig.update_xaxes(gridcolor="#eee")
    fig.update_yaxes(gridcolor="#eee")
    if len(records) <= 12:  # whole-step ticks (Plotly would put ticks at 0, 0.5, 1 for a two-step run)
        for row, col in _STEP_AXES:
            fig.update_xaxes(dtick=1, row=row, col=col)
    return fig


def _tokens_panels(fig: go.Figure, s: RunStats, steps: list[int]) -> None:
    hist = s.tokens_per_step_hist
    fig.add_trace(go.Bar(x=list(range(1, len(hist))), y=list(hist[1:]), name="steps",
                         marker_color=COLORS["accepted"], showlegend=False,
                         hovertemplate="%{x} tokens: %{y} steps<extra></extra>"), row=1, col=1)
    fig.add_trace(go.Scatter(x=steps, y=list(s.series_new), mode="lines+markers", name="tokens/step",
                             line=dict(color=COLORS["accepted"]), showlegend=False), row=1, col=2)
    fig.add_hline(y=s.tokens_per_step, line_dash="dot", line_color="#555", row=1, col=2,
                  annotation_text=f"mean {s.tokens_per_step:.2f}", annotation_position="top left")
    fig.update_xaxes(title_text="tokens committed", dtick=1, row=1, col=1)
    fig.update_xaxes(title_text="step", row=1, col=2)


def _acceptance_panels(fig: go.Figure, s: RunStats) -> None:
    depth = s.accept_by_depth
    fig.add_trace(go.Bar(x=list(range(1, len(depth) + 1)), y=list(depth), name="by depth",
                         marker_color="#1f77b4", showlegend=False,
                         hovertemplate="path reached depth %{x} in %{y:.1%} of steps<extra></extra>"),
                  row=1, col=3)
    evidence = [f"{a}/{n} parents" for a, n in zip(s.rank_accepts, s.rank_parents)]
    fig.add_trace(go.Bar(x=list(range(1, len(s.acceptance) + 1)), y=list(s.acceptance), name="by rank",
                         marker_color="#ff7f0e", showlegend=False, customdata=evidence,
                         hovertemplate="p_%{x} = %{y:.3f} (%{customdata})<extra></extra>"), row=2, col=1)
    fig.update_xaxes(title_text="depth", dtick=1, row=1, col=3)
    fig.update_xaxes(title_text="child rank k (p_k)", dtick=1, row=2, col=1)
    fig.update_yaxes(range=[0, 1.05], row=1, col=3)
    fig.update_yaxes(range=[0, 1.05], row=2, col=1)


def _time_panels(fig: go.Figure, s: RunStats, records: Sequence[StepRecord]) -> None:
    steps = [r.step for r in records]
    elapsed, rate = 0.0, []
    for t, cum in zip(s.series_step_s, s.series_cum_tokens):
        elapsed += t
        rate.append(cum / elapsed if elapsed > 0 else 0.0)
    fig.add_trace(go.Scatter(x=steps, y=rate, mode="lines", name="tokens/s",
                             line=dict(color="#9467bd"), showlegend=False), row=2, col=2)
    fig.update_xaxes(title_text="step", row=2, col=2)
    parts = (("draft", "draft_s", "#ff7f0e"), ("verify", "verify_s", "#1f77b4"), ("other", "other_s", "#c7c7c7"))
    for name, attr, color in parts:
        fig.add_trace(go.Bar(x=steps, y=[1000 * getattr(r, attr) for r in records], name=name,
                             marker_color=color,
                             hovertemplate=f"{name}: %{{y:.1f}} ms<extra></extra>"), row=2, col=3)
    fig.update_xaxes(title_text="step", row=2, col=3)
    fig.update_yaxes(title_text="ms", row=2, col=3)


def summary_markdown(records: Sequence[StepRecord]) -> str:
    """One line: tokens, steps, tokens/step, tokens/s and the time split."""
    if not records:
        return "*No steps yet.*"
    s = summarize(records)
    split = " / ".join(f"{name} {100 * frac:.0f}%" for name, frac in s.time_split.items())
    finish = records[-1].finish_reason
    tail = f" · finished: {finish}" if finish else ""
    return (f"**{s.new_tokens}** tokens in **{s.steps}** target calls · "
            f"**{s.tokens_per_step:.2f}** tokens/step · {s.mean_accepted:.2f} accepted drafts/step · "
            f"**{s.tokens_per_s:.1f}** tokens/s · time {split}{tail}")


def speedup_markdown(records: Sequence[StepRecord], target_tps: float | None, measured: bool = False) -> str:
    """This run's tokens/s against the target alone's: predicted by the hardware profile, or measured.

    Empty without a rate to compare with, or before any step.
    """
    if not records or not target_tps:
        return ""
    s = summarize(records)
    how = "measured" if measured else "predicted by this machine's hardware profile"
    return (f"**{s.tokens_per_s / target_tps:.2f}×** the target alone "
            f"({s.tokens_per_s:.1f} vs {target_tps:.1f} tokens/s, the latter {how})")
