"""The app served on this machine's loopback, for the scripts that visit it and the tests: on a port no other
process takes between its choice and the server's bind.

A port the kernel hands out for ``bind(("127.0.0.1", 0))`` lies in its ephemeral range, the range it also draws
the source port of every outgoing connection from: a browser's or a client's connection could take it in the
moment between the choice and the server's bind (a full test run beside a busy loop lost a server that way:
"Cannot find empty port in range: 58349-58349").  :func:`free_port` picks below that range, where only another
server can bind, and :func:`serve_here` tries another port when one was taken all the same.
:func:`serve_loaded` serves the app as ``python app.py`` does (the page up while its pair loads) and returns once
the pair is ready: what the scripts under ``scripts/page/`` visit.
"""

from __future__ import annotations

import random
import socket
import time
from pathlib import Path

import gradio as gr

#: Gradio's words when the port it was given could not be bound (gradio.http_server.start_server).
PORT_TAKEN = "Cannot find empty port"
#: Gradio's words when the page it just served did not answer its check (one HEAD request, 3 s) in time.
NOT_REACHED = "localhost is not accessible"


def ephemeral_low(path: Path = Path("/proc/sys/net/ipv4/ip_local_port_range")) -> int:
    """The lowest port of the kernel's ephemeral range (Linux's default 32768 where it cannot be read)."""
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on ``host`` now, below the ephemeral range (see the module's docstring)."""
    low = ephemeral_low()
    for _ in range(200):
        port = random.randrange(max(low - 12000, 1024), low)
        with socket.socket() as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return port
    raise OSError(f"no free port on {host} below the ephemeral range ({low})")


def serve_here(demo: gr.Blocks, tries: int = 5, **launch) -> str:
    """``demo`` served on the loopback without blocking (``launch``: more of ``Blocks.launch``'s arguments), on a
    free port, another one if that one was taken before the server bound it, or if the page did not answer
    Gradio's check in time (seen once beside a busy loop); the page's URL."""
    for _ in range(tries - 1):
        try:
            return _launch(demo, launch)
        except OSError as exc:
            if PORT_TAKEN not in str(exc):
                raise
        except ValueError as exc:   # the server's first page took over Gradio's 3 s check (a starved CPU)
            if NOT_REACHED not in str(exc):
                raise
            demo.close()
    return _launch(demo, launch)


def _launch(demo: gr.Blocks, launch: dict, port: int | None = None) -> str:
    _, url, _ = demo.launch(server_name="127.0.0.1", server_port=port or free_port(), prevent_thread_lock=True,
                            quiet=True, **launch)
    return url


def serve_loaded(demo: gr.Blocks, port: int | None = None, timeout_s: float = 900.0, **launch) -> str:
    """The app's ``demo`` (``app.build_from_env``'s) served while its pair loads in the background, as ``python
    app.py`` serves it, on ``port`` or a free one (:func:`serve_here`); its URL once the pair is ready.  Where the
    load fails, or is not done within ``timeout_s``, the server is closed and a RuntimeError says which."""
    ctx = demo.sequoia_context
    ctx.models.start_loading()
    url = serve_here(demo, **launch) if port is None else _launch(demo, launch, port)
    deadline = time.monotonic() + timeout_s
    try:
        while not ctx.status.ready:
            if ctx.status.error:
                raise RuntimeError(f"the models failed to load: {ctx.status.error}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the models were not loaded after {timeout_s:g} s ({ctx.status.summary()})")
            time.sleep(0.1)
    except BaseException:
        demo.close()
        raise
    return url
