"""The Live tab's teaching pieces in a real browser (tests/app/test_browser.py's server and Chromium, tiny pair):
the projector view's font sizes at 1280x720, and step mode's buttons."""

import time

import pytest
from test_browser import CHROMIUM, _decode, _screenshot, browser_context, page, server  # noqa: F401 (fixtures)

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="no /usr/bin/chromium (apt-get install chromium)"),
]
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")

#: The key texts a class reads from the back of a room: where to start, the text, its summary, the inspector's
#: and step mode's words, the buttons that drive the lesson.
KEY_TEXTS = ("#sq-start", "#sq-text", "#sq-summary", "#sq-inspect-text", "#sq-step-text", "#sq-guided",
             "#sq-step-btn", "#sq-next-call", "#sq-next-rejection")
#: The smallest computed font size (px) of the elements holding text under each selector (None: no such text).
SMALLEST_FONT = """(selectors) => Object.fromEntries(selectors.map((sel) => {
  const root = document.querySelector(sel);
  if (!root) return [sel, null];
  const holders = [root, ...root.querySelectorAll('*')].filter((el) => el.getClientRects().length &&
      [...el.childNodes].some((n) => n.nodeType === Node.TEXT_NODE && n.textContent.trim()));
  return [sel, holders.length ? Math.min(...holders.map((el) => parseFloat(getComputedStyle(el).fontSize))) : null];
}))"""
#: [px, text] of every visible text outside the figures on the Live tab, the banner and the tabs' names, under 20 px.
SMALL_PAGE_TEXTS = """() => [...document.querySelectorAll('#sq-live *, .sq-status, .sq-status *, [role=tab]')]
  .filter((el) => !el.closest('svg') && el.getClientRects().length &&
    [...el.childNodes].some((n) => n.nodeType === Node.TEXT_NODE && n.textContent.trim()))
  .map((el) => [parseFloat(getComputedStyle(el).fontSize), el.textContent.trim().slice(0, 40)])
  .filter(([px]) => px < 20)"""
TREE_LABELS = """() => [...document.querySelectorAll('#sq-tree .textpoint text')]
  .map((t) => parseFloat(getComputedStyle(t).fontSize))"""
#: (text, px) of every visible text of the Live tab's figures a class reads, legends aside (studio.css sizes these):
#: each text, and each piece Plotly sized apart (a <sup> line: the statistics' "mean 4.00 (dotted)" was one, 14 px).
FIGURE_TEXTS = """() => [...document.querySelectorAll(
    ':is(#sq-tree, #sq-step-plot, #sq-inspect-plot, #sq-stats) svg :is(text, tspan[style*="font-size"])')]
  .filter((t) => !t.closest('.legend') && t.textContent.trim() && t.getClientRects().length)
  .map((t) => [t.textContent.trim().slice(0, 30), parseFloat(getComputedStyle(t).fontSize)])"""
#: The tree's token labels that a node marker covers: [label, how many px of it the marker covers], each label
#: against every marker drawn (its own node's sits just above it).  A text's box starts above its glyphs (the
#: font's ascent: ~3 px at 20 px over a digit's top), and a diamond's box is square: up to 3 px is no glyph under
#: a marker.  Before Plotly laid the labels out at 20 px, markers covered 6-8 px of them.
MARKERS_OVER_LABELS = """() => {
  const marks = [...document.querySelectorAll('#sq-tree .scatterlayer .points path')]
    .map((p) => p.getBoundingClientRect()).filter((b) => b.width > 0);
  return [...document.querySelectorAll('#sq-tree .textpoint text')].filter((t) => t.textContent.trim())
    .flatMap((t) => { const a = t.getBoundingClientRect();
      return marks.map((b) => [Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top),
                               Math.min(a.right, b.right) - Math.max(a.left, b.left)])
        .filter(([high, wide]) => high > 3 && wide > 1).map(([high]) => [t.textContent.trim(), Math.round(high)]); });
}"""
#: The legends of those figures (Plotly relays them out: live_teaching.PROJECTOR_JS): each legend item's text and
#: px, and whether any two items of one legend overlap on the screen.
LEGENDS = """() => {
  const legends = [...document.querySelectorAll(':is(#sq-tree, #sq-step-plot, #sq-inspect-plot, #sq-stats) .legend')];
  const texts = legends.flatMap((l) => [...l.querySelectorAll('text')].filter((t) => t.textContent.trim())
    .map((t) => [t.textContent.trim().slice(0, 30), parseFloat(getComputedStyle(t).fontSize)]));
  const overlaps = legends.flatMap((l) => {
    const boxes = [...l.querySelectorAll('.traces text')].map((t) => t.getBoundingClientRect());
    return boxes.flatMap((a, i) => boxes.slice(i + 1).filter((b) => a.left < b.right - 1 && b.left < a.right - 1
      && a.top < b.bottom - 1 && b.top < a.bottom - 1).map(() => i));
  });
  return {texts, overlaps: overlaps.length};
}"""


