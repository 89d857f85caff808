"""The roofline picture: what verifying n tokens costs relative to one token, on this machine and elsewhere.

One forward reads every weight once, however many tokens it carries, and does ``2 * params`` FLOPs per
token.  Where reading the weights takes longer than the arithmetic of n tokens (a GPU: terabytes a second
of memory, hundreds of TFLOP/s), n tokens cost about one: the curve is flat and a tree of n tokens is
nearly free to verify.  Where the arithmetic takes longer (a 2-core CPU), n tokens cost about n: the
curve is a line of slope 1 and no tree pays.  :func:`figure` draws the measured curves on log-log axes
with that line for reference; :func:`annotation` says it in one sentence from the numbers themselves.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import plotly.graph_objects as go

from sequoia.core.profiles.profile import HardwareProfile
from sequoia.core.profiles.projection import Elsewhere, Roofline, relative_costs

from components.widgets.hardware_view import log_ticks
from components.widgets.tree_view import BADGE_PX

#: The tree size the sentence prices (a Sequoia tree of 63 draft tokens plus its root).
SHOWN_TOKENS = 64
#: The largest forward drawn: the graph runner's largest bucket (a profile's points above it ran eagerly on the
#: H100, 7x one token at the 1.5B shapes: launch overhead, not the roofline).
MAX_TOKENS = 128
_PALETTE = ("#d62728", "#1f77b4", "#17becf", "#9467bd", "#8c564b")


@dataclass(frozen=True)
class Curve:
    label: str                    # "this machine (llama.cpp Q4_K_M)", "an H100 at the 7B shapes"
    n: tuple[int, ...]            # [G] tokens in one forward
    relative: tuple[float, ...]   # [G] its cost over one token's
    one_ms: float                 # ms of one token (the curve's unit)
    here: bool = False            # this machine's (drawn first and thickest)

    def __post_init__(self) -> None:
        if len(self.n) != len(self.relative) or not self.n:
            raise ValueError(f"curve {self.label!r}: n and relative need the same, non-zero length")


@dataclass(frozen=True)
class RooflineData:
    curves: tuple[Curve, ...]
    note: str = ""                # the sentence of arithmetic under the title


def curve(profile: HardwareProfile, label: str, here: bool = False) -> Curve:
    n, rel = relative_costs(profile, [x for x in profile.target_n if x <= MAX_TOKENS])
    return Curve(label=label, n=n, relative=rel, one_ms=float(profile.target(1)), here=here)


def roofline_data(here: HardwareProfile | None, elsewhere: Sequence[Elsewhere],
                  here_label: str = "this machine") -> RooflineData:
    """This machine's curve (when measured) beside every shipped one, and the sentence that explains them."""
    curves = ([curve(here, here_label, here=True)] if here is not None else []) + \
        [curve(e.profile, e.label) for e in elsewhere]
    return RooflineData(curves=tuple(curves), note=annotation(here, elsewhere, here_label))


def annotation(here: HardwareProfile | None, elsewhere: Sequence[Elsewhere], here_label: str = "this machine",
               n: int = SHOWN_TOKENS) -> str:
    """One sentence per side, computed: the roofline of the largest shipped model with one (weights over
    the memory rate against n tokens' FLOPs over the peak), and this machine's measured slope."""
    parts = []
    with_roof = [e for e in elsewhere if e.roofline is not None]
    if with_roof:
        e = max(with_roof, key=lambda x: x.roofline.weight_gb)
        parts.append(_memory_bound(e.label, e.roofline, e.profile, n))
    if here is not None:
        parts.append(_measured_slope(here_label, here, n))
    dips = [_dip(e.label, e.profile) for e in elsewhere] + ([_dip(here_label, here)] if here is not None else [])
    parts += [d for d in dips if d]
    return " ".join(parts)


def _dip(label: str, profile: HardwareProfile) -> str:
    """Why a curve falls below 1 (a forward of n tokens measured cheaper than one token's), where it does."""
    n, rel = relative_costs(profile, [x for x in profile.target_n if x <= MAX_TOKENS])
    low = min(range(len(n)), key=lambda i: rel[i])
    if rel[low] >= 0.95:
        return ""
    fp = profile.fingerprint
    kernels = (f" (one token: {fp.single_row_kernel}; several: {fp.multi_row_kernel})"
               if fp is not None and fp.single_row_kernel and fp.multi_row_kernel else "")
    return (f"On {label} {n[low]} tokens cost {rel[low]:.2f}× one: measured, not noise; its forwards of one token and "
            f"of several run on different kernels{kernels}, and the several-row kernel is the faster per forward "
            "there.")


