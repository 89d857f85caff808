"""The acceptance vectors the page offers: the catalogue, the one to preselect, parsing what a visitor types."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gradio as gr

from sequoia._meta import ASSETS
from sequoia.core.requests.request import parse_vector
from sequoia.runtime.measuring import finder
from sequoia.runtime.measuring.finder import DEFAULT_ENTRY

from components.app_state.context import LIGHT_WORK

#: The catalogue label of the built-in vector (used when no measured file fits).
DEFAULT_ACCEPTANCE_LABEL = DEFAULT_ENTRY.label


def acceptance_catalogue(assets_dir: Path = ASSETS) -> dict[str, tuple[float, ...]]:
    """label -> values of every measured acceptance vector (by kind and temperature), then the built-in one.

    Only ``sequoia-acceptance/1`` files (:func:`sequoia.runtime.measuring.finder.list_acceptance`): calibrations
    are not acceptance vectors and are never listed.
    """
    entries = [*finder.list_acceptance(assets_dir), DEFAULT_ENTRY]
    return {e.label: e.values for e in entries}


def default_acceptance_label(kind: str, temperature: float, assets_dir: Path = ASSETS) -> str:
    """The catalogue label to preselect for prompts of ``kind`` (e.g. "code", "chat", "rag") at ``temperature``."""
    return finder.find_acceptance(kind, float(temperature), assets_dir).label


def label_for_temperature(temperature: float, current: str | None, assets_dir: Path = ASSETS) -> str | None:
    """The vector to show after the temperature changes: same prompt kind as ``current``, nearest temperature.

    A vector the visitor typed in ("custom") or one the catalogue does not know is left as it is (None).
    """
    if not current or current not in acceptance_catalogue(assets_dir):
        return None
    entry = next((e for e in finder.list_acceptance(assets_dir) if e.label == current), None)
    kind = entry.kind if entry is not None and entry.kind else "code"   # the built-in vector was measured on code
    return default_acceptance_label(kind, temperature, assets_dir)


def follow_temperature(temperature, acceptance, assets_dir: Path = ASSETS) -> None:
    """Wire ``temperature`` so that ``acceptance`` switches to the vector measured nearest the new temperature."""
    def update(t, current):
        label = label_for_temperature(t, current, assets_dir)
        return gr.update() if label is None else gr.update(value=label)

    temperature.input(update, [temperature, acceptance], acceptance, api_visibility="private",
                      show_progress="hidden", **LIGHT_WORK)


def parse_acceptance(value: Any) -> tuple[float, ...]:
    """A list, or text such as ``"0.8, 0.1"`` / ``"[0.8, 0.1]"``, as a validated vector (at most
    MAX_ACCEPTANCE_LEN entries): :func:`sequoia.core.requests.request.parse_vector`."""
    return parse_vector(value)


def format_acceptance(vec: tuple[float, ...]) -> str:
    return ", ".join(f"{x:.4g}" for x in vec)
