"""Side-by-side comparison of decoding methods on one prompt.

A :class:`CompareRow` is one method's timed rounds (components.compare.compare_run): the medians of its runs, every
round's tokens/s, and its output; rows are also built from step records (:func:`row_from_records`) or from a
plain (token ids, seconds) result.  A ratio to the reference carries its band (:mod:`sequoia.core.statistics.rounds`:
the median and range of the per-round paired ratios) and its verdict: "same within noise" where the band holds
1, "target alone's work" where every target call made one token (never read as a speedup).
``figure(rows)`` draws four bar panels (latency, tokens/s, tokens per target call, ratio to the reference, the
last two with their spread as error bars) and ``table(rows)`` the same numbers plus the time to the first token
(the prompt's forward, which every method pays alike) and the "identical output" flag.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from sequoia.core.statistics import rounds
from sequoia.core.statistics.trace import StepRecord

from components import method_color
from components.widgets.divergence_view import near_tie_wording

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
#: room for its longest word in bold (assets/studio.css keeps words whole): tokens/s and speedup for a range
#: "(42.6–72.6)" (a break opportunity at its dash otherwise), the identical column for "identical up to a kernel
#: near-tie at token N (certify: exact mode)" on a few lines.  A narrower window scrolls the table sideways rather
#: than breaking a word.
COLUMN_WIDTHS = [120, 70, 74, 66, 100, 66, 70, 114, 110]


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
    rates: tuple[float, ...] = ()     # [rounds] tokens/s of each timed round (empty: one untimed-rounds result)
    reference_work: bool = False      # every target call of every round made one token: the target alone's work

    @property
    def tokens_per_s(self) -> float:
        """The median over the rounds (one result: tokens over seconds)."""
        if self.rates:
            return statistics.median(self.rates)
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def rate_spread(self) -> rounds.Spread | None:
        return rounds.spread(self.rates) if self.rates else None

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


def bands(rows: Sequence[CompareRow], reference: str = REFERENCE) -> list[rounds.Spread | None]:
    """Each row's ratio to the reference with its band: per-round paired ratios when both have rounds, else the
    one ratio of their results (None without a reference)."""
    ref = next((r for r in rows if r.method == reference), None)
    if ref is None or ref.tokens_per_s == 0:
        return [None] * len(rows)
    out = []
    for r in rows:
        paired = rounds.ratio_band(r.rates, ref.rates) if r.rates and ref.rates else None
        out.append(paired or rounds.spread([r.tokens_per_s / ref.tokens_per_s]))
    return out


def speedups(rows: Sequence[CompareRow], reference: str = REFERENCE) -> list[float | None]:
    """tokens/s of each row over the reference's, the median of the rounds' ratios (None without a reference)."""
    return [b.median if b is not None else None for b in bands(rows, reference)]


def judged(rows: Sequence[CompareRow], reference: str = REFERENCE) -> list[tuple[rounds.Spread | None, str | None]]:
    """Each row's band (:func:`bands`) with the verdict it gives (:func:`sequoia.core.statistics.rounds.verdict`; None
    without a reference): every band computed once."""
    ref = next((r for r in rows if r.method == reference), None)
    noise = ref.rate_spread.half_width if ref is not None and ref.rate_spread is not None else None
    return [(b, rounds.verdict(b, r.reference_work, r.method == reference, noise) if b is not None else None)
            for r, b in zip(rows, bands(rows, reference))]


def verdicts(rows: Sequence[CompareRow], reference: str = REFERENCE) -> list[str | None]:
    """Each row's verdict (:func:`sequoia.core.statistics.rounds.verdict`; None without a reference)."""
    return [v for _, v in judged(rows, reference)]


def span(lo: str, hi: str) -> str:
    """"(lo–hi)" as one unbreakable word: a browser may break a line after an en dash, and a range split over two
    lines reads as two numbers."""
    return f"({lo}\u2060–\u2060{hi})"


def ratio_text(band: rounds.Spread | None, verdict_: str | None) -> str:
    """A ratio as the table shows it, its band beside it: "1.52× (1.41–1.60)", "1.03× (0.97–1.10) same within
    noise", "0.70× (0.53–1.15) too noisy to tell", "0.97× (0.84–0.98) the target alone's work"; the number is
    always the band's median, and a row doing the target alone's work is named so, never read as a speedup."""
    if band is None:
        return "–"
    if verdict_ == rounds.REFERENCE:
        return "1× (reference)"
    spread_ = span(f"{band.lo:.2f}", f"{band.hi:.2f}") if band.n > 1 else "(1 round)"
    if verdict_ == rounds.REFERENCE_WORK:   # its measured ratio, which is noise: never a printed 1.00 over a band
        return f"{band.median:.2f}× {spread_} the target alone's work"   # that leaves 1 out
    words = {rounds.SAME: " same within noise", rounds.TOO_NOISY: " too noisy to tell"}.get(verdict_, "")
    return f"{band.median:.2f}× {spread_}{words}"


