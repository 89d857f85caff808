"""The Sequoia dynamic program: the tree shape that maximises expected tokens per step.

Vocabulary (Chen et al. 2024, section 3.1):

``acceptance vector``  p_1..p_W.  p_k is the unconditional probability that the
    k-th child the draft samples at a node is the one the target accepts.  The
    events are disjoint (at most one child is accepted), so sum p_k <= 1, and
    the vector does not depend on depth: that *positional acceptance*
    assumption is what makes the problem a small DP instead of a search.
``rank``  the 0-based sibling position of a node (``Tree.ranks``); a node of
    rank r is accepted, given its parent was, with probability p_{r+1}.
``f(v)``  the probability that draft node v is accepted: the product of
    p_{rank(u)+1} over the nodes u on the path root -> v (root excluded).
``expected tokens``  per step, 1 + sum_v f(v): every accepted draft token
    counts, plus the bonus token the target always contributes.
``budget n``  draft tokens per step (the root is not counted); ``depth d``
    the most levels of draft tokens.

The recurrence.  Let c(m, d) be the best value of a subtree with at most m
nodes (its root included) and at most d levels below its root, where the
value of a subtree is 1 + sum over its children i of p_i * c(child).  The
children of a node are sampled in order, so the rank-i child exists only if
the rank-(i-1) child does: children are a *contiguous* prefix of ranks.  A
knapsack over ranks from W down to 1 enforces that:

    H_{W+1}(k) = 0
    H_i(k)     = max(0,                                  # no rank-i child, hence none after it
                     max_{1<=a<=k} p_i c(a, d-1) + H_{i+1}(k - a))
    c(m, d)    = 1 + H_1(m - 1),        c(m, 0) = c(1, d) = 1

H_i(k) is the best the children of ranks i.. can do with at most k nodes.
Because "stop here" is always an option, c is non-decreasing in m and d
("at most n tokens, at most d levels"), so a table cell never reports less
than a smaller cell.  The optimal tree with n draft tokens and depth <= d has
value c(n + 1, d).

Each H_i(.) is a max-plus convolution of two length-(n+1) vectors; it is done
at once by broadcasting over a Toeplitz view, keeping the argmax so that the
optimal tree of *any* cell can be rebuilt.  Ties go to stopping and to the
smaller subtree, so a rebuilt tree spends no token below a zero-probability
node; it may therefore hold fewer than n tokens (when some p_k are 0, or the
depth limit and W cap the tree below n).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ..config import MAX_DEPTH, check_budget
from ..statistics.trace import DRAFT, NGRAM, ROOT
from .tree import Tree

#: Slack on sum(p) <= 1, for vectors estimated from counts in floating point.
SUM_TOLERANCE = 1e-6

#: Rows of one max-plus block: small enough that a block stays in cache.
ROW_BLOCK = 128

#: Widths of the k-independent-chains baseline in :func:`baseline_curves`.
CHAIN_WIDTHS = (2, 4, 8)


@dataclass(frozen=True)
class DPResult:
    """The filled DP table for one acceptance vector, budget and depth limit."""

    acceptance: tuple[float, ...]   # [W] p_1..p_W
    budget: int                     # largest n in the table
    depth: int                      # largest d in the table
    table: np.ndarray = field(compare=False, repr=False)   # [budget+1, depth+1] float64: c(n+1, d)
    choice: np.ndarray = field(compare=False, repr=False)   # [depth+1, W', budget+1] int32: argmax a of H_i(k), 0 = stop

    def value(self, n: int | None = None, d: int | None = None) -> float:
        """Expected tokens per step of the best tree with <= n draft tokens and <= d levels."""
        n, d = self._cell(n, d)
        return float(self.table[n, d])

    def tree(self, n: int | None = None, d: int | None = None) -> Tree:
        """The optimal tree of cell (n, d), in BFS order with children in rank order.

        It holds at most n draft tokens: fewer when more would add nothing.
        """
        n, d = self._cell(n, d)
        parents = [-1]
        queue = deque([(0, n, d)])  # (node index, nodes below it, levels below it)
        while queue:
            node, k, levels = queue.popleft()
            for a in self._child_sizes(k, levels):
                parents.append(node)
                queue.append((len(parents) - 1, a - 1, levels - 1))
        return Tree(tuple(parents))

    def _child_sizes(self, k: int, levels: int) -> list[int]:
        """Subtree sizes (child included) of the rank-1, rank-2, ... children of a node."""
        if levels == 0:
            return []
        sizes = []
        for row in self.choice[levels]:  # row: [budget+1] best a per remaining k, for one rank
            a = int(row[k])
            if a == 0:
                break
            sizes.append(a)
            k -= a
        return sizes

    def _cell(self, n: int | None, d: int | None) -> tuple[int, int]:
        n = self.budget if n is None else n
        d = self.depth if d is None else d
        if not isinstance(n, (int, np.integer)) or not 0 <= n <= self.budget:
            raise ValueError(f"n must be an integer in 0..{self.budget}, got {n!r}")
        if not isinstance(d, (int, np.integer)) or not 0 <= d <= self.depth:
            raise ValueError(f"d must be an integer in 0..{self.depth}, got {d!r}")
        return int(n), int(d)

    def to_dict(self) -> dict:
        return {
            "format": "sequoia-dp/1",
            "acceptance": list(self.acceptance),
            "budget": self.budget,
            "depth": self.depth,
            "table": self.table.tolist(),
            "value": self.value(),
            "tree": self.tree().to_dict(),
        }


def optimal_tree(acceptance, budget: int, depth: int | None = None) -> DPResult:
    """Solve the DP for every size <= ``budget`` and depth <= ``depth`` (default min(budget, MAX_DEPTH))."""
    p = check_acceptance(acceptance)
    check_budget(budget, depth)
    depth = min(budget, MAX_DEPTH) if depth is None else depth
    # A rank-i child needs i - 1 older siblings, so ranks past the budget never fit;
    # trailing zeros only ever add nodes worth nothing.
    nonzero = np.flatnonzero(p)
    p_used = p[: min(budget, nonzero[-1] + 1 if nonzero.size else 0)]
    table = np.ones((budget + 1, depth + 1))                                 # [n+1, d+1]
    choice = np.zeros((depth + 1, len(p_used), budget + 1), dtype=np.int32)  # [d+1, W', n+1]
    for d in range(1, depth + 1):
        table[:, d], choice[d] = _next_level(table[:, d - 1], p_used)
    return DPResult(tuple(float(x) for x in p), budget, depth, table, choice)


def _next_level(prev: np.ndarray, p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """c(., d) from c(., d-1).  prev: [n+1] with prev[k] = c(k+1, d-1)."""
    h = np.zeros_like(prev)                              # [n+1] H_{W+1}
    choice = np.zeros((len(p), len(prev)), dtype=np.int32)  # [W', n+1]
    for i in range(len(p) - 1, -1, -1):
        h, choice[i] = _knapsack_step(prev * p[i], h)
    return 1.0 + h, choice


def _knapsack_step(gain: np.ndarray, rest: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """H_i from H_{i+1}: max(0, max_{1<=a<=k} gain[a-1] + rest[k-a]), with its argmax a (0 = stop).

    gain: [n+1], gain[a-1] = p_i c(a, d-1); rest: [n+1] = H_{i+1}.
    """
    n = len(rest) - 1
    shifted = _toeplitz(rest)                            # [n+1, n]: rest[k-a] for a = 1..n, -inf where a > k
    best = np.full(n + 1, -np.inf)                       # [n+1]; k = 0 leaves no room for a child
    best_a = np.zeros(n + 1, dtype=np.int64)             # [n+1]
    # Row blocks keep each sum in cache, and rows k < k1 skip the all -inf columns a >= k1.
    for k0 in range(1, n + 1, ROW_BLOCK):
        k1 = min(n + 1, k0 + ROW_BLOCK)
        total = shifted[k0:k1, : k1 - 1] + gain[: k1 - 1]  # [k1-k0, k1-1]
        arg = np.argmax(total, axis=1)                     # first maximiser = smallest subtree
        best[k0:k1] = total[np.arange(k1 - k0), arg]
        best_a[k0:k1] = arg + 1
    # Strictly better than stopping, or the tie goes to the smaller tree.
    take = best > 0.0
    return np.where(take, best, 0.0), np.where(take, best_a, 0).astype(np.int32)


def _toeplitz(rest: np.ndarray) -> np.ndarray:
    """View [n+1, n] with out[k, a-1] = rest[k-a] for a = 1..n, -inf where k < a (no copy)."""
    n = len(rest) - 1
    padded = np.concatenate([np.full(n + 1, -np.inf), rest])  # [2n+2]: padded[n+1+j] = rest[j]
    windows = sliding_window_view(padded[::-1], n)            # [n+3, n]: windows[s, t] = padded[2n+1-s-t]
    # Row k needs padded[n+1+k-a] with a = t+1, i.e. s = n+1-k.
    return windows[n + 1 :: -1][: n + 1]


def check_acceptance(acceptance) -> np.ndarray:
    """Validate an acceptance vector and return it as float64.  # [W]"""
    try:
        p = np.asarray(acceptance, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"acceptance must be a sequence of numbers, got {acceptance!r}") from exc
    if p.ndim != 1 or p.size == 0:
        raise ValueError(f"acceptance must be a non-empty 1-D sequence, got shape {p.shape}")
    if not np.all(np.isfinite(p)):
        raise ValueError("acceptance entries must be finite")
    if np.any(p < 0) or np.any(p > 1):
        raise ValueError(f"acceptance entries must lie in [0, 1], got min {p.min():.6g}, max {p.max():.6g}")
    if p.sum() > 1 + SUM_TOLERANCE:
        raise ValueError(f"acceptance must sum to at most 1 (one child is accepted at most), got {p.sum():.6g}")
    return p


