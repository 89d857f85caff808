"""Sequoia Studio: the Gradio app.  This file only wires the tabs together.

    python app.py                      # embedded Qwen2.5-Coder 0.5B -> 1.5B pair, offline
    SEQUOIA_DRAFT=Qwen/Qwen2.5-0.5B-Instruct SEQUOIA_TARGET=Qwen/Qwen2.5-7B-Instruct \\
    SEQUOIA_DEVICE=cuda SEQUOIA_DTYPE=bfloat16 python app.py

Nothing is loaded at import: ``main()`` reads the environment, loads the
pair (with progress on the console), builds the Blocks and launches.  Tests
call :func:`build_demo` with a tiny model pair instead.  Named API endpoints
for ``gradio_client``: ``/decode`` (text + one JSON object per step),
``/decode_stream`` (the streaming UI handler), ``/dp`` and ``/compare``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import gradio as gr

from components import COLORS, compare_tab, dp_tab, hardware_tab, live_tab
from components.context import ASSETS, AppContext

CSS_PATH = ASSETS / "studio.css"
QUEUE_MAX_SIZE = 16  # waiting requests beyond this are refused rather than queued for minutes

_HEADER = """<div class="sq-header">
<h1>Sequoia Studio</h1>
<p>Speculative decoding with DP-optimal token trees (Chen et al., 2024): a small draft proposes a tree,
the target verifies it in one forward, and the output is distributed exactly as the target's.</p>
</div>"""


def _legend() -> str:
    items = [("accepted", "accepted draft token"), ("rejected", "rejected"), ("unreached", "never verified"),
             ("bonus", "target bonus token")]
    spans = "".join(f'<span><i style="background:{COLORS[k]}"></i>{label}</span>' for k, label in items)
    return f'<div class="sq-legend">{spans}</div>'


def build_demo(pair_or_loader: Any | Callable[[], Any], assets_dir: Path = ASSETS,
               max_budget: int | None = None) -> gr.Blocks:
    """The whole app for a model pair, or a zero-argument callable that loads one on first use."""
    ctx = AppContext.from_pair_or_loader(pair_or_loader, assets_dir=Path(assets_dir), max_budget=max_budget)
    if ctx.loaded:
        ctx.load_profile()
    with gr.Blocks(title="Sequoia Studio") as demo:
        gr.HTML(_HEADER)
        gr.Markdown(ctx.pair_label())
        gr.HTML(_legend())
        with gr.Tabs():
            with gr.Tab("Live decoding"):
                live_tab.build(ctx)
            with gr.Tab("DP explorer"):
                dp_tab.build(ctx, demo)
            with gr.Tab("Compare"):
                compare_tab.build(ctx)
            with gr.Tab("Hardware"):
                hardware_tab.build(ctx, demo)
    demo.sequoia_context = ctx  # for tests and scripts; not used by the UI
    return demo


class _ConsoleProgress:
    """progress(fraction, description) for load_pair: one console line per new description."""

    def __init__(self) -> None:
        self.last = None

    def __call__(self, fraction: float, description: str) -> None:
        if description != self.last:
            print(f"  [{fraction:4.0%}] {description}", flush=True)
            self.last = description


def load_from_env(env: Mapping[str, str] = os.environ, progress: Callable[[float, str], None] | None = None):
    """Load the pair named by SEQUOIA_DRAFT / SEQUOIA_TARGET / SEQUOIA_DEVICE / SEQUOIA_DTYPE."""
    from sequoia.models import load_pair

    return load_pair(
        draft=env.get("SEQUOIA_DRAFT") or "embedded",
        target=env.get("SEQUOIA_TARGET") or "embedded",
        device=env.get("SEQUOIA_DEVICE") or None,
        dtype=env.get("SEQUOIA_DTYPE") or "auto",
        progress=progress,
    )


def main() -> None:
    import torch

    # Denormal floats make CPU matmuls of small activations many times slower.
    torch.set_flush_denormal(True)
    print("Sequoia Studio: loading the model pair (the first run converts the embedded GGUF files once) …",
          flush=True)
    try:
        pair = load_from_env(progress=_ConsoleProgress())
    except (ValueError, RuntimeError, OSError) as exc:
        raise SystemExit(f"Sequoia Studio: could not load the model pair: {exc}") from None
    demo = build_demo(pair)
    # One model, one request at a time; GRADIO_SERVER_NAME / GRADIO_SERVER_PORT are read by gradio itself.
    demo.queue(default_concurrency_limit=1, max_size=QUEUE_MAX_SIZE)
    demo.launch(css_paths=[CSS_PATH] if CSS_PATH.exists() else None, show_error=True)


if __name__ == "__main__":
    main()
