"""The loopback server the scripts and tests use (components.loopback): its ports come from below the
kernel's ephemeral range, a port taken before the server binds it costs a retry, not the server, and the app
served while its pair loads answers once the pair is ready or says why it is not."""

import socket
import threading
import urllib.request
from types import SimpleNamespace

import gradio as gr
import pytest

from components import loopback


def test_a_free_port_is_below_the_ephemeral_range_and_free(tmp_path):
    low = loopback.ephemeral_low()
    ports = {loopback.free_port() for _ in range(20)}
    assert all(1024 <= p < low for p in ports) and len(ports) > 1   # drawn at random: two workers rarely meet
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", ports.pop()))
    (tmp_path / "range").write_text("40000\t60999\n")
    assert loopback.ephemeral_low(tmp_path / "range") == 40000
    assert loopback.ephemeral_low(tmp_path / "missing") == 32768


def test_a_port_taken_before_the_bind_is_retried(monkeypatch):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        offered = [taken.getsockname()[1]]   # the first port offered is held by another socket
        real = loopback.free_port
        monkeypatch.setattr(loopback, "free_port", lambda: offered.pop() if offered else real())
        with gr.Blocks() as demo:
            gr.Markdown("served")
        url = loopback.serve_here(demo)
        try:
            assert not offered and f":{taken.getsockname()[1]}/" not in url
            with urllib.request.urlopen(url, timeout=60) as page:
                assert page.status == 200
        finally:
            demo.close()


def test_a_page_too_slow_for_gradios_check_is_closed_and_served_again(monkeypatch):
    tries, closed = [], []

    def slow_once(demo, launch):
        tries.append(launch)
        if len(tries) == 1:
            raise ValueError("When localhost is not accessible, a shareable link must be created.")
        return "http://127.0.0.1:1/"

    monkeypatch.setattr(loopback, "_launch", slow_once)
    demo = gr.Blocks()
    monkeypatch.setattr(demo, "close", lambda: closed.append(True))
    assert loopback.serve_here(demo) == "http://127.0.0.1:1/"
    assert len(tries) == 2 and closed == [True]


def test_other_launch_failures_are_not_retried(monkeypatch):
    tries = []

    def fails(demo, launch):
        tries.append(launch)
        raise OSError("no such device")

    monkeypatch.setattr(loopback, "_launch", fails)
    with pytest.raises(OSError, match="no such device"):
        loopback.serve_here(gr.Blocks())
    assert len(tries) == 1


def _loading_app(outcome: str):
    """A page whose "pair" loads in a thread: to ``ready``, to an ``error``, or never (``hang``)."""
    with gr.Blocks() as demo:
        gr.Markdown("served")
    status = SimpleNamespace(ready=False, error=None, summary=lambda: "40%, loading the target, 3 s")

    def load():
        if outcome == "ready":
            status.ready = True
        elif outcome == "error":
            status.error = "OSError: no weights here"

    demo.sequoia_context = SimpleNamespace(status=status, models=SimpleNamespace(
        start_loading=lambda: threading.Thread(target=load, daemon=True).start()))
    closed, close = [], demo.close
    demo.close = lambda: (closed.append(True), close())
    return demo, closed


def test_serve_loaded_returns_the_page_once_the_pair_is_ready():
    demo, closed = _loading_app("ready")
    url = loopback.serve_loaded(demo)
    try:
        assert demo.sequoia_context.status.ready
        with urllib.request.urlopen(url, timeout=60) as page:
            assert page.status == 200
    finally:
        demo.close()


@pytest.mark.parametrize("outcome,words", [("error", "failed to load: OSError: no weights here"),
                                           ("hang", r"not loaded after 0.3 s \(40%, loading the target, 3 s\)")])
def test_serve_loaded_says_why_the_pair_is_not_ready_and_closes_the_server(outcome, words):
    demo, closed = _loading_app(outcome)
    with pytest.raises(RuntimeError, match=words):
        loopback.serve_loaded(demo, timeout_s=0.3 if outcome == "hang" else 60)
    assert closed == [True]
