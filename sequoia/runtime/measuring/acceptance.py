"""Measured positional acceptance vectors p_1..p_W of a draft/target pair.

p_k is the probability that the k-th child the draft proposes at a node is
the one the target accepts (see :mod:`sequoia.core.trees.dp`).  Two ways to measure it:

``teacher``  The target writes a continuation of each prompt (greedy or
    sampled with the same warping), keeping its logits; one forward of the
    draft over prompt + continuation gives q (:mod:`sequoia.runtime.checks.teacher`).
    Greedy: p_k is the fraction of positions where the target's argmax is the
    draft's k-th ranked token.  Sampling: p_1 = sum_x min(p, q) exactly; for
    k >= 2 a seeded Monte Carlo draws W children without replacement from q
    and runs the residual verification rule of :mod:`sequoia.core.verification.sampling`.
    Continuations are what the target itself writes, so the contexts are
    distributed as in real decoding.
``decode``   Real speculative decoding with a tree whose root has W children;
    p_k comes from the step records (:func:`sequoia.core.statistics.stats.empirical_acceptance`).

For speed the Monte Carlo keeps, per position, the fewest tokens that hold
all but ``tail`` of both p's and q's mass and lumps the rest into one token;
the error this adds to any p_k is at most about ``tail``.  The same Monte
Carlo gives the robustness figure (:func:`rejection_curves`).  The record
itself, :class:`~sequoia.core.profiles.acceptance.AcceptanceVector`, is pure and lives
in :mod:`sequoia.core.profiles.acceptance`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

import torch

from ..._meta import Progress, ProgressFn, library_version, now_iso, pair_name
from ...core.config import SAMPLING_MODES, GenerationConfig, SamplingConfig
from ...core.profiles.acceptance import AcceptanceVector
from ...core.statistics.stats import rank_counts
from ...core.trees.tree import Tree
from ...core.verification.sampling import first_accepted, warp
from ..checks.teacher import continuation_logits
from ..drafter import StaticTreeProposer
from ..engine import SpeculativeEngine

#: How acceptance is measured: teacher-forced target continuations, or real decoding.
MEASURING_WAYS = ("teacher", "decode")


def load_prompts(path: str | Path) -> list[str]:
    """A JSONL prompt set: one ``{"prompt": "..."}`` object per non-empty line."""
    out = []
    for i, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{i}: not valid JSON ({exc})") from exc
        if not isinstance(obj, dict) or not isinstance(obj.get("prompt"), str) or not obj["prompt"].strip():
            raise ValueError(f'{path}:{i}: expected {{"prompt": "<non-empty text>"}}')
        out.append(obj["prompt"])
    if not out:
        raise ValueError(f"{path}: no prompts")
    return out


# ---------------------------------------------------------------------------- measuring
def measure_acceptance(
    pair,
    prompts: Sequence[str | Sequence[int]],
    sampling: SamplingConfig,
    width: int = 16,
    max_new_tokens: int = 64,
    method: str = "teacher",
    generator: torch.Generator | None = None,
    mc_samples: int = 128,
    prompt_set: str = "",
    chat: bool = True,
    tail: float = 1e-4,
    progress: ProgressFn | None = None,
) -> AcceptanceVector:
    """Measure p_1..p_width on ``prompts`` (texts, encoded with ``pair.encode_prompt``, or token ids).

    ``generator`` seeds the continuations, the Monte Carlo and the decoding
    runs (a fixed seed is used without one).
    """
    if method not in MEASURING_WAYS:
        raise ValueError(f"unknown method {method!r}; expected one of {MEASURING_WAYS}")
    if not isinstance(width, int) or width < 1 or not prompts or max_new_tokens < 1 or mc_samples < 1:
        raise ValueError("need width >= 1, at least one prompt, max_new_tokens >= 1 and mc_samples >= 1")
    gen = generator if generator is not None else torch.Generator().manual_seed(0)
    ids = [_encode(pair, p, chat) for p in prompts]
    tick = Progress(len(ids), progress, f"acceptance ({method})")
    try:
        measure = _teacher if method == "teacher" else _decode
        values, stderr, count = measure(pair, ids, sampling, width, max_new_tokens, gen, mc_samples, tail, tick)
    finally:
        tick.close()
    return AcceptanceVector(
        values=values, stderr=stderr, pair=pair_name(pair), temperature=float(sampling.temperature),
        top_p=float(sampling.top_p), top_k=sampling.top_k, prompt_set=prompt_set, positions=count,
        method=method, mc_samples=mc_samples if method == "teacher" and not sampling.greedy else 0,
        date=now_iso(), version=library_version(),
    )


def _encode(pair, prompt, chat: bool) -> list[int]:
    if isinstance(prompt, str):
        prompt = pair.encode_prompt(prompt, chat=chat)
    out = [int(t) for t in (prompt.flatten().tolist() if isinstance(prompt, torch.Tensor) else prompt)]
    if not out:
        raise ValueError("a prompt encoded to no tokens")
    return out


def _teacher(pair, prompts, sampling, width, max_new, gen, mc_samples, tail, tick):
    """Per-position success probabilities of every rank, averaged over all positions."""
    rows = []  # each [L, W]: P(rank-k child is the accepted one) at each position
    for prompt in prompts:
        cont, p_logits, q_logits = continuation_logits(pair, prompt, sampling, max_new, gen)  # [L], [L, V] x 2
        if sampling.greedy:
            rows.append(greedy_rank_hits(p_logits, q_logits, width))
        else:
            rows.append(sampled_rank_probs(warp(p_logits, sampling), warp(q_logits, sampling),
                                           width, mc_samples, gen, tail))
        tick(f"{len(cont)} positions")
    per_pos = torch.cat(rows)  # [positions, W]
    n = per_pos.shape[0]
    values = per_pos.mean(0)
    stderr = per_pos.std(0, unbiased=True) / math.sqrt(n) if n > 1 else torch.zeros_like(values)
    return tuple(values.tolist()), tuple(stderr.tolist()), n


def greedy_rank_hits(p_logits: torch.Tensor, q_logits: torch.Tensor, width: int) -> torch.Tensor:
    """One-hot [L, W]: the target's argmax is the draft's k-th ranked token.  logits: [L, V]"""
    if p_logits.ndim != 2 or p_logits.shape != q_logits.shape:
        raise ValueError(f"logits must both be [L, V], got {tuple(p_logits.shape)} and {tuple(q_logits.shape)}")
    target = p_logits.argmax(-1, keepdim=True)                          # [L, 1]
    rank = (q_logits > q_logits.gather(-1, target)).sum(-1)             # [L] tokens the draft ranks higher
    hits = torch.zeros(p_logits.shape[0], width)
    inside = rank < width
    hits[inside.nonzero()[:, 0], rank[inside]] = 1.0
    return hits


def sampled_rank_probs(p: torch.Tensor, q: torch.Tensor, width: int, samples: int,
                       gen: torch.Generator, tail: float = 1e-4) -> torch.Tensor:
    """P(rank-k child is the first accepted) at each position.  p, q: [L, V] -> [L, W].

    Rank 1 is exact (sum_x min(p, q)); ranks >= 2 are (1 - p_1) times the Monte Carlo
    frequency of rank k among the draws whose first child was rejected.
    """
    if p.ndim != 2 or p.shape != q.shape:
        raise ValueError(f"p and q must both be [L, V], got {tuple(p.shape)} and {tuple(q.shape)}")
    out = torch.zeros(p.shape[0], width)
    out[:, 0] = torch.minimum(p, q).sum(-1)
    if width > 1:
        for lo in range(0, p.shape[0], 16):  # chunks bound the [rows * samples, kept] working set
            ps, qs = truncate_tail(p[lo:lo + 16], q[lo:lo + 16], tail)
            first = first_accepted(ps.repeat_interleave(samples, 0), qs.repeat_interleave(samples, 0), width,
                                   "without_replacement", gen)                # [rows * S]
            hits = torch.nn.functional.one_hot(first + 1, width + 1)[:, 2:].float()  # [rows*S, W-1] ranks >= 2
            hits = hits.view(ps.shape[0], samples, width - 1).sum(1)                 # [rows, W-1]
            rejected = (first != 0).view(ps.shape[0], samples).sum(1, keepdim=True)  # [rows, 1]
            # P(rank k) = P(rank 1 rejected) * P(rank k | rank 1 rejected): the exact first factor
            # times a Monte Carlo ratio keeps every row's total <= 1.
            out[lo:lo + 16, 1:] = (1.0 - out[lo:lo + 16, :1]) * hits / rejected.clamp(min=1)
    return out


def truncate_tail(p: torch.Tensor, q: torch.Tensor, tail: float,
                  keep_at_least: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Keep the fewest top tokens (by p + q, at least ``keep_at_least``) holding all but ``tail`` of both
    rows' mass; lump the rest into one last token.  p, q: [L, V] -> [L, m+1]"""
    both = p + q                                                        # [L, V]
    order = both.argsort(-1, descending=True)
    mass = both.gather(-1, order).cumsum(-1)                            # [L, V]
    m = max(int((mass < 2.0 * (1.0 - tail)).sum(-1).max()) + 1, keep_at_least)
    idx = order[:, : min(m, p.shape[-1])]                               # [L, m]
    ps, qs = p.gather(-1, idx), q.gather(-1, idx)
    ps = torch.cat([ps, (1.0 - ps.sum(-1, keepdim=True)).clamp(min=0.0)], -1)
    qs = torch.cat([qs, (1.0 - qs.sum(-1, keepdim=True)).clamp(min=0.0)], -1)
    return ps / ps.sum(-1, keepdim=True), qs / qs.sum(-1, keepdim=True)