def rate_text(row: CompareRow) -> str:
    """tokens/s as the table shows it: the median, and its spread over the rounds where there are several."""
    s = row.rate_spread
    if s is None or s.n < 2:
        return number(row.tokens_per_s)
    return f"{number(s.median)} {span(number(s.lo), number(s.hi))}"


def outlier_note(rows: Sequence[CompareRow]) -> str:
    """hyperfine's warning: the rounds far from their row's median ("" when none)."""
    far = []
    for r in rows:
        for i in rounds.outliers(r.rates):
            far.append(f"{r.method} round {i + 1} ({number(r.rates[i])} tokens/s against a median of "
                       f"{number(r.tokens_per_s)})")
    if not far:
        return ""
    return ("**Outliers:** " + "; ".join(far) + ". Something else ran on this machine meanwhile: run the "
            "comparison again on a quiet machine, or read those rows' bands as wide.")


def _flag(row: CompareRow, checking: bool = False) -> str:
    """The identical column; ``checking``: a differing row is not yet checked for a kernel near-tie."""
    if row.method == LLAMACPP_REFERENCE:
        return "– other kernels"
    if row.identical is False and row.near_tie_at is not None:
        return "≈ " + near_tie_wording(row.near_tie_at)
    if row.identical is False and checking:
        return "… checking"
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
                "a kernel near-tie (below). A *kernel near-tie*: at that token the target's two likeliest tokens "
                "are within rounding of each other, so a forward of another shape (a tree's, not one token's) may "
                "round to the other one; *exact mode* (a float32 target) settles which, and proves the rest equal.")
    return "**Identical at T=0:** all methods reproduce the target-only output ✓"


def reference_note(rows: Sequence[CompareRow], reference: str = REFERENCE) -> str:
    """One sentence on the llama.cpp reference row, when there is one ("" otherwise)."""
    row = next((r for r in rows if r.method == LLAMACPP_REFERENCE), None)
    if row is None:
        return ""
    ratio = dict(zip((r.method for r in rows), speedups(rows, reference))).get(row.method)
    fastest = max(rows, key=lambda r: r.tokens_per_s)
    best = ("the fastest row here" if fastest is row else
            f"{fastest.method} is {fastest.tokens_per_s / row.tokens_per_s:.2f}× it" if row.tokens_per_s else "")
    vs = f", {ratio:.2f}× the {reference.lower()}" if ratio is not None else ""
    return (f"**{LLAMACPP_REFERENCE}**: the same target alone on llama.cpp, as its shipped Q4_K_M GGUF (4-bit "
            f"weights, llama.cpp's usual quantization; what a CPU user would run instead): {number(row.tokens_per_s)} tokens/s{vs}; {best}. Its kernels round "
            "differently, so its text is not compared token for token.")


def number(x: float) -> str:
    """``x`` to about three significant digits and never more than two decimals ("853", "53.7", "5.12", "0.35"):
    enough to rank methods whose timings vary by a few percent run to run, short enough to stay on one line."""
    if abs(x) >= 100:
        return f"{x:.0f}"
    return f"{x:.1f}" if abs(x) >= 10 else f"{x:.2f}"


#: The bar panels: title (short: four sit side by side in 600 px), the value of a row (given its ratio band and
#: verdict), and how its label reads.  A ratio is drawn at its band's median, as the table prints it (a row doing
#: the target alone's work too: the table names it so).
_PANELS = (
    ("latency (s)", lambda r, b, v: r.seconds, number),
    ("tokens / s", lambda r, b, v: r.tokens_per_s, number),
    ("tokens / target call", lambda r, b, v: r.tokens_per_call or 0.0, number),
    ("speedup", lambda r, b, v: b.median if b else 0.0,
     lambda y: f"{y:.2f}×"),
)
#: Height of one bar's row in the figure (px): the names and labels stay legible as rows are added.
BAR_ROW_PX = 30


