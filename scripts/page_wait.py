"""What a class waits for, timed in-process as ``python app.py`` builds the app from the environment.

    SEQUOIA_CACHE=$(mktemp -d) python scripts/page_wait.py --json out.json    # a fresh cache: nothing converted
    python scripts/page_wait.py --only-start                                  # start -> models ready only

Times (wall clock, one process, the runtime the app chooses unless SEQUOIA_BACKEND names one): from the
script's start (imports included) to the models being ready; the guided example (the Live tab's handler with
:data:`components.live_tab.GUIDED`): its first step's frame and the whole run, twice (the second with warm
caches); Compare's default (the ticked rows, :data:`components.compare_tab.DEFAULT_TOKENS` tokens) from start
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
from pathlib import Path

T0 = time.perf_counter()
ROOT = Path(__file__).resolve().parents[1]
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


def measure(only_start: bool = False, timeout_s: float = 900.0) -> dict:
    import app
    from components import compare_tab, live_tab
    from components.acceptance_choice import default_acceptance_label
    from components.decode_inputs import DecodeInputs

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
    compare = DecodeInputs(prompt=COMPARE_PROMPT, method="Sequoia (budget & depth)", budget=32, depth=8,
                           temperature=0.0, top_p=1.0, max_new_tokens=compare_tab.DEFAULT_TOKENS, seed=0, chat=True,
                           acceptance=default_acceptance_label("code", 0.0, ctx.assets_dir))
    methods = compare_tab.ticked(ctx)
    t1, last = time.perf_counter(), None
    for frame in compare_tab.on_compare(ctx, compare, methods):
        last = frame
    out["compare_default"] = {"methods": methods, "total_s": time.perf_counter() - t1,
                              "table": getattr(last[1], "value", last[1]) if last is not None else None}
    out["load_after"] = os.getloadavg()
    return out


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only-start", action="store_true", help="time start -> models ready only")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds to wait for the models (default 900)")
    ap.add_argument("--json", type=Path, help="also write the result here")
    args = ap.parse_args(argv)
    result = measure(args.only_start, args.timeout)
    text = json.dumps(result, indent=1, default=str)
    print(text, flush=True)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
