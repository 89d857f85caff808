"""The GPU check's baselines: what a user would run instead of Sequoia, each a row (tokens/s, or its error).

Beside Sequoia on the same target (random weights at real shapes, greedy, ``new_tokens`` after ``ctx``):

* **graph target alone**: the project's engine, no draft, each forward one CUDA graph replay (the ``ar``
  step part (b) measures; Sequoia's speed-ups are over this row);
* **compiled graph target alone** (``compile``): the same with the forward compiled by inductor before
  capture (its first run, compilation included, is reported);
* **HF generate, eager**: ``model.generate`` with its dynamic cache;
* **HF generate, static cache** (``compile``): ``cache_implementation="static"``, which transformers compiles
  itself on CUDA (``mode="reduce-overhead"``; off CUDA it runs eagerly, and the row says so);
* **HF generate, static cache + torch.compile** (``compile``): the static cache with ``model.forward``
  wrapped in ``torch.compile(mode="reduce-overhead", fullgraph=True)`` by hand (transformers' own compile
  off), as gpt-fast-style recipes do.

A baseline that fails is a row with its error (``{"error": ...}``), never a crash of the check: on one H100
the hand-compiled row compiled for 116 s and then failed ("accessing tensor output of CUDAGraphs that has
been overwritten by a subsequent run").
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from ...runtime.engine import sync
from .models import runner

ROW_GRAPH = "graph target alone (engine ar)"
ROW_COMPILED = "compiled graph target alone (engine ar, inductor before capture)"
ROW_EAGER = "HF generate, eager"
ROW_STATIC = "HF generate, static cache (transformers' own compile on CUDA)"
ROW_STATIC_COMPILE = "HF generate, static cache + torch.compile(reduce-overhead) by hand"


def row(measure: Callable[[], dict]) -> dict:
    """``measure()``, or its error as the row: a baseline that fails is reported, not raised."""
    try:
        return measure()
    except Exception as exc:  # noqa: BLE001 - any failure of a baseline is a result to show
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        return {"error": f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300] if str(exc) else ''}"}


def hf_generate(model, ctx: int, new_tokens: int, static: bool = False, compile_forward: bool = False) -> dict:
    """Tokens/s of greedy HF ``generate`` (second run; the first, compilation included, as ``first_run_s``).
    ``static``: a static cache; ``compile_forward``: ``model.forward`` compiled by hand (transformers' off)."""
    device = next(model.parameters()).device
    ids = torch.randint(min(model.config.vocab_size, 151936), (1, ctx), generator=torch.Generator().manual_seed(2))
    ids = ids.to(device)
    kwargs = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
    if static:
        kwargs["cache_implementation"] = "static"
    if compile_forward:
        kwargs["disable_compile"] = True
    original = model.forward
    try:
        if compile_forward:
            model.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)
        t0 = time.perf_counter()
        model.generate(ids, **kwargs)          # warm-up (and compilation)
        sync(device)
        first_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        model.generate(ids, **kwargs)
        sync(device)
        seconds = time.perf_counter() - t0
    finally:
        model.forward = original
    out = {"tokens_per_s": new_tokens / seconds, "ms_per_token": 1e3 * seconds / new_tokens, "first_run_s": first_s}
    if static and not compile_forward:
        out["compiled"] = device.type == "cuda"   # transformers compiles a static-cache generate on CUDA only
    return out


def engine_alone(model, name: str, alone: Callable[[object], dict], compile: bool) -> dict:
    """The engine's target-alone step on a fresh graph runner (``compile``: inductor before capture);
    ``alone(target_runner)`` times it (part (b)'s engine timing: a dict with ``step_ms``)."""
    t0 = time.perf_counter()
    ar = alone(runner(model, "graph", name, compile=compile))
    return {"tokens_per_s": 1e3 / ar["step_ms"], "ms_per_token": ar["step_ms"],
            "first_run_s": time.perf_counter() - t0}


def target_baselines(model, name: str, ctx: int, new_tokens: int, ar_step_ms: float, compile: bool,
                     alone: Callable[[object], dict], log: Callable[[str], None] = print) -> dict[str, dict]:
    """Every baseline row for one target ``model``; ``ar_step_ms``: the graph target-alone step part (b)
    measured already; ``alone``: how part (b) times the engine's target-alone steps on a runner.  ``compile``:
    also the compiled rows (minutes of compilation each on a GPU)."""
    rows = {ROW_GRAPH: {"tokens_per_s": 1e3 / ar_step_ms, "ms_per_token": ar_step_ms}}
    steps: list[tuple[str, Callable[[], dict]]] = [(ROW_EAGER, lambda: hf_generate(model, ctx, new_tokens))]
    if compile:
        steps += [(ROW_COMPILED, lambda: engine_alone(model, name, alone, True)),
                  (ROW_STATIC, lambda: hf_generate(model, ctx, new_tokens, static=True)),
                  (ROW_STATIC_COMPILE, lambda: hf_generate(model, ctx, new_tokens, static=True,
                                                           compile_forward=True))]
    for label, measure in steps:
        rows[label] = row(measure)
        b = rows[label]
        log(f"  baseline {label}: " + (f"{b['tokens_per_s']:.1f} tok/s" if "tokens_per_s" in b else b["error"]))
    return rows
