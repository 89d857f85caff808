"""Statistics of a decoding run, from its step records alone.

``figure(records)`` is a 2x3 panel: tokens per step (histogram and over
time), how often the accepted path reached each depth, acceptance by child rank
(the empirical acceptance vector p_k of :mod:`sequoia.core.statistics.stats`), tokens per second over the run, and each step's time
split into draft / verify / other.  ``summary_markdown(records)`` is the
one-paragraph version for a status line.

When the run holds nodes copied from the context (``StepRecord.sources``
with :data:`~sequoia.core.statistics.trace.NGRAM`), a third row shows the committed
tokens by source, per step and cumulative: accepted from the draft model,
accepted copies, and the bonus.  A plain Sequoia run looks as before.
"""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from sequoia.core.statistics.stats import RunStats, accepted_by_source, kept, summarize
from sequoia.core.statistics.trace import DRAFT, NGRAM, StepRecord
from sequoia.core.statistics.words import counted

from components import COLORS
from components.app_state.target_rate import TargetRate

_TITLES = ("tokens per step", "tokens per step over the run", "acceptance by depth",
           "acceptance by child rank", "tokens / s (cumulative)", "time per step")
_STEP_AXES = ((1, 2), (2, 2), (2, 3))  # (row, col) of the panels whose x axis is the step
_SOURCE_TITLES = ("committed tokens by source, per step", "", "cumulative, by source")
#: What the acceptance panels of a target-alone run say instead of bars.
NOTHING_DRAFTED = "the target alone drafts nothing"
#: (series name, colour) of the by-source panels: accepted drafts, accepted copies, the bonus.
SOURCES = (("draft model", COLORS["accepted"]), ("copied from the context", "#8c564b"), ("bonus", COLORS["bonus"]))


def figure(records: Sequence[StepRecord]) -> go.Figure:
    """The six-panel statistics figure (a by-source row more with copies); an empty run gives an empty figure."""
    copies = has_copies(records)
    if copies:
        specs = [[{}, {}, {}], [{}, {}, {}], [{"colspan": 2}, None, {}]]
        fig = make_subplots(rows=3, cols=3, subplot_titles=_TITLES + _SOURCE_TITLES[::2], specs=specs,
                            horizontal_spacing=0.08, vertical_spacing=0.12)
    else:
        fig = make_subplots(rows=2, cols=3, subplot_titles=_TITLES,
                            horizontal_spacing=0.08, vertical_spacing=0.18)
    fig.update_layout(height=860 if copies else 580, margin=dict(l=40, r=20, t=50, b=60), showlegend=True,
                      barmode="stack",
                      legend=dict(orientation="h", x=1, xanchor="right", y=-0.1, yanchor="top"),
                      plot_bgcolor="white")
    if not records:
        fig.add_annotation(text="no steps yet", x=0.5, y=0.5, xref="paper", yref="paper",
                           showarrow=False, font=dict(size=16, color="#888"))
        return fig
    s = summarize(records)
    steps = [r.step for r in records]
    _tokens_panels(fig, s, steps)
    _acceptance_panels(fig, s, records)
    _time_panels(fig, s, records)
    if copies:
        _source_panels(fig, records)
    fig.update_xaxes(gridcolor="#eee")
    fig.update_yaxes(gridcolor="#eee")
    if len(records) <= 12:  # whole-step ticks (Plotly would put ticks at 0, 0.5, 1 for a two-step run)
        for row, col in _STEP_AXES + (((3, 1), (3, 3)) if copies else ()):
            fig.update_xaxes(dtick=1, row=row, col=col)
    return fig


def has_copies(records: Sequence[StepRecord]) -> bool:
    """Whether any step proposed a node copied from the context."""
    return any(NGRAM in r.sources for r in records)


