"""The page as ZeroGPU serves it (issue 50), under :class:`components.app_state.serving.ZeroGPUStandIn`: every
model call in a process forked for it (its inputs and outputs pickled, killed at its duration), the models
refusing work outside a call (no CUDA there on ZeroGPU).  A decode, a comparison and the distribution check
must be served, twice each (nothing a call leaves behind may be needed by the next), Stop must reach a call's
process, and every call must end well (returned, or closed by Stop), none aborted.  Whether a duration asked
for covers its call is a price for a card (tests/runtime/measuring/test_gpu_call.py prices it; the GPU run times
it): here the stand-in kills a call at :data:`GRACE` times its duration, a hang guard, since a CPU shared with
other work is what a call's time measures here.

    python -m pytest -q tests/app/test_zerogpu.py         # ~1 min on a 2-core CPU
"""

import multiprocessing
import os
import time
from contextlib import closing
from types import SimpleNamespace

import pytest
from conftest import app_pair

import app
from components.app_state import serving
from components.live import live_tab
from components.loopback import serve_here
from test_browser import (STOP_HANG_GUARD_S, _click_decode, _event_ended, _settled, _wait_for,
                          browser_context, sync_api)
from test_browser_fresh import _errors   # the error toasts and badges on the page

pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(not os.path.exists("/usr/bin/chromium"), reason="no /usr/bin/chromium")]
__all__ = ["browser_context"]
#: The stand-in kills a call at this many times its duration: a hang guard.  The tiny pair's calls here ask for
#: ZeroGPU's shortest call, 20 s, and take 0.1-2.7 s on a quiet 2-vCPU Xeon with AMX (the one Stop ends also
#: waits for the test at a step); beside a busy loop and the other test worker, one took over 20 s (killed:
#: "GPU task aborted", an Error on the page over a finished run).
GRACE = 10

@pytest.fixture(scope="module")
def zero(tiny_target, tmp_path_factory, lanes):
    """The app on a tiny pair of its own, built and served under the stand-in."""
    standin = serving.ZeroGPUStandIn(grace=GRACE)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(serving, "spaces", standin)
        pair = app_pair(tiny_target, tiny_target)
        standin.guard(pair.draft)
        standin.guard(pair.target)
        demo = app.build_demo(pair, assets_dir=tmp_path_factory.mktemp("assets"), max_budget=24, lanes=lanes)
        url = serve_here(demo, css_paths=[app.CSS_PATH])
        yield SimpleNamespace(url=url, standin=standin, pair=pair, ctx=demo.sequoia_context)
        demo.close()


@pytest.fixture()
def page(zero, browser_context):
    page = browser_context.new_page()
    page.set_viewport_size({"width": 1280, "height": 720})
    page.goto(zero.url, wait_until="domcontentloaded")
    page.locator("#sq-prompt textarea").wait_for()
    yield page
    page.close()


def _calls_since(zero, n: int) -> list:
    return zero.standin.calls[n:]


def _all_ended_well(calls) -> None:
    assert calls, "no call went through the stand-in"
    deadline = time.monotonic() + 10        # the page may show a call's last frame before the call has ended
    while any(c.outcome == "running" for c in calls) and time.monotonic() < deadline:
        time.sleep(0.05)
    for call in calls:
        assert call.outcome in ("returned", "closed"), call


def test_the_models_refuse_work_outside_a_call(zero):
    assert serving.zerogpu()
    with pytest.raises(RuntimeError, match="outside a @spaces.GPU call"):
        zero.pair.target.session()


def test_the_api_decodes_and_compares_in_a_fresh_process_each_call(zero):
    from gradio_client import Client

    client, first = Client(zero.url, verbose=False), len(zero.standin.calls)
    decodes = [client.predict("def add(a, b):", "Sequoia (budget & depth)", 8, 3, 0.0, 1.0, 12, 0,
                              api_name="/decode") for _ in range(2)]
    steps = [[(s["tokens"], s["accepted"], s["new_tokens"]) for s in d[1]] for d in decodes]
    assert decodes[0][0] and decodes[0][0] == decodes[1][0] and steps[0] == steps[1]   # T=0, call after call
    rows = client.predict("def add(a, b):", 8, 3, 0.0, 1.0, 8, 0, False, api_name="/compare")
    assert rows[0]["method"] == "target only" and len(rows) >= 4
    calls = _calls_since(zero, first)
    assert len(calls) == 3 and len({c.pid for c in calls}) == 3 and os.getpid() not in {c.pid for c in calls}
    _all_ended_well(calls)


