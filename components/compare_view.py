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

REFERENCE = "target only"
#: The row of the same target alone on llama.cpp (its shipped GGUF): a speed reference on other kernels, whose
#: output is never flagged identical or different (greedy ties can break otherwise there).
LLAMACPP_REFERENCE = "llama.cpp target only"
HEADERS = ["method", "tokens", "latency (s)", "first token (s)", "tokens/s", "target calls", "tokens/call", "speedup",
           "identical"]
#: Widths of those columns: the whole table fits a 1,280 px window beside the controls, and the identical column
#: has room for "identical up to a kernel near-tie at token N" on two lines.
COLUMN_WIDTHS = ["15%", "7%", "8%", "8%", "9%", "8%", "8%", "9%", "28%"]


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
    vs = f", {ratio:.2f}x {reference}" if ratio is not None else ""
    return (f"**{LLAMACPP_REFERENCE}**: the same target alone on llama.cpp, as its shipped Q4_K_M GGUF (what a "
            f"CPU user would run instead): {row.tokens_per_s:.1f} tokens/s{vs}; {best}. Its kernels round "
            "differently, so its text is not compared token for token.")


def figure(rows: Sequence[CompareRow], reference: str = REFERENCE, title: str = "") -> go.Figure:
    """Four bar panels, one bar per method; hover shows the identical-output flag."""
    fig = make_subplots(rows=1, cols=4, subplot_titles=(
        "latency (s)", "tokens / s", "tokens per target call", f"speedup vs {reference}"))
    fig.update_layout(height=380, showlegend=False, margin=dict(l=40, r=20, t=60, b=80),
                      plot_bgcolor="white", title=dict(text=title, x=0.01))
    if not rows:
        fig.add_annotation(text="no runs yet", x=0.5, y=0.5, xref="paper", yref="paper",
                           showarrow=False, font=dict(size=16, color="#888"))
        return fig
    names = [r.method for r in rows]
    colors = [method_color(n) for n in names]
    flags = [_flag(r) for r in rows]
    series = (
        [r.seconds for r in rows],
        [r.tokens_per_s for r in rows],
        [r.tokens_per_call or 0.0 for r in rows],
        [s or 0.0 for s in speedups(rows, reference)],
    )
    fmts = ("{:.2f}", "{:.1f}", "{:.2f}", "{:.2f}×")
    for col, (ys, fmt) in enumerate(zip(series, fmts), start=1):
        fig.add_trace(go.Bar(
            x=names, y=ys, marker_color=colors, text=[fmt.format(y) for y in ys], textposition="auto",
            customdata=flags, hovertemplate="%{x}: %{y:.3f}<br>%{customdata}<extra></extra>",
        ), row=1, col=col)
    fig.add_hline(y=1.0, line_dash="dot", line_color="#555", row=1, col=4)
    fig.update_xaxes(tickangle=-30)
    fig.update_yaxes(gridcolor="#eee")
    return fig


def table(rows: Sequence[CompareRow], reference: str = REFERENCE) -> list[list]:
    """Rows for a table under :data:`HEADERS` (numbers rounded for display)."""
    out = []
    for r, s in zip(rows, speedups(rows, reference)):
        per_call = r.tokens_per_call
        out.append([
            r.method, r.tokens, round(r.seconds, 3),
            round(r.first_token_s, 3) if r.first_token_s is not None else "–", round(r.tokens_per_s, 2),
            r.target_calls if r.target_calls is not None else "–",
            round(per_call, 2) if per_call is not None else "–",
            round(s, 2) if s is not None else "–", _flag(r),
        ])
    return out
