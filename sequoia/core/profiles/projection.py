"""What a run would do on other hardware: its measured acceptance priced by another machine's measured costs.

Acceptance is a property of the two models and the prompt, not of the device: the trees a run drew and the
tokens each step committed would be the same on an H100.  Only what each step costs changes.  For a run's
decoding steps s (the prompt's forward, step 0, excluded) with trees T_s committing k_s tokens,

    rate(profile)  = sum_s k_s / sum_s step_ms(T_s)            tokens per ms
    alone(profile) = 1 / baseline_ms                           the target alone: one token per target(1)

where ``step_ms`` is :func:`sequoia.core.profiles.cost.step_ms` (draft levels, the verify forward of the tree, the
step overhead; a plain step is target(1)) and ``baseline_ms`` is :func:`sequoia.core.profiles.cost.baseline_ms`.
Their ratio is the speedup the run would have there.  The projection uses this machine's acceptance on the
other machine's models (e.g. the 1.5B target's acceptance priced at the 7B shapes), which is what the
GPU check did with the shipped vectors (docs/data/gpu-check-h100.md).

The other machines are shipped profiles under ``assets/projections/`` (format ``sequoia-hardware/2`` with
a ``label`` and, where the card's datasheet is known, a ``roofline``): :func:`shipped_elsewhere` reads them.
A :class:`Roofline` says why a curve is flat or steep: one step reads every weight once
(``weight_gb / memory rate``) while n tokens need ``2 * params * n`` FLOPs (over the arithmetic peak).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..._meta import ASSETS, read_json
from ..statistics.trace import DRAFT, StepRecord
from .cost import baseline_ms, draft_widths, step_ms
from .profile import FORMAT, WHAT, HardwareProfile

#: Where the other machines' profiles are shipped (beside, not in, ``profiles/``: the finder must never pick
#: one of these for this machine).
FOLDER = "projections"


@dataclass(frozen=True)
class Roofline:
    """A target's size and a device's two rates: the two floors of one forward."""

    params_b: float         # target parameters, billions (2 FLOPs per parameter per token)
    bytes_per_param: float  # as stored (bf16: 2)
    memory_tb_s: float      # memory rate, TB/s
    peak_tflops: float      # arithmetic peak at that type, TFLOP/s
    source: str = ""        # where the rates come from

    def __post_init__(self) -> None:
        for name in ("params_b", "bytes_per_param", "memory_tb_s", "peak_tflops"):
            if not float(getattr(self, name)) > 0:
                raise ValueError(f"roofline {name} must be > 0, got {getattr(self, name)!r}")

    @property
    def weight_gb(self) -> float:
        return self.params_b * self.bytes_per_param

    @property
    def memory_ms(self) -> float:
        """ms to read every weight once: the floor of any forward, however few its tokens."""
        return self.weight_gb / self.memory_tb_s     # GB / (TB/s) = ms

    def tflop(self, n: int) -> float:
        """TFLOP of a forward of ``n`` tokens (the matrix products only)."""
        return 2.0 * self.params_b * n / 1e3

    def compute_ms(self, n: int) -> float:
        """ms of the arithmetic of ``n`` tokens at the peak: the other floor."""
        return 1e3 * self.tflop(n) / self.peak_tflops


@dataclass(frozen=True)
class Elsewhere:
    """A machine the project measured and ships: its costs and, where known, its roofline."""

    name: str                       # the file's stem: "h100-7b"
    label: str                      # how a sentence names it: "an H100 at the 7B shapes"
    profile: HardwareProfile
    roofline: Roofline | None = None


@dataclass(frozen=True)
class Projection:
    """A run priced on one machine."""

    label: str
    steps: int                  # decoding steps (target calls after the prompt's forward)
    tokens: int                 # tokens they committed
    step_ms: float              # mean projected ms of one of those steps
    alone_ms: float             # ms of one token of the target alone there

    @property
    def tokens_per_step(self) -> float:
        return self.tokens / self.steps

    @property
    def tokens_per_s(self) -> float:
        return 1e3 * self.tokens_per_step / self.step_ms

    @property
    def alone_tokens_per_s(self) -> float:
        return 1e3 / self.alone_ms

    @property
    def speedup(self) -> float:
        return self.tokens_per_s / self.alone_tokens_per_s


def record_widths(record: StepRecord, catch_up: int = 0) -> tuple[float, ...]:
    """The draft forwards a step's tree needed: none when every node was copied from the context (the n-gram
    proposer then skips the draft model), else the tree's levels (:func:`sequoia.core.profiles.cost.draft_widths`;
    a mixed tree is priced as if the draft had grown all of it, an upper bound), the first feeding ``catch_up``
    committed tokens the draft has not read beside the root (:func:`catch_ups`)."""
    if record.sources and DRAFT not in record.sources:
        return ()
    return draft_widths(record.tree, catch_up)


def record_ms(record: StepRecord, profile: HardwareProfile, catch_up: int = 0) -> float:
    """Projected ms of one step's target call under ``profile`` (a plain step: target(1))."""
    return step_ms(profile, record_widths(record, catch_up), record.tree.n_nodes)


