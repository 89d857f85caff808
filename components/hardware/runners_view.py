"""The Hugging Face runtime's two runners on this machine: eager forwards and CUDA graph replays.

``runners_figure``    verify cost against tokens and draft level cost against
                      width for the graph runner and the eager one, on one
                      figure, each labelled; a runner with no measured profile
                      is named as not measured (on a CPU graphs do not apply);
``runners_markdown``  the same in words: what was measured, the graph
                      runner's gain where both were, and its slot cache.

Both take plain numbers (:class:`RunnerCurves`); the Hardware tab reads them
off the profiles cached for this machine.  Where the pair serves on another
runtime (llama.cpp), the curves are that runtime's and both say so: the
Hugging Face runners are then not loaded at all.
"""

from __future__ import annotations

from dataclasses import dataclass

import plotly.graph_objects as go

from components.widgets.hardware_view import CostSeries, log_ticks

GRAPH, EAGER = "graph runner (CUDA graphs)", "eager runner"
CPU_NOTE = "CUDA graphs do not apply on a CPU: the Hugging Face runtime runs eagerly here"
#: The pair on another runtime than Hugging Face's (pair.backend): the figure's title, what serves, what the curves are.
OTHER_RUNTIME = {
    "llamacpp": ("llama.cpp runtime", "This server runs llama.cpp (its own CPU kernels); the Hugging Face "
                 "runtime's eager and graph runners are not loaded here", "the curves are llama.cpp's forwards"),
    "mixed": ("mixed runtime", "This server runs the target on the Hugging Face runtime (eagerly: CUDA graphs do "
              "not apply on a CPU) and the draft on llama.cpp", "the curves are that pair's"),
}
_COLORS = {GRAPH: "#2ca02c", EAGER: "#1f77b4"}


@dataclass(frozen=True)
class RunnerCurves:
    """The loaded pair's measured costs on each runner of its device (None: no profile measured with it)."""

    device: str                         # "cuda" or "cpu"
    graph: CostSeries | None = None
    eager: CostSeries | None = None
    cache_note: str = ""                # the graph runner's slot cache and graphs, when the loaded runner has them
    backend: str = "hf"                 # the runtime the pair serves on (ModelPair.backend)

    def measured(self) -> dict[str, CostSeries]:
        return {name: c for name, c in ((GRAPH, self.graph), (EAGER, self.eager)) if c is not None}

    def missing(self) -> list[str]:
        if self.device != "cuda":
            return [] if self.eager is not None else [EAGER]
        return [name for name, c in ((GRAPH, self.graph), (EAGER, self.eager)) if c is None]


def runners_figure(curves: RunnerCurves) -> go.Figure:
    """Verify (solid) and draft level (dotted) ms by tokens for each measured runner, log x; a title that names
    what was not measured."""
    fig = go.Figure()
    for name, cost in curves.measured().items():
        color = _COLORS[name]
        fig.add_trace(go.Scatter(x=list(cost.target_n), y=list(cost.target_ms), mode="lines+markers",
                                 name=f"{name}: verify (target forward)", line=dict(color=color, width=2.5),
                                 hovertemplate="%{x} tokens: %{y:.2f} ms<extra>" + name + " verify</extra>"))
        if cost.draft_width:
            fig.add_trace(go.Scatter(x=list(cost.draft_width), y=list(cost.draft_ms), mode="lines+markers",
                                     name=f"{name}: draft level", line=dict(color=color, dash="dot"),
                                     hovertemplate="width %{x}: %{y:.2f} ms<extra>" + name + " draft</extra>"))
    if curves.backend in OTHER_RUNTIME:
        title = OTHER_RUNTIME[curves.backend][0]
    elif curves.device != "cuda":
        title = f"eager runner · {CPU_NOTE.split(':')[0]}"
    else:
        title = "eager and graph runners" + "".join(f" · {name}: not measured" for name in curves.missing())
    fig.update_layout(title=dict(text=title, x=0.01), height=400, margin=dict(l=50, r=20, t=50, b=45),
                      plot_bgcolor="white", xaxis_title="tokens in one forward", yaxis_title="ms",
                      legend=dict(orientation="h", y=-0.2))
    fig.update_xaxes(type="log", gridcolor="#eee",
                     **log_ticks([n for c in curves.measured().values() for n in (*c.target_n, *c.draft_width)]))
    fig.update_yaxes(rangemode="tozero", gridcolor="#eee")
    return fig


def runners_markdown(curves: RunnerCurves) -> str:
    """What each runner's curve is, what is not measured and how to measure it, and the slot cache note."""
    lines = []
    if curves.backend in OTHER_RUNTIME:
        _, serves, curves_are = OTHER_RUNTIME[curves.backend]
        lines.append(f"{serves}; {curves_are}." if curves.eager is not None else
                     f"{serves}; no profile of it is measured yet.")
    elif curves.device != "cuda":
        lines.append(f"{CPU_NOTE}; the curves are the eager runner's."
                     if curves.eager is not None else f"{CPU_NOTE}, and no profile of it is measured yet.")
    else:
        for name in curves.missing():
            lines.append(f"The {name} is not measured on this machine: no profile of it is cached or shipped "
                         "(`python -m sequoia profile` measures the runner a pair loads with, graphs on CUDA; "
                         "`load_pair(..., graphs=False)` gives the eager one).")
        if curves.graph is not None and curves.eager is not None:
            lines.append(_gain(curves.graph, curves.eager))
    if curves.cache_note:
        lines.append(curves.cache_note)
    return "\n\n".join(lines)


def _gain(graph: CostSeries, eager: CostSeries) -> str:
    """One token's verify and a one-token draft level, graph replay against eager (where both grids have them)."""
    parts = []
    for what, (gx, gy), (ex, ey) in (("one-token verify", (graph.target_n, graph.target_ms),
                                      (eager.target_n, eager.target_ms)),
                                     ("one-token draft level", (graph.draft_width, graph.draft_ms),
                                      (eager.draft_width, eager.draft_ms))):
        if 1 in gx and 1 in ex:
            g, e = gy[gx.index(1)], ey[ex.index(1)]
            parts.append(f"{what} {g:.2f} ms on graphs against {e:.2f} ms eager ({e / g:.1f}×)")
    return ("Measured: " + "; ".join(parts) + ".") if parts else ""
