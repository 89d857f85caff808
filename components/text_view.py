"""Generated text with every step's tokens marked, as an HTML string.

Each step contributes its accepted draft tokens (green) followed by the
target's bonus token (blue); a thin bar separates steps, and the step whose
tree is on screen can be outlined.  Only inline styles are used, so the
markup survives HTML sanitising, and every piece of model text is escaped.
"""

from __future__ import annotations

import html
from collections.abc import Sequence

from sequoia.core.trace import StepRecord

from . import COLORS, TEXT_BACKGROUNDS

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


def _token_span(kind: str, text: str) -> str:
    bg = TEXT_BACKGROUNDS[kind]
    who = "draft token accepted by the target" if kind == "accepted" else "bonus token sampled from the target"
    return f'<span style="background:{bg};border-radius:2px" title="{who}">{html.escape(text)}</span>'


def _step_span(record: StepRecord, selected: bool) -> str:
    inner = "".join(_token_span(kind, text) for kind, text in step_segments(record))
    style = _STEP_STYLE + (";" + _SELECTED_STYLE if selected else "")
    title = f"step {record.step}: {record.n_accepted} accepted + bonus ({record.method})"
    return f'<span data-step="{record.step}" style="{style}" title="{html.escape(title)}">{inner}</span>'


def legend() -> str:
    """The colour key, as HTML."""
    def chip(kind: str, label: str) -> str:
        return (f'<span style="background:{TEXT_BACKGROUNDS[kind]};border:1px solid {COLORS.get(kind, "#999")};'
                f'padding:0 6px;border-radius:3px;margin-right:10px">{label}</span>')
    return ('<div style="font-size:0.85em;margin-bottom:6px">'
            + chip("accepted", "draft token accepted")
            + chip("bonus", "target bonus token")
            + chip("prompt", "prompt")
            + '<span style="border-left:1px solid #999;padding-left:4px">step boundary</span></div>')


def html_view(records: Sequence[StepRecord], prompt: str | None = None,
              selected_step: int | None = None, show_legend: bool = True) -> str:
    """The whole generation as marked-up HTML (prompt shown greyed when given)."""
    parts = []
    if prompt:
        parts.append(f'<span style="background:{TEXT_BACKGROUNDS["prompt"]};color:#555">'
                     f'{html.escape(prompt)}</span>')
    parts.extend(_step_span(r, r.step == selected_step) for r in records)
    if not records:
        parts.append('<span style="color:#999">(nothing generated yet)</span>')
    body = f'<div style="{_BODY_STYLE}">{"".join(parts)}</div>'
    return (legend() if show_legend else "") + body


def plain_text(records: Sequence[StepRecord]) -> str:
    """The generated text without markup (concatenated token texts)."""
    return "".join(text for r in records for _, text in step_segments(r))
