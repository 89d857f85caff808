"""llama.cpp's process-wide setup, done on first use: the backend and a log filter, once, thread-safe.

llama.cpp keeps one backend and one log callback per process (``llama_backend_init``,
``llama_log_set``), so they cannot belong to a runner; they are set up when the first
runner or requantization needs them, never at import, so importing this package
changes nothing in the process.
"""

from __future__ import annotations

import ctypes
import sys
import threading

import llama_cpp

_LOG_ERROR, _LOG_CONT = 4, 5  # enum ggml_log_level in ggml.h (DEBUG 1, INFO 2, WARN 3, ERROR 4, CONT 5)


class _ErrorsOnly:
    """llama.cpp prints hundreds of INFO lines per load: keep errors and their continuation lines.

    A continuation line (``_LOG_CONT``) carries no level of its own, so the level of the
    line it continues is remembered here.
    """

    def __init__(self) -> None:
        self.last_level = 0
        # The ctypes callback must outlive every call llama.cpp makes to it: held here, and this object by
        # _Backend for the life of the process.
        self.callback = llama_cpp.llama_log_callback(self._log)

    def _log(self, level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
        if level != _LOG_CONT:
            self.last_level = level
        if self.last_level == _LOG_ERROR:
            sys.stderr.write(text.decode("utf-8", "replace"))


class _Backend:
    """Initialises llama.cpp once per process, from whichever thread asks first."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._log: _ErrorsOnly | None = None

    def ensure(self) -> None:
        with self._lock:
            if self._log is not None:
                return
            log = _ErrorsOnly()
            llama_cpp.llama_log_set(log.callback, ctypes.c_void_p(0))
            llama_cpp.llama_backend_init()
            self._log = log

    @property
    def ready(self) -> bool:
        return self._log is not None


_BACKEND = _Backend()


def ensure_backend() -> None:
    """Set up llama.cpp's backend and log filter if this process has not yet (cheap after the first call)."""
    _BACKEND.ensure()


def backend_ready() -> bool:
    return _BACKEND.ready
