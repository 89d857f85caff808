"""Forking a process that will run torch, from a threaded one.

A forked process keeps only the thread that forked it, and with it that thread's GNU OpenMP pool, whose worker
threads it does not have: when the forking thread ran a parallel torch op before the fork, the child's first
parallel op waits for them forever.  Measured on a 2-vCPU Xeon with torch's two threads: a 2000x2000 matmul
in a thread, then a fork from that thread, hangs the child's matmul (and a 65,536-element ``sum``); forked
from a thread made for the fork, the child's matmul takes 0.27 s.  The server threads of a page that served a
model in-process, and a main thread that built models on the CPU, are such threads.

:func:`start_from_a_fresh_thread` starts a ``multiprocessing`` fork from a thread made for it.
"""

from __future__ import annotations

import threading
import warnings


def start_from_a_fresh_thread(process) -> None:
    """``process.start()`` (a fork context's process) from a thread made for it, so that the child inherits no
    OpenMP pool; its errors are raised here."""
    failure: list[BaseException] = []

    def start() -> None:
        try:
            with warnings.catch_warnings():   # a fork of a threaded process: meant (ZeroGPU forks its server too)
                warnings.simplefilter("ignore", DeprecationWarning)
                process.start()
        except BaseException as exc:   # noqa: BLE001 - raised in the caller's thread below
            failure.append(exc)

    starter = threading.Thread(target=start, name="sequoia-fork", daemon=True)
    starter.start()
    starter.join()
    if failure:
        raise failure[0]