def node_acceptance(tree: Tree, acceptance) -> list[float]:
    """f(v) of every node: the probability that node v is accepted, the product of p_rank along its path (root:
    1; ranks beyond W: 0).  # [n_nodes]"""
    p = check_acceptance(acceptance)
    f = [1.0] * tree.n_nodes
    for v in range(1, tree.n_nodes):
        r = tree.ranks[v]
        f[v] = f[tree.parents[v]] * p[r] if r < len(p) else 0.0
    return f


def expected_tokens(tree: Tree, acceptance) -> float:
    """1 + sum_v f(v): expected tokens per step of ``tree``; ranks beyond W contribute 0."""
    return 1.0 + float(sum(node_acceptance(tree, acceptance)[1:]))


def baseline_curves(acceptance, sizes: list[int]) -> dict[str, list[float]]:
    """Expected tokens per step against tree size for Sequoia and the fixed shapes.

    Keys: ``sequoia`` (the DP, depth <= MAX_DEPTH), ``chain``, ``k_chains`` (the
    best of 2, 4 and 8 independent chains) and ``binary`` (a complete binary
    tree cut to n nodes in BFS order).  Chains and binary trees that do not
    divide evenly are cut the same way, so every curve has one point per size.
    """
    p = check_acceptance(acceptance)
    if not sizes:
        raise ValueError("sizes must not be empty")
    for n in sizes:
        check_budget(n)
    dp = optimal_tree(p, max(sizes))
    return {
        "sequoia": [dp.value(n) for n in sizes],
        "chain": [expected_tokens(Tree.chain(n), p) for n in sizes],
        "k_chains": [max(expected_tokens(_cut_chains(k, n), p) for k in CHAIN_WIDTHS) for n in sizes],
        "binary": [expected_tokens(_cut_binary(n), p) for n in sizes],
    }


