"""Free drafts: continuations copied from the context by suffix match (prompt lookup, as a tree).

When the output quotes its input (summaries, answers from a passage, edits of
code) the next tokens often already appear in the context: find the earlier
places where the context's last n tokens occur, and propose the tokens that
followed them.  Such drafts cost no draft-model forward; they only widen the
target's verification.

:class:`NgramIndex` keeps, for every n in ``min_n..max_n``, a hash from each
n-gram of the context to the positions right after its occurrences; it is
updated incrementally as tokens are committed (O(max_n) per token), so an
8k-token context costs nothing per step beyond the lookup.

:meth:`NgramIndex.lookup` matches the context's tail, longest n first; every
distinct continuation (up to ``length`` tokens, most recent occurrence first)
becomes a branch, and branches sharing a prefix are merged into one
:class:`NgramTrie`, whose nodes carry the match length that proposed them and
their depth.  Shorter matches only add branches the longer ones did not
already propose.

Losslessness does not depend on any of this: a copied token is a
deterministic proposal verified as a point mass (see :mod:`sequoia.core.verification.sampling`).
How likely a copied token is accepted is :mod:`sequoia.core.ngrams.ngram_acceptance`'s.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

@dataclass(frozen=True)
class NgramTrie:
    """Candidate continuations merged into a trie; node 0 is the context's last token (not a candidate).

    Nodes are in breadth-first order (parents precede children, siblings in
    proposal order: longer matches first, then most recent occurrence).
    """

    parents: tuple[int, ...]        # [n_nodes] parent of each node (root: -1)
    tokens: tuple[int, ...]         # [n_nodes] token (root: the context's last token)
    match_len: tuple[int, ...]      # [n_nodes] n of the n-gram match that first proposed the node (root: 0)
    depths: tuple[int, ...]         # [n_nodes] 1 for the root's children (root: 0)

    @property
    def size(self) -> int:
        """Candidate tokens (root excluded)."""
        return len(self.parents) - 1

    def children(self, node: int) -> list[int]:
        return [v for v in range(1, len(self.parents)) if self.parents[v] == node]

    def branches(self) -> list[tuple[int, ...]]:
        """Every root-to-leaf token sequence (root excluded)."""
        has_kids = {p for p in self.parents[1:]}
        out = []
        for v in range(1, len(self.parents)):
            if v not in has_kids:
                seq = []
                while v > 0:
                    seq.append(self.tokens[v])
                    v = self.parents[v]
                out.append(tuple(reversed(seq)))
        return out


@dataclass
class NgramIndex:
    """Incremental n-gram index of a token sequence (the context: prompt and text generated so far)."""

    max_n: int = 4
    min_n: int = 1
    tokens: list[int] = field(default_factory=list)
    # n -> n-gram -> positions right after each occurrence (ascending)
    _after: dict[int, dict[tuple[int, ...], list[int]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not (1 <= self.min_n <= self.max_n):
            raise ValueError(f"need 1 <= min_n <= max_n, got min_n={self.min_n}, max_n={self.max_n}")
        self._after = {n: defaultdict(list) for n in range(self.min_n, self.max_n + 1)}
        seq, self.tokens = list(self.tokens), []
        self.extend(seq)

    def __len__(self) -> int:
        return len(self.tokens)

    def extend(self, new: Sequence[int]) -> None:
        """Append committed tokens; index every n-gram that now has a following token."""
        for t in new:
            end = len(self.tokens)  # the new token's position: n-grams ending at end - 1 are followed by it
            for n in range(self.min_n, self.max_n + 1):
                if end >= n:
                    self._after[n][tuple(self.tokens[end - n:end])].append(end)
            self.tokens.append(int(t))

    def sync(self, context: Sequence[int]) -> None:
        """Catch up with ``context``, which must extend the tokens indexed so far (else re-index)."""
        k = len(self.tokens)
        tail = max(0, k - 16)  # a generation only appends: checking the last tokens is enough to catch a new one
        if len(context) >= k and list(context[tail:k]) == self.tokens[tail:]:
            self.extend(context[k:])
        else:
            fresh = NgramIndex(self.max_n, self.min_n, list(context))
            self.tokens, self._after = fresh.tokens, fresh._after

    def lookup(self, length: int, max_branches: int = 4, max_occurrences: int = 8,
               extra: Sequence[int] = (), min_match: int = 1) -> NgramTrie:
        """Continuations of the context's tail, up to ``length`` tokens each, merged into a trie.

        Longest match first; within one n, the most recent occurrences first
        (at most ``max_occurrences`` looked at per n); at most ``max_branches``
        distinct first-differing continuations in all.

        ``extra``: hypothetical tokens after the context (a draft node's path
        from the root): the tail of context + extra is matched, at positions
        inside the committed context only, and a continuation that runs past
        the context's end goes on with ``extra``.  The trie's root is then the
        last token of ``extra``.  Matches shorter than ``min_match`` are not tried.
        """
        extra = [int(t) for t in extra]
        seq_len = len(self.tokens) + len(extra)
        root = extra[-1] if extra else self.tokens[-1] if self.tokens else -1
        parents, toks, mlen, depths = [-1], [root], [0], [0]
        kids: dict[tuple[int, int], int] = {}   # (parent node, token) -> node
        branches = 0
        ctx = self.tokens
        for n in range(min(self.max_n, seq_len), max(self.min_n, min_match) - 1, -1):
            if branches >= max_branches:
                break
            gram = tuple(extra[len(extra) - n:]) if n <= len(extra) else \
                tuple(ctx[len(ctx) - (n - len(extra)):]) + tuple(extra)
            hits = self._after[n].get(gram)
            if not hits:
                continue
            for start in reversed(hits[-max_occurrences:]):
                if start >= len(ctx):
                    continue  # cannot happen (the tail n-gram is indexed only once followed), kept for safety
                cont = ctx[start:start + length]
                cont = cont + extra[:length - len(cont)]
                node, new = 0, False
                for d, t in enumerate(cont, start=1):
                    key = (node, t)
                    if key not in kids:
                        if not new and branches >= max_branches:
                            break
                        new = True
                        parents.append(node)
                        toks.append(t)
                        mlen.append(n)
                        depths.append(d)
                        kids[key] = len(parents) - 1
                    node = kids[key]
                branches += new
                if branches >= max_branches:
                    break
        return _breadth_first(parents, toks, mlen, depths)


def _breadth_first(parents, toks, mlen, depths) -> NgramTrie:
    """Renumber a trie built branch by branch into breadth-first order (siblings keep their order)."""
    n = len(parents)
    kids: list[list[int]] = [[] for _ in range(n)]
    for v in range(1, n):
        kids[parents[v]].append(v)
    order, new_of = [0], {0: 0}
    i = 0
    while i < len(order):
        for c in kids[order[i]]:
            new_of[c] = len(order)
            order.append(c)
        i += 1
    return NgramTrie(
        parents=tuple(-1 if v == 0 else new_of[parents[v]] for v in order),
        tokens=tuple(toks[v] for v in order),
        match_len=tuple(mlen[v] for v in order),
        depths=tuple(depths[v] for v in order),
    )
