"""Run clicked right after Stop, while the stopped run's step is still in flight (issue 59): the new run starts
once that step ends, in Live, Compare and the Distribution check; headless Debian Chromium on the tiny pair.

The page's Run is two events: a light one that leaves a fresh session, then the run itself.  Gradio skips a
click's event while that same event is still pending on the page (its ``trigger_mode="once"``), so the run of a
click after Stop was dropped while the stopped run finished its step: the page kept saying "Stopped" and nothing
ran.  The run's event now defers such a click to the pending run's end (``"always_last"``).
"""

import threading

import pytest

from components.compare import compare_tab
from components.distribution import distribution_tab
from components.live import live_tab
from test_browser import _click_decode, _wait_for, browser_context, server, sync_api

pytestmark = [pytest.mark.browser, pytest.mark.skipif(not __import__("os").path.exists("/usr/bin/chromium"),
                                                      reason="no /usr/bin/chromium")]
__all__ = ["browser_context", "server"]   # test_browser's fixtures: the tiny pair's page and one Chromium


@pytest.fixture()
def page(server, browser_context):
    page = browser_context.new_page()
    page.goto(server, wait_until="domcontentloaded")
    page.locator("#sq-prompt textarea").wait_for()
    yield page
    page.close()


def _first_run_held(monkeypatch, module, name: str) -> threading.Event:
    """``module.name`` (a generator of states) as it is, except the first call's second state waits for the event
    returned (at most 60 s): the step in flight when Stop comes.  ``holding`` on it says the run is there."""
    real, calls, release = getattr(module, name), [], threading.Event()
    release.holding = threading.Event()

    def held(*args, **kwargs):
        first = not calls
        calls.append(1)
        for i, state in enumerate(real(*args, **kwargs)):
            if first and i == 1:
                release.holding.set()
                release.wait(60)
            yield state

    monkeypatch.setattr(module, name, held)
    release.calls = calls
    return release


def _stop_then_run(page, release, run, stop, said) -> None:
    """Run, Stop while the run's step is in flight, Run again at once, then let the stopped step end."""
    try:
        run.click()
        _wait_for(release.holding.is_set, 60)
        stop.click()
        sync_api.expect(said).to_contain_text("Stopped")
        completed = page.evaluate("window.sqEvents.completed")
        run.click()                               # the stopped run's event is still pending on the page
        # The click's first (light) event answers while the stopped run is held; the page then chains the run's
        # event to it (a timer of its own, run before a later one): held until then, so the page meets it pending.
        page.wait_for_function("n => window.sqEvents.completed > n", arg=completed)
        page.evaluate("() => new Promise(done => setTimeout(done, 100))")
    finally:
        release.set()


def test_compare_runs_a_click_made_right_after_stop(page, monkeypatch):
    release = _first_run_held(monkeypatch, compare_tab, "iter_comparison")
    page.get_by_role("tab", name="Compare", exact=True).click()
    notes = page.locator("#sq-compare-notes")
    _stop_then_run(page, release, page.get_by_role("button", name="Run comparison", exact=True),
                   page.locator("#sq-compare-stop"), notes)
    sync_api.expect(notes).to_contain_text("interleaved rounds", timeout=120_000)   # the second run, to its end
    assert len(release.calls) == 2 and "Stopped" not in notes.text_content()


def test_the_distribution_check_runs_a_click_made_right_after_stop(page, monkeypatch):
    release = _first_run_held(monkeypatch, distribution_tab, "iter_check")
    page.get_by_role("tab", name="Distribution check", exact=True).click()
    verdicts = page.locator("#sq-check-verdicts")
    _stop_then_run(page, release, page.get_by_role("button", name="Run the check", exact=True),
                   page.locator("#sq-check-stop"), verdicts)
    sync_api.expect(verdicts).to_contain_text("Finished in", timeout=120_000)   # the second check, to its end
    assert len(release.calls) == 2 and "Stopped" not in verdicts.text_content()


def test_live_decodes_a_click_made_right_after_stop(page, monkeypatch):
    release = _first_run_held(monkeypatch, live_tab, "run_decode")
    page.locator("#sq-prompt textarea").fill("def again():")
    box = page.get_by_label(__import__("re").compile(r"^max new tokens"))
    box.fill("6")
    box.press("Enter")
    _click_decode(page)   # the fields' own events answered first, as test_browser's visitor
    summary = page.locator("#sq-summary")
    decode = page.get_by_role("button", name="Decode", exact=True)
    try:
        _wait_for(release.holding.is_set, 60)
        page.get_by_role("button", name="Stop", exact=True).click()
        sync_api.expect(summary).to_contain_text("Stopped")
        completed = page.evaluate("window.sqEvents.completed")
        decode.click()                            # the stopped run's event is still pending on the page
        page.wait_for_function("n => window.sqEvents.completed > n", arg=completed)
        page.evaluate("() => new Promise(done => setTimeout(done, 100))")
    finally:
        release.set()
    sync_api.expect(summary).to_contain_text("6 tokens", timeout=120_000)   # the second run, to its end
    assert len(release.calls) == 2 and "Stopped" not in summary.text_content()
