"""What a class waits for, timed in-process as ``python app.py`` builds the app from the environment.

    SEQUOIA_CACHE=$(mktemp -d) python scripts/page/page_wait.py --json out.json    # a fresh cache: nothing converted
    python scripts/page/page_wait.py --only-start                                  # start -> models ready only

Times (wall clock, one process, the runtime the app chooses unless SEQUOIA_BACKEND names one): from the
script's start (imports included) to the models being ready; the guided example (the Live tab's handler with
:data:`components.live.live_tab.GUIDED`): its first step's frame and the whole run, twice (the second with warm
caches); Compare's default (the ticked rows, :data:`components.compare.compare_tab.DEFAULT_TOKENS` tokens) from start
to its last row.  Prints one JSON object; ``--json`` also writes it.  Load average before and after says how
quiet the machine was.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from dataclasses import replace
from pathlib import Path

T0 = time.perf_counter()
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

COMPARE_PROMPT = "Write a Python function that reverses a linked list."   # the Compare tab's default prompt


def _ready(ctx, timeout_s: float) -> float:
    """Seconds from the script's start until the pair is loaded (SystemExit on a load error or timeout)."""
    ctx.models.start_loading()
    while not ctx.status.ready:
        if ctx.status.error:
            raise SystemExit(f"loading failed: {ctx.status.error}")
        if time.perf_counter() - T0 > timeout_s:
            raise SystemExit(f"the models were not ready after {timeout_s:.0f} s")
        time.sleep(0.05)
    return time.perf_counter() - T0


def _guided(ctx, live_tab, inputs) -> dict:
    """The guided example through the Live tab's handler: the first frame after the first step, and the end."""
    t1, first, frames, last = time.perf_counter(), None, 0, None
    for frame in live_tab.decode_stream(ctx, inputs):
        frames += 1
        if first is None and frames >= 2:   # the first yield is the session, before any step
            first = time.perf_counter() - t1
        last = frame
    return {"first_step_frame_s": first, "total_s": time.perf_counter() - t1, "frames": frames,
            "summary": str(last[3]) if last is not None else ""}


def measure(only_start: bool = False, timeout_s: float = 900.0, compare_runs: int = 1, full: bool = False) -> dict:
    import app
    from components.compare import compare_tab
    from components.live import live_tab
    from components.app_state.acceptance_choice import default_acceptance_label
    from components.app_state.decode_inputs import DecodeInputs

    out = {"machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
           "load_before": os.getloadavg()}
    ctx = app.build_from_env(os.environ).sequoia_context
    out["start_to_ready_s"] = _ready(ctx, timeout_s)
    out["runtime"] = ctx.pair().backend
    if only_start:
        return out
    g = live_tab.GUIDED
    guided = DecodeInputs(prompt=g["prompt"], method=g["method"], budget=g["budget"], depth=g["depth"],
                          temperature=g["temperature"], top_p=1.0, max_new_tokens=g["max_new_tokens"],
                          seed=g["seed"], chat=True,
                          acceptance=default_acceptance_label("code", g["temperature"], ctx.assets_dir))
    out["guided"] = _guided(ctx, live_tab, guided)
    out["guided_again"] = _guided(ctx, live_tab, guided)
    compare = DecodeInputs(prompt=COMPARE_PROMPT, method="Sequoia (budget & depth)", budget=compare_tab.DEFAULT_BUDGET,
                           depth=compare_tab.DEFAULT_DEPTH,
                           temperature=0.0, top_p=1.0, max_new_tokens=compare_tab.DEFAULT_TOKENS, seed=0, chat=True,
                           acceptance=default_acceptance_label("code", 0.0, ctx.assets_dir))
    methods = compare_tab.ticked(ctx)
    out["compare_default"] = _compare(ctx, compare_tab, compare, methods)
    runs = [_compare(ctx, compare_tab, compare, methods) for _ in range(max(compare_runs - 1, 0))]
    if runs:
        out["compare_default_runs"] = _summary([out["compare_default"], *runs])
    if full:
        out["compare_full"] = _compare(ctx, compare_tab, replace(compare, max_new_tokens=compare_tab.FULL_TOKENS),
                                       compare_tab.ticked(ctx, full=True), rounds=compare_tab.FULL_ROUNDS)
    out["load_after"] = os.getloadavg()
    return out


def _compare(ctx, compare_tab, inputs, methods, **kw) -> dict:
    """One click of a Compare button through the tab's handler: its wall time and the rows as ``/compare`` gives
    them (each ratio with its band over the rounds, the verdict)."""
    from components.compare import compare_view
    from components.compare.compare_methods import API_KEYS

    seen, inner = [], compare_tab.iter_comparison

    def watched(*a, **k):   # the handler's own comparison, its last state kept for the rows
        for state in inner(*a, **k):
            seen[:] = [state]
            yield state

    compare_tab.iter_comparison = watched
    try:
        t1 = time.perf_counter()
        for _ in compare_tab.on_compare(ctx, inputs, methods, **kw):
            pass
        total = time.perf_counter() - t1
    finally:
        compare_tab.iter_comparison = inner
    rows = compare_view.records(seen[0].rows, API_KEYS) if seen else []
    return {"methods": methods, "tokens": inputs.max_new_tokens, "total_s": round(total, 2),
            "rows": [{k: r[k] for k in ("label", "tokens/s", "tokens/s min", "tokens/s max", "speedup",
                                        "speedup min", "speedup max", "verdict", "target calls")} for r in rows]}


def _summary(runs: list[dict]) -> dict:
    """Over repeated clicks: wall times, and per row its speedups, its bands (min, max) with their half-widths
    relative to the ratio, and the verdicts it got."""
    by_row: dict[str, dict] = {}
    for run in runs:
        for r in run["rows"]:
            row = by_row.setdefault(r["label"], {"speedups": [], "bands": [], "band_half_widths": [], "verdicts": []})
            sp, lo, hi = r["speedup"], r["speedup min"], r["speedup max"]
            row["speedups"].append(sp)
            row["bands"].append([lo, hi])
            if isinstance(sp, (int, float)) and isinstance(lo, (int, float)) and isinstance(hi, (int, float)) and sp:
                row["band_half_widths"].append(round((hi - lo) / 2 / sp, 3))
            row["verdicts"].append(r["verdict"])
    return {"runs": len(runs), "total_s": [r["total_s"] for r in runs], "rows": by_row}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only-start", action="store_true", help="time start -> models ready only")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds to wait for the models (default 900)")
    ap.add_argument("--compare-runs", type=int, default=1,
                    help="click Compare's default this many times (default 1); the rows' ratios and bands over them")
    ap.add_argument("--full", action="store_true", help="also click Full comparison once (every method, 64 tokens)")
    ap.add_argument("--json", type=Path, help="also write the result here")
    args = ap.parse_args(argv)
    result = measure(args.only_start, args.timeout, args.compare_runs, args.full)
    text = json.dumps(result, indent=1, default=str)
    print(text, flush=True)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