def tokens_by_source(records: Sequence[StepRecord]) -> dict[str, list[int]]:
    """Committed tokens per step by source (keys: the names of :data:`SOURCES`).  # [steps] each

    Accepted drafts and copies come from :func:`sequoia.core.statistics.stats.accepted_by_source`
    (kept tokens only); the bonus counts when the step kept it.
    """
    out: dict[str, list[int]] = {name: [] for name, _ in SOURCES}
    for r in records:
        by = accepted_by_source([r])
        for (name, _), n in zip(SOURCES, (by.get(DRAFT, 0), by.get(NGRAM, 0), int(kept(r)[1]))):
            out[name].append(n)
    return out


def _source_panels(fig: go.Figure, records: Sequence[StepRecord]) -> None:
    steps = [r.step for r in records]
    series = tokens_by_source(records)
    for name, color in SOURCES:
        ys = series[name]
        fig.add_trace(go.Bar(x=steps, y=ys, name=name, marker_color=color, legendgroup=name,
                             hovertemplate=f"step %{{x}}: %{{y}} {name}<extra></extra>"), row=3, col=1)
        cum = [sum(ys[: i + 1]) for i in range(len(ys))]
        fig.add_trace(go.Scatter(x=steps, y=cum, mode="lines", name=f"{name} (cumulative)", legendgroup=name,
                                 showlegend=False, line=dict(color=color)), row=3, col=3)
    fig.update_xaxes(title_text="step", row=3, col=1)
    fig.update_xaxes(title_text="step", row=3, col=3)
    fig.update_yaxes(title_text="tokens", row=3, col=1)


def _tokens_panels(fig: go.Figure, s: RunStats, steps: list[int]) -> None:
    hist = s.tokens_per_step_hist
    words = [f"{counted(k, 'token')} a step: {counted(n, 'step')}" for k, n in enumerate(hist) if k]
    fig.add_trace(go.Bar(x=list(range(1, len(hist))), y=list(hist[1:]), name="steps",
                         marker_color=COLORS["accepted"], showlegend=False, hovertext=words,
                         hovertemplate="%{hovertext}<extra></extra>"), row=1, col=1)
    fig.add_trace(go.Scatter(x=steps, y=list(s.series_new), mode="lines+markers", name="tokens/step",
                             line=dict(color=COLORS["accepted"]), showlegend=False), row=1, col=2)
    # The mean in the panel's title: written on the plot, its label sat on the line and the axis' ticks.  One line
    # at the title's size: a smaller second line was 14 px in the projector view, and a second line of any size
    # ran into the first there (the page's CSS enlarges what Plotly spaced for its own size).
    fig.add_hline(y=s.tokens_per_step, line_dash="dot", line_color="#555", row=1, col=2)
    fig.update_annotations(selector=dict(text=_TITLES[1]), text=f"each step's tokens · mean {s.tokens_per_step:.2f} "
                                                                "(dotted)")
    fig.update_xaxes(title_text="tokens committed", dtick=1, row=1, col=1)
    fig.update_xaxes(title_text="step", row=1, col=2)


def _acceptance_panels(fig: go.Figure, s: RunStats, records: Sequence[StepRecord]) -> None:
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
    if not depth:   # nothing drafted: say why the two panels are empty, rather than leave bare axes
        note = NOTHING_DRAFTED if all(r.method == "ar" for r in records) else "no step drafted a token"
        for row, col in ((1, 3), (2, 1)):
            axes = fig.get_subplot(row, col)
            fig.add_annotation(text=note, x=sum(axes.xaxis.domain) / 2, y=sum(axes.yaxis.domain) / 2, xref="paper",
                               yref="paper", xanchor="center", yanchor="middle", showarrow=False,
                               font=dict(size=13, color="#666"))
            fig.update_xaxes(showticklabels=False, row=row, col=col)


