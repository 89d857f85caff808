"""Plotly charts of benchmark results: pure functions of result data, plus one writer.

Each ``*_figure`` takes plain result rows (no model, no I/O) and returns a
``plotly.graph_objects.Figure``; :func:`write_figures` saves HTML and, when
kaleido and a headless Chromium are available, PNG.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from ..core.requests.request import LABEL_OF
from .bench_report import MethodSummary

_COLORS = {"hf-generate": "#9e9e9e", "ar": "#616161", "hf-assisted": "#ff9800", "hf-prompt-lookup": "#1f3b8c",
           "chain": "#42a5f5", "specinfer": "#7e57c2", "sequoia": "#2e7d32", "sequoia-auto": "#558b2f",
           "sequoia-dynamic": "#00897b",
           "ngram": "#e6ab02", "sequoia-ngram": "#d81b60", "kary": "#8d6e63", "k_chains": "#7e57c2",
           "binary": "#8d6e63", "without_replacement": "#2e7d32", "with_replacement": "#7e57c2", "topk": "#ff9800"}


def _go():
    import plotly.graph_objects as go  # optional heavy: only when figures are drawn, not for `sequoia --help`

    return go


def _groups(summaries: Sequence[MethodSummary]) -> list[str]:
    return list(dict.fromkeys(f"{s.prompt_set}, T={s.temperature:g}" for s in summaries))


def _bars(summaries: Sequence[MethodSummary], value, title: str, y_title: str, methods=None):
    go = _go()
    fig = go.Figure()
    methods = methods or list(dict.fromkeys(s.method for s in summaries))
    for m in methods:
        rows = [s for s in summaries if s.method == m]
        fig.add_bar(name=LABEL_OF.get(m, m), x=[f"{s.prompt_set}, T={s.temperature:g}" for s in rows], y=[value(s) for s in rows],
                    marker_color=_COLORS.get(m), text=[f"{value(s):.2f}" for s in rows], textposition="outside")
    fig.update_layout(title=title, barmode="group", yaxis_title=y_title, template="plotly_white",
                      legend_title="method", xaxis=dict(categoryorder="array", categoryarray=_groups(summaries)))
    return fig


def speed_figure(summaries: Sequence[MethodSummary]):
    """Median tokens/s of every method, grouped by prompt set and temperature."""
    return _bars(summaries, lambda s: s.tokens_per_s, "Decoding speed (median over prompts)", "tokens / s")


def speedup_figure(summaries: Sequence[MethodSummary]):
    """Median per-prompt speedup over the target alone (hf-generate); a dashed line marks 1x."""
    rows = [s for s in summaries if s.speedup == s.speedup]  # drop NaN (no reference)
    fig = _bars(rows, lambda s: s.speedup, "Speedup over target-only generate (median over prompts)", "x")
    fig.add_hline(y=1.0, line_dash="dash", line_color="#9e9e9e")
    return fig


def time_split_figure(summaries: Sequence[MethodSummary]):
    """Where an engine step's time goes: draft / verify / other, as stacked fractions."""
    go = _go()
    rows = [s for s in summaries if s.draft_frac is not None and s.method != "ar"]
    x = [[f"{s.prompt_set}, T={s.temperature:g}" for s in rows], [s.method for s in rows]]
    fig = go.Figure()
    for part, color in (("draft", "#42a5f5"), ("verify", "#ef5350"), ("other", "#bdbdbd")):
        vals = [getattr(s, f"{part}_frac") for s in rows]
        fig.add_bar(name=part, x=x, y=vals, marker_color=color, text=[f"{v:.0%}" for v in vals])
    fig.update_layout(title="Engine step time split", barmode="stack", yaxis_tickformat=".0%",
                      template="plotly_white")
    return fig


def scalability_figure(rows: Sequence[Mapping], predicted: Mapping[str, Sequence[float]] | None = None,
                       sizes: Sequence[int] | None = None):
    """Tokens per target call against tree size, one line per shape; ``rows``: {shape, size, tokens_per_call}.

    ``predicted`` (shape -> values at ``sizes``) adds the DP's expectation as dotted lines.
    """
    go = _go()
    fig = go.Figure()
    for shape in dict.fromkeys(r["shape"] for r in rows):
        pts = sorted((r["size"], r["tokens_per_call"]) for r in rows if r["shape"] == shape)
        fig.add_scatter(x=[p[0] for p in pts], y=[p[1] for p in pts], mode="lines+markers", name=f"{shape} (measured)",
                        line=dict(color=_COLORS.get(shape)))
        if predicted and shape in predicted and sizes:
            fig.add_scatter(x=list(sizes), y=list(predicted[shape]), mode="lines", name=f"{shape} (DP prediction)",
                            line=dict(color=_COLORS.get(shape), dash="dot"))
    fig.update_layout(title="Scalability: tokens per target call vs tree size", template="plotly_white",
                      xaxis=dict(title="tree size (draft tokens per step)", type="log"),
                      yaxis_title="new tokens per target call")
    return fig


def robustness_figure(rows: Sequence[Mapping]):
    """Average rejection rate against number of children, one panel per temperature.

    ``rows``: {temperature, mode, children, rejection}.
    """
    go = _go()
    from plotly.subplots import make_subplots  # optional heavy: as _go

    temps = sorted({r["temperature"] for r in rows})
    fig = make_subplots(rows=1, cols=len(temps), shared_yaxes=True,
                        subplot_titles=[f"T = {t:g}" for t in temps])
    for col, t in enumerate(temps, 1):
        for mode in dict.fromkeys(r["mode"] for r in rows):
            pts = sorted((r["children"], r["rejection"]) for r in rows if r["temperature"] == t and r["mode"] == mode)
            fig.add_trace(go.Scatter(x=[p[0] for p in pts], y=[p[1] for p in pts], mode="lines+markers", name=mode,
                                     line=dict(color=_COLORS.get(mode)), showlegend=col == 1, legendgroup=mode),
                          row=1, col=col)
        fig.update_xaxes(title_text="children per node", type="log", row=1, col=col)
    fig.update_yaxes(title_text="P(all children rejected)", row=1, col=1)
    fig.update_layout(title="Robustness: average rejection rate", template="plotly_white")
    return fig


def write_figures(figures: Mapping[str, object], out_dir: str | Path, png: bool = True) -> tuple[list[Path], str]:
    """Write ``name.html`` (plotly.js saved once beside them) and, if possible, ``name.png``.

    Returns the written paths and a note ("" when every PNG was written, else why not).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths, note = [], "" if png else "PNG skipped (disabled)"
    for name, fig in figures.items():
        path = out / f"{name}.html"
        fig.write_html(path, include_plotlyjs="directory")
        paths.append(path)
    if png:
        try:
            import kaleido  # noqa: F401  -- optional; needs a local Chromium, no download
        except ImportError:
            return paths, "PNG skipped: kaleido is not installed"
        for name, fig in figures.items():
            try:
                fig.write_image(out / f"{name}.png", width=1000, height=520, scale=1)
                paths.append(out / f"{name}.png")
            except Exception as exc:  # kaleido raises many types (no browser, timeouts); PNGs are optional
                return paths, f"PNG skipped: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    return paths, note