def _decoded(page, tokens: int = 12) -> None:
    _decode(page, "def add(a, b):", tokens)   # the page's default method: a fixed tree, drawn on every machine
    sync_api.expect(page.locator("#sq-summary")).to_contain_text("finished: length", timeout=60_000)
    last = int(page.locator("#sq-step-slider input[type=number]").input_value())
    page.locator("#sq-step-btn").click()   # a replay starts at the call the slider shows: a run leaves it at its last
    sync_api.expect(page.locator("#sq-step-text")).to_contain_text(f"Target call {last} · phase 1 of")
    _slide_to(page, 1)                     # moved by hand: the replay starts over there
    page.locator("#sq-step-btn").click()
    sync_api.expect(page.locator("#sq-step-text")).to_contain_text("Target call 1 · phase 1 of")


def _slide_to(page, step: int) -> None:
    box = page.locator("#sq-step-slider input[type=number]")
    box.fill(str(step))
    box.press("Enter")
    page.wait_for_timeout(500)   # the slider's own event (the tree and text of that step) answers first


def test_the_projector_view_sets_key_texts_to_20_px_at_1280x720(page, tmp_path):
    page.set_viewport_size({"width": 1280, "height": 720})
    _decoded(page)
    before = page.evaluate(SMALLEST_FONT, list(KEY_TEXTS))
    assert min(v for v in before.values() if v) < 20, before      # the page's own sizes: the box must matter
    page.get_by_label("Projector view").check()
    page.wait_for_function("document.body.classList.contains('sq-projector')")
    # buttons ease their font size up (a CSS transition): poll until every key text is there rather than read a
    # size mid-way (issue 51: this read once failed in the full run, a race)
    deadline, after = time.monotonic() + 5.0, page.evaluate(SMALLEST_FONT, list(KEY_TEXTS))
    while not all(v is not None and v >= 20 for v in after.values()) and time.monotonic() < deadline:
        page.wait_for_timeout(100)
        after = page.evaluate(SMALLEST_FONT, list(KEY_TEXTS))
    assert all(v is not None and v >= 20 for v in after.values()), after
    # and every other text a class sees there: control labels, accordion titles, buttons, the banner, the tabs
    # (buttons ease their size up: waited for, 10 s being far past the transition's fraction of a second)
    try:
        page.wait_for_function(f"({SMALL_PAGE_TEXTS})().length === 0", timeout=10_000)
    except sync_api.TimeoutError:
        pytest.fail(f"texts under 20 px in the projector view: {page.evaluate(SMALL_PAGE_TEXTS)}")
    # the tree redraws as the page settles after the run: wait for its labels rather than read a blank frame
    page.wait_for_function(f"({TREE_LABELS})().length > 0")
    labels = page.evaluate(TREE_LABELS)
    assert labels and min(labels) >= 20, labels                    # the tree's token labels
    # below their nodes, none under a marker (Plotly places them for the size it draws: PROJECTOR_JS relays it)
    try:
        page.wait_for_function(f"({MARKERS_OVER_LABELS})().length === 0", timeout=10_000)
    except sync_api.TimeoutError:
        pytest.fail(f"tree labels under a node marker: {page.evaluate(MARKERS_OVER_LABELS)}")
    figures = page.evaluate(FIGURE_TEXTS)                          # titles, axes and annotations of every figure
    assert figures and min(size for _, size in figures) >= 20, [f for f in figures if f[1] < 20]
    legends = _legends(page, lambda px: px >= 20)                  # Plotly's relayout: polled, it is async
    assert legends["texts"] and not legends["overlaps"], legends
    page.locator("#sq-next-call").click()                          # a redrawn figure keeps its large legend
    sync_api.expect(page.locator("#sq-step-text")).to_contain_text("Target call 2")
    legends = _legends(page, lambda px: px >= 20)
    assert legends["texts"] and not legends["overlaps"], legends
    _screenshot(page, tmp_path, "projector-1280x720")
    page.get_by_label("Projector view").uncheck()
    page.wait_for_function("!document.body.classList.contains('sq-projector')")
    # buttons ease their font size back (a CSS transition): poll until they are back rather than read mid-way
    deadline, now = time.monotonic() + 5.0, page.evaluate(SMALLEST_FONT, list(KEY_TEXTS))
    while now != before and time.monotonic() < deadline:
        page.wait_for_timeout(100)
        now = page.evaluate(SMALLEST_FONT, list(KEY_TEXTS))
    assert now == before, (now, before)
    assert _legends(page, lambda px: px < 20)["texts"]             # legends back at Plotly's own size


def _legends(page, wanted, seconds: float = 5.0) -> dict:
    """LEGENDS once every legend text's px satisfies ``wanted`` (or after ``seconds``)."""
    deadline, found = time.monotonic() + seconds, page.evaluate(LEGENDS)
    while not (found["texts"] and all(wanted(px) for _, px in found["texts"])) and time.monotonic() < deadline:
        page.wait_for_timeout(100)
        found = page.evaluate(LEGENDS)
    assert all(wanted(px) for _, px in found["texts"]), found
    return found


def test_step_mode_walks_one_call_then_moves_the_slider_to_the_next(page):
    _decoded(page)
    words = page.locator("#sq-step-text")
    page.locator("#sq-step-btn").click()
    sync_api.expect(words).to_contain_text("Target call 1 · phase 2 of")
    assert page.locator("#sq-step-plot .js-plotly-plot").count() == 1
    page.locator("#sq-next-call").click()
    sync_api.expect(words).to_contain_text("Target call 2 · phase 1 of")
    sync_api.expect(page.locator("#sq-tree .gtitle")).to_contain_text("step 2")   # the tree follows the replay