def rejection_curves(p_logits: torch.Tensor, q_logits: torch.Tensor, temperature: float, children: Sequence[int],
                     samples: int, gen: torch.Generator, tail: float = 1e-4, chunk: int = 8,
                     max_elements: int = 1 << 22) -> dict[str, list[float]]:
    """Mode -> average P(all k children rejected) for each k in ``children`` (the Sequoia paper's robustness
    figure).  logits: [L, V].

    The first k of K = max(children) children drawn are a valid draw of k children in every mode, so one
    Monte Carlo run of :func:`sequoia.core.verification.sampling.first_accepted` per mode gives the whole curve.
    ``chunk`` positions are truncated together; ``max_elements`` (rows x kept tokens) bounds memory.
    """
    if p_logits.ndim != 2 or p_logits.shape != q_logits.shape:
        raise ValueError(f"logits must both be [L, V], got {tuple(p_logits.shape)} and {tuple(q_logits.shape)}")
    cfg = SamplingConfig(temperature=temperature)
    k_max = max(children)
    rejected = {mode: torch.zeros(len(children)) for mode in SAMPLING_MODES}
    for lo in range(0, p_logits.shape[0], chunk):
        p, q = truncate_tail(warp(p_logits[lo:lo + chunk], cfg), warp(q_logits[lo:lo + chunk], cfg), tail, k_max + 1)
        rows = torch.arange(p.shape[0]).repeat_interleave(samples)     # [positions * samples] -> position
        step = max(1, max_elements // p.shape[1])
        for mode in SAMPLING_MODES:
            for r0 in range(0, rows.numel(), step):
                sel = rows[r0:r0 + step]
                first = first_accepted(p[sel], q[sel], k_max, mode, gen)   # [len(sel)]
                for j, k in enumerate(children):
                    rejected[mode][j] += ((first < 0) | (first >= k)).float().sum()
    total = p_logits.shape[0] * samples
    return {mode: (v / total).tolist() for mode, v in rejected.items()}


def _decode(pair, prompts, sampling, width, max_new, gen, mc_samples, tail, tick):
    """Real speculative decoding with a root of ``width`` children (one verified parent per step)."""
    engine = SpeculativeEngine(pair)
    proposer = StaticTreeProposer(Tree.k_ary(width, 1), name="acceptance")
    records = []
    for prompt in prompts:
        seed = int(torch.randint(2**31 - 1, (1,), generator=gen))
        cfg = GenerationConfig(max_new_tokens=max_new, sampling=sampling, seed=seed)
        records.extend(engine.generate(prompt, proposer, cfg))
        tick(f"{len(records)} steps")
    accepts, parents = rank_counts(records, width)
    values = tuple(a / n if n else 0.0 for a, n in zip(accepts, parents))
    stderr = tuple(math.sqrt(v * (1 - v) / n) if n else 0.0 for v, n in zip(values, parents))
    return values, stderr, parents[0]
