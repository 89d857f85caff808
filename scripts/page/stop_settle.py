"""How soon a click's first frame shows and a Stop settles the page, timed in headless Chromium with their spread.

    python scripts/page/stop_settle.py --json out.json      # the page as `python app.py` serves it (~3 min, 2 cores)
    python scripts/page/stop_settle.py --tries 20           # 20 tries of each (default 5)

The page promises a first frame at once after a click and a Stop that settles within about 2 s, whatever the step
in flight; the tests bound these only against a hang (10x the medians this prints), so they are measured here.
Serves the app from this environment in this process (the embedded pair, the runtime the app chooses unless
SEQUOIA_BACKEND names one), opens it at 1280x720 and, per try, interleaved (A B C D, A B C D, ...):

* ``live_forward``: Decode clicked (``first_frame_s``: until the prompt is drawn, before any step), then Stop at
  once, inside the prompt's forward;
* ``live_decode``: Stop after the run's first step is drawn;
* ``compare``: Stop in a comparison's warm-up round;
* ``check``: Stop while the distribution check runs.

For each Stop: ``said_s``, from the click until the output says "Stopped", ``settle_s``, until it does and none
of the tab's outputs shows Gradio's progress, and ``free_s``, until the models are free and the page quiet (the
step in flight ended: a new Run starts at once).  Prints the median, min and max of each, with the load average
before and after (a busy machine stretches them all).  Needs `apt-get install chromium`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

CHROMIUM = "/usr/bin/chromium"
KINDS = ("live_forward", "live_decode", "compare", "check")
#: About 120 tokens of code: its forward takes a second or more on a 2-core CPU, so Stop lands inside it.
PROMPT = "Explain, line by line, what this Python code does:\n" + "\n".join(
    f"def step_{i}(values, factor={i}):\n    return [v * factor + {i} for v in values if v % {i + 2}]"
    for i in range(3))
_BUSY = """sel => [...document.querySelectorAll(sel)].some(e => e.matches('.pending, .generating')
    || e.querySelector('.pending, .generating, .eta-bar, .progress-text') !== null)"""
_ANY_BUSY = "() => document.querySelectorAll('.pending, .generating').length > 0"


def _until(condition, timeout_s: float, what: str) -> float:
    """Seconds until ``condition()`` holds (polled every 20 ms); SystemExit naming ``what`` past ``timeout_s``."""
    t0 = time.monotonic()
    while not condition():
        if time.monotonic() - t0 > timeout_s:
            raise SystemExit(f"{what}: not after {timeout_s:.0f} s")
        time.sleep(0.02)
    return time.monotonic() - t0


#: The outputs a Stop must leave settled, per tab (the first says Stopped).
OUTPUTS = {"live": "#sq-summary, #sq-text, #sq-tree, #sq-stats, #sq-inspect-text, #sq-inspect-plot",
           "compare": "#sq-compare-notes, #sq-compare-table, #sq-compare-bars",
           "check": "#sq-check-verdicts"}


def _stopped(page, said: str, outputs: str):
    """``said`` says Stopped and none of ``outputs`` shows Gradio's progress."""
    return lambda: "Stopped" in page.locator(said).inner_text() and not page.evaluate(_BUSY, outputs)


def _event_over(page, timeout_s: float = 600.0) -> None:
    """No output of the page shows progress for 0.3 s (an event's chained events start within milliseconds)."""
    since = None
    deadline = time.monotonic() + timeout_s
    while since is None or time.monotonic() - since < 0.3:
        since = None if page.evaluate(_ANY_BUSY) else (since or time.monotonic())
        if time.monotonic() > deadline:
            raise SystemExit(f"the page was still busy after {timeout_s:.0f} s")
        time.sleep(0.02)


def _stop(page, stop, tab: str, lease) -> dict:
    """Stop (a locator) clicked; the seconds until the tab's outputs settle, and until the models' ``lease`` is
    free and the page quiet (the stopped step ended: a Run clicked before then waits for it)."""
    said = OUTPUTS[tab].split(",")[0]
    clicked = time.monotonic()
    stop.click()
    shown = _until(lambda: "Stopped" in page.locator(said).inner_text(), 60, "Stop's words")
    settle = _until(_stopped(page, said, OUTPUTS[tab]), 60, "Stop settling") + shown
    words = next(line for line in page.locator(said).inner_text().splitlines() if "Stopped" in line).strip()[:80]
    _until(lambda: not lease.owned, 600, "the stopped run's step")
    _event_over(page)
    return {"said_s": shown, "settle_s": settle, "free_s": time.monotonic() - clicked, "said": words}


