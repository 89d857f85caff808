"""Parsing one field of a request from a raw value, and collecting every bad field into one error.

Each message starts with the field's label (the page's words, :data:`LABELS`), so a
front end can put it on its own input; :class:`Errors` keeps the first per field and
raises them together as a :class:`RequestError`.  Pure: text and numbers only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

#: Field -> the label its messages start with (the page's words).
LABELS = {"prompt": "prompt", "method": "method", "budget": "budget", "depth": "depth", "temperature": "temperature",
          "top_p": "top-p", "max_new_tokens": "max new tokens", "seed": "seed", "chat": "chat",
          "acceptance": "acceptance vector"}


class RequestError(ValueError):
    """One or more fields of a request are wrong; ``errors`` maps each field to its message (label first)."""

    def __init__(self, errors: Mapping[str, str]) -> None:
        self.errors = dict(errors)
        super().__init__("; ".join(self.errors.values()))

    @property
    def fields(self) -> tuple[str, ...]:
        return tuple(self.errors)


def labelled(field_name: str, message: str) -> str:
    label = LABELS.get(field_name, field_name)
    return message if message.lower().startswith(label) else f"{label}: {message}"


class Errors:
    """Collects the first message per field; :meth:`raise_any` raises them all as one RequestError."""

    def __init__(self) -> None:
        self.found: dict[str, str] = {}

    def check(self, field_name: str, parse, *args):
        try:
            return parse(*args)
        except (ValueError, TypeError) as exc:
            self.found.setdefault(field_name, labelled(field_name, str(exc)))
            return None

    def raise_any(self) -> None:
        if self.found:
            raise RequestError(self.found)


def whole(label: str, value: Any, lo: int, hi: int | None = None) -> int:
    """A whole number in lo..hi from an int, an integral float or text; ValueError naming ``label`` otherwise."""
    v = value
    if isinstance(v, str):
        text = v.strip()
        try:
            v = int(text)
        except ValueError:
            try:
                v = float(text)
            except ValueError:
                v = None
    if isinstance(v, float) and math.isfinite(v) and v == int(v):
        v = int(v)
    if not isinstance(v, int) or isinstance(v, bool):
        raise ValueError(f"{label} must be a whole number, got {value!r}")
    if v < lo or (hi is not None and v > hi):
        raise ValueError(f"{label} must be a whole number in {lo}..{hi}, got {v}" if hi is not None
                         else f"{label} must be a whole number >= {lo}, got {v}")
    return v


def real(label: str, value: Any) -> float:
    """A finite number from an int, a float or text; ValueError naming ``label`` otherwise."""
    try:
        v = float(value.strip() if isinstance(value, str) else value)
    except (TypeError, ValueError):
        v = math.nan
    if isinstance(value, bool) or not math.isfinite(v):
        raise ValueError(f"{label} must be a finite number, got {value!r}")
    return v
