"""A tree that adapts to the draft's confidence every step (``sequoia-dynamic``).

The static Sequoia tree is fixed in advance from an *average* acceptance
vector.  Acceptance is bursty (long runs of easy tokens, then hard ones), so
this proposer grows each step's tree from the draft's own probabilities:

* the estimated acceptance of a node is f(v) = product along its path of
  a(q, rank) (:mod:`sequoia.core.profiles.calibration`), the same quantity the DP maximises;
* a step is priced by the one cost model (:func:`sequoia.core.profiles.cost.step_ms`:
  measured overheads + sum_levels draft(width) + target(n + 1) ms under a
  :class:`~sequoia.core.profiles.profile.HardwareProfile`, exactly as the static
  optimizer prices it) and is predicted to yield E = 1 + sum f(v) tokens;
* level by level (one draft forward per level), it first chooses how many
  children each frontier node gets, best-first over the whole level, keeping
  the prefix of candidates that maximises E / cost; then it chooses which of
  the new nodes to forward for the next level, by a short lookahead that
  prices the draft forward and the larger verification against the expected
  gain; it stops when no level pays for itself, or at the budget or depth cap.

Before a step, a gate (``wants_draft``, an engine hook) may skip drafting
altogether: never when no chain could beat the target alone under the
profile (a compute-bound target verifying k tokens for k times the price of
one), and for a while after drafting steps were predicted not to beat the
target alone by ``min_gain`` (10%: the cost model's error).  With ``price``
set (as :func:`~sequoia.runtime.methods.make_method` does), the price gate
(:mod:`sequoia.runtime.proposers.price`) also judges the steps by their measured cost
against the measured target alone and backs off to smaller trees, then to
plain steps, whose records carry its decision (``DynamicInfo.gate``).

Losslessness (see :mod:`sequoia.core.verification.sampling`): verification is the library's,
unchanged.  At temperature > 0 a node's *number* of children must not depend
on the values of the children it draws (a child included only because it
came out likely would bias the draw).  So the child count of a node is
decided from the node's q distribution (its sorted probabilities) and from
other nodes' draws, which are independent of its children's Gumbel noise;
the children are then the first k of one draw without replacement.  At
temperature 0 every choice is exact anyway (a child is accepted iff it is
the target's argmax).

Each :class:`~sequoia.runtime.drafter.Draft` carries a
:class:`~sequoia.core.statistics.trace.DynamicInfo`: what was added and pruned against the
static DP tree of the same size (nodes matched by their path of sibling ranks),
the predicted tokens and ms of the step, and the draft forward widths.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import torch

from ...core.profiles import cost
from ...core.profiles.calibration import Calibration
from ...core.profiles.profile import HardwareProfile
from ...core.statistics.trace import DynamicInfo, StepRecord
from ...core.trees.dp import DPResult, optimal_tree
from ...core.trees.optimizer import choose_tree
from ...core.trees.tree import Tree
from ..drafter import Draft, Drafter, Proposer
from .growth import _Growth, best_prefix, choose_expansion
from .price import PLAIN, Decision, PredictedGate, PriceGate, PriceSettings
from .prompt_fit import PromptFit

#: Per-token acceptance of the most confident draft the gate prices (``can_pay``).  Not 1: priced as if every
#: token were accepted, a deep chain pays wherever verifying many tokens costs less than that many steps,
#: and on llama.cpp's AVX2 costs (one token 77 ms, 32 tokens 869 ms: no tree pays at the acceptance measured
#: here) the gate then kept re-checking with drafts that lost: 0.79-0.84x the target alone (bench, 48 tokens).
CONFIDENT = 0.95
#: Default depth cap.  The tree stops deepening by itself once a level no longer pays; the cap only binds on
#: runs the draft gets all right.  Held-out code, T=0, 64 tokens (AVX-512-BF16 CPU, two runs each): cap 16
#: took 55 target calls and 33.3-38.4 s for five prompts, 24 took 54 calls and 30.4-31.2 s, 32 the same
#: calls and 31.5 s (HF assisted drafts up to 20 tokens a call).
MAX_DEPTH = 24


#: Context lengths are priced in steps of this many tokens (see DynamicTreeProposer._price_at).
CONTEXT_STEP = 64


@dataclass
class DynamicTreeProposer(Proposer):
    """Grows each step's tree from the draft's confidence under a hardware cost model."""

    profile: HardwareProfile          # prices every step (sequoia.core.profiles.cost); conservative_profile() drafts nothing
    calibration: Calibration = field(default_factory=Calibration.identity)
    budget: int = 48                  # most draft tokens per step (the target verifies budget + 1)
    max_depth: int = MAX_DEPTH
    max_children: int = 8             # most children of one node
    acceptance: tuple[float, ...] = (0.797, 0.104, 0.048, 0.020, 0.010, 0.005)  # prior: p_1 prices lookahead
    min_gain: float = 0.1             # "pays" means beats the target alone by this much (can_pay and the gate)
    gate: bool = True                 # skip drafting while it has been predicted not to pay
    price: PriceSettings | None = None  # judge steps by their measured cost too (None: by predictions alone)
    fit: bool = True                  # scale acceptance estimates by what verification saw (PromptFit)
    mode: str = "without_replacement"
    name: str = "sequoia-dynamic"

    def __post_init__(self) -> None:
        if not isinstance(self.budget, int) or self.budget < 1:
            raise ValueError(f"budget must be a positive integer, got {self.budget!r}")
        if not (0.0 <= self.min_gain < 10.0):
            raise ValueError(f"min_gain must be in [0, 10), got {self.min_gain!r}")
        if not isinstance(self.max_depth, int) or self.max_depth < 1:
            raise ValueError(f"max_depth must be a positive integer, got {self.max_depth!r}")
        self._static_cache: dict[int, Tree] = {}
        self._gate = PredictedGate()
        self._measured = self.profile     # with its curves at every measured context length
        self._context = 0                 # committed tokens so far in this generation
        self._priced_at = self.profile.context_len
        self._price = PriceGate(self.profile, self.price) if self.price is not None else None
        self._decision: Decision | None = None   # the price gate's choice for the step being drafted
        self._fit = PromptFit()
        self._drawn: dict[int, float] = {}       # the step being verified: drawn node -> unscaled acceptance

    #: Cached properties computed from the prices (cleared when the context's prices change).
    _PRICED = ("can_pay", "gate_prior", "tree")

    # ------------------------------------------------------------------ pricing by context
    def _price_at(self, context: int) -> None:
        """Price steps with the curves at ``context`` cached tokens (rounded to CONTEXT_STEP, so prices change
        a few times a generation, not every step): what a step costs grows with the context it runs at."""
        bucket = max(CONTEXT_STEP, CONTEXT_STEP * round(context / CONTEXT_STEP))
        if not self._measured.contexts or bucket == self._priced_at:
            return
        self.profile = self._measured.at_context(bucket)
        self._priced_at = bucket
        self._static_cache.clear()
        for name in self._PRICED:   # cached from the old prices
            self.__dict__.pop(name, None)

    # ------------------------------------------------------------------ engine hooks
    def start(self) -> None:
        """A new generation: the gate forgets its evidence and starts from the prior (:attr:`gate_prior`).

        The prior is judged as an observed step is: where the workload's static tree is not predicted to beat
        the target alone by ``min_gain`` (chat on a CPU where verifying a few tokens costs 1.5-2 plain steps),
        the first step after the prompt's forward is a plain target step, and the draft model's prefill of the
        prompt waits for the first step that drafts.
        """
        self._context = 0
        self._price_at(self._measured.context_len)
        self._restart_gate()
        self._decision = None
        self._fit.start()
        self._drawn = {}
        if self._price is not None:
            self._price.start()

    def _restart_gate(self) -> None:
        self._gate = PredictedGate()
        if self.can_pay:   # else the gate is never asked (_predicted_draft): no DP for its prior
            tokens, ms = self.gate_prior
            self._gate.observe(tokens, ms, self._paying_rate)

    @property
    def _paying_rate(self) -> float:
        """Tokens per ms a drafting step must beat: the target alone's, plus ``min_gain``.

        Not merely the target alone's: a drafting step's predicted ms ran ~9% under its measured time on
        held-out chat prompts (2-vCPU AMD EPYC, AVX-512-BF16; single steps vary by 15% there), so drafting that
        only breaks even by the prediction loses in fact.
        """
        return (1.0 + self.min_gain) / cost.baseline_ms(self.profile)

    @cached_property
    def gate_prior(self) -> tuple[float, float]:
        """(tokens, predicted ms) of the step the acceptance prior expects: the optimizer's static tree.

        The gate's average starts here, worth one observed step, so one hard step
        (often the first: a chat answer's opening words) does not stop the draft
        by itself; steps that keep losing still do.  Measured on held-out code
        (AVX-512-BF16 CPU), an empty start cost three plain target steps in 15
        after the first step accepted nothing.
        """
        budget = min(self.budget, self.profile.max_tokens - 1)
        choice = choose_tree(self.acceptance, self.profile, max_budget=budget, max_depth=min(self.max_depth, 64))
        return choice.expected_tokens, choice.cost.total_ms

    def observe(self, record: StepRecord) -> None:
        self._context = (record.prompt_tokens or self._context) + record.n_new
        if record.prompt_tokens:      # the prompt's forward: the gate starts from the prior at this context
            before = self._priced_at
            self._price_at(self._context)
            if self._priced_at != before:
                self._restart_gate()
        else:
            self._price_at(self._context)
        if self._price is not None:
            self._price.observe(record)
        # A drafting step feeds the predicted gate (skipped steps and the price gate's plain ones predict nothing).
        if record.dynamic is not None and record.dynamic.gate != "plain":
            self._gate.observe(record.n_new, record.dynamic.predicted_ms, self._paying_rate)
        if self._drawn and not record.prompt_tokens:
            self._fit.observe(record, self._drawn)
        self._drawn = {}

    @property
    def scale(self) -> float:
        """This generation's factor on every acceptance estimate (:mod:`sequoia.runtime.proposers.prompt_fit`; 1: off)."""
        return self._fit.scale if self.fit else 1.0

    def wants_draft(self) -> bool:
        """The price gate decides first (its plain steps are root-only proposals that carry its reason); then
        the predicted gate."""
        self._decide_price()
        return self._priced_plain or self._predicted_draft()

    def _decide_price(self) -> None:
        self._decision = self._price.decide() if self._price is not None else None

    def wants_draft_model(self) -> bool:
        return not self._priced_plain

    @property
    def _priced_plain(self) -> bool:
        return self._decision is not None and self._decision.level == PLAIN

    def _predicted_draft(self) -> bool:
        """Whether the prediction says draft (the predicted gate's skip counter moves: call once a step)."""
        if not self.gate:
            return True
        return self.can_pay and self._gate.wants_draft()

    def _step_budget(self, full: int) -> int:
        return self._price.budget(full) if self._price is not None else full

    def _priced_plain_draft(self, drafter: Drafter) -> Draft:
        """The price gate's plain step: the root alone, with its decision for the record."""
        d = self._decision
        info = DynamicInfo(static_tree_parents=(-1,), added=(), pruned=(), predicted_tokens=1.0,
                           predicted_ms=cost.baseline_ms(self.profile), widths=(), gate=d.name, gate_note=d.reason)
        return Draft(tree=Tree.root_only(), tokens=[drafter.root_token], q={}, q_token=[1.0], dynamic=info)

    @cached_property
    def can_pay(self) -> bool:
        """Whether some chain from a confident draft (each token accepted with probability :data:`CONFIDENT`)
        beats the target alone by more than ``min_gain``.

        When even that loses (verification as dear per token as a plain step, as
        for a compute-bound target), the gate never drafts: plain target steps.
        A gain below ``min_gain`` (10%) is within the cost model's error (predicted
        vs measured step times differ by up to ~15%) and would be eaten by the
        steps the gate spends finding out.
        """
        ar_rate = 1.0 / cost.baseline_ms(self.profile)
        best = max(sum(CONFIDENT ** i for i in range(L + 1)) / self.step_ms([1] * L, L + 1)
                   for L in range(1, self.max_depth + 1))
        return best > ar_rate * (1.0 + self.min_gain)

    @property
    def max_nodes(self) -> int:
        """Largest tree the target may verify (root included)."""
        return self.budget + 1

    @cached_property
    def tree(self) -> Tree:
        """The static prior: the DP tree of the full budget (a teaching view; steps draft their own trees)."""
        return self.static_tree(self.budget)

    # ------------------------------------------------------------------ propose
    def propose(self, drafter: Drafter, generator) -> Draft:
        if self._priced_plain:
            return self._priced_plain_draft(drafter)
        g = _Growth(parents=[-1], depths=[0], tokens=[drafter.root_token], q_token=[1.0], f=[1.0],
                    q={0: drafter.root_q}, budget=self._step_budget(self.budget))
        frontier = [0]
        for depth in range(1, self.max_depth + 1):
            level = self._add_children(g, frontier, drafter, generator)
            if not level or depth == self.max_depth or g.size >= g.budget:
                break
            frontier = self._choose_expansion(g, level)
            if not frontier:
                break
            rows = drafter.expand(frontier, g.parents, g.depths, g.tokens)
            g.q.update(zip(frontier, rows))
            g.widths.append(len(frontier))
        tree = Tree(tuple(g.parents))
        q = {v: g.q[v] for v in range(tree.n_nodes) if tree.children[v]}
        return Draft(tree=tree, tokens=g.tokens, q=q, q_token=g.q_token,
                     dynamic=self._annotate(tree, g))

    # ------------------------------------------------------------------ costs
    def step_ms(self, widths, n_nodes: int) -> float:
        """Predicted ms of a step with these draft widths and a target forward of n_nodes tokens (the cost model's)."""
        return cost.step_ms(self.profile, widths, n_nodes)

    def _add_children(self, g: _Growth, frontier: list[int], drafter: Drafter, generator) -> list[int]:
        """Choose child counts from each frontier node's q, draw the children; return the new nodes."""
        rows = torch.stack([g.q[u] for u in frontier])                   # [m, V]
        k = min(self.max_children, g.budget - g.size, rows.shape[-1])
        top = torch.topk(rows, k, dim=-1).values                           # [m, k] sorted q
        f_u = torch.tensor([g.f[u] for u in frontier])                    # [m]
        # Under fixed children the calibration sees the draft's own probability of a drawn token (q without
        # the fixed tokens, times what they leave) at its rank behind them: the draft agreeing with a copy
        # makes its next choice unlikely, not likely.
        held = [g.held.get(u, (0.0, 0)) for u in frontier]
        keep = torch.tensor([1.0 - m for m, _ in held])[:, None]          # [m, 1]
        shift = torch.tensor([c for _, c in held])[:, None]               # [m, 1]
        scale = self.scale
        value = f_u[:, None] * scale * self.calibration.accept(top.cpu() * keep, torch.arange(k)[None] + shift)
        value = torch.cummin(value, dim=-1).values                         # children are a prefix of ranks
        counts = self._best_prefix(g, value)                               # [m]
        if int(counts.max()) == 0:
            return []
        live = counts > 0
        rows = rows[live.to(rows.device)]
        drawn = drafter.sample(rows, int(counts.max()), self.mode, generator)        # [m', kmax]
        q_drawn = rows.gather(-1, drawn)                                              # [m', kmax]
        a = self.calibration.accept(q_drawn.cpu() * keep[live],
                                    torch.arange(drawn.shape[1])[None] + shift[live])
        new = []
        for u, c, toks, qs, acc in zip(np.array(frontier)[live.numpy()].tolist(), counts[live].tolist(),
                                       drawn.tolist(), q_drawn.tolist(), a.tolist()):
            for r in range(c):
                new.append(g.add(u, toks[r], qs[r], g.f[u] * scale * acc[r]))
                g.drawn[new[-1]] = acc[r]
        self._drawn = g.drawn
        return new

    def _best_prefix(self, g: _Growth, value: torch.Tensor) -> torch.Tensor:
        return best_prefix(g, value, self.profile)

    def _choose_expansion(self, g: _Growth, level: list[int]) -> list[int]:
        prior = self.calibration.acceptance or self.acceptance
        return choose_expansion(g, level, self.profile, self.scale * (float(prior[0]) if prior else 0.0))

    # ------------------------------------------------------------------ static comparison
    def static_tree(self, n: int) -> Tree:
        """The static DP tree of at most n draft tokens (cached per n)."""
        if n not in self._static_cache:
            self._static_cache[n] = self._dp.tree(min(n, self.budget))
        return self._static_cache[n]

    @cached_property
    def _dp(self) -> DPResult:
        return optimal_tree(self.acceptance, self.budget, min(self.max_depth, 64))

    def _annotate(self, tree: Tree, g: _Growth) -> DynamicInfo:
        static = self.static_tree(tree.size) if tree.size else Tree.root_only()
        dyn_paths, static_paths = tree.rank_paths(), static.rank_paths()
        static_set, dyn_set = set(static_paths), set(dyn_paths)
        return DynamicInfo(
            static_tree_parents=tuple(static.parents),
            added=tuple(v for v, key in enumerate(dyn_paths) if v and key not in static_set),
            pruned=tuple(v for v, key in enumerate(static_paths) if v and key not in dyn_set),
            predicted_tokens=1.0 + float(sum(g.f[1:])),
            predicted_ms=self.step_ms(g.widths, tree.n_nodes),
            widths=tuple(g.widths),
            gate=self._decision.name if self._decision is not None else "",
            gate_note=self._decision.reason if self._decision is not None else "",
        )
