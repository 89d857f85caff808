"""Press every model button of the served app once, in-process, and print the resident memory after each.

    flock /tmp/sequoia-heavy.lock /usr/bin/time -v .venv/bin/python scripts/page/memory_tour.py
    SEQUOIA_MEMORY_GB=14 .venv/bin/python scripts/page/memory_tour.py --tokens 16 --json out.json

The app is built as ``python app.py`` builds it (the same environment variables: SEQUOIA_BACKEND,
SEQUOIA_MEMORY_GB, ...) and served on 127.0.0.1; then the tour calls the handlers behind the buttons, in
this order: Live (the default method), the guided example, Live in exact mode, Compare in exact mode, Compare
with the llama.cpp reference row, Full comparison (every method, 64 tokens, its rounds), the distribution
check, the Hardware tab's Measure, the DP tab at its largest budget and depth (in its own process), Live again.
After each it reads this process's resident memory (VmRSS) and its peak so far (VmHWM), the proportional
memory (PSS) of the whole process tree (the app and its DP process: what a Space's container counts, shared
pages once) with its peak sampled every 0.1 s, and checks that the server still answers an HTTP request.  A step that the memory budget refuses prints its message and the tour goes on:
a refusal is an answer, a killed server is not.  Runs are short (``--tokens``): the weights, not the
decode, decide the memory.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import gradio as gr  # noqa: E402

import app  # noqa: E402
from components.app_state.acceptance_choice import DEFAULT_ACCEPTANCE_LABEL, acceptance_catalogue
from components.app_state.context import AppContext  # noqa: E402
from components.app_state.decode_inputs import DecodeInputs  # noqa: E402
from components.compare import compare_tab  # noqa: E402
from components.compare.compare_methods import FULL_TOKENS  # noqa: E402
from components.distribution import distribution_tab
from components.dp_explorer import dp_tab
from components.hardware import hardware_tab
from components.live import live_tab
from components.loopback import serve_here  # noqa: E402
from sequoia.core.config import MAX_DEPTH  # noqa: E402
from sequoia.core.trees.tree import MAX_TREE_SIZE  # noqa: E402
from sequoia.runtime.memory import GB, parse_kib_field  # noqa: E402

PROMPT = "Write a Python function that checks whether a number is prime."


def status_gb(field: str) -> float:
    return (parse_kib_field(Path("/proc/self/status").read_text(), field) or 0) / GB


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants (from /proc/<pid>/task/*/children)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        for task in Path(f"/proc/{p}/task").glob("*/children"):
            try:
                todo += [int(c) for c in task.read_text().split()]
            except OSError:   # gone meanwhile
                pass
    return out


def tree_pss_gb() -> float:
    """PSS of this process and its descendants (shared pages split between them, so a forked child's
    copy-on-write pages count once)."""
    total = 0
    for p in _tree(os.getpid()):
        try:
            total += parse_kib_field(Path(f"/proc/{p}/smaps_rollup").read_text(), "Pss") or 0
        except OSError:
            pass
    return total / GB


class TreePeak:
    """The largest :func:`tree_pss_gb` seen, sampled every ``every_s`` on a daemon thread."""

    def __init__(self, every_s: float = 0.1) -> None:
        self.peak, self._every = tree_pss_gb(), every_s
        threading.Thread(target=self._run, name="memory-tour-sampler", daemon=True).start()

    def _run(self) -> None:
        while True:
            self.peak = max(self.peak, tree_pss_gb())
            time.sleep(self._every)


PEAK: TreePeak | None = None


def serving(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/config", timeout=30) as resp:
            return resp.status == 200
    except OSError:
        return False


def drain(gen) -> None:
    for _ in gen:
        pass


def steps(ctx: AppContext, tokens: int) -> list[tuple[str, Callable[[], object]]]:
    """(name, press) for every model button, in the tour's order."""
    label = DEFAULT_ACCEPTANCE_LABEL
    live = DecodeInputs(PROMPT, live_tab.DEFAULT_METHOD, live_tab.DEFAULT_BUDGET, live_tab.DEFAULT_DEPTH, 0.0, 1.0,
                        tokens, 0, True, label)
    compare = DecodeInputs(PROMPT, "", 32, 8, 0.0, 1.0, tokens, 0, True, label)
    methods = compare_tab.ticked(ctx, full=True)   # every method of the full run, the reference where offered
    g = live_tab.GUIDED
    guided = DecodeInputs(g["prompt"], g["method"], g["budget"], g["depth"], g["temperature"], 1.0,
                          g["max_new_tokens"], g["seed"], True, label)
    full = DecodeInputs(PROMPT, "", 32, 8, 0.0, 1.0, FULL_TOKENS, 0, True, label)
    vector = ", ".join(f"{a:g}" for a in acceptance_catalogue(ctx.assets_dir)[label])
    return [
        ("live", lambda: drain(live_tab.decode_stream(ctx, live))),
        ("guided example", lambda: drain(live_tab.decode_stream(ctx, guided))),
        ("live exact", lambda: drain(live_tab.decode_stream(ctx.exact_context(), live))),
        ("compare exact", lambda: drain(compare_tab.on_compare(ctx, compare, methods, exact=True))),
        ("compare + reference", lambda: drain(compare_tab.on_compare(ctx, compare, methods))),
        ("full comparison", lambda: drain(compare_tab.on_compare(ctx, full, methods, rounds=compare_tab.FULL_ROUNDS))),
        ("distribution check", lambda: drain(distribution_tab.on_check(
            ctx.models, "Write a haiku about autumn leaves.", 1.0, 0.95, 200, 4, 0, True))),
        ("measure", lambda: hardware_tab.measure(ctx, 32, 8, acceptance_catalogue(ctx.assets_dir)[label])),
        ("dp largest", lambda: dp_tab.on_solve(ctx.lanes, vector, MAX_TREE_SIZE, MAX_DEPTH, 32, 8, None)),
        ("live again", lambda: drain(live_tab.decode_stream(ctx, live))),
    ]


