"""The loopback server the scripts and tests use (components.loopback): its ports come from below the
kernel's ephemeral range, and a port taken before the server binds it costs a retry, not the server."""

import socket
import urllib.request

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


def test_other_launch_failures_are_not_retried(monkeypatch):
    tries = []

    def fails(demo, launch):
        tries.append(launch)
        raise OSError("no such device")

    monkeypatch.setattr(loopback, "_launch", fails)
    with pytest.raises(OSError, match="no such device"):
        loopback.serve_here(gr.Blocks())
    assert len(tries) == 1
