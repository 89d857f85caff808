"""Compare tab: every method on one prompt, one after another.

Target only, chain, SpecInfer, Sequoia (and Sequoia auto when a hardware
profile is loaded) and Hugging Face assisted generation run with the same
settings; the bars and the table come from
:mod:`components.compare_view`.  At temperature 0 every lossless method must
reproduce the target-only output token for token, which the "identical"
column checks.
"""

# No ``from __future__ import annotations``: gr.api reads the return annotation.

import time
from collections.abc import Callable

import gradio as gr

from . import compare_view
from .context import AppContext, acceptance_catalogue
from .live_tab import make_request, run_decode

#: (row name, method label for make_request), in run order; the first is the reference.
RUNS = (
    ("target only", "Target only"),
    ("chain", "Chain"),
    ("specinfer", "SpecInfer"),
    ("sequoia", "Sequoia (budget & depth)"),
)
HF_ROW = "hf assisted"


def _hf_row(ctx: AppContext, req) -> compare_view.CompareRow | str:
    """HF assisted generation with the same pair, or a note why it was skipped."""
    from sequoia.baselines import hf_generate

    try:
        run = hf_generate(ctx.pair(), req.prompt_ids, req.config, assisted=True)
    except (ValueError, RuntimeError, NotImplementedError, TypeError) as exc:
        return f"HF assisted generation failed: {exc}"
    return compare_view.CompareRow(HF_ROW, tokens=len(run.tokens), seconds=run.seconds,
                                   target_calls=run.target_calls, token_ids=run.tokens)


def run_comparison(ctx: AppContext, prompt, budget, depth, temperature, top_p, max_new_tokens, seed,
                   acceptance=None, chat=True, include_hf=True,
                   progress: Callable[[float, str], None] | None = None):
    """All rows (reference first, identical flags set) and notes; ValueError on bad input."""
    runs = RUNS + ((("sequoia-auto", "Sequoia (auto)"),) if ctx.profile is not None else ())
    total = len(runs) + int(include_hf)
    rows, notes = [], []
    first_req = None
    for i, (name, label) in enumerate(runs):
        if progress:
            progress(i / total, f"running {name}")
        req = make_request(ctx, prompt, label, budget, depth, temperature, top_p, max_new_tokens,
                           seed, acceptance, chat)
        first_req = first_req or req
        t0 = time.perf_counter()
        records = list(run_decode(ctx, req))
        rows.append(compare_view.row_from_records(name, records, seconds=time.perf_counter() - t0))
    if include_hf:
        if progress:
            progress(len(runs) / total, "running HF assisted generation")
        hf = _hf_row(ctx, first_req)
        if isinstance(hf, compare_view.CompareRow):
            rows.append(hf)
        else:
            notes.append(hf)
    if progress:
        progress(1.0, "done")
    return compare_view.mark_identical(rows), notes


def _notes_markdown(rows, notes, temperature) -> str:
    lines = list(notes)
    if float(temperature) == 0:
        bad = [r.method for r in rows if r.identical is False]
        lines.append("**Identical at T=0:** " + ("all methods reproduce the target-only output ✓" if not bad
                     else f"differs for {', '.join(bad)} (near-ties in low precision can flip tokens)"))
    else:
        lines.append("At temperature > 0 outputs differ by design; only their distribution matches the target's.")
    return "\n\n".join(lines)


def on_compare(ctx, prompt, budget, depth, temperature, top_p, max_new, seed, acceptance_name, chat, include_hf,
               progress=gr.Progress()):
    acceptance = acceptance_catalogue(ctx.assets_dir).get(acceptance_name)
    try:
        rows, notes = run_comparison(ctx, prompt, budget, depth, temperature, top_p, max_new, seed, acceptance,
                                     chat, include_hf, progress=lambda f, desc: progress(f, desc=desc))
    except ValueError as exc:
        raise gr.Error(str(exc), title="Cannot compare") from None
    except RuntimeError as exc:
        raise gr.Error(f"comparison failed: {exc}", title="Decoding error") from None
    return (compare_view.figure(rows), compare_view.table(rows), _notes_markdown(rows, notes, temperature))


def compare_api_fn(ctx: AppContext):
    def compare(prompt: str, budget: int = 32, depth: int = 8, temperature: float = 0.0, top_p: float = 1.0,
                max_new_tokens: int = 64, seed: int = 0, include_hf: bool = True) -> list:
        """Run every method on one prompt; one object per method (tokens, seconds, speedup, identical…)."""
        try:
            rows, _ = run_comparison(ctx, prompt, budget, depth, temperature, top_p, max_new_tokens, seed,
                                     include_hf=include_hf)
        except ValueError as exc:
            raise gr.Error(str(exc)) from None
        return [dict(zip(compare_view.HEADERS, row)) for row in compare_view.table(rows)]
    return compare


def build(ctx: AppContext) -> None:
    cap = ctx.budget_cap()
    choices = list(acceptance_catalogue(ctx.assets_dir))
    with gr.Row():
        with gr.Column(scale=1, min_width=300):
            prompt = gr.Textbox(label="Prompt", lines=4, value="Write a Python function that reverses a linked list.")
            chat = gr.Checkbox(value=True, label="apply the chat template")
            with gr.Row():
                budget = gr.Slider(1, cap, value=min(32, cap), step=1, label="budget")
                depth = gr.Slider(1, 32, value=8, step=1, label="depth")
            with gr.Row():
                temperature = gr.Slider(0, 2, value=0, step=0.05, label="temperature")
                top_p = gr.Slider(0.05, 1, value=1, step=0.05, label="top-p")
            with gr.Row():
                max_new = gr.Slider(1, 512, value=64, step=1, label="max new tokens")
                seed = gr.Number(0, precision=0, minimum=0, label="seed")
            acceptance = gr.Dropdown(choices, value=choices[0], label="acceptance vector (Sequoia tree)")
            include_hf = gr.Checkbox(value=True, label="include HF assisted generation")
            run_btn = gr.Button("Run comparison", variant="primary")
        with gr.Column(scale=2):
            bars = gr.Plot(label="comparison")
            table = gr.Dataframe(headers=compare_view.HEADERS, label="results", interactive=False)
            notes = gr.Markdown()

    def handler(*args, progress=gr.Progress()):
        return on_compare(ctx, *args, progress=progress)

    run_btn.click(handler, [prompt, budget, depth, temperature, top_p, max_new, seed, acceptance, chat, include_hf],
                  [bars, table, notes], api_visibility="private", concurrency_id="model")
    gr.api(compare_api_fn(ctx), api_name="compare", concurrency_id="model")