def _held_in_calls(monkeypatch) -> SimpleNamespace:
    """The Live runs of the calls' processes (forked after this) hold their second step until ``release`` is
    set (``at_hold`` once one waits there), and count the steps they drew in ``steps``: shared memory, which
    the test reads and sets from the server's process."""
    fork = multiprocessing.get_context("fork")
    held = SimpleNamespace(at_hold=fork.Event(), release=fork.Event(), steps=fork.Value("i", 0))
    real = live_tab.run_decode

    def run_decode(ctx, req, should_stop=None):
        with closing(real(ctx, req, should_stop)) as steps:
            for rec in steps:
                if rec.step == 1:
                    held.at_hold.set()
                    held.release.wait(60)
                with held.steps.get_lock():
                    held.steps.value += 1
                yield rec
    monkeypatch.setattr(live_tab, "run_decode", run_decode)
    return held


def test_live_decodes_twice_and_stop_reaches_the_calls_process(zero, page, monkeypatch):
    first = len(zero.standin.calls)
    summary = page.locator("#sq-summary")
    for _ in range(2):                                  # the second click runs: the first one's flags settled
        _click_decode(page)
        sync_api.expect(summary).to_contain_text("finished", timeout=60_000)
    _settled(page)                                      # the last run's own calls (its rate measured) over
    held = _held_in_calls(monkeypatch)
    try:
        _click_decode(page)
        assert held.at_hold.wait(60), "the run did not reach its second step"
        sync_api.expect(summary).to_contain_text("1 target call", timeout=30_000)   # its first step on the page
        page.get_by_role("button", name="Stop", exact=True).click()
        # A hang guard only: the run is held, so a late Stop cannot lose a race (10 s ran out once in a loaded run)
        sync_api.expect(summary).to_contain_text("Stopped", timeout=STOP_HANG_GUARD_S * 1000)
    finally:
        held.release.set()                              # the run may go on now: it must read Stop's flag
    stopped = zero.standin.calls[-1]
    _wait_for(lambda: stopped.outcome != "running", 60, "the stopped call did not end")
    # The held step and at most the one under way when the flag was read; unstopped, the run takes 23.
    assert held.steps.value <= 3, f"the call's process drew {held.steps.value} steps: it did not read Stop's flag"
    monkeypatch.undo()
    _click_decode(page)                                  # and the page runs again after Stop
    sync_api.expect(summary).to_contain_text("finished", timeout=60_000)
    assert _errors(page) == []
    _all_ended_well(_calls_since(zero, first))


def _or_dump_the_calls(zero, expectation) -> None:
    """``expectation()``; where it fails, the running calls' processes print their stacks first (captured as the
    test's stderr): a stalled call says where it waits."""
    try:
        expectation()
    except AssertionError:
        if zero.standin.dump_running():
            time.sleep(0.5)             # the dump is written by the call's process, on its own
        raise


def test_compare_and_the_distribution_check_run_twice(zero, page):
    first = len(zero.standin.calls)
    page.get_by_role("tab", name="Compare").click()
    notes = page.locator("#sq-compare-notes")
    for _ in range(2):
        page.get_by_role("button", name="Run comparison", exact=True).click()
        _or_dump_the_calls(zero, lambda: sync_api.expect(notes).to_contain_text("Identical at T=0", timeout=120_000))
        _wait_for(lambda: zero.standin.calls[-1].outcome != "running", 120)   # the run's GPU call over...
        _event_ended(page)   # ...and its event: the next click is not dropped as a second click of this run
    page.get_by_role("tab", name="Distribution check", exact=True).click()
    verdicts = page.locator("#sq-check-verdicts")
    for _ in range(2):
        page.get_by_role("button", name="Run the check", exact=True).click()
        _or_dump_the_calls(zero, lambda: sync_api.expect(verdicts).to_contain_text("Finished in", timeout=120_000))
        _wait_for(lambda: zero.standin.calls[-1].outcome != "running", 120)
        _event_ended(page)
    assert _errors(page) == []
    _all_ended_well(_calls_since(zero, first))
