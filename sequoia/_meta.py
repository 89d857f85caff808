"""Small helpers shared by the measurement files (hardware profiles, acceptance vectors)."""

from __future__ import annotations

import datetime as _dt
import json
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import sequoia

#: The repository's shipped measurements and prompt sets (profiles, acceptance vectors, calibrations).
ASSETS = Path(__file__).resolve().parent.parent / "assets"

#: progress(fraction in [0, 1], description): the one progress shape, that of ``gr.Progress``, so a tab passes
#: its progress straight through; a counting loop reports done / total through :class:`Progress`.
ProgressFn = Callable[[float, str], None]


def library_version() -> str:
    """``sequoia.__version__`` if the package defines one, else "unknown"."""
    return str(getattr(sequoia, "__version__", "unknown"))


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()


def pair_name(pair) -> str:
    """A readable name for a model pair: its ``name``, else ``draft_name+target_name``, else both model ids."""
    name = getattr(pair, "name", None)
    if name:
        return str(name)
    names = getattr(pair, "draft_name", None), getattr(pair, "target_name", None)
    if all(names):
        return f"{names[0]}+{names[1]}"
    ids = [getattr(getattr(m, "config", None), "name_or_path", "") or type(m).__name__ for m in (pair.draft, pair.target)]
    return "+".join(ids)


def write_json(path, data: dict) -> None:
    """Write ``data`` as indented JSON, creating the parent folders."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1))


def read_json(path: str | Path, fmt: str, what: str) -> dict:
    """Read a JSON object and check its ``format`` tag; errors name the file and what was expected."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"{path}: no such {what} file") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a {what} file holds a JSON object, got {type(data).__name__}")
    found = data.get("format")
    if found != fmt:
        hint = f"it is a {found!r} file" if found else "it has no 'format' field"
        raise ValueError(f"{path}: expected a {what} file (format {fmt!r}), but {hint}")
    return data


def require(data: dict, key: str, kind, what: str):
    """``data[key]`` checked against ``kind`` (a type or tuple of types)."""
    if key not in data:
        raise ValueError(f"{what}: missing field {key!r}")
    value = data[key]
    if not isinstance(value, kind) or isinstance(value, bool) and bool not in _as_tuple(kind):
        raise ValueError(f"{what}: field {key!r} must be {_kind_name(kind)}, got {type(value).__name__}")
    return value


def number_list(data: dict, key: str, what: str) -> tuple[float, ...]:
    values = require(data, key, list, what)
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in values):
        raise ValueError(f"{what}: field {key!r} must be a list of finite numbers")
    return tuple(float(v) for v in values)


def int_list(data: dict, key: str, what: str) -> tuple[int, ...]:
    values = require(data, key, list, what)
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise ValueError(f"{what}: field {key!r} must be a list of integers")
    return tuple(values)


def optional_number(data: dict, key: str, what: str) -> float:
    """An optional number field (0 when absent); booleans are refused."""
    value = data.get(key, 0.0)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{what}: field {key!r} must be a number, got {type(value).__name__}")
    return float(value)


def _as_tuple(kind) -> tuple:
    return kind if isinstance(kind, tuple) else (kind,)


def _kind_name(kind) -> str:
    return " or ".join(k.__name__ for k in _as_tuple(kind))


@contextmanager
def named_errors(what: str) -> Iterator[None]:
    """Re-raise a ValueError or TypeError from reading a record as ValueError("<what>: ..."), once."""
    try:
        yield
    except (ValueError, TypeError) as exc:
        if str(exc).startswith(what):
            raise
        raise ValueError(f"{what}: {exc}") from exc


class Progress:
    """tqdm bar, or a caller's progress(done / total, label)."""

    def __init__(self, total: int, fn: ProgressFn | None, desc: str) -> None:
        self.total, self.done, self.fn, self.bar = total, 0, fn, None
        if fn is None:
            from tqdm.auto import tqdm  # optional: only without a caller's progress; keeps core free of it

            self.bar = tqdm(total=total, desc=desc)

    def __call__(self, label: str) -> None:
        self.done += 1
        if self.bar is not None:
            self.bar.set_postfix_str(label)
            self.bar.update(1)
        else:
            self.fn(self.done / max(self.total, 1), label)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