def _live(page, lease, attempt: int, kind: str, max_new: int) -> dict:
    page.get_by_role("tab", name="Live decoding", exact=True).click()
    prompt = f"# try {attempt} ({kind})\n{PROMPT}"          # new text: no cached prefix
    page.locator("#sq-prompt textarea").fill(prompt)
    box = page.locator(".sq-max-new input").first
    box.fill(str(max_new))
    box.press("Enter")
    _event_over(page)                                        # the fields' own events first, as a visitor's click
    clicked = time.monotonic()
    page.get_by_role("button", name="Decode", exact=True).click()
    text = page.locator("#sq-text")
    first = _until(lambda: f"# try {attempt} ({kind})" in text.inner_text(), 60, "the first frame")
    if kind == "live_decode":
        summary = page.locator("#sq-summary")
        _until(lambda: re.search(r"\d+ tokens? in", summary.inner_text()), 600, "the first step")
    out = _stop(page, page.get_by_role("button", name="Stop", exact=True).filter(visible=True).first, "live", lease)
    return {**out, "first_frame_s": first} if kind == "live_forward" else out


def _tab(page, lease, tab: str, run: str, phase: str, stop: str, kind: str) -> dict:
    page.get_by_role("tab", name=tab, exact=True).click()
    page.get_by_role("button", name=run, exact=True).click()
    said = OUTPUTS[kind].split(",")[0]
    _until(lambda: re.search(phase, page.locator(said).inner_text()), 600, f"{tab} running")
    return _stop(page, page.locator(stop), kind, lease)


def visit(url: str, lease, tries: int, max_new: int) -> dict:
    """``lease``: the models' (``owned`` while a run holds them)."""
    from playwright.sync_api import sync_playwright

    out = {kind: [] for kind in KINDS}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1280, "height": 720})
        page.goto(url, wait_until="domcontentloaded")
        page.locator("#sq-prompt textarea").wait_for(timeout=60_000)
        for attempt in range(tries):
            for kind in KINDS:
                if kind.startswith("live"):
                    row = _live(page, lease, attempt, kind, max_new)
                elif kind == "compare":
                    row = _tab(page, lease, "Compare", "Run comparison", "Warm-up round|Round 1 of",
                               "#sq-compare-stop", "compare")
                else:
                    row = _tab(page, lease, "Distribution check", "Run the check", "Forwarding|Running",
                               "#sq-check-stop", "check")
                out[kind].append(row)
                print(f"try {attempt} {kind}: " + ", ".join(f"{k} {v:.2f} s" for k, v in row.items()
                                                             if k.endswith("_s")) + f"  {row['said'][:50]!r}",
                      flush=True)
        browser.close()
    return out


def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tries", type=int, default=5)
    ap.add_argument("--max-new-tokens", type=int, default=64, help="the Live runs' length (Stop comes first)")
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)
    if not os.path.exists(CHROMIUM):
        raise SystemExit("no /usr/bin/chromium: apt-get install chromium")
    import app
    from components.app_state.lanes import WorkLanes
    from components.loopback import serve_loaded

    demo = app.build_from_env(dict(os.environ), lanes=WorkLanes())
    ctx = demo.sequoia_context
    url = serve_loaded(demo, css_paths=[app.CSS_PATH])
    try:
        load_before = os.getloadavg()[0]
        rows = visit(url, ctx.pair().lock, args.tries, args.max_new_tokens)
    finally:
        demo.close()
    result = {"machine": platform.processor() or platform.machine(), "cores": os.cpu_count(),
              "backend": ctx.pair().backend, "load_before": load_before, "load_after": os.getloadavg()[0],
              "tries": rows}
    for kind, runs in rows.items():
        for key in ("first_frame_s", "said_s", "settle_s", "free_s"):
            values = [r[key] for r in runs if key in r]
            if values:
                result[f"{kind}.{key}"] = s = spread(values)
                print(f"{kind:>12} {key:>13}: median {s['median']:.2f} s ({s['min']:.2f}-{s['max']:.2f}, n={s['n']})")
    print(f"{result['backend']}, {result['cores']} cores, load {load_before:.1f} -> {result['load_after']:.1f}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
