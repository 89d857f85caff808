"""The price gate: whether drafting pays, judged by what the steps really cost.

The cost model (:mod:`sequoia.core.profiles.cost`) predicts what a step costs; its
errors are what make an automatic method slower than the target alone (on
retrieval prompts of ~740 tokens the dynamic tree accepted 2.2 tokens a call
and decoded at 0.72x the target alone, and nothing noticed).  The gate here
keeps the prediction as a prior and lets measurement win:

* every drafting step's realized ms per token (``StepRecord`` timings over
  its new tokens) feeds a running exponential mean per *level* of drafting;
* every plain step (a root-only tree: the target alone, one token) feeds a
  running mean of its measured time *as a ratio to the profile's price* of a
  plain step at that context.  The estimate of the target alone now is that
  ratio times the profile's price at the current context: the profile gives
  the shape along the context, the measurement its level.  Before any plain
  step is measured the ratio is 1 (the profile alone).

Levels, best first: ``full`` (the method's own trees), ``small`` (trees of at
most :attr:`PriceSettings.small_fraction` of the budget), ``plain`` (no draft).
Once a level has ``min_steps`` steps of evidence and its realized rate falls
below the target alone's times ``1 + margin``, the gate steps down one level
(after measuring the target alone, if no plain step did lately).  After
``probe_after`` steps at a lower level it tries the level above again; each
failed try doubles that interval (up to ``max_probe_after``), a successful one
resets it.  A level that loses clearly (under ``clear_loss`` times the target
alone, beyond what single steps vary) is judged on its first measured step:
each step at a level that does not pay costs the whole loss.  Where trees are
priced to pay but none does (the embedded pair on llama.cpp priced by the HF
runtime's profile: verifying 4 tokens costs 3.5x one there; one thread, CPU
time, AVX-512-BF16 EPYC, 48 tokens) three steps per level and per try left
the declined methods at 1.8-2.1x the target alone's decode time, one step at
1.5-1.7x (the rest: the draft's read of the prompt, and the tries).  A plain
step is spent to measure the target alone when none was measured for
``plain_every`` drafting steps (doubling after each) and the level is in
doubt: it beats the estimate by less than ``doubt``.  Plain steps
taken for any other reason are measurements too.  The first drafting step of
a request, and the first after plain steps, also feeds the draft model the
tokens it has not read; that one-off cost is left out of the evidence: such a
step counts only when its verification alone (a lower bound of what the level
costs) already loses clearly.

:class:`PredictedGate` is the dynamic tree's other gate, by *predicted* costs
(reproducible from a seed); the price gate runs beside it.

Losslessness: the gate chooses only *which tree* is drafted (its budget, or
none), from past steps' records, before the step; verification is unchanged,
so every step's output follows the target's distribution (at T=0 its greedy
choice, up to the bf16 near-ties any tree shape meets).  Decisions read the
engine's clock, so which trees are drafted is not reproducible from a seed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...core.profiles import cost
from ...core.profiles.profile import HardwareProfile
from ...core.statistics.trace import StepRecord

FULL, SMALL, PLAIN = 0, 1, 2
LEVEL_NAMES = ("full", "small", "plain")
#: Longest run of plain target steps the predicted gate (PredictedGate) allows before drafting again to re-check.
MAX_SKIP = 16
#: Context lengths are priced in steps of this many tokens (the profile's curves are interpolated once per bucket).
PRICE_STEP = 64


@dataclass(frozen=True)
class PriceSettings:
    """How the gate weighs evidence; validated once here."""

    alpha: float = 0.3            # weight of the newest step in each running mean
    margin: float = 0.03          # drafting must beat the target alone by this fraction to stay
    min_steps: int = 3            # steps at a level before it is judged (single steps vary by ~15%)
    small_fraction: float = 0.25  # the small level's budget, as a fraction of the method's
    probe_after: int = 4          # steps at a lower level before trying the level above again
    max_probe_after: int = 64
    plain_every: int = 8          # drafting steps between measured plain steps (doubles after each)
    max_plain_every: int = 64
    doubt: float = 1.5            # measure the target alone only while drafting beats it by less than this
    clear_loss: float = 0.67      # a level under this x the target alone is judged on one step (not noise: ~15%)

    def __post_init__(self) -> None:
        for name in ("alpha", "small_fraction", "clear_loss"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and 0.0 < v <= 1.0):
                raise ValueError(f"price gate {name} must be in (0, 1], got {v!r}")
        if not (isinstance(self.margin, (int, float)) and 0.0 <= self.margin < 1.0):
            raise ValueError(f"price gate margin must be in [0, 1), got {self.margin!r}")
        if not (isinstance(self.doubt, (int, float)) and self.doubt >= 1.0):
            raise ValueError(f"price gate doubt must be >= 1, got {self.doubt!r}")
        for name in ("min_steps", "probe_after", "max_probe_after", "plain_every", "max_plain_every"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"price gate {name} must be a positive integer, got {v!r}")
        if self.max_probe_after < self.probe_after or self.max_plain_every < self.plain_every:
            raise ValueError("price gate max_probe_after / max_plain_every must be at least their starting values")


@dataclass
class RunningMean:
    """Exponential means of a step's ms and tokens (a ratio of means: a 1-token step weighs as one step)."""

    ms: float = 0.0
    tokens: float = 0.0
    n: int = 0

    def add(self, ms: float, tokens: float, alpha: float) -> None:
        a = 1.0 if self.n == 0 else alpha
        self.ms = (1 - a) * self.ms + a * ms
        self.tokens = (1 - a) * self.tokens + a * tokens
        self.n += 1

    @property
    def ms_per_token(self) -> float:
        return self.ms / self.tokens if self.tokens > 0 else float("inf")


