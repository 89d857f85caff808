"""Counts in words: "1 token", "2 tokens".  Every count a page, a report or the console prints goes through
:func:`counted`, so no sentence says "1 tokens" (a slip a class notices before the result it frames)."""

from __future__ import annotations

#: Nouns whose plural is not the singular plus "s".
_IRREGULAR = {"child": "children", "copy": "copies", "entry": "entries"}


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` and ``noun``, the noun plural unless ``n`` is 1 ("1 target call", "0 target calls").

    ``noun`` may be several words; only the last is made plural ("target call" -> "target calls").
    """
    if n == 1:
        return f"{n} {noun}"
    if plural is None:
        head, _, last = noun.rpartition(" ")
        plural = (head + " " if head else "") + _IRREGULAR.get(last, last + "s")
    return f"{n} {plural}"
