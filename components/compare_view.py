"""Side-by-side comparison of decoding methods on one prompt.

A :class:`CompareRow` is one method's run; rows are built from step records
(:func:`row_from_records`) or from a plain (token ids, seconds) result such
as Hugging Face assisted generation.  ``figure(rows)`` draws four bar panels
(latency, tokens/s, tokens per target call, speedup over the reference) and
``table(rows)`` the same numbers plus the time to the first token (the
prompt's forward, which every method pays alike) and the "identical output" flag.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from sequoia.core.trace import StepRecord

from . import method_color
from .divergence_view import near_tie_wording

#: The rows are named as the tab's checkboxes name the methods (one vocabulary on the page).
REFERENCE = "Target alone"
#: The row of the same target alone on llama.cpp (its shipped GGUF): a speed reference on other kernels, whose
#: output is never flagged identical or different (greedy ties can break otherwise there).
LLAMACPP_REFERENCE = "llama.cpp target alone"
#: The table's headers: spaces where a narrow column may wrap (the words themselves never break).
HEADERS = ["method", "tokens", "latency (s)", "first token (s)", "tokens / s", "target calls", "tokens / call",
           "speedup", "identical"]
#: The same columns' keys in the /compare API's objects.
API_KEYS = ["method", "tokens", "latency (s)", "first token (s)", "tokens/s", "target calls", "tokens/call",
            "speedup", "identical"]
#: Widths of those columns in px: 790 in all, what a 1,280 px window leaves beside the controls; each column has
#: room for its longest word in bold (assets/studio.css keeps words whole), the identical column for "identical
#: up to a kernel near-tie at token N (certify: exact mode)" on a few lines.  A narrower window scrolls the table
#: sideways rather than breaking a word.
COLUMN_WIDTHS = [146, 70, 74, 66, 70, 66, 70, 84, 144]


@dataclass(frozen=True)
class CompareRow:
    method: str
    tokens: int                       # new tokens generated
    seconds: float                    # wall time of the whole generation
    target_calls: int | None = None   # target forwards (None when the method does not report them)
    token_ids: tuple[int, ...] = ()   # [tokens] the output, for identity checks
    identical: bool | None = None     # output == reference output (None: not compared)
    first_token_s: float | None = None  # time to the first output: the prompt's forward, alike for every method
    near_tie_at: int | None = None    # differs only from this token on (1-based), at a kernel near-tie

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def tokens_per_call(self) -> float | None:
        return self.tokens / self.target_calls if self.target_calls else None


def row_from_records(method: str, records: Sequence[StepRecord], seconds: float | None = None) -> CompareRow:
    """One method's row from its step records (``seconds`` defaults to the summed step times)."""
    ids = tuple(t for r in records for t in r.new_tokens)
    secs = sum(r.total_s for r in records) if seconds is None else seconds
    return CompareRow(method=method, tokens=len(ids), seconds=secs, target_calls=len(records), token_ids=ids)


def mark_identical(rows: Sequence[CompareRow], reference: str = REFERENCE) -> list[CompareRow]:
    """Flag each row whose output equals the reference row's (the reference itself included)."""
    ref = next((r for r in rows if r.method == reference), None)
    if ref is None:
        return list(rows)
    return [r if r.method == LLAMACPP_REFERENCE else replace(r, identical=(r.token_ids == ref.token_ids))
            for r in rows]


def speedups(rows: Sequence[CompareRow], reference: str = REFERENCE) -> list[float | None]:
    """tokens/s of each row over the reference's (None without a reference)."""
    ref = next((r for r in rows if r.method == reference), None)
    if ref is None or ref.tokens_per_s == 0:
        return [None] * len(rows)
    return [r.tokens_per_s / ref.tokens_per_s for r in rows]


def _flag(row: CompareRow) -> str:
    if row.method == LLAMACPP_REFERENCE:
        return "– other kernels"
    if row.identical is False and row.near_tie_at is not None:
        return "≈ " + near_tie_wording(row.near_tie_at)
    return {True: "✓ identical", False: "✗ differs", None: "–"}[row.identical]


