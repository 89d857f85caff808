"""Calibrating the dynamic tree on a model pair: (q, rank, hit) observations from teacher forcing.

The record and its fit are pure (:mod:`sequoia.core.profiles.calibration`); this module
feeds them.  Both models score a text (:mod:`sequoia.runtime.checks.teacher`): given
tokens (:func:`calibrate`, e.g. chunks of files, fast) or what the target
writes after each prompt (:func:`calibrate_prompts`, faithful; the target's
logits come from its own decoding steps, the draft adds one forward).  At each
position ``width`` children are scored by the library's verification rule
(:func:`outcomes`).  The command line is :mod:`sequoia.tools.calibrate_cli`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import torch

from ..._meta import ProgressFn, library_version, now_iso, pair_name
from ...core.config import SamplingConfig
from ...core.profiles.calibration import Calibration, fit_outcomes
from ...core.verification.sampling import sample_children, verify_rows, warp
from ..checks.teacher import continuation_logits, teacher_logits

LogitPairs = Iterable[tuple[torch.Tensor, torch.Tensor]]  # (p_logits, q_logits), each [L, V]


def calibrate(pair, sequences: Sequence[tuple[list[int], list[int]]], samplings: Sequence[SamplingConfig],
              width: int = 4, seed: int = 0, prompt_set: str = "", progress=None) -> list[Calibration]:
    """One calibration per sampling config, from teacher-forced forwards over given tokens.

    ``sequences`` are (context, scored) token lists: both models run once over
    context + scored, and every position predicting a scored token yields
    ``width`` (q, rank, hit) observations per config (:func:`outcomes`).
    """
    logits = (teacher_logits(pair, context, scored) for context, scored in sequences)
    return fit_logits(pair, logits, len(sequences), samplings, width, seed, prompt_set, progress)


def calibrate_prompts(pair, prompts: Sequence[list[int]], samplings: Sequence[SamplingConfig], max_new_tokens: int,
                      width: int = 4, seed: int = 0, prompt_set: str = "", progress=None) -> list[Calibration]:
    """As :func:`calibrate`, scoring what the target writes (greedily) after each prompt."""
    logits = (continuation_logits(pair, ids, SamplingConfig(), max_new_tokens, None)[1:] for ids in prompts)
    return fit_logits(pair, logits, len(prompts), samplings, width, seed, prompt_set, progress)


def fit_logits(pair, logits: LogitPairs, count: int, samplings: Sequence[SamplingConfig], width: int, seed: int,
               prompt_set: str, progress: ProgressFn | None) -> list[Calibration]:
    """Fit one calibration per sampling config from ``count`` (p_logits, q_logits) pairs."""
    gen = torch.Generator().manual_seed(seed)
    obs: list[list[tuple[np.ndarray, ...]]] = [[] for _ in samplings]
    for i, (p_logits, q_logits) in enumerate(logits):
        for j, sampling in enumerate(samplings):
            obs[j].append(outcomes(p_logits, q_logits, sampling, width, gen))
        if progress is not None:
            progress((i + 1) / count, f"calibration: {i + 1}/{count} sequences")
    out = []
    for sampling, parts in zip(samplings, obs):
        q, r, h = (np.concatenate(x) for x in zip(*parts))
        out.append(fit_outcomes(q, r, h, ranks=width, pair=pair_name(pair), temperature=sampling.temperature,
                                top_p=sampling.top_p, top_k=sampling.top_k, prompt_set=prompt_set,
                                steps=int(len(q) // width), date=now_iso(), version=library_version()))
    return out


def outcomes(p_logits: torch.Tensor, q_logits: torch.Tensor, sampling: SamplingConfig, width: int,
             gen: torch.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(q, rank, hit) of ``width`` children at each position.  logits: [L, V] -> three [L * width]"""
    if p_logits.ndim != 2 or p_logits.shape != q_logits.shape:
        raise ValueError(f"logits must both be [L, V], got {tuple(p_logits.shape)} and {tuple(q_logits.shape)}")
    if sampling.greedy:
        top = torch.topk(torch.softmax(q_logits, -1), width, dim=-1)    # [L, W] as the Drafter sees q
        hit = (top.indices == p_logits.argmax(-1, keepdim=True)).float()
        q_kids = top.values
    else:
        q_all, p_all = warp(q_logits, sampling), warp(p_logits, sampling)
        kids = sample_children(q_all, width, "without_replacement", gen)  # [L, W]
        u = torch.rand(kids.shape, generator=gen)                        # [L, W]
        first = verify_rows(p_all, q_all, kids, u, "without_replacement")  # [L] -1: all rejected
        hit = torch.nn.functional.one_hot(first + 1, width + 1)[:, 1:].float()
        q_kids = q_all.gather(-1, kids)
    rank = torch.arange(width).expand_as(hit)
    return q_kids.numpy().ravel(), rank.numpy().ravel(), hit.numpy().ravel()


def text_sequences(pair, paths: Sequence[str], chunk: int, limit: int | None) -> list[tuple[list[int], list[int]]]:
    """Chunks of text files: the first 16 tokens of a chunk are context, the rest are scored."""
    out = []
    for path in paths:
        ids = pair.tokenizer(Path(path).read_text(errors="ignore"))["input_ids"]
        starts = list(range(0, len(ids) - chunk + 1, chunk))[:limit]
        out.extend((ids[lo: lo + 16], ids[lo + 16: lo + chunk]) for lo in starts)
    return out