def _error_bars(col: int, rows: Sequence[CompareRow], xs: list[float], bands_: list) -> dict | None:
    """The spread over the rounds as error bars: tokens/s (min..max of the rounds) and the ratio (its band)."""
    if col == 2 and any(r.rates for r in rows):
        spreads = [r.rate_spread for r in rows]
    elif col == 4 and any(b is not None and b.n > 1 for b in bands_):
        spreads = bands_
    else:
        return None
    return dict(type="data", symmetric=False, color="#444", thickness=1.2, width=4,
                array=[max(s.hi - x, 0.0) if s else 0.0 for s, x in zip(spreads, xs)],
                arrayminus=[max(x - s.lo, 0.0) if s else 0.0 for s, x in zip(spreads, xs)])


def figure(rows: Sequence[CompareRow], reference: str = REFERENCE, title: str = "") -> go.Figure:
    """Four panels of horizontal bars, one bar per method (top: the first row), its value written beside it;
    the method names once, on the left (horizontal bars: long names never overlap, however many rows).  Hover
    shows the identical-output flag and the verdict; tokens/s and the ratio show their spread."""
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
    bands_, verdicts_ = map(list, zip(*judged(rows, reference)))   # rows is not empty here
    hover = [f"{_flag(r)}<br>{ratio_text(b, v)}" for r, b, v in zip(rows, bands_, verdicts_)]
    labels = []
    for col, (_, value, fmt) in enumerate(_PANELS, start=1):
        xs = [value(r, b, v) for r, b, v in zip(rows, bands_, verdicts_)]
        errors = _error_bars(col, rows, xs, bands_)
        fig.add_trace(go.Bar(
            y=names, x=xs, orientation="h", marker_color=colors, customdata=hover,
            hovertemplate="%{y}: %{x:.3f}<br>%{customdata}<extra></extra>", error_x=errors), row=1, col=col)
        ends = label_positions(xs, errors["array"] if errors else None, line=1.0 if col == 4 else None)
        labels.append((col, ends, [fmt(x) for x in xs]))
        # Room right of the furthest label's start for the label itself.
        fig.update_xaxes(range=[0, max(max(ends), 1e-9) * 1.45], row=1, col=col)
    # Each value written where nothing crosses it: past its whisker and, on the ratio panel, past the 1× line
    # (written at the bar's end, outside it, the whisker and the dotted line struck it through).  Text traces
    # after the four bar traces, so fig.data[0..3] stay the bars.
    for col, ends, texts in labels:
        fig.add_trace(go.Scatter(y=names, x=ends, mode="text", text=texts, textposition="middle right",
                                 cliponaxis=False, hoverinfo="skip", showlegend=False), row=1, col=col)
    fig.add_vline(x=1.0, line_dash="dot", line_color="#555", row=1, col=4)
    fig.update_xaxes(gridcolor="#eee", showticklabels=False)
    fig.update_yaxes(autorange="reversed", automargin=True)
    return fig


#: The gap between a value label and what it clears (bar end, whisker cap, the 1× line), as a part of the panel's
#: furthest such end: the text starts at that point, so with no gap a whisker's cap touched its first digit.
LABEL_GAP = 0.03


def label_positions(xs: Sequence[float], whiskers: Sequence[float] | None, line: float | None = None) -> list[float]:
    """Where each bar's value label starts: a small gap past the bar's end, its whisker (``whiskers``: how far
    each reaches beyond the bar) and ``line`` (a reference line the label would otherwise cross), whichever is
    furthest."""
    ups = whiskers if whiskers is not None else [0.0] * len(xs)
    ends = [max(x + (up or 0.0), line if line is not None else 0.0) for x, up in zip(xs, ups)]
    gap = LABEL_GAP * max(ends, default=0.0)
    return [end + gap for end in ends]


def reference_work_note(rows: Sequence[CompareRow], reference: str = REFERENCE) -> str:
    """Why a row doing the target alone's work (one token a target call) is not at 1×: its time a call after the
    prompt's forward against the reference's, the difference named as the method's own work around each call
    ("" when no such row, or no time a call to compare)."""
    ref = next((r for r in rows if r.method == reference), None)
    ref_call = _call_s(ref) if ref is not None else None
    if not ref_call:
        return ""
    parts = []
    for r in rows:
        call = _call_s(r) if r.reference_work and r.method != reference else None
        if call is None:
            continue
        more = call - ref_call
        how = (f"{_ms(abs(more))} a call more: the method's own work around each call (choosing and pricing its "
               "tree, the engine's bookkeeping, the draft model's forward where it runs), not a slower target"
               if more > 0 else f"{_ms(abs(more))} a call less: the rounds' noise, not a faster target")
        parts.append(f"**{r.method}** made one token a target call, as the {reference.lower()} does, at "
                     f"{_ms(call)} a call against {_ms(ref_call)}: {how}")
    return ("Rows doing the target alone's work: " + "; ".join(parts) + ".") if parts else ""


