"""A small thread-safe memo of parsed requests by their raw values (components.app_state.validation parses through it)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

T = TypeVar("T")


class RequestMemo:
    """An LRU of parsed requests by their raw values; ``parses`` counts the real parses.

    Gradio runs an event's validator before the request queues and the handler after it, both with the same raw
    values: the memo makes the second call get the first call's parse.
    """

    def __init__(self, size: int) -> None:
        self.size, self.parses = size, 0
        self._items: OrderedDict = OrderedDict()
        self._lock = threading.Lock()

    def get_or_parse(self, key: Hashable | None, parse: Callable[[], T]) -> T:
        if key is not None:
            with self._lock:
                if key in self._items:
                    self._items.move_to_end(key)
                    return self._items[key]
        value = parse()   # errors propagate and are not remembered
        with self._lock:
            self.parses += 1
            if key is not None:
                self._items[key] = value
                while len(self._items) > self.size:
                    self._items.popitem(last=False)
        return value


def raw_key(*values: Any) -> tuple | None:
    """The raw values with their types (so 1, 1.0 and True stay apart); None when one is unhashable."""
    key = tuple((type(v).__name__, v) for v in values)
    try:
        hash(key)
    except TypeError:
        return None
    return key
