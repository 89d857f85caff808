"""Graphs captured inside each ZeroGPU call, under the stand-in (a process forked per call; test_zerogpu's hang
guard on its time): with SEQUOIA_CALL_GRAPHS=1 a CPU call takes the capture path (replays emulated over the graphs' static
buffers), decodes the eager call's tokens at T=0, counts its captures on the page inside the call's own time, and
a capture that fails leaves that shape eager with the reason on the page."""

import os
import re

import pytest

from sequoia.runners.hf.graphs import call_graphs
from test_browser import _click_decode, browser_context, sync_api
from test_browser_fresh import _errors
from test_zerogpu import _all_ended_well, page, zero

pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(not os.path.exists("/usr/bin/chromium"), reason="no /usr/bin/chromium")]
__all__ = ["browser_context", "page", "zero"]
CAPTURED = re.compile(r"This GPU call captured (\d+) graph replays \(emulated: no CUDA here\) in ([0-9.]+) s")


def _decode_api(zero):
    from gradio_client import Client

    text, steps = Client(zero.url, verbose=False).predict(
        "def add(a, b):", "Sequoia (budget & depth)", 8, 3, 0.0, 1.0, 16, 0, api_name="/decode")
    return text, [(s["tokens"], s["accepted"], s["new_tokens"]) for s in steps]


def test_a_capturing_call_decodes_the_eager_calls_tokens(zero, monkeypatch):
    monkeypatch.setenv("SEQUOIA_CALL_GRAPHS", "0")
    eager = _decode_api(zero)
    monkeypatch.setenv("SEQUOIA_CALL_GRAPHS", "1")   # read when the call is ordered; the fork inherits it
    first = len(zero.standin.calls)
    assert _decode_api(zero) == eager and eager[0]
    _all_ended_well(zero.standin.calls[first:])


def test_the_page_counts_the_calls_captures_within_its_time(zero, page, monkeypatch):
    monkeypatch.setenv("SEQUOIA_CALL_GRAPHS", "1")
    first = len(zero.standin.calls)
    summary = page.locator("#sq-summary")
    _click_decode(page)
    sync_api.expect(summary).to_contain_text("This GPU call captured", timeout=60_000)
    sync_api.expect(summary).to_contain_text("finished", timeout=60_000)
    match = CAPTURED.search(summary.inner_text())
    assert match and int(match.group(1)) >= 2, summary.inner_text()
    calls = zero.standin.calls[first:]
    _all_ended_well(calls)
    assert any(c.seconds >= float(match.group(2)) for c in calls)   # the captures ran inside the call
    assert _errors(page) == []


def test_a_failed_capture_runs_eagerly_and_the_page_says_why(zero, page, monkeypatch):
    monkeypatch.setenv("SEQUOIA_CALL_GRAPHS", "1")

    def refused(cls, runner, bucket, window):
        raise RuntimeError("capture refused (test)")
    monkeypatch.setattr(call_graphs.ReplayedEagerly, "capture", classmethod(refused))   # forked into the call
    summary = page.locator("#sq-summary")
    _click_decode(page)
    sync_api.expect(summary).to_contain_text("failed and ran eagerly", timeout=60_000)
    sync_api.expect(summary).to_contain_text("capture refused (test)")
    sync_api.expect(summary).to_contain_text("finished", timeout=60_000)
    assert _errors(page) == []