def mark_near_ties(rows: Sequence[CompareRow], positions: dict[str, int]) -> list[CompareRow]:
    """``rows`` with ``near_tie_at`` set from ``positions`` (method -> 1-based token of a certified near-tie)."""
    return [replace(r, near_tie_at=positions[r.method]) if r.method in positions else r for r in rows]


def verdict(rows: Sequence[CompareRow]) -> str:
    """The T=0 line: identical (some up to a near-tie), or which methods differ."""
    bad = [r.method for r in rows if r.identical is False and r.near_tie_at is None]
    ties = [r.method for r in rows if r.identical is False and r.near_tie_at is not None]
    if bad:
        return f"**Identical at T=0:** ✗ differs for {', '.join(bad)} (below: where and why)"
    if ties:
        return (f"**Identical at T=0:** every method reproduces the target-only output ✓, {len(ties)} of them up to "
                "a kernel near-tie (below)")
    return "**Identical at T=0:** all methods reproduce the target-only output ✓"


def reference_note(rows: Sequence[CompareRow], reference: str = REFERENCE) -> str:
    """One sentence on the llama.cpp reference row, when there is one ("" otherwise)."""
    row = next((r for r in rows if r.method == LLAMACPP_REFERENCE), None)
    if row is None:
        return ""
    ratio = dict(zip((r.method for r in rows), speedups(rows, reference))).get(row.method)
    fastest = max(rows, key=lambda r: r.tokens_per_s)
    best = ("the fastest row here" if fastest is row else
            f"{fastest.method} is {fastest.tokens_per_s / row.tokens_per_s:.2f}x it" if row.tokens_per_s else "")
    vs = f", {ratio:.2f}x the {reference.lower()}" if ratio is not None else ""
    return (f"**{LLAMACPP_REFERENCE}**: the same target alone on llama.cpp, as its shipped Q4_K_M GGUF (what a "
            f"CPU user would run instead): {number(row.tokens_per_s)} tokens/s{vs}; {best}. Its kernels round "
            "differently, so its text is not compared token for token.")


def number(x: float) -> str:
    """``x`` to about three significant digits and never more than two decimals ("853", "53.7", "5.12", "0.35"):
    enough to rank methods whose timings vary by a few percent run to run, short enough to stay on one line."""
    if abs(x) >= 100:
        return f"{x:.0f}"
    return f"{x:.1f}" if abs(x) >= 10 else f"{x:.2f}"


#: The bar panels: title (short: four sit side by side in 600 px), the value of a row, and how its label reads.
_PANELS = (
    ("latency (s)", lambda r, s: r.seconds, number),
    ("tokens / s", lambda r, s: r.tokens_per_s, number),
    ("tokens / target call", lambda r, s: r.tokens_per_call or 0.0, number),
    ("speedup", lambda r, s: s or 0.0, lambda y: f"{y:.2f}×"),
)
#: Height of one bar's row in the figure (px): the names and labels stay legible as rows are added.
BAR_ROW_PX = 30


