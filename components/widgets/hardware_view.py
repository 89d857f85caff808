"""Hardware-aware tree choice: the measured cost model and what it picked.

``cost_figure``        target forward time against the number of tokens
                       verified at once, the draft's time per tree level
                       against its width, and the chosen tree size marked;
``prediction_figure``  predicted vs measured time per generated token for
                       each candidate configuration;
``runtimes_figure``    each runtime's two cost curves side by side.

Log axes take :func:`log_ticks` (powers of two or decades, never plotly's digit labels).

They take plain numbers (milliseconds, like the profile); :func:`cost_series`
reads them off a :class:`sequoia.core.profiles.profile.HardwareProfile`, and
:func:`choice_markdown` describes a :class:`sequoia.core.trees.optimizer.Choice`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import plotly.graph_objects as go

from sequoia.core.profiles.runtimes import display_name

from components import COLORS

#: The most ticks a log axis gets before it falls back to decades.
MAX_TICKS = 10
#: What the predicted-vs-measured chart says before anything was measured.
NOT_MEASURED_YET = "measured: not yet (Measure predicted vs real runs them here)"


@dataclass(frozen=True)
class CostSeries:
    target_n: tuple[int, ...]           # [G] new tokens in one target forward (tree size + 1)
    target_ms: tuple[float, ...]        # [G] ms of that forward
    draft_width: tuple[int, ...] = ()   # [H] tokens in one draft level
    draft_ms: tuple[float, ...] = ()    # [H] ms of that level
    label: str = ""                     # device / dtype description


@dataclass(frozen=True)
class PredictionRow:
    label: str                          # e.g. "sequoia n=32 d=6"
    predicted_ms: float                 # predicted ms per generated token
    measured_ms: float | None = None    # measured ms per generated token, once run (the median of its rounds)
    chosen: bool = False
    measured_lo: float | None = None    # the fastest and slowest round's ms per token
    measured_hi: float | None = None
    rounds: int = 0                     # rounds measured


def cost_figure(cost: CostSeries, chosen_n: int | None = None) -> go.Figure:
    """Target ms vs tokens per forward and draft ms vs level width, both axes log; chosen size marked.

    Log y as well as log x: a cost linear in n is then a straight line of slope 1 beside the measured curve's
    flatter one (on log x and linear y it curved up like an exponential, steep beside a memory-bound target)."""
    if len(cost.target_n) != len(cost.target_ms) or len(cost.draft_width) != len(cost.draft_ms):
        raise ValueError("each cost curve needs as many times as grid points")
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=list(cost.target_n), y=list(cost.target_ms), mode="lines+markers",
                             name="target forward (n tokens)", line=dict(color=COLORS["bonus"], width=2.5),
                             hovertemplate="%{x} tokens: %{y:.1f} ms<extra>target</extra>"))
    if cost.target_n:
        per_token = cost.target_ms[0] / cost.target_n[0]
        fig.add_trace(go.Scatter(x=list(cost.target_n), y=[per_token * n for n in cost.target_n],
                                 mode="lines", name="target if linear in n (compute-bound; slope 1 on log axes)",
                                 line=dict(color="#bbbbbb", dash="dot"), hoverinfo="skip"))
    if cost.draft_width:
        fig.add_trace(go.Scatter(x=list(cost.draft_width), y=list(cost.draft_ms), mode="lines+markers",
                                 name="draft level (width tokens)", line=dict(color="#ff7f0e", width=2),
                                 hovertemplate="width %{x}: %{y:.1f} ms<extra>draft</extra>"))
    times = [t for t in (*cost.target_ms, *cost.draft_ms) if t > 0] or [1.0]
    low, top = min(times) / 1.5, max(times)
    if chosen_n is not None:
        # A trace, not add_vline: shape coordinates on a log axis are log10 units.
        fig.add_trace(go.Scatter(x=[chosen_n + 1, chosen_n + 1], y=[low, top * 1.1], mode="lines+text",
                                 name=f"chosen: {chosen_n} draft tokens", text=["", f"chosen: {chosen_n} draft tokens"],
                                 textposition="middle left", hoverinfo="skip",
                                 line=dict(color=COLORS["accepted"], width=2)))
    fig.update_layout(title=dict(text="measured cost" + (f" · {cost.label}" if cost.label else ""), x=0.01),
                      height=400, margin=dict(l=50, r=20, t=50, b=45), plot_bgcolor="white",
                      xaxis_title="tokens in one forward", yaxis_title="ms",
                      legend=dict(orientation="h", y=-0.2))
    fig.update_xaxes(type="log", gridcolor="#eee", **log_ticks([*cost.target_n, *cost.draft_width]))
    # The measured curves fill the height; the linear line runs off the top past them, as it would.
    fig.update_yaxes(type="log", range=[math.log10(low), math.log10(top * 1.3)], gridcolor="#eee",
                     **log_ticks(times))
    return fig


def prediction_figure(rows: Sequence[PredictionRow]) -> go.Figure:
    """Grouped bars of predicted and measured ms per token, with a legend; the chosen row starred.  Before
    anything was measured the chart says so, rather than showing one series as if it were the comparison."""
    labels = [("★ " if r.chosen else "") + r.label for r in rows]
    fig = go.Figure()
    fig.add_trace(go.Bar(x=labels, y=[r.predicted_ms for r in rows], name="predicted",
                         marker_color="#9ecae1", hovertemplate="%{x}: %{y:.1f} ms/token<extra>predicted</extra>"))
    measured = [r.measured_ms for r in rows]
    if any(m is not None for m in measured):
        # The whisker: the range over the rounds (none where a row was not measured or ran once).
        up = [r.measured_hi - r.measured_ms if r.measured_hi is not None and r.measured_ms is not None else 0
              for r in rows]
        down = [r.measured_ms - r.measured_lo if r.measured_lo is not None and r.measured_ms is not None else 0
                for r in rows]
        words = [f"median of {r.rounds} rounds ({r.measured_lo:.1f}–{r.measured_hi:.1f})"
                 if r.rounds > 1 and r.measured_lo is not None else "" for r in rows]
        fig.add_trace(go.Bar(x=labels, y=measured, name="measured (median, range over rounds)",
                             marker_color=COLORS["bonus"], customdata=words,
                             error_y=dict(type="data", symmetric=False, array=up, arrayminus=down, color="#444"),
                             hovertemplate="%{x}: %{y:.1f} ms/token, %{customdata}<extra>measured</extra>"))
    else:
        fig.add_annotation(text=NOT_MEASURED_YET, xref="paper", yref="paper", x=0.99, y=1.0, xanchor="right",
                           yanchor="bottom", showarrow=False, font=dict(size=12, color="#666"))
    fig.update_layout(barmode="group", title=dict(text="time per generated token (★ the optimizer's choice)",
                                                  x=0.01), height=380,
                      margin=dict(l=50, r=20, t=70, b=90), plot_bgcolor="white", yaxis_title="ms / token",
                      showlegend=True, legend=dict(orientation="h", x=0.0, y=1.02, yanchor="bottom"))
    fig.update_xaxes(tickangle=-25)
    fig.update_yaxes(gridcolor="#eee")
    return fig


def measured_markdown(rows: Sequence[PredictionRow], tokens: int, cores: CoresWait | None = None,
                      profile_note: str = "") -> str:
    """One line on what Measure timed ("" before it ran): each measured row's median decode ms/token with its
    range and how far the prediction was from it; past 10% off, by how much and the likely why (another program
    on the cores, from the kernel's accounting of the runs' threads, or a profile measured under other
    conditions)."""
    done = [r for r in rows if r.measured_ms is not None]
    if not done:
        return ""
    rounds_ = max(r.rounds for r in done)
    parts, far = [], []
    for r in done:
        band = f" ({r.measured_lo:.1f}–{r.measured_hi:.1f})" if r.rounds > 1 else ""
        off = (r.measured_ms / r.predicted_ms - 1) * 100 if r.predicted_ms else None
        vs = f", {off:+.0f}% vs predicted" if off is not None else ""
        parts.append(f"{r.label} **{r.measured_ms:.1f} ms/token**{band}{vs}")
        if off is not None and abs(off) > 10:
            far.append(f"{r.label} {off:+.0f}%")
    text = (f"**Measured here** (median of {rounds_} interleaved rounds of {tokens} tokens; ms per token after the "
            f"prompt's forward, the decode rate the profile predicts; range in brackets): " + "; ".join(parts) + ".")
    if far:
        busy = cores_words(cores)
        why = "; ".join(w for w in (busy, "the profile in use was measured under other conditions"
                                    + (f" ({profile_note.rstrip('.')})" if profile_note else "")) if w)
        text += f" More than 10% off the prediction: {', '.join(far)}. Likely why: {why}."
    return text


@dataclass(frozen=True)
class CoresWait:
    """How Measure's threads spent its rounds, from the kernel's per-thread accounting (read by the Hardware tab:
    components.app_state.target_rate.core_wait): the part of their busy time spent ready to compute but waiting
    for a core another program held, and those seconds."""

    waited: float        # 0..1
    wait_s: float
    shared_above: float = 0.10   # above this part the cores are said to have been shared


def cores_words(cores: CoresWait | None) -> str:
    """What the kernel's accounting says of the cores during Measure's rounds ("" when not read).  Unlike the
    load average, which counts the runs' own threads (a 2-thread decode alone on 2 cores reads 2), this counts only
    the time they waited for a core another program held (a browser on this machine counts)."""
    if cores is None:
        return ""
    figure = (f"the runs' threads waited for a core another program held {100 * cores.waited:.0f}% of their busy "
              f"time ({cores.wait_s:.1f} s, the kernel's accounting)")
    if cores.waited > cores.shared_above:
        return f"other programs shared the cores: {figure}"
    return f"the cores were not shared much: {figure}"


def cost_series(profile) -> CostSeries:
    """Read a :class:`sequoia.core.profiles.profile.HardwareProfile` into a :class:`CostSeries`."""
    return CostSeries(target_n=tuple(profile.target_n), target_ms=tuple(profile.target_ms),
                      draft_width=tuple(profile.draft_width), draft_ms=tuple(profile.draft_ms),
                      label=profile_label(profile))


def profile_label(profile) -> str:
    """What a profile's costs were measured on, in the words of its runtime: a llama.cpp profile names its GGUF
    weights, not torch's kernels and logits dtype (issue 51: "oneDNN bf16 ... torch.float32" on llama.cpp)."""
    fp = profile.fingerprint
    runtime = getattr(fp, "runtime", "") or "hf"
    if fp is None or runtime == "hf":
        return f"{profile.device} · {profile.dtype}"
    cpu = fp.cpu_model + (f" ({', '.join(fp.cpu_features)})" if fp.cpu_features else "")
    where = fp.gpu_name or f"{cpu}, {fp.threads} threads"
    same = fp.target_dtype == fp.draft_dtype
    weights = fp.target_dtype if same else f"target {fp.target_dtype}, draft {fp.draft_dtype}"
    name = display_name("mixed" if "+" in runtime else runtime)
    return f"{where} · {name}, {weights}"