def press(name: str, fn: Callable[[], object], url: str) -> dict:
    start = time.monotonic()
    try:
        fn()
        outcome = "ok"
    except (gr.Error, ValueError) as exc:   # a refusal (the memory budget's included) is shown, not fatal
        outcome = f"refused: {getattr(exc, 'message', None) or exc}"
    row = {"step": name, "outcome": outcome, "seconds": round(time.monotonic() - start, 1),
           "rss_gb": round(status_gb("VmRSS"), 2), "peak_gb": round(status_gb("VmHWM"), 2),
           "tree_pss_gb": round(tree_pss_gb(), 2), "tree_peak_gb": round(PEAK.peak, 2) if PEAK else None,
           "serving": serving(url)}
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=16, help="new tokens per decode (default 16)")
    ap.add_argument("--json", type=Path, help="write the rows here too")
    ap.add_argument("--only", nargs="*", help="run only the steps whose names start with these (e.g. compare)")
    args = ap.parse_args()
    memory = app.memory_from_env()
    demo = app.build_demo(app.load_from_env, device=app.env_device(), exact_loader=app.exact_loader_from_env(),
                          reference_loader=app.reference_loader_from_env(), memory=memory)
    ctx = demo.sequoia_context
    global PEAK
    PEAK = TreePeak()
    url = serve_here(demo).rstrip("/")
    rows = [press("start (pair loaded)", ctx.pair, url)]
    rows += [press(name, fn, url) for name, fn in steps(ctx, args.tokens)
             if not args.only or any(name.startswith(o) for o in args.only)]
    print(ctx.extras.memory_note(), flush=True)
    machine = {"cap_gb": memory.budget.cap / GB if memory.budget.cap else None,
               "backend": app.backend_from_env(), "cpu_count": os.cpu_count(),
               "tree_peak_gb": round(PEAK.peak, 2), "peak_gb": round(status_gb("VmHWM"), 2)}
    print(json.dumps(machine), flush=True)
    if args.json:
        args.json.write_text(json.dumps({"machine": machine, "rows": rows}, indent=1) + "\n")
    demo.close()


if __name__ == "__main__":
    main()
