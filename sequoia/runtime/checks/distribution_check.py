"""The distribution check on a real pair: p and q at a prompt's end, then every rule's trials.

One forward of each model over the prompt gives the target's p and the draft's q
at the position after it, warped with the page's sampling settings exactly as the
engine warps them (:func:`sequoia.core.verification.sampling.warp`); :mod:`sequoia.core.verification.distribution`
does the rest.  The far tails of p and q (1e-3 of the mass) are cut before the
trials (:func:`~sequoia.core.verification.distribution.head_of`), and the test is against the cut p.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

from ...core.config import SamplingConfig
from ...core.verification.distribution import (DEFAULT_CHILDREN, DEFAULT_TRIALS, RULES, RULES_BY_NAME, RuleResult,
                                               check_rule, head_of)
from ...core.verification.sampling import warp
from ...runners.base import shared_vocab
from ..engine import model_lock

MAX_TRIALS = 20000
#: Most children drawn at the root (the tab's slider goes this far).
MAX_CHILDREN = 16


@dataclass
class CheckState:
    """Where a distribution check stands; :func:`iter_check` yields it after each rule."""

    p: torch.Tensor                                   # [V] the target's distribution (tail cut), float64
    q: torch.Tensor                                   # [V] the draft's
    sampling: SamplingConfig
    n: int
    k: int
    results: list[RuleResult] = field(default_factory=list)
    running: str | None = None                        # rule now running (None: done)
    forward_s: float = 0.0                            # the two models' forwards
    seconds: float = 0.0                              # everything so far


def root_distributions(pair, prompt_ids: list[int], sampling: SamplingConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """(p, q) at the position after ``prompt_ids``: one prompt forward of each model, warped.  # [V], [V]"""
    if sampling.greedy:
        raise ValueError("the distribution check needs a temperature above 0 (at 0 both are point masses)")
    vocab = shared_vocab(pair)
    with model_lock(pair):   # the background profiler may be using the same runners
        rows = [runner.session().forward(prompt_ids, keep=1)[-1, :vocab] for runner in (pair.target, pair.draft)]
    return warp(rows[0], sampling).cpu(), warp(rows[1], sampling).cpu()


def iter_check(pair, prompt_ids: list[int], sampling: SamplingConfig, n: int = DEFAULT_TRIALS,
               k: int = DEFAULT_CHILDREN, seed: int = 0, rules=None,
               should_stop: Callable[[], bool] | None = None) -> Iterator[CheckState]:
    """Run the check rule by rule, yielding the state before each rule and once at the end."""
    if not 1 <= int(n) <= MAX_TRIALS:
        raise ValueError(f"trials must be in 1..{MAX_TRIALS}, got {n}")
    if not 1 <= int(k) <= MAX_CHILDREN:
        raise ValueError(f"children must be in 1..{MAX_CHILDREN}, got {k}")
    chosen = [RULES_BY_NAME[r] for r in rules] if rules is not None else list(RULES)
    t0 = time.perf_counter()
    p, q = head_of(*root_distributions(pair, prompt_ids, sampling))
    state = CheckState(p=p, q=q, sampling=sampling, n=int(n), k=int(k), forward_s=time.perf_counter() - t0)
    for i, rule in enumerate(chosen):
        state.running = rule.name
        state.seconds = time.perf_counter() - t0
        yield state
        if should_stop is not None and should_stop():
            break
        # Each rule gets its own stream (seed + index): the rules' verdicts are independent tests.
        state.results.append(check_rule(p, q, rule, state.k, state.n, seed * 1000 + i, should_stop,
                                        time.perf_counter))
    state.running = None
    state.seconds = time.perf_counter() - t0
    yield state


def run_check(pair, prompt_ids: list[int], sampling: SamplingConfig, n: int = DEFAULT_TRIALS,
              k: int = DEFAULT_CHILDREN, seed: int = 0, rules=None) -> CheckState:
    """:func:`iter_check` to its end."""
    for state in iter_check(pair, prompt_ids, sampling, n, k, seed, rules):
        pass
    return state
