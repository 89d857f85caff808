"""Conformance of any :class:`~sequoia.runners.base.Runner` to the slot contract, checked against plain chains.

``check_runner_conformance(runner)`` drives the calls the engine and the
drafter make (a verification tree in one call, a tree grown level by level,
keep of an accepted path, crop, the last-k rows, a chain longer than a batch)
and compares every logits row with the same token's path forwarded as a plain
chain in a fresh session (opened only after the session under test is done:
a runtime may hold one cache per model and invalidate older sessions).  It
raises AssertionError naming the check and the difference, and returns the
largest difference each check saw, so a test can record how close a runtime
comes.  It needs nothing but the Runner protocol; ``atol`` is the caller's
judgement of the runtime's rounding (1e-4 suits an f32 model on llama.cpp).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch

from sequoia.runners.base import Runner

#: A verification tree in breadth-first order: parent index within the tree (-1: hangs off the cached prefix).
#: Depth 4, six leaves (5, 7, 9, 11, 12, 13).
TREE = (-1, 0, 0, 0, 1, 1, 2, 3, 4, 4, 6, 8, 8, 10)


def tree_depths(tree: tuple[int, ...]) -> list[int]:
    depth: list[int] = []
    for p in tree:
        depth.append(0 if p < 0 else depth[p] + 1)
    return depth


def tree_path(tree: tuple[int, ...], node: int) -> list[int]:
    """Nodes from the root down to ``node``."""
    path = []
    while node >= 0:
        path.append(node)
        node = tree[node]
    return path[::-1]


@dataclass
class ConformanceReport:
    """The largest |logit difference| each check saw against plain chains."""

    max_diff: dict[str, float] = field(default_factory=dict)

    def record(self, check: str, got: torch.Tensor, want: torch.Tensor, atol: float) -> None:
        assert got.shape == want.shape, f"{check}: shape {tuple(got.shape)} != chain's {tuple(want.shape)}"
        diff = (got.float() - want.float()).abs().max().item()
        self.max_diff[check] = max(self.max_diff.get(check, 0.0), diff)
        assert diff <= atol, f"{check}: max |logit difference| {diff:.3g} against the chain exceeds atol {atol:g}"

    @property
    def worst(self) -> float:
        return max(self.max_diff.values(), default=0.0)


class _Checker:
    def __init__(self, runner: Runner, atol: float, prompt_len: int, seed: int) -> None:
        self.runner, self.atol = runner, atol
        self.gen = torch.Generator().manual_seed(seed)
        self.report = ConformanceReport()
        self.prompt = self.tokens(prompt_len)

    def tokens(self, n: int) -> list[int]:
        return torch.randint(0, self.runner.vocab_size, (n,), generator=self.gen).tolist()

    def chain(self, tokens: list[int], rows: int) -> torch.Tensor:
        """The last ``rows`` logits rows of ``tokens`` forwarded as a chain in a fresh session.  # [rows, V]"""
        return self.runner.session().forward(tokens, keep=rows).float()

    def tree_vs_chain(self, got: torch.Tensor, prefix: list[int], toks: list[int], tree, check: str) -> None:
        """Every node's row of ``got`` against its path after ``prefix`` as a chain (one chain per leaf)."""
        leaves = [i for i in range(len(tree)) if i not in tree]
        for leaf in leaves:
            path = tree_path(tree, leaf)
            want = self.chain(prefix + [toks[i] for i in path], len(path))
            self.report.record(check, got[path].float(), want, self.atol)


def check_runner_conformance(runner: Runner, *, atol: float = 1e-4, prompt_len: int = 24,
                             long_chain: int = 600, seed: int = 0) -> ConformanceReport:
    """Run every check on ``runner``; raise AssertionError on the first failure, else return the diffs."""
    c = _Checker(runner, atol, prompt_len, seed)
    _check_tree(c)
    _check_forest(c)
    _check_levels(c)
    _check_keep_steps(c)
    _check_crop(c)
    _check_keep_rows(c)
    _check_long_chain(c, long_chain)
    _check_bad_arguments(c)
    return c.report


def _check_tree(c: _Checker) -> None:
    """The target's step: cached prompt but its last token; that token plus the tree in one call."""
    toks = c.tokens(len(TREE))
    s = c.runner.session()
    s.forward(c.prompt[:-1], keep=1)
    root = [c.prompt[-1]]  # the last committed token is the root of the tree
    n0 = len(s)
    parents = [n0 - 1] + [n0 + (p + 1) for p in TREE]
    got = s.forward(root + toks, parents)
    assert got.shape == (len(TREE) + 1, c.runner.vocab_size), f"tree: logits shape {tuple(got.shape)}"
    assert len(s) == n0 + len(TREE) + 1, f"tree: session length {len(s)} after the call"
    c.report.record("tree", got[:1].float(), c.chain(c.prompt, 1), c.atol)
    c.tree_vs_chain(got[1:], c.prompt, toks, TREE, "tree")


