"""Teacher forcing: what the target writes, and both models' logits over a text.

The acceptance measurements (:mod:`sequoia.runtime.measuring.acceptance`), the
calibration of the dynamic tree (:mod:`sequoia.runtime.measuring.calibration`) and the
robustness figure all score the same thing: at each position of a text, the
target's distribution p and the draft's q over the next token.  The text is
either what the target itself writes (:func:`target_continuation`, the
contexts real decoding meets) or any given tokens (:func:`teacher_logits`).

Logits are float32 on the CPU, cut to the vocabulary both models share
(:func:`sequoia.runners.base.shared_vocab`).
"""

from __future__ import annotations

from collections.abc import Collection

import torch

from ...core.config import SamplingConfig
from ...core.verification.sampling import sample_token, warp
from ...runners.base import Runner
from ...runners.base import shared_vocab


def target_continuation(runner: Runner, prompt: list[int], sampling: SamplingConfig, max_new: int,
                        gen: torch.Generator | None, eos: Collection[int] = (), vocab: int | None = None,
                        return_logits: bool = False):
    """Plain autoregressive continuation of ``prompt`` by ``runner`` (stops after an ``eos`` token).

    Returns the tokens, and with ``return_logits`` also the logits that
    predicted each of them ([len(tokens), vocab] float32, CPU) -- the target's
    side of teacher forcing without a second forward over the continuation.
    """
    vocab = runner.vocab_size if vocab is None else vocab
    session = runner.session()
    feed = list(prompt)
    out: list[int] = []
    kept: list[torch.Tensor] = []
    for _ in range(max_new):
        logits = session.forward(feed, keep=1)[-1, :vocab]  # [V]
        if return_logits:
            kept.append(logits.float().cpu())
        tok = int(logits.argmax()) if sampling.greedy else sample_token(warp(logits, sampling), gen)
        out.append(tok)
        if tok in eos:
            break
        feed = [tok]
    return (out, torch.stack(kept)) if return_logits else out


def logits_over(runner: Runner, context: list[int], scored: list[int], vocab: int) -> torch.Tensor:
    """Logits predicting each scored token, from one forward over context + scored.  # [len(scored), V] float32"""
    if not context or not scored:
        raise ValueError("teacher forcing needs a non-empty context and scored tokens")
    # The last scored token is never a context.
    return runner.session().forward(context + scored[:-1], keep=len(scored))[:, :vocab].float().cpu()


def teacher_logits(pair, context: list[int], scored: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Target and draft logits at the positions predicting each scored token.  -> two [L, V] float32"""
    vocab = shared_vocab(pair)
    return logits_over(pair.target, context, scored, vocab), logits_over(pair.draft, context, scored, vocab)


def continuation_logits(pair, prompt: list[int], sampling: SamplingConfig, max_new: int,
                        gen: torch.Generator | None) -> tuple[list[int], torch.Tensor, torch.Tensor]:
    """What the target writes after ``prompt`` and both models' logits over it.  -> tokens [L], p, q [L, V]

    The target's logits come from its own decoding steps; the draft's from one forward.
    """
    vocab = shared_vocab(pair)
    eos = set(getattr(pair, "eos_token_ids", ()) or ())
    cont, p_logits = target_continuation(pair.target, prompt, sampling, max_new, gen, eos, vocab,
                                         return_logits=True)
    return cont, p_logits, logits_over(pair.draft, prompt, cont, vocab)