def figure(rows: Sequence[CompareRow], reference: str = REFERENCE, title: str = "") -> go.Figure:
    """Four panels of horizontal bars, one bar per method (top: the first row), its value written beside it;
    the method names once, on the left (horizontal bars: long names never overlap, however many rows).  Hover
    shows the identical-output flag."""
    fig = make_subplots(rows=1, cols=4, shared_yaxes=True, horizontal_spacing=0.03,
                        subplot_titles=[t if t != "speedup" else f"× {reference.lower()}" for t, _, _ in _PANELS])
    fig.update_layout(height=110 + BAR_ROW_PX * max(len(rows), 3), showlegend=False, plot_bgcolor="white",
                      margin=dict(l=10, r=10, t=60, b=30), title=dict(text=title, x=0.01), font=dict(size=13))
    if not rows:
        fig.add_annotation(text="no runs yet", x=0.5, y=0.5, xref="paper", yref="paper",
                           showarrow=False, font=dict(size=16, color="#888"))
        return fig
    names = [r.method for r in rows]
    colors = [method_color(n) for n in names]
    flags = [_flag(r) for r in rows]
    ratios = speedups(rows, reference)
    for col, (_, value, fmt) in enumerate(_PANELS, start=1):
        xs = [value(r, s) for r, s in zip(rows, ratios)]
        fig.add_trace(go.Bar(
            y=names, x=xs, orientation="h", marker_color=colors, text=[fmt(x) for x in xs], textposition="outside",
            cliponaxis=False, customdata=flags, hovertemplate="%{y}: %{x:.3f}<br>%{customdata}<extra></extra>",
        ), row=1, col=col)
        # Room right of the longest bar for its label, which is drawn outside the bar.
        fig.update_xaxes(range=[0, max(max(xs), 1e-9) * 1.45], row=1, col=col)
    fig.add_vline(x=1.0, line_dash="dot", line_color="#555", row=1, col=4)
    fig.update_xaxes(gridcolor="#eee", showticklabels=False)
    fig.update_yaxes(autorange="reversed", automargin=True)
    return fig


def table(rows: Sequence[CompareRow], reference: str = REFERENCE) -> list[list]:
    """Rows for the page's table under :data:`HEADERS`, numbers as short text (:func:`number`)."""
    out = []
    for r, s in zip(rows, speedups(rows, reference)):
        per_call = r.tokens_per_call
        out.append([
            r.method, r.tokens, number(r.seconds),
            number(r.first_token_s) if r.first_token_s is not None else "–", number(r.tokens_per_s),
            r.target_calls if r.target_calls is not None else "–",
            number(per_call) if per_call is not None else "–",
            f"{s:.2f}×" if s is not None else "–", _flag(r),
        ])
    return out


def records(rows: Sequence[CompareRow], keys: dict[str, str], reference: str = REFERENCE) -> list[dict]:
    """One dict per row for the ``/compare`` API: keys :data:`API_KEYS`, numbers as numbers (rounded to the
    millisecond or the hundredth); ``method`` is ``keys[row label]`` (the API's stable method names) and
    ``label`` the page's name."""
    out = []
    for r, s in zip(rows, speedups(rows, reference)):
        per_call = r.tokens_per_call
        values = [keys.get(r.method, r.method), r.tokens, round(r.seconds, 3),
                  round(r.first_token_s, 3) if r.first_token_s is not None else "–", round(r.tokens_per_s, 2),
                  r.target_calls if r.target_calls is not None else "–",
                  round(per_call, 2) if per_call is not None else "–", round(s, 2) if s is not None else "–",
                  _flag(r)]
        out.append({**dict(zip(API_KEYS, values)), "label": r.method})
    return out


def progress(phase: str, method: str = "", row: int = 0, total: int = 0, tokens: int | None = None,
             max_tokens: int = 0) -> str:
    """The line above the notes while a comparison runs, one wording per phase so that loading is never read as
    running: "loading" (``method``: what loads, on its first use), "warming" (``method``'s untimed warm-up before
    its row), "running" (row ``row`` of ``total``, ``tokens`` of ``max_tokens`` so far; None: a run that reports
    no steps, as Hugging Face generate)."""
    if phase == "loading":
        return f"*Loading {method} (first use only: its row runs next)…*"
    where = f"row {row} of {total}"
    if phase == "warming":
        return f"*Warming up **{method}** (untimed, a few tokens), then running it: {where}…*"
    if phase == "running" and tokens is None:
        return f"*Running **{method}**, {where}…*"
    if phase == "running":
        done = f"{tokens} of {max_tokens} tokens" if max_tokens else f"{tokens} tokens"
        return f"*Running **{method}**, {where}: {done} so far…*"
    raise ValueError(f"phase: unknown phase {phase!r}")
