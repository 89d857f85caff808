"""Token trees as data.

A :class:`Tree` is the *shape* of one speculation step: node 0 is the root (the
last committed token, which the target has not processed yet) and nodes
1..n are the n draft tokens.  Nodes are stored in breadth-first order, so a
node's parent always has a smaller index and depths never decrease; siblings
appear in *sampling order* (the first child listed is the first one the draft
samples and the first one the target verifies).  That order is what the
Sequoia acceptance vector p_k is indexed by.

Everything the engine needs (depths, position ids, the ancestor attention
mask, root-to-node paths) is a small pure function of ``parents``.
"""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import torch

#: Largest number of draft tokens any tree may hold; a guard against budgets
#: that cannot fit in memory (the target verifies n + 1 tokens at once).
MAX_TREE_SIZE = 1024


@dataclass(frozen=True)
class Tree:
    """Parent index of every node, in breadth-first order; ``parents[0] == -1``."""

    parents: tuple[int, ...]

    def __post_init__(self) -> None:
        p = tuple(int(x) for x in self.parents)
        object.__setattr__(self, "parents", p)
        if not p or p[0] != -1:
            raise ValueError("a tree needs a root: parents[0] must be -1")
        if len(p) - 1 > MAX_TREE_SIZE:
            raise ValueError(f"tree has {len(p) - 1} draft nodes; the maximum is {MAX_TREE_SIZE}")
        depth = [0] * len(p)
        for i in range(1, len(p)):
            if not 0 <= p[i] < i:
                raise ValueError(f"node {i} has parent {p[i]}; parents must precede their children")
            depth[i] = depth[p[i]] + 1
            if depth[i] < depth[i - 1]:
                raise ValueError("nodes must be in breadth-first order (depth never decreases)")
            if p[i] < p[i - 1]:
                raise ValueError("siblings must be contiguous and parents in breadth-first order")

    # ------------------------------------------------------------------ shape
    @property
    def n_nodes(self) -> int:
        """Nodes including the root."""
        return len(self.parents)

    @property
    def size(self) -> int:
        """Draft tokens (nodes excluding the root): the tree budget n."""
        return len(self.parents) - 1

    @cached_property
    def depths(self) -> tuple[int, ...]:
        d = [0] * self.n_nodes
        for i in range(1, self.n_nodes):
            d[i] = d[self.parents[i]] + 1
        return tuple(d)

    @property
    def depth(self) -> int:
        """Deepest level of draft tokens (0 for the root-only tree)."""
        return self.depths[-1]

    @cached_property
    def children(self) -> tuple[tuple[int, ...], ...]:
        kids: list[list[int]] = [[] for _ in range(self.n_nodes)]
        for i in range(1, self.n_nodes):
            kids[self.parents[i]].append(i)
        return tuple(tuple(k) for k in kids)

    @cached_property
    def ranks(self) -> tuple[int, ...]:
        """0-based position of each node among its siblings (root: 0)."""
        r = [0] * self.n_nodes
        for kids in self.children:
            for j, c in enumerate(kids):
                r[c] = j
        return tuple(r)

    @cached_property
    def levels(self) -> tuple[tuple[int, ...], ...]:
        """Node indices at each depth 0..depth."""
        out: list[list[int]] = [[] for _ in range(self.depth + 1)]
        for i, d in enumerate(self.depths):
            out[d].append(i)
        return tuple(tuple(x) for x in out)

    @cached_property
    def drafted_levels(self) -> tuple[tuple[int, ...], ...]:
        """Nodes with children, level by level: what a drafter forwards (the root's q comes from the context)
        and draws children for; the leaves' level, having none, is not listed."""
        return tuple(ps for ps in (tuple(v for v in level if self.children[v]) for level in self.levels) if ps)

    def path(self, node: int) -> tuple[int, ...]:
        """Root-to-node indices, root included."""
        out = [node]
        while self.parents[out[-1]] >= 0:
            out.append(self.parents[out[-1]])
        return tuple(reversed(out))

    # ------------------------------------------------------------- tensors
    def position_ids(self, offset: int, device: torch.device | str = "cpu") -> torch.Tensor:
        """Absolute positions, root at ``offset``.  # [n_nodes] int64"""
        return torch.tensor(self.depths, dtype=torch.long, device=device) + offset

    def ancestor_mask(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """``mask[i, j]`` is True when j is i or an ancestor of i.  # [n_nodes, n_nodes] bool"""
        n = self.n_nodes
        mask = torch.zeros(n, n, dtype=torch.bool)
        mask[0, 0] = True
        for i in range(1, n):
            mask[i] = mask[self.parents[i]]
            mask[i, i] = True
        return mask.to(device)

    # ------------------------------------------------------------- (de)serialise
    def to_dict(self) -> dict:
        return {"format": "sequoia-tree/1", "parents": list(self.parents), "size": self.size, "depth": self.depth}

    def to_json(self, path: str | Path, **extra) -> None:
        Path(path).write_text(json.dumps({**self.to_dict(), **extra}, indent=1))

    @classmethod
    def from_dict(cls, data: dict) -> "Tree":
        if not isinstance(data, dict) or "parents" not in data:
            raise ValueError("not a tree file: expected a JSON object with a 'parents' list")
        parents = data["parents"]
        if not isinstance(parents, list) or not all(isinstance(x, int) for x in parents):
            raise ValueError("tree file: 'parents' must be a list of integers")
        return cls(tuple(parents))

    @classmethod
    def from_json(cls, path: str | Path) -> "Tree":
        try:
            data = json.loads(Path(path).read_text())
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not valid JSON ({exc})") from exc
        return cls.from_dict(data)

    # ------------------------------------------------------------- rank paths
    def rank_paths(self) -> list[tuple[int, ...]]:
        """Each node's path of sibling ranks from the root (root: ``()``): a shape-independent node name.

        ``(0,)`` is the root's first child, ``(1,)`` its second, ``(0, 0)`` the first child of ``(0,)``;
        breadth-first order with contiguous siblings lists them by length, then lexicographically.
        """
        paths: list[tuple[int, ...]] = [()]
        for i in range(1, self.n_nodes):
            paths.append(paths[self.parents[i]] + (self.ranks[i],))
        return paths

    @classmethod
    def from_rank_paths(cls, paths) -> "Tree":
        """The tree whose draft nodes have these rank paths (a list of tuples, or its ``str()``), sorted by
        length, then lexicographically: :meth:`rank_paths` without the root's ``()``."""
        if isinstance(paths, str):
            try:
                paths = ast.literal_eval(paths)
            except (ValueError, SyntaxError) as exc:
                raise ValueError(f"rank paths: not a list of tuples ({exc})") from None
        if not isinstance(paths, (list, tuple)) or not all(
                isinstance(t, (list, tuple)) and t and all(isinstance(r, int) and r >= 0 for r in t) for t in paths):
            raise ValueError("rank paths: expected a list of non-empty tuples of ranks >= 0")
        paths = [tuple(t) for t in paths]
        if paths != sorted(paths, key=lambda t: (len(t), t)):
            raise ValueError("rank paths: must be sorted by length, then lexicographically")
        index = {(): 0}
        parents = [-1]
        for i, path in enumerate(paths, start=1):
            parent = index.get(path[:-1])
            if parent is None or (path[-1] > 0 and path[:-1] + (path[-1] - 1,) not in index):
                raise ValueError(f"rank paths: {path} has no parent or no older sibling before it")
            if path in index:
                raise ValueError(f"rank paths: {path} appears twice")
            index[path] = i
            parents.append(parent)
        return cls(tuple(parents))

    @classmethod
    def from_children_counts(cls, counts: list[int] | tuple[int, ...]) -> "Tree":
        """Build from the number of children of each node in BFS order."""
        parents = [-1]
        for node, c in enumerate(counts):
            if node >= len(parents):
                break
            parents.extend([node] * int(c))
        return cls(tuple(parents))

    # ------------------------------------------------------------- baseline shapes
    @classmethod
    def root_only(cls) -> "Tree":
        """No speculation: plain autoregressive decoding."""
        return cls((-1,))

    @classmethod
    def chain(cls, length: int) -> "Tree":
        _check_pos("length", length, allow_zero=True)
        return cls((-1,) + tuple(range(length)))

    @classmethod
    def k_chains(cls, k: int, length: int) -> "Tree":
        """k independent sequences of ``length`` tokens sharing the root."""
        _check_pos("k", k)
        _check_pos("length", length)
        parents = [-1] + [0] * k
        for level in range(1, length):
            first = 1 + (level - 1) * k
            parents.extend(range(first, first + k))
        return cls(tuple(parents))

    @classmethod
    def k_ary(cls, k: int, depth: int) -> "Tree":
        """Full k-ary tree with ``depth`` levels of draft tokens."""
        _check_pos("k", k)
        _check_pos("depth", depth, allow_zero=True)
        parents = [-1]
        level = [0]
        for _ in range(depth):
            nxt = []
            for node in level:
                for _ in range(k):
                    parents.append(node)
                    nxt.append(len(parents) - 1)
            level = nxt
            if len(parents) - 1 > MAX_TREE_SIZE:
                raise ValueError(f"a {k}-ary tree of depth {depth} exceeds {MAX_TREE_SIZE} nodes")
        return cls(tuple(parents))

    @classmethod
    def specinfer(cls, width: int, depth: int) -> "Tree":
        """SpecInfer-style tree: ``width`` sequences of ``depth`` tokens (sampled with replacement)."""
        return cls.k_chains(width, depth)


def _check_pos(name: str, value: int, allow_zero: bool = False) -> None:
    lo = 0 if allow_zero else 1
    if not isinstance(value, int) or value < lo:
        raise ValueError(f"{name} must be an integer >= {lo}, got {value!r}")
