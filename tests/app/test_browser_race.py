"""The race between runtimes on the page as ``python app.py`` serves it (its default runtime, the embedded pair):
the button, the second runtime's pair loading, the three lanes side by side, the sentence, the pair freed after,
and the Live tab's Stop stopping a race.

The offer is made to appear on any CPU: this machine's profiles are replaced by test_race's hand-made ones (a
tree pays on the runtime the server does not serve); the race itself loads and runs the real second pair.
One timed round of 4 tokens a run (the product's race is race.ROUNDS rounds of the guided example's 48).

    python -m pytest -q tests/app/test_browser_race.py       # loads both runtimes' pairs: ~12 GB
"""

import os
import re
import threading
import time
from types import SimpleNamespace

import pytest

import app
from components.app_state.load_status import LoadCancelled
from components.live import race_panel, race_run
from components.loopback import serve_here
from test_browser import _wait_for, browser_context, sync_api
from test_race import LLAMA, TORCH

pytestmark = [pytest.mark.browser, pytest.mark.embedded, pytest.mark.slow,
              pytest.mark.skipif(not os.path.exists("/usr/bin/chromium"), reason="no /usr/bin/chromium")]
__all__ = ["browser_context"]


@pytest.fixture(scope="module")
def race_server(lanes):
    """The app from this environment with its models loaded; the other runtime made to pay by hand-made profiles."""
    with pytest.MonkeyPatch.context() as mp:
        # no background timing of the runtimes (its children load the targets again, niced, and outlive the
        # module; test_browser_fresh keeps it): the background profile still measures beside the visits
        demo = app.build_from_env({**os.environ, "SEQUOIA_PROBE": "0"}, lanes=lanes)
        ctx = demo.sequoia_context
        if ctx.extras.race_loader is None:
            pytest.skip("this server offers no race (no second runtime to load)")
        ctx.models.start_loading()
        deadline = time.monotonic() + 900
        while not ctx.status.ready:     # the pair loads before the page: its profiles decide the offer
            assert not ctx.status.error, ctx.status.error
            assert time.monotonic() < deadline, "the models were not ready after 900 s"
            time.sleep(0.2)
        serving = ctx.pair().backend
        other = "hf" if serving != "hf" else "llamacpp"
        mp.setattr(race_run, "race_profiles", lambda c, acceptance: {serving: LLAMA, other: TORCH})
        mp.setitem(race_panel.PAGE_RACE, "rounds", 1)
        mp.setitem(race_panel.PAGE_RACE, "max_new_tokens", 4)
        url = serve_here(demo, css_paths=[app.CSS_PATH])
        yield SimpleNamespace(url=url, ctx=ctx, other=other)
        demo.close()
        # Nothing of this module's races may load on beside the next modules' servers: a load in flight when a
        # ZeroGPU stand-in call forks (test_zerogpu) shares the process with it.  A stopped race's load ends at
        # its next stage (race_run._load), a finished one frees its pair.
        _wait_for(lambda: not [t for t in threading.enumerate() if t.name.startswith("sequoia-race-load")]
                    and ctx.extras.race_loaded is None, 300, "a race's load still ran after the module")


@pytest.fixture()
def page(race_server, browser_context):
    page = browser_context.new_page()
    page.set_viewport_size({"width": 1280, "height": 720})
    page.goto(race_server.url, wait_until="domcontentloaded")
    page.locator("#sq-prompt textarea").wait_for()
    yield page
    page.close()


def _freed(ctx, timeout_s: float = 120.0) -> None:
    """Wait until the race's second pair is freed (the handler's last act); fails after ``timeout_s``."""
    _wait_for(lambda: ctx.extras.race_loaded is None, timeout_s, "the race's second runtime was not freed")


def _loading_or_refused(words, race_server) -> None:
    """Wait until the second pair's load has passed the memory budget and started (its progress is kept), or the
    race is already over; skip where the budget refused it for want of memory (other programs hold it now: the
    refusal, drawn with its reason and nothing loaded, is the page's answer).  The page says "loading" before the
    budget is asked, so its words alone cannot tell a load from a refusal still to come."""
    extras = race_server.ctx.extras
    _wait_for(lambda: extras.race_status is not None or extras.race_loaded is not None
              or re.search("not enough memory|fastest here", words.text_content() or ""), 60,
              "the race neither loaded its second pair nor said why not")
    if "not enough memory" in words.text_content():
        assert extras.race_loaded is None
        pytest.skip("the machine's free memory was under the race's estimate (the refusal was drawn)")


def test_the_race_button_runs_three_lanes_and_frees_the_second_runtime(page, race_server):
    offer = page.locator("#sq-race-offer")
    sync_api.expect(offer).to_contain_text("A tree pays one runtime away", timeout=120_000)
    page.locator("#sq-race-btn").click()
    words = page.locator("#sq-race-words")
    _loading_or_refused(words, race_server)                                     # says so while loading
    sync_api.expect(words).to_contain_text("fastest here", timeout=600_000)      # the sentence, at the end
    text = words.text_content()
    assert "decoded" in text and "over 1 round)" in text and "Resident memory with both runtimes loaded" in text
    lanes = page.locator("#sq-race-lanes .sq-race-lane")
    assert lanes.count() == 3
    for i in range(3):
        assert len(lanes.nth(i).text_content()) > 60     # label, rate and the run's text
    sync_api.expect(page.locator("#sq-race-bars .bars, #sq-race-bars .point")).not_to_have_count(0)
    _freed(race_server.ctx)


def test_stop_stops_the_race_while_its_pair_loads(page, race_server, monkeypatch):
    """Stop while the race's second pair loads: the page says so, the load ends at its next report, nothing stays
    held and no race is run.  The load is a stand-in that reports as a real one does until Stop cancels it: a real
    load needs about 8 GB free, which beside the float32 group's pair the memory budget often refuses on a 24 GB
    machine (the refusal is the page's right answer, and left nothing to stop).  The test above loads the real one."""
    extras = race_server.ctx.extras
    loading, cancelled = threading.Event(), threading.Event()

    def held_load(backend, status):
        loading.set()
        deadline = time.monotonic() + 120         # a hang guard: the test fails below when Stop never cancels it
        try:
            while time.monotonic() < deadline:    # reports as a real load does at each stage
                status(0.5, "the test's stand-in load")
                time.sleep(0.05)                  # a stage of the load
        except LoadCancelled:
            cancelled.set()
            raise
        raise RuntimeError("the test's stand-in load was never cancelled")

    monkeypatch.setattr(extras, "race_loader", held_load)
    monkeypatch.setattr(extras, "race_bytes", lambda backend: 0)
    sync_api.expect(page.locator("#sq-race-btn")).to_be_visible(timeout=120_000)   # once the offer is read
    page.locator("#sq-race-btn").click()
    words = page.locator("#sq-race-words")
    sync_api.expect(words).to_contain_text("loading", timeout=60_000)
    assert loading.wait(60), "the race did not start its second pair's load"
    page.get_by_role("button", name="Stop", exact=True).click()
    sync_api.expect(words).to_contain_text("Stopped", timeout=30_000)
    assert cancelled.wait(60), "the load went on after Stop: its next report did not cancel it"
    _freed(race_server.ctx, timeout_s=60)
    assert "fastest here" not in words.text_content()
