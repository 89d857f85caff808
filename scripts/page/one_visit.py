"""Every target-alone figure one visit to the page shows, read in Chromium as a class reads them.

    python scripts/page/one_visit.py --json out.json       # the page as `python app.py` serves it (~5 min, 2 cores)
    python scripts/page/one_visit.py --measures 5          # the Hardware tab's Measure pressed 5 times (default)

Serves the app from this environment (the embedded pair, the runtime the app chooses unless SEQUOIA_BACKEND names
one) in this process, opens it in headless Debian Chromium at 1280x720 and, in the order a teacher would: runs the
guided example and reads its summary (this run's decode rate and the target alone's, measured on its prompt); reads
*Run the fastest here* (the profile's predicted rate), presses it (it decodes too) and reads that run's decode rate; opens
Compare, presses *Run comparison* and reads the target alone's row (its end-to-end rate); opens the Hardware tab and
reads the target alone's rates there (the profile's prediction, the page's latest measurement) and the optimizer's
line (the target alone's predicted ms per token), then presses Measure ``--measures`` times and reads each
predicted-against-measured line.  Each figure carries its definition as the page states it (a decode rate after the
prompt's forward or an end-to-end one; drawn on the page as it ran or not; predicted): the script converts them to
tokens/s and prints each with its spread from the median of the figures of its own definition; the load average
before and after each Measure says what else ran.  Needs `apt-get install chromium`.
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
#: "0.36× the target alone (31.0 vs 85.7 tokens/s, both decode rates; ..." and the target alone's own run.
SUMMARY_VS = re.compile(r"the target alone \(([\d.]+) vs ([\d.]+) tokens/s, both decode rates; the latter measured")
SUMMARY_ALONE = re.compile(r"this run is the target alone: decode rate ([\d.]+)")
DECODE_RATE = re.compile(r"decode rate \*?\*?([\d.]+)\*?\*? tokens/s")
FASTEST = re.compile(r"~([\d.]+) tokens/s predicted")
CHOICE_ALONE = re.compile(r"target alone (?:at )?([\d.]+) ms/token")
RECONCILED = re.compile(r"measured \*?\*?([\d.]+) tokens/s")
COMPARE_ROW = "Target alone"
#: The definitions the page states (what each figure is): one spread per definition.
DECODE_DRAWN, DECODE_SERVER = "decode rate, drawn on the page as it ran", "decode rate, in the server (not drawn)"
END_TO_END, PREDICTED = "end to end, in the server (not drawn)", "predicted by the profile"
MEASURED = re.compile(r"([^;:]+?) ([\d.]+) ms/token(?: \(([\d.]+)–([\d.]+)\))?(?:, ([+-]\d+)% vs predicted)?")


def _settled(locator, quiet_s: float = 1.0, timeout_s: float = 30.0) -> str:
    text, since, deadline = locator.inner_text(), time.monotonic(), time.monotonic() + timeout_s
    while time.monotonic() - since < quiet_s and time.monotonic() < deadline:
        time.sleep(0.2)
        now = locator.inner_text()
        if now != text:
            text, since = now, time.monotonic()
    return text


def _finished(page, before: str = "", until: str = "finished:", timeout_s: float = 600.0) -> str:
    """The summary once a run other than the one ``before`` shows has ``until`` in it (the target alone's rate is
    measured on the prompt after the run: until "measured on this prompt" waits for it)."""
    summary = page.locator("#sq-summary")
    deadline = time.monotonic() + timeout_s
    while until not in (now := summary.inner_text()) or (before and now == before):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the run did not finish in {timeout_s:.0f} s: {summary.inner_text()[:200]}")
        time.sleep(0.5)
    return _settled(summary)


def _target_rate(summary: str) -> float | None:
    """The target alone's decode rate the summary divides by (or this run's, when it is the target alone)."""
    vs = SUMMARY_VS.search(summary)
    if vs:
        return float(vs[2])
    alone = SUMMARY_ALONE.search(summary)
    return float(alone[1]) if alone else None


def visit(url: str, measures: int, out: dict) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_context(viewport={"width": 1280, "height": 720}).new_page()
        page.set_default_timeout(180_000)   # on a busy 2-core machine the browser waits its turn for a core
        page.goto(url, wait_until="domcontentloaded")
        page.locator("#sq-prompt textarea").wait_for(timeout=120_000)
        figures = out["figures"]

        t0 = time.monotonic()
        page.locator("#sq-guided").click()
        summary = _finished(page, until="measured on this prompt")
        out["guided_s"] = time.monotonic() - t0
        rate = _target_rate(summary)
        figures.append({"where": "Live: the guided example's summary (the target alone, measured on its prompt)",
                        "tokens_per_s": rate, "kind": "measured", "text": summary[:400],
                        "definition": DECODE_DRAWN if "drawn on the page as it ran" in summary else DECODE_SERVER})
        fastest = _settled(page.locator("#sq-fastest"))
        m = FASTEST.search(fastest)
        figures.append({"where": "Live: Run the fastest here (the profile's prediction)",
                        "tokens_per_s": float(m[1]) if m else None, "kind": "predicted", "text": fastest,
                        "definition": PREDICTED, "alone": "target alone" in fastest.lower()})
        page.locator("#sq-fastest").click()   # sets the fields and decodes (live_teaching.wire)
        page.wait_for_function("!document.querySelector('#sq-summary').innerText.includes('finished:')")   # begun
        summary = _finished(page, before=summary)
        m = DECODE_RATE.search(summary) or SUMMARY_VS.search(summary)
        figures.append({"where": "Live: the run Run the fastest here set (its decode rate)",
                        "tokens_per_s": float(m[1]) if m else None, "kind": "measured", "text": summary[:400],
                        "definition": DECODE_DRAWN, "alone": "this run is the target alone" in summary})
        _compare(page, figures)

        page.get_by_role("tab", name="Hardware").click()
        page.get_by_role("button", name="Measure predicted vs real").wait_for()
        time.sleep(2.0)
        body = page.locator("body")
        text = _settled(body, quiet_s=1.0)
        m = CHOICE_ALONE.search(text)
        figures.append({"where": "Hardware: the optimizer's line (the profile's target alone)",
                        "tokens_per_s": 1000.0 / float(m[1]) if m else None, "kind": "predicted",
                        "text": m[0] if m else "", "definition": PREDICTED})
        line = next((ln for ln in text.splitlines() if "The target alone here" in ln), "")
        m = RECONCILED.search(line)
        figures.append({"where": "Hardware: the target alone here (the page's latest measurement)",
                        "tokens_per_s": float(m[1]) if m else None, "kind": "measured", "text": line[:400],
                        "definition": DECODE_DRAWN if "drawn on the page as it ran" in line else DECODE_SERVER})
        for i in range(measures):
            before = text
            load_before = os.getloadavg()[0]
            t1 = time.monotonic()
            page.get_by_role("button", name="Measure predicted vs real").click()
            deadline = time.monotonic() + 600
            while True:
                time.sleep(1.0)
                text = body.inner_text()
                line = next((ln for ln in text.splitlines() if "Measured here" in ln), "")
                if line and (line not in before) and "ms/token" in line:
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError("Measure gave no line in 600 s")
            line = next(ln for ln in _settled(body).splitlines() if "Measured here" in ln)
            rows = [{"label": r[1].strip(), "ms": float(r[2]), "lo": float(r[3]) if r[3] else None,
                     "hi": float(r[4]) if r[4] else None, "vs_predicted_pct": int(r[5]) if r[5] else None}
                    for r in MEASURED.finditer(line.split("):", 1)[-1])]
            out["measures"].append({"seconds": time.monotonic() - t1, "load_before": load_before,
                                    "load_after": os.getloadavg()[0], "rows": rows, "line": line})
            alone = next((r for r in rows if r["label"].lower().startswith(("target only", "target alone"))), None)
            if alone:
                figures.append({"where": f"Hardware: Measure, click {i + 1} (the target alone)",
                                "tokens_per_s": 1000.0 / alone["ms"], "kind": "measured",
                                "text": f"{alone['ms']} ms/token, {alone['vs_predicted_pct']}% vs predicted",
                                "definition": DECODE_SERVER})
        browser.close()


def _compare(page, figures: list) -> None:
    """Compare's *Run comparison* with the page's defaults: the target alone's row (its end-to-end rate, the
    median of the rounds) and the notes under the table."""
    page.get_by_role("tab", name="Compare").click()
    page.get_by_role("button", name="Run comparison").click()
    notes = page.locator("#sq-compare-notes")
    deadline = time.monotonic() + 900
    while "interleaved rounds" not in notes.inner_text():
        if time.monotonic() > deadline:
            raise TimeoutError("Compare gave no rounds' note in 900 s")
        time.sleep(1.0)
    rows = page.locator("#sq-compare-table").evaluate(   # each cell's text is a span.text in Gradio's table
        "root => [...root.querySelectorAll('.virtual-row')].map(r => [...r.querySelectorAll('span.text')]"
        ".map(s => s.textContent.trim()))")
    row = next((r for r in rows if COMPARE_ROW in r), [])
    cells = row[row.index(COMPARE_ROW):] if row else []   # method, tokens, latency, first token, tokens / s, ...
    rate = float(re.match(r"[\d.]+", cells[4])[0]) if len(cells) > 4 else None
    figures.append({"where": "Compare: Run comparison, the target alone's row (tokens / s)", "tokens_per_s": rate,
                    "kind": "measured", "text": " | ".join(cells)[:300] + " || " + _settled(notes)[:600],
                    "definition": END_TO_END})


def _spreads(figures: list) -> dict:
    """Each definition's median and every figure's distance from it."""
    out = {}
    for definition in sorted({f["definition"] for f in figures}):
        rates = [f["tokens_per_s"] for f in figures if f["definition"] == definition and f["tokens_per_s"]
                 and f.get("alone", True)]
        if not rates:
            continue
        mid = statistics.median(rates)
        out[definition] = {"median_tokens_per_s": mid, "n": len(rates),
                           "within_10pct": all(abs(r / mid - 1) <= 0.10 for r in rates)}
        for f in figures:
            if f["definition"] == definition and f["tokens_per_s"] and f.get("alone", True):
                f["vs_median_of_definition"] = f["tokens_per_s"] / mid - 1
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--measures", type=int, default=5)
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
    out = {"machine": platform.processor() or platform.machine(), "cpu": _cpu(), "cores": os.cpu_count(),
           "backend": ctx.pair().backend, "load_start": os.getloadavg()[0], "figures": [], "measures": []}
    try:
        visit(url, args.measures, out)
    except Exception as exc:   # a starved browser (a busy machine) ends the visit: the figures read so far stay
        out["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
    finally:
        demo.close()
    rates = [f["tokens_per_s"] for f in out["figures"] if f["tokens_per_s"]]
    mid = statistics.median(rates) if rates else float("nan")
    for f in out["figures"]:
        f["vs_median"] = f["tokens_per_s"] / mid - 1 if f["tokens_per_s"] else None
    out["median_tokens_per_s"] = mid
    out["within_10pct"] = all(abs(f["vs_median"]) <= 0.10 for f in out["figures"] if f["vs_median"] is not None)
    out["by_definition"] = _spreads(out["figures"])
    off = [m for m in out["measures"] for r in m["rows"] if r["vs_predicted_pct"] is not None
           and abs(r["vs_predicted_pct"]) > 10]
    out["measures_within_10pct"] = f"{len(out['measures']) - len({id(m) for m in off})} of {len(out['measures'])}"
    for f in out["figures"]:
        rate = f"{f['tokens_per_s']:.1f}" if f["tokens_per_s"] else "-"
        spread = f"{f['vs_median_of_definition']:+.0%}" if "vs_median_of_definition" in f else "(not the target)"
        print(f"{rate:>7} tokens/s {spread:>5}  {f['definition']:40}  {f['where']}")
    for definition, d in out["by_definition"].items():
        print(f"{definition}: median {d['median_tokens_per_s']:.1f} tokens/s over {d['n']}; within 10%: "
              f"{d['within_10pct']}")
    print(f"median {mid:.1f} tokens/s; every figure within 10%: {out['within_10pct']}; Measure within 10% of its "
          f"prediction: {out['measures_within_10pct']}; {out['backend']}, {out['cpu']}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


if __name__ == "__main__":
    sys.exit(main())