def _cut_chains(k: int, n: int) -> Tree:
    """The first n nodes (BFS) of k independent chains: node i > k hangs under node i - k."""
    return Tree((-1,) + tuple(0 if i <= k else i - k for i in range(1, n + 1)))


def _cut_binary(n: int) -> Tree:
    """The first n nodes (BFS) of a complete binary tree."""
    return Tree((-1,) + tuple((i - 1) // 2 for i in range(1, n + 1)))


# ------------------------------------------------------------ one copied chain
@dataclass(frozen=True)
class CopiesResult:
    """The best static tree holding one copied chain at the root (:func:`optimal_tree_with_copies`)."""

    tree: Tree                          # copied chain first among the root's children, then the draft's tree
    sources: tuple[str, ...]            # [n_nodes] ROOT / NGRAM / DRAFT per node (sequoia.core.statistics.trace)
    n_copied: int                       # m, copied nodes kept (0: the plain DP tree)
    value: float                        # expected tokens per step, E(m)
    value_by_copies: tuple[float, ...]  # [min(L, n, d) + 1] E(m) for every m
    draft: DPResult = field(compare=False, repr=False)  # the draft's DP table (budget n, depth d)


def optimal_tree_with_copies(acceptance, copies, budget: int, depth: int | None = None) -> CopiesResult:
    """The best static tree of ``budget`` nodes holding the first m tokens of one copied chain at the root.

    ``copies`` c_1..c_L: c_j is the chance the j-th copied token (copied from
    the context, a fixed proposal) is accepted given the (j-1)-th was.  The
    chain hangs under the root, listed first among its children, so it is
    verified first; the draft's DP tree of the other n - m nodes fills the
    rest.  Its children only matter when the first copied token is rejected,
    so

        E(m) = 1 + sum_{j<=m} prod_{i<=j} c_i + w(m) * (c(n - m + 1, d) - 1),
        w(0) = 1,  w(m > 0) = 1 - c_1,

    maximised over m = 0..min(L, n, d) (ties to the smaller m; m = 0 is
    :func:`optimal_tree` exactly).  Approximation: the draft's acceptance
    vector p is taken as unchanged given that the copied token was rejected
    (the draft's siblings are drawn without it, and the target's residual
    lacks it, which in truth shifts p), and copied tokens below depth 1 get
    no draft siblings.  With w(m) = 0 the draft gets no nodes: they would add
    nothing.
    """
    c = check_copies(copies)
    dp = optimal_tree(acceptance, budget, depth)
    depth = dp.depth
    reach = np.cumprod(c)                                            # [L] prod_{i<=j} c_i
    values = []
    for m in range(min(len(c), budget, depth) + 1):
        weight = 1.0 if m == 0 else 1.0 - float(c[0])
        values.append(1.0 + float(reach[:m].sum()) + weight * (dp.value(budget - m, depth) - 1.0))
    m = int(np.argmax(values))  # first maximiser: the smaller m
    if m == 0:
        tree = dp.tree(budget, depth)
    else:
        tree = _with_chain(dp.tree(budget - m, depth) if c[0] < 1.0 else Tree.root_only(), m)
    return CopiesResult(tree, _sources(tree, m), m, values[m], tuple(values), dp)


def _with_chain(draft: Tree, m: int) -> Tree:
    """``draft`` with a chain of m nodes as the root's first child (the draft's root children shift one rank)."""
    chain = [(0,) * j for j in range(1, m + 1)]
    shifted = [(path[0] + 1,) + path[1:] for path in draft.rank_paths()[1:]]
    return Tree.from_rank_paths(sorted(chain + shifted, key=lambda t: (len(t), t)))


def _sources(tree: Tree, m: int) -> tuple[str, ...]:
    """ROOT, then NGRAM for the chain under the root's first child (when m > 0), DRAFT elsewhere."""
    return tuple(ROOT if not path else NGRAM if m and set(path) == {0} and len(path) <= m else DRAFT
                 for path in tree.rank_paths())


def check_copies(copies) -> np.ndarray:
    """Validate a copied chain's conditional acceptances c_1..c_L (may be empty).  # [L]"""
    try:
        c = np.asarray(copies, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"copies must be a sequence of numbers, got {copies!r}") from exc
    if c.ndim != 1:
        raise ValueError(f"copies must be a 1-D sequence, got shape {c.shape}")
    if not np.all(np.isfinite(c)) or np.any(c < 0) or np.any(c > 1):
        raise ValueError("copied acceptances must be finite and lie in [0, 1]")
    return c


__all__ = ["DPResult", "optimal_tree", "expected_tokens", "node_acceptance", "baseline_curves", "check_acceptance",
           "CopiesResult", "optimal_tree_with_copies", "check_copies"]