def _memory_bound(label: str, roof: Roofline, profile: HardwareProfile, n: int) -> str:
    bound = "memory" if roof.memory_ms >= roof.compute_ms(n) else "arithmetic"
    ratio = float(profile.target(n)) / float(profile.target(1))
    return (f"On {label} one forward reads {roof.weight_gb:.1f} GB of weights (at least {roof.memory_ms:.1f} ms "
            f"at {roof.memory_tb_s:g} TB/s; measured {float(profile.target(1)):.1f} ms) while {n} tokens need "
            f"{roof.tflop(n):.2f} TFLOP ({roof.compute_ms(n):.1f} ms at {roof.peak_tflops:g} TFLOP/s): {bound} "
            f"sets the pace, and {n} tokens cost {ratio:.2f}× one.")


def _measured_slope(label: str, profile: HardwareProfile, n: int) -> str:
    n = min(n, profile.max_tokens)
    one, many = float(profile.target(1)), float(profile.target(n))
    per_token = (many - one) / max(n - 1, 1)
    # The extra tokens' arithmetic against the one forward's cost, which reading the weights bounds from below.
    pace = "the arithmetic sets the pace" if many - one > one else "memory sets the pace"
    return (f"On {label} one token costs {one:.1f} ms and {n} cost {many:.0f} ms ({many / one:.1f}×): each "
            f"further token adds {per_token:.1f} ms, so {pace}.")


def figure(data: RooflineData) -> go.Figure:
    """Relative cost against tokens (log-log), each machine a curve, "n x one token" dotted for reference."""
    fig = go.Figure()
    all_n = [x for c in data.curves for x in c.n]
    ref = [x for x in (1, 2, 4, 8, 16, 32, 64, 128) if x <= max(all_n, default=0)]
    if ref:
        fig.add_trace(go.Scatter(x=ref, y=ref, mode="lines", name="n × one token (compute-bound)",
                                 line=dict(color="#bbbbbb", dash="dot"), hoverinfo="skip"))
    for i, c in enumerate(data.curves):
        fig.add_trace(go.Scatter(
            x=list(c.n), y=list(c.relative), mode="lines+markers", name=f"{c.label} (1 token: {c.one_ms:.1f} ms)",
            line=dict(color=_PALETTE[i % len(_PALETTE)], width=4 if c.here else 2.5),
            hovertemplate="%{x} tokens: %{y:.2f}× one<extra>" + c.label + "</extra>"))
    note = _wrap(data.note) if data.note else ""
    lines = note.count("<br>") + 1 if note else 0   # the sentence sits between the title and the axes
    height = 460 + 18 * lines + BADGE_PX
    # The title below the plot's label badge (it hid the title's first half), the sentence under the title.
    fig.update_layout(title=dict(text="cost of verifying n tokens, relative to one token", x=0.01,
                                 y=1 - BADGE_PX / height, yanchor="top"),
                      height=height, margin=dict(l=55, r=20, t=BADGE_PX + 50 + 18 * lines, b=45),
                      plot_bgcolor="white", xaxis_title="tokens verified in one forward (n)",
                      yaxis_title="cost / cost of one token", legend=dict(orientation="h", y=-0.2, yanchor="top"))
    if note:
        fig.add_annotation(text=note, xref="paper", yref="paper", x=0.0, y=1.02, xanchor="left", yanchor="bottom",
                           showarrow=False, align="left", font=dict(size=12, color="#333"))
    fig.update_xaxes(type="log", gridcolor="#eee", **log_ticks(all_n))
    fig.update_yaxes(type="log", gridcolor="#eee", **log_ticks([*ref, *(y for c in data.curves for y in c.relative)]))
    return fig


def _wrap(text: str, width: int = 95) -> str:
    """Plotly annotations do not wrap: break the sentence at spaces with <br>."""
    lines, line = [], ""
    for word in text.split():
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}".strip()
    return "<br>".join(lines + [line] if line else lines)