@dataclass(frozen=True)
class Decision:
    """What the gate chose for one step, and why (shown by the Live tab's tree view)."""

    level: int                    # FULL, SMALL or PLAIN
    reason: str                   # one readable clause
    probe: bool = False           # this step measures: the target alone, or the level above

    @property
    def name(self) -> str:
        return LEVEL_NAMES[self.level]


@dataclass
class PriceGate:
    """Chooses each step's level from the measured cost of past steps (see the module docstring)."""

    profile: HardwareProfile      # the prior: the target alone's price along the context
    settings: PriceSettings = field(default_factory=PriceSettings)

    def __post_init__(self) -> None:
        self.plain = RunningMean()    # measured plain step ms / the profile's price, per step (kept across requests)
        self._prior_cache: tuple[int, float] | None = None
        self.start()

    def start(self) -> None:
        """A new request: drafting evidence is forgotten (prompts differ); the target alone's level is kept."""
        s = self.settings
        self.level = FULL
        self.means = [RunningMean(), RunningMean()]       # [FULL, SMALL] drafting ms and tokens
        self.steps_at_level = 0
        self.probing = False
        self.probe_after = s.probe_after
        self.plain_every = s.plain_every
        self.since_plain = 0
        self.context = 0
        self.lagging = True           # the draft model has not read the prompt yet (see observe)
        self.reason = "drafting: no step measured yet"
        self.decision = Decision(FULL, self.reason)

    # ------------------------------------------------------------------ estimates
    def prior_ms(self, context: int | None = None) -> float:
        """The profile's price of a plain step at ``context`` (default: now), bucketed by PRICE_STEP."""
        context = self.context if context is None else context
        bucket = max(PRICE_STEP, PRICE_STEP * round(context / PRICE_STEP))
        if self._prior_cache is None or self._prior_cache[0] != bucket:
            at = self.profile.at_context(bucket) if self.profile.contexts else self.profile
            self._prior_cache = (bucket, cost.baseline_ms(at))
        return self._prior_cache[1]

    def plain_ms(self) -> float:
        """The target alone's ms per token now: measured level times the profile's shape along the context."""
        ratio = self.plain.ms_per_token if self.plain.n else 1.0
        return ratio * self.prior_ms()

    def speedup(self, level: int) -> float | None:
        """Realized rate of a drafting level over the target alone's (None: not measured at this level)."""
        m = self.means[level]
        return self.plain_ms() / m.ms_per_token if m.n else None

    def budget(self, full: int) -> int:
        """The draft budget of the level decided for this step (0: no draft)."""
        if self.decision.level == PLAIN:
            return 0
        if self.decision.level == SMALL:
            return max(1, round(full * self.settings.small_fraction))
        return full

    # ------------------------------------------------------------------ engine hooks
    def decide(self) -> Decision:
        """The level of the next step (call once per step, before drafting)."""
        if self._may_try_above():
            self._enter(self.level - 1, True, f"trying {LEVEL_NAMES[self.level - 1]} trees again after "
                                              f"{self.steps_at_level} {LEVEL_NAMES[self.level]} steps")
        if self.level < PLAIN and self._wants_plain():
            self.decision = Decision(PLAIN, "measuring the target alone at this context", probe=True)
        else:
            self.decision = Decision(self.level, self.reason, self.probing)
        return self.decision

    def observe(self, record: StepRecord) -> None:
        """Account for the step just decoded (every step, the prompt's forward included).

        A root-only step measures the target alone (its verify and other time: a draft forward that found
        nothing to propose is not the target's).  A step that drafted is evidence for its level, and so is
        a dynamic tree's step whose draft forward found nothing worth verifying (what the level costs); a
        step some other rule kept plain (the predicted gate's skips, no copies found) is not.
        """
        before = self.context
        self.context = (record.prompt_tokens or self.context) + record.n_new
        if record.prompt_tokens:
            return                    # the prompt's forward prices nothing the gate chooses
        level = self.decision.level
        if record.tree.size == 0:
            self._observe_plain(1000.0 * (record.verify_s + record.other_s), self.prior_ms(before))
        drafted = record.tree.size > 0 or (record.dynamic is not None and record.dynamic.gate != "plain")
        if level == PLAIN:
            return
        self.steps_at_level += 1
        if not drafted:
            return
        if self.lagging:
            # The first drafting step of a request, or after plain steps, also feeds the draft model every token
            # it has not read (the prompt: 1.2 s of the first step's 1.6 s at 779 tokens, Xeon AMX, 1 thread):
            # a cost no later choice of tree changes, so it is not evidence of what the level costs.  Its
            # verification alone is a lower bound of the level's cost: a clear loss by that is one.
            self.lagging = False
            if not self._clear_loss(1000.0 * (record.verify_s + record.other_s), record.n_new):
                return
            self.means[level].add(1000.0 * (record.verify_s + record.other_s), record.n_new, self.settings.alpha)
        else:
            self.means[level].add(1000.0 * record.total_s, record.n_new, self.settings.alpha)
        self.since_plain += 1
        self._judge()

    # ------------------------------------------------------------------ decisions
    def _observe_plain(self, ms: float, prior_ms: float) -> None:
        s = self.settings
        self.plain.add(ms / prior_ms, 1.0, s.alpha)
        probe = self.decision.probe and self.decision.level == PLAIN
        if probe:
            self.plain_every = min(2 * self.plain_every, s.max_plain_every)
        self.since_plain = 0
        if self.level == PLAIN:
            self.steps_at_level += 1
        elif probe:
            self._judge()             # the verdict waited for this measurement

    def _clear_loss(self, ms: float, tokens: float) -> bool:
        """Whether a step of ``tokens`` in ``ms`` made under ``clear_loss`` times the target alone's rate."""
        return tokens > 0 and ms > 0 and self.plain_ms() * tokens / ms < self.settings.clear_loss

    def _judged(self, level: int) -> bool:
        """Enough evidence to judge a drafting level: ``min_steps`` steps, or fewer that lose clearly."""
        m = self.means[level]
        return m.n >= self.settings.min_steps or (m.n > 0 and self.speedup(level) < self.settings.clear_loss)

    def _may_try_above(self) -> bool:
        """Time to try the level above: ``probe_after`` steps here, and a drafting level judged first (or found
        to draft nothing, as when the predicted gate skips every step: no evidence would ever come)."""
        if self.level == FULL or self.steps_at_level < self.probe_after:
            return False
        if self.level == PLAIN:
            return True
        return self._judged(self.level) or self.steps_at_level >= self.probe_after + self.settings.min_steps

    def _wants_plain(self) -> bool:
        """Spend a plain step to measure the target alone: none measured lately, and drafting is in doubt on
        enough steps to judge (one slow step among fast ones made a needless plain step in 3 of 6 runs)."""
        if not self._plain_stale() or not self._judged(self.level):
            return False
        return self.speedup(self.level) < self.settings.doubt

    def _plain_stale(self) -> bool:
        return not self.plain.n or self.since_plain >= self.plain_every

    def _judge(self) -> None:
        s, level = self.settings, self.level
        if not self._judged(level):
            return
        rate = self.speedup(level)
        if rate < 1.0 + s.margin:
            if self._plain_stale():
                return                # measure the target alone first: decide() spends a plain step on it
            if self.probing:
                self.probe_after = min(2 * self.probe_after, s.max_probe_after)
            lower = LEVEL_NAMES[level + 1]
            self._enter(level + 1, False, f"backed off to {lower}: {LEVEL_NAMES[level]} trees made {rate:.2f}× "
                                          f"the target alone (measured); next try in {self.probe_after} steps")
        elif self.probing:
            self.probe_after = s.probe_after
            self.probing = False
            self.reason = f"{LEVEL_NAMES[level]} trees pay again: {rate:.2f}× the target alone (measured)"
        else:
            self.reason = f"{LEVEL_NAMES[level]} trees: {rate:.2f}× the target alone (measured)"

    def _enter(self, level: int, probing: bool, reason: str) -> None:
        self.lagging = self.lagging or self.level == PLAIN   # the draft model skipped the plain steps' tokens
        self.level, self.probing, self.reason, self.steps_at_level = level, probing, reason, 0
        if level < PLAIN:
            self.means[level] = RunningMean()   # judge the level on fresh steps


@dataclass
class PredictedGate:
    """The dynamic tree's first gate: skips the draft while drafting steps have been *predicted* not to beat a
    rate (the target alone's + min_gain).

    Evidence is an exponential average of tokens and *predicted* ms of past
    drafting steps (not wall time: decisions stay reproducible from a seed).
    After a losing average it skips 1, 2, 4, ... steps, drafting once in
    between to re-check; a winning average resets it.
    """

    tokens: float = 0.0
    ms: float = 0.0
    backoff: int = 0          # steps to skip after the next failed check
    skip_left: int = 0

    def observe(self, n_new: float, predicted_ms: float, ar_rate: float, alpha: float = 0.3) -> None:
        first = self.ms == 0.0
        self.tokens = n_new if first else (1 - alpha) * self.tokens + alpha * n_new
        self.ms = predicted_ms if first else (1 - alpha) * self.ms + alpha * predicted_ms
        if self.tokens / self.ms < ar_rate:
            self.backoff = min(max(1, 2 * self.backoff), MAX_SKIP)
            self.skip_left = self.backoff
        else:
            self.backoff = 0

    def wants_draft(self) -> bool:
        if self.skip_left > 0:
            self.skip_left -= 1
            return False
        return True