def catch_ups(steps: Sequence[StepRecord]) -> list[int]:
    """Per decoding step, the committed tokens its first draft forward feeds beside the root: the last drafted
    step's accepted leaf, and the roots of the plain steps since (the draft skipped them).  The first drafting step
    of a run reads the prompt: a cost of the run's start, priced by no step, as the prompt's forward is not."""
    out, lag, read = [], 0, False
    for r in steps:
        drafts = bool(record_widths(r))
        out.append(lag if drafts and read else 0)
        if drafts:
            read, lag = True, int(r.ended_on_leaf)
        else:
            lag += 1
    return out


def decoding_steps(records: Iterable[StepRecord]) -> list[StepRecord]:
    """The steps after the prompt's forward (which reads the prompt and is the same for every method)."""
    return [r for r in records if not r.prompt_tokens]


def run_context(records: Sequence[StepRecord]) -> int:
    """Cached tokens half way through the run: where its steps are priced along a profile's contexts."""
    prompt = sum(r.prompt_tokens for r in records)
    return prompt + sum(r.n_new for r in records) // 2


def project(records: Sequence[StepRecord], profile: HardwareProfile, label: str = "") -> Projection | None:
    """The run priced on ``profile`` (None: no decoding step to price)."""
    steps = decoding_steps(records)
    if not steps:
        return None
    prof = profile.at_context(run_context(records))
    total = sum(record_ms(r, prof, c) for r, c in zip(steps, catch_ups(steps)))
    return Projection(label=label or prof.device, steps=len(steps), tokens=sum(r.n_new for r in steps),
                      step_ms=total / len(steps), alone_ms=baseline_ms(prof))


def relative_costs(profile: HardwareProfile,
                   ns: Sequence[int] | None = None) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """(n, target(n) / target(1)) on the profile's own grid (or ``ns``): the roofline picture's curve."""
    grid = tuple(profile.target_n if ns is None else ns)
    one = float(profile.target(1))
    return grid, tuple(float(profile.target(n)) / one for n in grid)


# ------------------------------------------------------------------ shipped machines
def load_elsewhere(path: str | Path) -> Elsewhere:
    """One shipped machine: a hardware profile file with a ``label`` and an optional ``roofline``."""
    path = Path(path)
    data = read_json(path, FORMAT, WHAT)
    label = data.get("label")
    if not isinstance(label, str) or not label:
        raise ValueError(f"{path}: a projection profile needs a 'label' (how a sentence names the machine)")
    roof = data.get("roofline")
    try:
        roofline = Roofline(**roof) if roof is not None else None
    except TypeError as exc:
        raise ValueError(f"{path}: roofline: {exc}") from None
    return Elsewhere(name=path.stem, label=label, profile=HardwareProfile.from_dict(data, str(path)),
                     roofline=roofline)


def shipped_elsewhere(assets_dir: str | Path = ASSETS) -> tuple[Elsewhere, ...]:
    """Every machine under ``assets_dir/projections``, by file name."""
    return tuple(load_elsewhere(p) for p in sorted((Path(assets_dir) / FOLDER).glob("*.json")))