def _check_forest(c: _Checker) -> None:
    """Roots hanging off different cached slots (a fork in the middle of the prompt) in one call."""
    s = c.runner.session()
    s.forward(c.prompt, keep=1)
    p = len(c.prompt)
    fork = p // 2
    toks = c.tokens(5)
    # slots p.. : a (off the last slot), b (off slot fork-1), a's child, b's two children
    parents = [p - 1, fork - 1, p, p + 1, p + 1]
    got = s.forward(toks, parents)
    wants = [c.prompt + toks[:1], c.prompt[:fork] + toks[1:2], c.prompt + [toks[0], toks[2]],
             c.prompt[:fork] + [toks[1], toks[3]], c.prompt[:fork] + [toks[1], toks[4]]]
    for i, w in enumerate(wants):
        c.report.record("forest", got[i:i + 1].float(), c.chain(w, 1), c.atol)


def _check_levels(c: _Checker) -> None:
    """The drafter's growth: one tree level per call, parents in earlier (cached) levels."""
    toks = c.tokens(len(TREE))
    depth = tree_depths(TREE)
    s = c.runner.session()
    s.forward(c.prompt, keep=1)
    p = len(c.prompt)
    rows = []
    for d in range(max(depth) + 1):
        level = [i for i in range(len(TREE)) if depth[i] == d]
        parents = [p - 1 if TREE[i] < 0 else p + TREE[i] for i in level]
        rows.append(s.forward([toks[i] for i in level], parents))
    got = torch.cat(rows)
    assert len(s) == p + len(TREE), f"levels: session length {len(s)}"
    c.tree_vs_chain(got, c.prompt, toks, TREE, "levels")


def _check_keep_steps(c: _Checker) -> None:
    """Three engine steps: tree, keep an accepted path (or none), continue; then equal to the chain of all kept."""
    s = c.runner.session()
    s.forward(c.prompt, keep=1)
    text = list(c.prompt)
    leaves = [i for i in range(len(TREE)) if i not in TREE]
    steps = []  # (logits after the keep, text so far): compared once the session is done (one cache per runner)
    # (accepted leaf, nodes rejected at its end): a whole path, nothing, a path cut short
    for leaf, cut in [(leaves[-1], 0), (None, 0), (leaves[0], 1)]:
        toks = c.tokens(len(TREE))
        p = len(s)
        s.forward(toks, [p - 1 if q < 0 else p + q for q in TREE])
        path = tree_path(TREE, leaf)[: -cut or None] if leaf is not None else []
        s.keep(p, [p + i for i in path])
        text += [toks[i] for i in path]
        assert len(s) == len(text), f"keep: session length {len(s)}, kept text {len(text)}"
        more = c.tokens(3)
        text += more
        steps.append((s.forward(more), list(text)))
    for got, upto in steps:
        c.report.record("keep", got.float(), c.chain(upto, 3), c.atol)


def _check_crop(c: _Checker) -> None:
    s = c.runner.session()
    extra, more, again = c.tokens(8), c.tokens(2), c.tokens(2)
    s.forward(c.prompt + extra, keep=1)
    s.crop(len(c.prompt) + 3)
    assert len(s) == len(c.prompt) + 3, f"crop: session length {len(s)}"
    got1 = s.forward(more)
    p = len(s)  # crop a whole tree away: back to the chain
    s.forward(c.tokens(len(TREE)), [p - 1 if q < 0 else p + q for q in TREE])
    s.crop(p)
    got2 = s.forward(again, keep=1)
    c.report.record("crop", got1.float(), c.chain(c.prompt + extra[:3] + more, 2), c.atol)
    c.report.record("crop", got2.float(), c.chain(c.prompt + extra[:3] + more + again, 1), c.atol)


def _check_keep_rows(c: _Checker) -> None:
    toks = c.tokens(6)
    s = c.runner.session()
    s.forward(c.prompt, keep=1)
    all_rows = s.forward(toks)
    s = c.runner.session()
    s.forward(c.prompt, keep=1)
    last = s.forward(toks, keep=2)
    assert last.shape == (2, c.runner.vocab_size), f"keep rows: shape {tuple(last.shape)} for keep=2"
    c.report.record("keep_rows", last.float(), all_rows[-2:].float(), c.atol)


def _check_long_chain(c: _Checker, n: int) -> None:
    """A chain longer than a batch in one call equals the same chain fed in pieces."""
    toks = c.tokens(n)
    whole = c.runner.session().forward(toks)
    s = c.runner.session()
    pieces = [s.forward(toks[a:a + 97]) for a in range(0, n, 97)]
    c.report.record("long_chain", whole.float(), torch.cat(pieces).float(), c.atol)
    del whole, pieces


def _check_bad_arguments(c: _Checker) -> None:
    s = c.runner.session()
    s.forward(c.prompt[:4])
    bad_calls = [
        (lambda: s.forward([]), "no tokens"),
        (lambda: s.forward([1, 2], [3]), "2 tokens but 1 parents"),
        (lambda: s.forward([1], [4]), "parent must be an earlier slot"),
        (lambda: s.forward([1], keep=2), "keep must be in"),
        (lambda: s.keep(5, []), "prefix 5 outside"),
        (lambda: s.keep(1, [3, 2]), "sorted"),
        (lambda: s.crop(9), "crop"),
    ]
    for call, message in bad_calls:
        with pytest.raises(ValueError, match=message):
            call()
    assert len(s) == 4, f"bad arguments changed the session: length {len(s)}"
