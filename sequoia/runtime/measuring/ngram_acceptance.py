"""Measuring how often copied tokens are accepted, by match length and depth, on real decodes.

The record and the fit are :mod:`sequoia.core.ngrams.ngram_acceptance`
(:class:`~sequoia.core.ngrams.ngram_acceptance.NgramAcceptance`,
:func:`~sequoia.core.ngrams.ngram_acceptance.fit_ngram_acceptance`); this module runs the decodes.

Method: the ``ngram`` method (copied continuations only, no draft model) decodes
each prompt with a copy budget and a hardware profile under which verification is
free, so every node of the step's trie (every distinct continuation of every
match, up to ``length`` tokens) is verified.  Decoding is lossless, so the text is
the target's own at the given temperature, and each step record says which copied
nodes were accepted and which match length proposed each.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..._meta import Progress, ProgressFn, library_version, now_iso, pair_name
from ...core.config import GenerationConfig, SamplingConfig
from ...core.ngrams.ngram_acceptance import NgramAcceptance, fit_ngram_acceptance
from ...core.profiles.profile import HardwareProfile
from ...core.statistics.trace import StepRecord
from ..engine import SpeculativeEngine
from ..proposers.ngram_proposer import NgramProposer, NgramSettings

#: The trie searched while measuring: 4 continuations of up to 8 tokens, every node verified.
MEASURE_SETTINGS = NgramSettings(length=8, max_branches=4, max_ngram=4, min_ngram=1, budget=32)


def free_verification() -> HardwareProfile:
    """A stand-in profile where verifying more tokens costs nothing, so the whole trie is always taken."""
    return HardwareProfile.hand_made(target=lambda n: 1.0, draft=lambda w: 1.0, note="free verification")


def ngram_records(pair, prompt_ids: Sequence[list[int]], sampling: SamplingConfig, max_new_tokens: int,
                  settings: NgramSettings = MEASURE_SETTINGS, seed: int = 0,
                  progress: ProgressFn | None = None) -> list[StepRecord]:
    """Step records of ``ngram`` decodes of every prompt (each record carries its nodes' ``match_len``)."""
    engine = SpeculativeEngine(pair)
    proposer = NgramProposer(profile=free_verification(), settings=settings, max_depth=settings.length)
    gen = torch.Generator().manual_seed(seed)
    tick = Progress(len(prompt_ids), progress, "n-gram acceptance")
    out: list[StepRecord] = []
    try:
        for ids in prompt_ids:
            cfg = GenerationConfig(max_new_tokens=max_new_tokens, sampling=sampling,
                                   seed=int(torch.randint(2**31 - 1, (1,), generator=gen)))
            out += engine.generate(ids, proposer, cfg)
            tick(f"{len(out)} steps")
    finally:
        tick.close()
    return out


def measure_ngram_acceptance(pair, prompts: Sequence[str | Sequence[int]], sampling: SamplingConfig,
                             max_new_tokens: int = 48, prompt_set: str = "", chat: bool = True, seed: int = 0,
                             progress: ProgressFn | None = None, max_depth: int = 8) -> NgramAcceptance:
    """The acceptance table of copied tokens on ``prompts`` (texts or token ids) at ``sampling``."""
    if not prompts or max_new_tokens < 1:
        raise ValueError("need at least one prompt and max_new_tokens >= 1")
    if sampling.top_p != 1.0 or sampling.top_k:
        raise ValueError("n-gram acceptance is measured without top-p / top-k")
    ids = [pair.encode_prompt(p, chat=chat) if isinstance(p, str) else [int(t) for t in p] for p in prompts]
    records = ngram_records(pair, ids, sampling, max_new_tokens, seed=seed, progress=progress)
    return fit_ngram_acceptance(
        records, sampling.temperature, max_n=MEASURE_SETTINGS.max_ngram, max_depth=max_depth,
        pair=pair_name(pair), prompt_set=prompt_set, method="decode",
        note=f"ngram decodes, {len(ids)} prompts x {max_new_tokens} tokens, every trie node verified "
             f"(length {MEASURE_SETTINGS.length}, {MEASURE_SETTINGS.max_branches} branches)",
        date=now_iso(), version=library_version())
