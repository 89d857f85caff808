"""One step's tree as the dynamic tree grows it, and the two choices it makes level by level.

:class:`_Growth` holds the tree so far; :func:`best_prefix` chooses how many children each frontier node
gets, :func:`choose_expansion` which new nodes get a draft forward (see :mod:`sequoia.runtime.proposers.dynamic`).
Both price with the one cost model (:mod:`sequoia.core.profiles.cost`) under the step's profile.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from ...core.profiles import cost
from ...core.profiles.profile import HardwareProfile

#: Levels of lookahead when pricing the next draft forward.
LOOKAHEAD = 3


@dataclass
class _Growth:
    """The tree so far, in breadth-first order."""

    parents: list[int]
    depths: list[int]
    tokens: list[int]
    q_token: list[float]
    f: list[float]                              # estimated acceptance of each node (root: 1)
    q: dict[int, torch.Tensor]                  # node -> [V] q over its children
    budget: int = 1 << 30                       # most draft tokens this step (the price gate may lower it)
    widths: list[int] = field(default_factory=lambda: [1])  # draft forward widths (begin first)
    # node -> (the draft's probability of its fixed (copied) children's tokens, how many): its drawn children
    # come from q without those tokens and are verified after them, so they are priced below them.
    held: dict[int, tuple[float, int]] = field(default_factory=dict)
    drawn: dict[int, float] = field(default_factory=dict)   # drawn node -> its acceptance before the prompt's scale

    @property
    def size(self) -> int:
        return len(self.parents) - 1

    def add(self, parent: int, token: int, q_token: float, f: float) -> int:
        self.parents.append(parent)
        self.depths.append(self.depths[parent] + 1)
        self.tokens.append(token)
        self.q_token.append(q_token)
        self.f.append(f)
        return len(self.parents) - 1


def best_prefix(g: _Growth, value: torch.Tensor, profile: HardwareProfile) -> torch.Tensor:
    """Children per row: the best-first prefix of all candidates maximising E / cost.  value: [m, k]"""
    flat = value.flatten()
    order = torch.argsort(flat, descending=True, stable=True)
    room = g.budget - g.size
    gains = np.concatenate([[0.0], np.cumsum(flat[order[:room]].numpy(), dtype=np.float64)])  # [J+1]
    j = np.arange(len(gains))
    base = cost.step_ms(profile, g.widths, 1) - float(profile.target(1))
    ms = base + profile.target(g.size + 1 + j)
    rate = (1.0 + sum(g.f[1:]) + gains) / ms
    best = int(np.argmax(rate))
    chosen = torch.zeros(flat.shape[0], dtype=torch.long)
    chosen[order[:best]] = 1
    return chosen.view(value.shape).sum(-1)


def choose_expansion(g: _Growth, level: list[int], profile: HardwareProfile, first_accept: float) -> list[int]:
    """The new nodes worth a draft forward: the best w, w priced over a short lookahead.

    A node's children are predicted to be accepted with probability
    ``next_accept``: half ``first_accept`` (the average first child's), half the
    node's own calibrated confidence (acceptance comes in runs, so a
    confident token tends to be followed by another).  Expanding w nodes
    for L more levels adds about w * L nodes, L draft forwards of width w
    and a larger verification.
    """
    f = np.array([g.f[v] for v in level])                              # [m]
    own = np.array([g.f[v] / max(g.f[g.parents[v]], 1e-12) for v in level])
    nxt = np.clip(0.5 * first_accept + 0.5 * own, 0.0, 1.0)  # [m]
    order = np.argsort(-(f * nxt), kind="stable")
    E = 1.0 + sum(g.f[1:])
    base = cost.step_ms(profile, g.widths, g.size + 1)
    best_rate, best_w = E / base, 0
    room = g.budget - g.size
    w = np.arange(1, len(level) + 1)                                  # [m] candidate widths
    for L in range(1, LOOKAHEAD + 1):
        chain = sum(nxt[order] ** i for i in range(1, L + 1))          # [m] gain of one chain of L
        added = np.minimum(w * L, room)
        gain = np.cumsum(f[order] * chain) * added / (w * L)
        ms = (base + L * (profile.draft(w) + profile.level_overhead_ms)
              + profile.target(g.size + 1 + added) - profile.target(g.size + 1))
        rate = (E + gain) / ms
        i = int(np.argmax(rate))
        if rate[i] > best_rate:
            best_rate, best_w = float(rate[i]), int(w[i])
    return sorted(level[i] for i in order[:best_w])