def _time_panels(fig: go.Figure, s: RunStats, records: Sequence[StepRecord]) -> None:
    steps = [r.step for r in records]
    # The decode rate so far (after the prompt's forward, step 0, whose bar shows its time).
    fig.add_trace(go.Scatter(x=steps, y=list(s.series_rate), mode="lines", name="tokens/s",
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
    if has_copies(records):
        by = dict(s.accepted_by_source)
        tail = (f" · accepted: {by.get(DRAFT, 0)} from the draft model, {by.get(NGRAM, 0)} copied from the "
                f"context{tail}")
    if all(r.prompt_tokens for r in records):   # the prompt's forward only: no rate after it to show yet
        rate = f"no decode rate yet (the prompt's forward: {s.total_s:.2f} s)"
    else:
        first = f", after the prompt's forward ({s.first_token_s:.2f} s)" if s.first_token_s else ""
        rate = f"decode rate **{s.tokens_per_s:.1f}** tokens/s{first}"
    return (f"**{counted(s.new_tokens, 'token')}** in **{counted(s.steps, 'target call')}** · "
            f"**{s.tokens_per_step:.2f}** tokens/step · {s.mean_accepted:.2f} accepted drafts/step · "
            f"{rate} · time {split}{tail}")


def speedup_markdown(records: Sequence[StepRecord], rate: TargetRate | None, itself: bool = False) -> str:
    """This run's decode rate against the target alone's, with the rate's source, and a one-line reading.

    ``rate``: the target alone's, measured on this prompt or predicted (it says which); ``itself``: the run
    is the target alone, so it is its own reference (1.00×, whatever ``rate`` is).  Empty before the
    second step (no decode rate yet) or without a rate to compare with.
    """
    if len(records) < 2 or (rate is None and not itself):
        return ""
    s = summarize(records)
    calls = records[1:]   # the steps after the prompt's forward: what tokens_per_s counts
    per_call_s = sum(r.total_s for r in calls) / len(calls)
    per_call = sum(r.n_new for r in calls) / len(calls)
    if itself:
        return (f"**1.00× the target alone** (this run is the target alone: decode rate {s.tokens_per_s:.1f} "
                f"tokens/s) · "
                f"{per_call:.1f} token per target call at {_secs(per_call_s)} a call")
    ratio = s.tokens_per_s / rate.tokens_per_s
    label = "" if rate.measured else " (predicted)"
    alone_s = 1.0 / rate.tokens_per_s
    # One multiplier a line: the reading after it is in tokens and seconds, never a second "×" to mistake for it.
    return (f"**{ratio:.2f}× the target alone{label}** ({s.tokens_per_s:.1f} vs {rate.tokens_per_s:.1f} "
            f"tokens/s, both decode rates; the latter {rate.source}) · why: {per_call:.1f} tokens per target call at "
            f"{_secs(per_call_s)} a call{_calls_apart(s, per_call)}, against 1 token at {_secs(alone_s)} for the "
            f"target alone{_same_work(per_call, per_call_s, alone_s)}")


def _calls_apart(s: RunStats, per_call: float) -> str:
    """Why the tokens a call here differ from the summary's tokens/step ("" when they print alike): these count
    the calls after the prompt's forward, the summary every call, that forward's one token included."""
    if f"{per_call:.2f}" == f"{s.tokens_per_step:.2f}":
        return ""
    return (f" (the calls after the prompt's forward; the {s.tokens_per_step:.2f} tokens/step above count that "
            "forward's call too)")


def _same_work(per_call: float, per_call_s: float, alone_s: float) -> str:
    """Where a run made one token a call (the target alone's work) yet took longer a call: what the difference
    is ("" otherwise)."""
    if per_call > 1.0 + 1e-9 or per_call_s <= alone_s * 1.05:
        return ""
    return (f": the same work, {_secs(per_call_s - alone_s)} a call slower: this method's own work around each "
            "call (choosing and pricing its tree, the engine's bookkeeping), and any difference between this run's "
            "conditions and those the target alone's rate was measured in (its source, above)")


def _secs(s: float) -> str:
    """0.19 s, or 4.2 ms below a tenth of a second (a small model's calls)."""
    return f"{s:.2f} s" if s >= 0.1 else f"{1000 * s:.1f} ms"