def choice_markdown(choice, acceptance_name: str = "") -> str:
    """What the optimizer chose (a :class:`sequoia.core.trees.optimizer.Choice`), in one paragraph."""
    if choice.budget == 0:
        return (f"**No speculation pays off** on this profile: target alone at "
                f"{choice.baseline_ms:.1f} ms/token.")
    # Quotes, not italics: asterisks inside the bold line around a name ending in ")" were shown literally.
    src = f" for acceptance “{acceptance_name}”" if acceptance_name else ""
    return (f"**Chosen tree{src}: {choice.budget} draft tokens, depth {choice.depth}** · "
            f"{choice.expected_tokens:.2f} expected tokens/step · predicted "
            f"**{choice.ms_per_token:.1f} ms/token** (draft {choice.cost.draft_ms:.1f} ms + "
            f"verify {choice.cost.target_ms:.1f} ms per step) vs target alone "
            f"{choice.baseline_ms:.1f} ms/token → **{choice.speedup:.2f}×** predicted speedup.")


def runtimes_figure(series: Sequence[CostSeries]) -> go.Figure:
    """Each runtime's target forward (solid) and draft level (dotted) by tokens, side by side (log x)."""
    fig = go.Figure()
    palette = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd")
    for i, cost in enumerate(series):
        color = palette[i % len(palette)]
        fig.add_trace(go.Scatter(x=list(cost.target_n), y=list(cost.target_ms), mode="lines+markers",
                                 name=f"{cost.label}: target", line=dict(color=color, width=2.5),
                                 hovertemplate="%{x} tokens: %{y:.1f} ms<extra>" + cost.label + " target</extra>"))
        if cost.draft_width:
            fig.add_trace(go.Scatter(x=list(cost.draft_width), y=list(cost.draft_ms), mode="lines+markers",
                                     name=f"{cost.label}: draft level", line=dict(color=color, dash="dot"),
                                     hovertemplate="width %{x}: %{y:.1f} ms<extra>" + cost.label + " draft</extra>"))
    # The legend below the axis title (a line per runtime and curve): placed lower than one row would need.
    fig.update_layout(title=dict(text="measured cost by runtime", x=0.01), height=400,
                      margin=dict(l=50, r=20, t=50, b=45), plot_bgcolor="white",
                      xaxis_title="tokens in one forward", yaxis_title="ms",
                      legend=dict(orientation="h", y=-0.28, yanchor="top"))
    fig.update_xaxes(type="log", gridcolor="#eee",
                     **log_ticks([n for c in series for n in (*c.target_n, *c.draft_width)]))
    fig.update_yaxes(rangemode="tozero", gridcolor="#eee")
    return fig


def log_ticks(values: Sequence[float]) -> dict:
    """Tick settings for a log axis over ``values`` (token counts): the powers of two they span, labelled as
    numbers, or the decades when those would be more than :data:`MAX_TICKS`.  Plotly's own log ticks label
    every digit between decades ("8 9 1 2 3 ... 9 10 2 3"), unreadable on a narrow chart."""
    positive = [float(v) for v in values if v > 0]
    if not positive:
        return {}
    lo, hi = min(positive), max(positive)
    ticks = [2 ** k for k in range(math.floor(math.log2(lo)), math.ceil(math.log2(hi)) + 1)]
    if len(ticks) > MAX_TICKS:
        ticks = [10 ** k for k in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)]
    return {"tickmode": "array", "tickvals": ticks, "ticktext": [f"{t:g}" for t in ticks]}
