"""The first divergence of each method from the target alone at T=0, in Markdown.

Pure: :class:`sequoia.runtime.checks.divergence.Divergence` values in, text out.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    # Views load no model code (tests/core/test_request.py): the types are for the reader only.
    from sequoia.runtime.checks.divergence import Divergence, KernelView


def _tok(text: str) -> str:
    return f"`{text!r}`"


def _kernel(v: KernelView, d: Divergence, what: str) -> str:
    picked = d.reference_text if v.argmax == d.reference_token else d.other_text if v.argmax == d.other_token \
        else f"token {v.argmax}"
    lead = f"{_tok(d.reference_text)} leads {_tok(d.other_text)} by {v.lead:+.4f}"
    return f"{what}: picks {_tok(picked)}; top-2 margin {v.margin:.4f} ({lead})"


def describe(d: Divergence) -> str:
    """One Markdown bullet for one method."""
    head = (f"- **{d.method}** leaves the target alone at token {d.position + 1} (after …{_tok(d.context)}): "
            f"target alone {_tok(d.reference_text)}, {d.method} {_tok(d.other_text)}.")
    if d.one_row is None or d.many_row is None:
        return head + " One output ended before the other."
    body = [f"  - {_kernel(d.one_row, d, 'one-row forward (what the target alone ran)')}",
            f"  - {_kernel(d.many_row, d, 'many-row forward (what verification ran)')}"]
    if d.kernels_disagree:
        why = ("  - The two kernels pick different tokens: a near-tie that rounding breaks one way or the other. "
               "Both outputs are greedy decodes of the target; exact mode removes the difference.")
    else:
        why = ("  - Both kernels pick the same token on this prefix, so the flip came from rows this replay "
               "does not reproduce (the verifying tree's own rows); the margin above says how close it was.")
    return "\n".join([head, *body, why])


def near_tie_wording(position: int) -> str:
    """The identical column's words for a row that parts at a kernel near-tie (``position``: 1-based token)."""
    return f"identical up to a kernel near-tie at token {position} (certify: exact mode)"


def near_ties(divergences: Sequence[Divergence]) -> str:
    """ONE explanation for every method that parts from the target alone at a near-tie ("" when none)."""
    ties = [d for d in divergences if d.near_tie]
    if not ties:
        return ""
    places: dict[tuple, list[str]] = {}
    for d in ties:
        places.setdefault((d.position, d.reference_text, d.other_text), []).append(d.method)
    where = "; ".join(f"token {pos + 1}, target alone {_tok(ref)} vs {_tok(other)}: {', '.join(methods)}"
                      for (pos, ref, other), methods in sorted(places.items()))
    lead = min(abs(d.one_row.lead) for d in ties)
    gap = max(d.gap for d in ties)
    return (f"**Identical up to a kernel near-tie** ({where}). At that token the target's two best logits are "
            f"{lead:.4f} apart, within what its two kernels differ by on this text ({gap:.4f}: one row at a time "
            "for the target alone, many rows at once for verification, both in low precision). Both texts are "
            "greedy decodes of the same target; **Run in exact mode** (float32 target) certifies them identical.")


def markdown(divergences: Sequence[Divergence]) -> str:
    """The whole section ("" when nothing diverged): one paragraph for all near-ties, one bullet per other."""
    if not divergences:
        return ""
    others = [d for d in divergences if not d.near_tie]
    parts = [near_ties(divergences)]
    if others:
        parts.append("\n".join(["**Where the outputs part** (the target's logits at the first differing token, "
                                "measured by replaying the shared prefix):", *map(describe, others), "",
                                "Press **Run in exact mode** (under the Run button) to rerun with the float32 "
                                "target: every method then matches."]))
    return "\n\n".join(p for p in parts if p)


def exact_markdown(all_identical: bool, gap=None) -> str:
    """The line under an exact-mode comparison at T=0; ``gap``: the run's
    :class:`~sequoia.runtime.checks.exactness.KernelGap` certificate (None: not measured)."""
    if not all_identical:
        return ("**Exact mode:** a method differs from the float32 target alone. That should not happen; "
                "the report below says where.")
    text = ("**Exact mode (float32 target, plain forward):** every method reproduces the target alone ✓. "
            "Here equality is a guarantee, not a hope: verification accepts a token exactly when it is the "
            "target's argmax, and the target's one-row and many-row forwards now differ only by float32 rounding, "
            "far below any top-2 margin the text came near.")
    if gap is not None:
        verdict = ("certified: no token on this path was close enough to flip" if gap.certified else
                   "NOT certified: some top-2 margin is within the kernels' difference, so a flip was possible")
        text += (f"\n\nCheck on this run: smallest top-2 margin on the target alone's path {gap.min_margin:.4f}; "
                 f"one-row and many-row logits differ by at most {gap.max_abs:.2e} "
                 f"({'bit for bit equal' if gap.bit_equal else 'float32 rounding'}); {verdict}.")
    return text


#: Shown while the float32 target loads on the first exact-mode run.
LOADING = ("*Loading the float32 target for exact mode (first use only: about a minute and 6 GB for the "
           "embedded 1.5B target; the draft is shared)…*")
