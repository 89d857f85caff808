"""Generated text with every step's tokens marked, as an HTML string.

Each step contributes its accepted draft tokens (green) followed by the
target's bonus token (blue); a thin bar separates steps, and the step whose
tree is on screen can be outlined.  Only inline styles are used, so the
markup survives HTML sanitising, and every piece of model text is escaped.
"""

from __future__ import annotations

import html
from collections.abc import Sequence

from sequoia.core.statistics.stats import kept
from sequoia.core.statistics.trace import StepRecord

from components import COLORS, TEXT_BACKGROUNDS, method_label

_BODY_STYLE = ("white-space:pre-wrap;word-break:break-word;font-family:ui-monospace,Menlo,Consolas,monospace;"
               "font-size:0.92em;line-height:1.7;padding:8px;border:1px solid #ddd;border-radius:6px;"
               "background:#fff;color:#111")
_STEP_STYLE = "border-left:1px solid #999;padding-left:1px"
_SELECTED_STYLE = "outline:2px solid #ff7f0e;outline-offset:1px;border-radius:2px"


def step_segments(record: StepRecord) -> list[tuple[str, str]]:
    """``[(kind, text)]`` for the tokens a step committed, kind in {"accepted", "bonus"}.

    The committed tokens are the accepted drafts then the bonus, cut to
    ``record.n_new`` when a stop condition trimmed the step.
    """
    segs = [("accepted", record.texts[i]) for i in record.accepted[1:]]
    segs.append(("bonus", record.bonus_text))
    return segs[: record.n_new]


_WHO = {"accepted": "draft token accepted by the target", "bonus": "bonus token sampled from the target",
        "target": "token from the target alone (nothing drafted)"}


def _token_span(kind: str, text: str) -> str:
    who = _WHO[kind]
    bg = TEXT_BACKGROUNDS["bonus" if kind == "target" else kind]
    return f'<span style="background:{bg};border-radius:2px" title="{who}">{html.escape(text)}</span>'


def _step_span(record: StepRecord, selected: bool) -> str:
    plain = record.tree.size == 0  # a target-alone step: its token is the target's, not a "bonus"
    inner = "".join(_token_span("target" if plain else kind, text) for kind, text in step_segments(record))
    style = _STEP_STYLE + (";" + _SELECTED_STYLE if selected else "")
    n_kept, bonus_kept = kept(record)
    what = "1 token from the target" if plain else f"{n_kept} accepted" + (" + bonus" if bonus_kept else "")
    title = f"step {record.step}: {what} ({method_label(record.method)})"
    return f'<span data-step="{record.step}" style="{style}" title="{html.escape(title)}">{inner}</span>'


def legend() -> str:
    """The colour key, as HTML."""
    def chip(kind: str, label: str) -> str:
        return (f'<span style="background:{TEXT_BACKGROUNDS[kind]};border:1px solid {COLORS.get(kind, "#999")};'
                f'padding:0 6px;border-radius:3px;margin-right:10px">{label}</span>')
    return ('<div style="font-size:0.85em;margin-bottom:6px">'
            + chip("accepted", "draft token accepted")
            + chip("bonus", "token from the target (bonus)")
            + chip("prompt", "prompt")
            + '<span style="border-left:1px solid #999;padding-left:4px">step boundary</span></div>')


def html_view(records: Sequence[StepRecord], prompt: str | None = None,
              selected_step: int | None = None, show_legend: bool = True, waiting: str = "") -> str:
    """The whole generation as marked-up HTML (prompt shown greyed when given).

    ``waiting`` replaces the "nothing generated yet" note (e.g. "drafting the first step…").
    """
    parts = []
    if prompt:
        parts.append(f'<span style="background:{TEXT_BACKGROUNDS["prompt"]};color:#555">'
                     f'{html.escape(prompt)}</span>')
    parts.extend(_step_span(r, r.step == selected_step) for r in records)
    if not records:
        note = html.escape(waiting) if waiting else "(nothing generated yet)"
        parts.append(f'<span class="sq-waiting" style="color:#999">{note}</span>')
    body = f'<div style="{_BODY_STYLE}">{"".join(parts)}</div>'
    return (legend() if show_legend else "") + body


def plain_text(records: Sequence[StepRecord]) -> str:
    """The generated text without markup (concatenated token texts)."""
    return "".join(text for r in records for _, text in step_segments(r))