def _call_s(row: CompareRow) -> float | None:
    """Seconds a target call after the prompt's forward (None: not enough calls or times to tell)."""
    if not row.target_calls or row.target_calls < 2:
        return None
    first = row.first_token_s or 0.0
    return max(row.seconds - first, 0.0) / (row.target_calls - 1) if first else row.seconds / row.target_calls


def _ms(s: float) -> str:
    return f"{1000 * s:.1f} ms"


def table(rows: Sequence[CompareRow], reference: str = REFERENCE, checking: bool = False) -> list[list]:
    """Rows for the page's table under :data:`HEADERS`, numbers as short text (:func:`number`), tokens/s and
    the ratio with their spread over the rounds; ``checking``: differing rows read "checking" (their near-tie
    check has not answered yet)."""
    out = []
    for r, (b, v) in zip(rows, judged(rows, reference)):
        per_call = r.tokens_per_call
        out.append([
            r.method, r.tokens, number(r.seconds),
            number(r.first_token_s) if r.first_token_s is not None else "–", rate_text(r),
            r.target_calls if r.target_calls is not None else "–",
            number(per_call) if per_call is not None else "–",
            ratio_text(b, v), _flag(r, checking),
        ])
    return out


def _rounded(x: float | None, digits: int) -> float | str:
    return round(x, digits) if x is not None else "–"


def records(rows: Sequence[CompareRow], keys: dict[str, str], reference: str = REFERENCE) -> list[dict]:
    """One dict per row for the ``/compare`` API: keys :data:`API_KEYS`, numbers as numbers (rounded to the
    millisecond or the hundredth); ``method`` is ``keys[row label]`` (the API's stable method names) and
    ``label`` the page's name; the rounds: ``rounds``, ``tokens/s min`` / ``max``, ``speedup min`` / ``max``
    (the band of the per-round ratios) and ``verdict`` (:mod:`sequoia.core.statistics.rounds`: "same within noise",
    "reference's work", "faster", "slower", "one round", "reference")."""
    out = []
    for r, (b, v) in zip(rows, judged(rows, reference)):
        per_call, spread_ = r.tokens_per_call, r.rate_spread
        values = [keys.get(r.method, r.method), r.tokens, round(r.seconds, 3), _rounded(r.first_token_s, 3),
                  round(r.tokens_per_s, 2), r.target_calls if r.target_calls is not None else "–",
                  _rounded(per_call, 2), _rounded(b.median if b else None, 2), _flag(r)]
        out.append({**dict(zip(API_KEYS, values)), "label": r.method, "rounds": len(r.rates) or 1,
                    "tokens/s min": _rounded(spread_.lo if spread_ else None, 2),
                    "tokens/s max": _rounded(spread_.hi if spread_ else None, 2),
                    "speedup min": _rounded(b.lo if b else None, 2), "speedup max": _rounded(b.hi if b else None, 2),
                    "verdict": v or "–"})
    return out


def progress(phase: str, method: str = "", row: int = 0, total: int = 0, tokens: int | None = None,
             max_tokens: int = 0, round_: int = 0, rounds_: int = 0) -> str:
    """The line above the notes while a comparison runs, one wording per phase so that loading is never read as
    running: "loading" (``method``: what loads, on its first use), "warming" (``method``'s untimed warm-up, the
    ``row``-th of ``total``), "running" (round ``round_`` of ``rounds_``, ``method`` the ``row``-th of ``total``,
    ``tokens`` of ``max_tokens`` so far; None: a run that reports no steps, as Hugging Face generate)."""
    if phase == "loading":
        return f"*Loading {method} (first use only: its warm-up runs next)…*"
    where = f"{row} of {total}"
    if phase == "warming":
        return f"*Warm-up round (untimed, a few tokens each): **{method}**, {where}…*"
    if phase != "running":
        raise ValueError(f"phase: unknown phase {phase!r}")
    head = f"*Round {round_} of {rounds_}: running **{method}**, {where}" if rounds_ else \
        f"*Running **{method}**, {where}"
    if tokens is None:
        return head + "…*"
    done = f"{tokens} of {max_tokens} tokens" if max_tokens else f"{tokens} tokens"
    return f"{head}: {done} so far…*"
