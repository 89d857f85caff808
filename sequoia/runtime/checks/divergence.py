"""Where and why a speculative output left the target alone's at T=0.

At temperature 0 every method must print the target's greedy output; when one
does not, the cause is nearly always a near-tie that the target's two kernels
break differently (see :mod:`sequoia.runtime.checks.exactness`): the target alone ran
that position as a one-row forward, verification as a many-row forward.  This
module finds the first differing position and measures, with the target itself,
the top two logits there under each kernel:

* **one-row**: the prompt's forward, then one forward per token of the target
  alone's text up to the position (exactly what the target alone ran);
* **many-row**: the prompt's forward, then ONE forward of the same tokens (what
  verification runs; a chain stands in for the step's tree, whose rows see the
  same ancestors).

Both read the same prefix, so a different argmax there is the kernels' doing.

The largest difference between the two kernels' logits over the shared prefix
is the measured **kernel gap**.  A divergence is a **near-tie** when the target
alone's token leads the method's by no more than :data:`SAFETY` times twice
that gap (the bound :func:`sequoia.runtime.checks.exactness.certify` uses the other
way round), or when the two kernels already pick differently on the replay:
then both texts are greedy decodes of the target, and exact mode certifies it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from .exactness import SAFETY, many_row_logits, one_row_logits, top2_margin


def first_divergence(reference: Sequence[int], other: Sequence[int]) -> int | None:
    """The first index where the two token sequences differ (a length difference counts); None if equal."""
    for i, (a, b) in enumerate(zip(reference, other)):
        if a != b:
            return i
    return None if len(reference) == len(other) else min(len(reference), len(other))


@dataclass(frozen=True)
class KernelView:
    """The target's logits at the diverging position under one kernel."""

    kernel: str                 # "one-row" | "many-row"
    argmax: int
    margin: float               # top logit minus the second
    lead: float                 # logit of the target alone's token minus that of the method's token

    def picks(self, token: int) -> bool:
        return self.argmax == token


@dataclass(frozen=True)
class Divergence:
    """The first position where a method's output left the target alone's, and the target's numbers there."""

    method: str
    position: int               # index into the generated tokens
    reference_token: int | None  # the target alone's token (None: its output ended before)
    other_token: int | None
    reference_text: str
    other_text: str
    context: str                # the text just before the position (the shared prefix's tail)
    one_row: KernelView | None  # None where a token is missing (one output is longer)
    many_row: KernelView | None
    gap: float = 0.0            # largest |one-row - many-row| logit over the shared prefix's rows

    @property
    def near_tie(self) -> bool:
        """The flip is within the kernels' measured difference: a rounding near-tie, not a wrong token."""
        if self.one_row is None or self.many_row is None:
            return False
        return self.kernels_disagree or abs(self.one_row.lead) <= SAFETY * 2 * self.gap

    @property
    def kernels_disagree(self) -> bool:
        """The two kernels pick different tokens here: the flip is a rounding near-tie."""
        return (self.one_row is not None and self.many_row is not None
                and self.one_row.argmax != self.many_row.argmax)


def kernel_views(one: torch.Tensor, many: torch.Tensor, ref_tok: int, other_tok: int) -> tuple[KernelView, KernelView]:
    """Both kernels' views of one position from their logits rows [V] each (pure: used with forced logits)."""
    if one.ndim != 1 or one.shape != many.shape:
        raise ValueError(f"one-row and many-row logits must be [V] each, got {tuple(one.shape)}, {tuple(many.shape)}")

    def view(name: str, row: torch.Tensor) -> KernelView:
        row = row.float()
        return KernelView(name, int(row.argmax()), float(top2_margin(row[None])[0]),
                          float(row[ref_tok] - row[other_tok]))

    return view("one-row", one), view("many-row", many)


def explain(target, tokenizer, prompt_ids: list[int], reference: Sequence[int], other: Sequence[int],
            method: str, vocab: int, context_tokens: int = 6) -> Divergence | None:
    """The first divergence of ``other`` from ``reference`` (the target alone's tokens), measured on the
    ``target`` runner.

    Costs one forward per token up to the position (the one-row replay) plus one many-row forward.
    None when the outputs are equal.
    """
    i = first_divergence(reference, other)
    if i is None:
        return None
    ref_tok = reference[i] if i < len(reference) else None
    oth_tok = other[i] if i < len(other) else None
    one_v = many_v = None
    gap = 0.0
    if ref_tok is not None and oth_tok is not None:
        prefix = list(reference[:i])
        one = one_row_logits(target, prompt_ids, prefix, vocab)  # [i + 1, V]
        # The method's token as one more row keeps the forward many-row even at position 1 (its own row is unused).
        many = many_row_logits(target, prompt_ids, prefix + [oth_tok], vocab)[: i + 1]
        gap = float((one - many).abs().max())
        one_v, many_v = kernel_views(one[i], many[i], ref_tok, oth_tok)

    def text(tok: int | None) -> str:
        return "(end of output)" if tok is None else tokenizer.decode([tok])

    return Divergence(method=method, position=i, reference_token=ref_tok, other_token=oth_tok,
                      reference_text=text(ref_tok), other_text=text(oth_tok),
                      context=tokenizer.decode(list(reference[max(0, i - context_tokens):i])),
                      one_row=one_v, many_row=many_v, gap=gap)


def explain_all(target, tokenizer, prompt_ids: list[int], reference: Sequence[int],
                others: dict[str, Sequence[int]], vocab: int) -> list[Divergence]:
    """:func:`explain` for every method that differs; methods diverging at the same position with the
    same token share one measurement."""
    out: list[Divergence] = []
    seen: dict[tuple[int, int | None], Divergence] = {}
    for method, tokens in others.items():
        i = first_divergence(reference, tokens)
        if i is None:
            continue
        key = (i, tokens[i] if i < len(tokens) else None)
        if key in seen:
            d = seen[key]
            out.append(replace(d, method=method))
            continue
        d = explain(target, tokenizer, prompt_ids, reference, tokens, method, vocab)
        seen[key] = d
        out.append(d)
    return out
