"""The banner at the top of the page: model-loading progress, the loaded pair, or why loading failed.

``banner_html(status, pair_label)`` is a pure function of a
:class:`components.app_state.context.LoadStatus`; the app re-renders it on a timer
until the models are ready.
"""

from __future__ import annotations

import html

from components import COLORS

_BOX = "padding:8px 12px;border-radius:6px;border:1px solid {border};background:{bg};font-size:0.95em"


def banner_html(status, pair_label: str, converts: bool = True) -> str:
    """Loading (with a progress bar), failed (with the error) or ready (the pair, ``pair_label`` as HTML);
    ``converts``: the runtime converts the embedded GGUF files on its first start (llama.cpp reads them as they are)."""
    if status.error is not None:
        box = _BOX.format(border=COLORS["rejected"], bg="#fdecea")
        return (f'<div class="sq-status sq-status-failed" style="{box}">'
                f"<b>The model pair could not be loaded.</b> {html.escape(status.error)}<br>"
                "<small>The DP explorer works without models. Fix the model settings "
                "(SEQUOIA_DRAFT / SEQUOIA_TARGET / SEQUOIA_DEVICE / SEQUOIA_DTYPE) and restart the app.</small></div>")
    if status.ready:
        return f'<div class="sq-status sq-status-ready">{pair_label}</div>'
    pct = round(100 * status.fraction)
    first = ("The first start of the embedded pair converts its weights once (about 2 minutes on 2 CPU cores); "
             "later starts take seconds. " if converts else "")
    elapsed = f" · {status.elapsed_s:.0f} s" if status.started is not None else ""
    return (f'<div class="sq-status sq-status-loading" style="{_BOX.format(border="#e0c060", bg="#fff8e1")}">'
            f"<b>Loading the model pair: {pct}%</b> · {html.escape(status.description)}{elapsed}"
            f'<div style="height:6px;background:#eee;border-radius:3px;margin:6px 0">'
            f'<div style="height:6px;width:{pct}%;background:{COLORS["accepted"]};border-radius:3px"></div></div>'
            f"<small>{first}The DP explorer works already; decoding works once the models are ready.</small></div>")
