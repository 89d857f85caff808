"""Statistics of a decoding run, computed from its step records alone.

Acceptance by child rank is defined to match the positional acceptance vector
the tree DP consumes: ``p_k`` is the probability that the k-th child of an
accepted node (in sampling order, 1-based) is the one the target accepts.
Every accepted-path node that had children is one verified *parent*; its
outcome is the rank of the accepted child, or none.  A parent with only m
children says nothing about ranks beyond m, so

    p_k = #(parents with >= k children whose accepted child has rank k)
          / #(parents with >= k children)

which is unbiased for p_k whatever the tree shapes were, because the k-th
child is drawn before (and independently of) any later sibling.  Ranks no
parent reached have no evidence and are reported as 0.0 by
:func:`empirical_acceptance` (so a tree built from it never relies on them);
:attr:`RunStats.rank_parents` says how much evidence each entry has.

When a stop condition (length, EOS, stop string) cuts the last step, the
statistics count what was *kept*: :func:`kept` says how many accepted drafts
and whether the bonus survived.  The acceptance evidence (``rank_counts``)
still uses every verification, since the cut happened after the target had
judged the drafts.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from .trace import StepRecord


@dataclass(frozen=True)
class RunStats:
    steps: int
    new_tokens: int
    tokens_per_step: float                     # mean committed tokens per target call
    tokens_per_step_hist: tuple[int, ...]      # [max n_new + 1] steps that committed exactly i tokens
    accept_by_depth: tuple[float, ...]         # [max depth] fraction of steps whose accepted path reached depth k (1-based)
    rank_accepts: tuple[int, ...]              # [max width] parents whose accepted child had rank k (1-based)
    rank_parents: tuple[int, ...]              # [max width] accepted-path parents with >= k children
    acceptance: tuple[float, ...]              # [max width] empirical p_k = rank_accepts / rank_parents (0 if no evidence)
    total_s: float
    draft_s: float
    verify_s: float
    other_s: float
    tokens_per_s: float                        # decode rate: tokens after the prompt's forward over the time after it
    # Per-step series, for plots.  # [steps] each
    series_new: tuple[int, ...]
    series_accepted: tuple[int, ...]
    series_tree_size: tuple[int, ...]
    series_step_s: tuple[float, ...]
    series_cum_tokens: tuple[int, ...]
    series_rate: tuple[float, ...] = ()        # the decode rate (as tokens_per_s) up to each step
    accepted_by_source: tuple[tuple[str, int], ...] = ()  # (source, accepted drafts kept), see accepted_by_source
    first_token_s: float = 0.0                 # the prompt's forward (step 0), which also gave the first token

    @property
    def time_split(self) -> dict[str, float]:
        """Fraction of wall time spent drafting, verifying and elsewhere."""
        t = self.total_s or 1.0
        return {"draft": self.draft_s / t, "verify": self.verify_s / t, "other": self.other_s / t}

    @property
    def mean_accepted(self) -> float:
        """Mean accepted draft tokens per step (bonus excluded)."""
        return sum(self.series_accepted) / self.steps if self.steps else 0.0


def kept(record: StepRecord) -> tuple[int, bool]:
    """(accepted drafts kept, bonus kept) of a step whose committed tokens may have been cut."""
    n_kept = min(record.n_accepted, record.n_new)
    return n_kept, record.n_new > record.n_accepted


def dropped_nodes(record: StepRecord) -> tuple[int, ...]:
    """Accepted nodes whose tokens a stop condition dropped (the bonus excluded)."""
    return tuple(record.accepted[1 + kept(record)[0]:])


def rank_counts(records: Iterable[StepRecord], width: int | None = None) -> tuple[list[int], list[int]]:
    """(accepts[k], parents[k]) for 0-based ranks k, as defined in the module docstring.

    ``width`` fixes the length of both lists; by default it is the largest
    number of children any accepted-path node had.
    """
    accepts: list[int] = [0] * (width or 0)
    parents: list[int] = [0] * (width or 0)
    for rec in records:
        kids_of = rec.tree.children
        path = rec.accepted
        for i, node in enumerate(path):
            n_kids = len(kids_of[node])
            if n_kids == 0:
                continue
            if width is None and n_kids > len(parents):
                grow = n_kids - len(parents)
                parents.extend([0] * grow)
                accepts.extend([0] * grow)
            for k in range(min(n_kids, len(parents))):
                parents[k] += 1
            if i + 1 < len(path):
                rank = rec.tree.ranks[path[i + 1]]
                if rank < len(accepts):
                    accepts[rank] += 1
    return accepts, parents


def empirical_acceptance(records: Iterable[StepRecord], width: int) -> tuple[float, ...]:
    """Empirical positional acceptance vector p_1..p_width (0.0 where there is no evidence)."""
    if not isinstance(width, int) or width < 1:
        raise ValueError(f"width must be a positive integer, got {width!r}")
    accepts, parents = rank_counts(records, width)
    return tuple(a / n if n else 0.0 for a, n in zip(accepts, parents))


def accepted_by_source(records: Iterable[StepRecord]) -> dict[str, int]:
    """Accepted draft tokens kept, by who proposed them (DRAFT, NGRAM; see StepRecord.sources)."""
    out: dict[str, int] = {}
    for rec in records:
        for v in rec.accepted[1:1 + kept(rec)[0]]:
            src = rec.source(v)
            out[src] = out.get(src, 0) + 1
    return out


def summarize(records: Iterable[StepRecord]) -> RunStats:
    """All run statistics from a stream of step records (consumed once)."""
    recs = list(records)
    steps = len(recs)
    news = tuple(r.n_new for r in recs)
    accs = tuple(kept(r)[0] for r in recs)
    new_tokens = sum(news)
    hist = [0] * (max(news, default=0) + 1)
    for n in news:
        hist[n] += 1
    max_depth = max((r.tree.depth for r in recs), default=0)
    by_depth = tuple(sum(a >= k for a in accs) / steps for k in range(1, max_depth + 1))
    accepts, parents = rank_counts(recs)
    draft_s = sum(r.draft_s for r in recs)
    verify_s = sum(r.verify_s for r in recs)
    other_s = sum(r.other_s for r in recs)
    total_s = draft_s + verify_s + other_s
    # The decode rate: tokens and time after the prompt's forward (step 0), up to each step.
    decode_s, decoded, rate = 0.0, 0, []
    for r in recs:
        if not r.prompt_tokens:
            decode_s, decoded = decode_s + r.total_s, decoded + r.n_new
        rate.append(decoded / decode_s if decode_s > 0 else 0.0)
    cum, running = [], 0
    for n in news:
        running += n
        cum.append(running)
    return RunStats(
        steps=steps,
        new_tokens=new_tokens,
        tokens_per_step=new_tokens / steps if steps else 0.0,
        tokens_per_step_hist=tuple(hist),
        accept_by_depth=by_depth,
        rank_accepts=tuple(accepts),
        rank_parents=tuple(parents),
        acceptance=tuple(a / n if n else 0.0 for a, n in zip(accepts, parents)),
        total_s=total_s,
        draft_s=draft_s,
        verify_s=verify_s,
        other_s=other_s,
        tokens_per_s=rate[-1] if decode_s > 0 else new_tokens / total_s if total_s > 0 else 0.0,
        series_new=news,
        series_accepted=accs,
        series_tree_size=tuple(r.tree.size for r in recs),
        series_step_s=tuple(r.total_s for r in recs),
        series_cum_tokens=tuple(cum),
        series_rate=tuple(rate),
        accepted_by_source=tuple(sorted(accepted_by_source(recs).items())),
        first_token_s=total_s - decode_s,
    )
