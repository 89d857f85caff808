"""The app served on this machine's loopback, for the scripts that visit it and the tests: on a port no other
process takes between its choice and the server's bind.

A port the kernel hands out for ``bind(("127.0.0.1", 0))`` lies in its ephemeral range, the range it also draws
the source port of every outgoing connection from: a browser's or a client's connection could take it in the
moment between the choice and the server's bind (a full test run beside a busy loop lost a server that way:
"Cannot find empty port in range: 58349-58349").  :func:`free_port` picks below that range, where only another
server can bind, and :func:`serve_here` tries another port when one was taken all the same.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

import gradio as gr

#: Gradio's words when the port it was given could not be bound (gradio.http_server.start_server).
PORT_TAKEN = "Cannot find empty port"


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
    free port, another one if that one was taken before the server bound it; the page's URL."""
    for _ in range(tries - 1):
        try:
            return _launch(demo, launch)
        except OSError as exc:
            if PORT_TAKEN not in str(exc):
                raise
    return _launch(demo, launch)


def _launch(demo: gr.Blocks, launch: dict) -> str:
    _, url, _ = demo.launch(server_name="127.0.0.1", server_port=free_port(), prevent_thread_lock=True, quiet=True,
                            **launch)
    return url
