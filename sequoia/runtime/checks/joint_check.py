"""Is the engine's sampled output distributed as the target's?  A chi-square of two tokens' joint.

For tiny vocabularies (e.g. 8 tokens): decode three tokens ``n`` times with
different seeds.  The first token comes from the prompt's forward (step 0, no
draft), so the tokens that went through a tree are the second and third: their
expected joint is P(x2, x3 | prompt, x1) under the target alone, mixed over the
x1 drawn.  The exact probabilities come from the target runner's own sessions,
so the check runs on any runtime and device.  A broken verifier (the residual
replaced by p, see :func:`broken_residual`) must fail it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from scipy import stats

from ...core.config import GenerationConfig, SamplingConfig
from ...core.verification import sampling as sampling_rule
from ...core.verification.sampling import warp
from ..engine import SpeculativeEngine


def empirical_joint(pair, proposer, sampling: SamplingConfig, prompt: list[int], n: int,
                    device_walk: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Counts of (x2, x3) over ``n`` seeds and the share of each first token.  # [V, V], [V]"""
    vocab = pair.target.vocab_size
    counts, firsts = torch.zeros(vocab, vocab), torch.zeros(vocab)
    engine = SpeculativeEngine(pair, device_walk=device_walk)
    for seed in range(n):
        cfg = GenerationConfig(max_new_tokens=3, sampling=sampling, seed=seed, stop_at_eos=False)
        toks = [t for r in engine.generate(prompt, proposer, cfg) for t in r.new_tokens]
        firsts[toks[0]] += 1
        counts[toks[1], toks[2]] += 1
    return counts, firsts / firsts.sum()


def exact_joint(target, prompt: list[int], sampling: SamplingConfig, firsts: torch.Tensor) -> torch.Tensor:
    """P(x2, x3 | prompt, x1) under the target alone, mixed over ``firsts``.  # [V, V]"""
    vocab = target.vocab_size
    out = torch.zeros(vocab, vocab, dtype=torch.float64)
    for x1, share in enumerate(firsts.tolist()):
        if share > 0:
            out += share * _two_tokens(target, prompt + [x1], sampling)
    return out


def _two_tokens(target, prefix: list[int], sampling: SamplingConfig) -> torch.Tensor:
    """P(x1, x2 | prefix).  # [V, V]"""
    vocab = target.vocab_size
    session = target.session()
    p1 = warp(session.forward(prefix, keep=1)[-1].float(), sampling).double().cpu()
    start = len(session)
    rows = session.forward(list(range(vocab)), [start - 1] * vocab)        # every x1 as a sibling: [V, V]
    p2 = warp(rows.float(), sampling).double().cpu()
    return p1[:, None] * p2


def joint_pvalue(counts: torch.Tensor, exact: torch.Tensor) -> float:
    """Chi-square p-value of ``counts`` against ``exact`` (cells expected below 5 pooled); 0 for an impossible pair."""
    n = counts.sum()
    flat_c, flat_e = counts.flatten().double(), exact.flatten().double() * n
    if flat_c[flat_e == 0].sum() > 0:
        return 0.0
    big = flat_e >= 5
    small = (~big) & (flat_e > 0)
    obs = torch.cat([flat_c[big], flat_c[small].sum()[None]])
    exp = torch.cat([flat_e[big], flat_e[small].sum()[None]])
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    return float(stats.chisquare(obs.numpy(), exp.numpy() * obs.sum().item() / exp.sum().item()).pvalue)


@contextmanager
def broken_residual() -> Iterator[None]:
    """The foil: after a rejection, draw from p itself instead of norm(max(p - q, 0)) (not lossless)."""
    original = sampling_rule._residual
    sampling_rule._residual = lambda p, q, x: p
    try:
        yield
    finally:
        sampling_rule._residual = original
