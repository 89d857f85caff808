"""The batched rule and the device walk are lossless EXACTLY: every outcome's probability computed, not sampled.

:func:`~sequoia.core.verification.sampling.verify_rows_state` (the batched form of the rule, which the device walk runs)
takes its uniforms as an argument, and a child's test is a threshold in its uniform: accepted iff u < a.  So
the probability of each verdict is the length of an interval of u.  Each threshold is found by bisection on u,
the rule called as it is (a black box, every other uniform at 1.0, which rejects), to one ulp in float64, and
checked to be a threshold (the verdict flips once on a grid of u).  Then, for every sequence of children the
drawing scheme can produce (enumerated with its probability, as in ``test_verification_exact.py``),
P(first accepted = i) = (1 - a_0) ... (1 - a_{i-1}) a_i, and the bonus comes from the residual the rule returns.
Compared with

* the scalar rule's exact outcome for the same children (``verify_children``'s steps with the library's
  ``acceptance_probability`` and ``reject``, held at import, so that a rule patched in a test moves only the
  batched side), to 1e-9, and
* p: the distribution of the emitted token, summed over every draw, equals p to 1e-9.

The device walk (:func:`sequoia.runtime.verify.walk_verdicts`, its uniforms given the same way) is checked on
small trees: its distribution over (accepted path, bonus token) equals the host walk's exact one for given draft
tokens, and over every draw of the tree's tokens the tokens it emits, completed by the target, are distributed
as the target's own chain.  The device walk computes in float32 (``warp``), so those compare to 2e-6; a rule
off by 2% is off by ~1e-3.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Callable

import pytest
import torch
from test_verification_exact import CASES, _draws

from sequoia.core.config import SAMPLING_MODES, SamplingConfig
from sequoia.core.trees.tree import Tree
from sequoia.core.verification import sampling
from sequoia.core.verification.sampling import verify_rows_state, warp
from sequoia.runtime.drafter import Draft
from sequoia.runtime.verify import PendingWalk, StepReadback, walk_layout, walk_verdicts

TOL = 1e-9            # float64: the batched rule
TOL_DEVICE = 2e-6     # float32: the device walk
_ACCEPT, _REJECT = sampling.acceptance_probability, sampling.reject   # the scalar rule, as shipped
GRID = [i / 32 for i in range(32)] + [0.999]    # where each verdict is checked to be a threshold in u
GRID_DEVICE = [i / 8 for i in range(8)] + [0.999]


# ------------------------------------------------------------------ integrating over the uniforms
def thresholds(first_of: Callable[[torch.Tensor], torch.Tensor], n_rows: int, k: int, dtype: torch.dtype,
               grid: list[float] = GRID) -> torch.Tensor:
    """t: [R, k] float64 such that, every earlier slot rejected, slot i of row r is accepted iff u < t[r, i].

    ``first_of(u)``: the rule's first accepted slot per row (-1: none) for uniforms u: [R, k].
    """
    out = torch.zeros(n_rows, k, dtype=torch.float64)
    for i in range(k):
        def accepts(ui: torch.Tensor, i=i) -> torch.Tensor:
            u = torch.ones(n_rows, k, dtype=dtype)
            u[:, i] = ui
            return first_of(u) == i

        lo, hi = torch.zeros(n_rows, dtype=dtype), torch.ones(n_rows, dtype=dtype)
        always = accepts(hi)                       # accepted even at u = 1: probability 1 (never at u = 0: 0)
        for _ in range(64 if dtype == torch.float64 else 26):   # to an ulp (float64), 2**-26 (float32)
            mid = (lo + hi) / 2
            yes = accepts(mid)
            lo, hi = torch.where(yes, mid, lo), torch.where(yes, hi, mid)
        t = torch.where(always, torch.ones_like(hi), torch.where(accepts(lo * 0), hi, torch.zeros_like(hi)))
        for g in grid:                            # a threshold indeed: accepted below it, rejected above
            yes = accepts(torch.full((n_rows,), g, dtype=dtype))
            far = (t - g).abs() > 1e-6
            assert torch.equal(yes[far], (g < t)[far]), f"slot {i}: the verdict is not a threshold in u at {g}"
        out[:, i] = t.double()
    return out


def verdict_probs(t: torch.Tensor) -> torch.Tensor:
    """[R, k + 1]: P(first accepted = i) for each slot, then P(none), from the thresholds t: [R, k]."""
    reach = torch.cumprod(torch.cat([torch.ones_like(t[:, :1]), 1 - t], 1), 1)   # [R, k + 1]
    return torch.cat([reach[:, :-1] * t, reach[:, -1:]], 1)


def scalar_outcome(p: torch.Tensor, q: torch.Tensor, drawn: list[int], mode: str):
    """Exact (P(first accepted = i) for each slot, then P(none): [k + 1], the residual after all rejections)
    of ``verify_children`` on the children ``drawn``: its steps, with the rule held at import."""
    r, q_now, reach, out = p, (None if mode == "topk" else q), 1.0, []
    for x in drawn:
        qx = 1.0 if q_now is None else float(q_now[x])
        if qx <= 0.0:                              # a filler slot: skipped without a test
            out.append(0.0)
            continue
        a = float(_ACCEPT(float(r[x]), qx))
        out.append(reach * a)
        reach *= 1.0 - a
        r, q_now = _REJECT(r, q_now, torch.tensor([x]), mode)
    return torch.tensor(out + [reach], dtype=torch.float64), r


def sequences(q: torch.Tensor, k: int, mode: str) -> list[tuple[list[int], float]]:
    """Every sequence of k children ``mode`` can draw from q, with its probability."""
    out = []

    def grow(drawn, w):
        if len(drawn) == k:
            out.append((drawn, w))
            return
        for x, wx in _draws(q, drawn, k, mode):
            grow(drawn + [x], w * wx)

    grow([], 1.0)
    return out


# ------------------------------------------------------------------ the batched rule
def check_batched(p: torch.Tensor, q: torch.Tensor, mode: str, ks=(3, 2, 1)) -> None:
    """All draws of k children for each k in ``ks`` (widest first), as rows of one call of the batched rule."""
    ks = [min(k, len(q)) for k in ks]
    groups = [(k, sequences(q, k, mode)) for k in ks]
    rows = [(k, drawn, w) for k, seqs in groups for drawn, w in seqs]
    width = ks[0]
    drawn = torch.tensor([d + [0] * (width - len(d)) for _, d, _ in rows])                 # [R, k]
    widths = [sum(k > i for k, _, _ in rows) for i in range(width)]
    pr, qr = p.expand(len(rows), -1), q.expand(len(rows), -1)
    t = thresholds(lambda u: verify_rows_state(pr, qr, drawn, u, mode, widths)[0], len(rows), width, p.dtype)
    probs = verdict_probs(t)                                                               # [R, k + 1]
    residual = verify_rows_state(pr, qr, drawn, torch.ones(len(rows), width, dtype=p.dtype), mode, widths)[1]
    emitted = {k: torch.zeros_like(p) for k in ks}
    for j, (k, d, w) in enumerate(rows):
        want, want_r = scalar_outcome(p, q, d, mode)
        got = torch.cat([probs[j, :k], probs[j, -1:]])
        assert (got - want).abs().max() < TOL, f"{mode}, children {d}: P(verdict) {got.tolist()} != {want.tolist()}"
        assert probs[j, k:-1].sum() < TOL, f"{mode}: a slot past the row's children was accepted"
        if want[-1] > 1e-12:
            assert (residual[j] - want_r).abs().max() < TOL, f"{mode}, children {d}: the residual differs"
        for i, x in enumerate(d):
            emitted[k][x] += w * got[i]
        emitted[k] += w * got[-1] * residual[j]
    for k in ks:
        err = (emitted[k] - p).abs().max().item()
        if err > TOL:
            raise AssertionError(f"{mode}, k={k}: emitted {emitted[k].tolist()} != p {p.tolist()} (max error {err:.3g})")


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("mode", SAMPLING_MODES)
def test_the_batched_rule_emits_exactly_p(case, mode):
    check_batched(*CASES[case], mode)


# The cases a scaled acceptance cannot move: every test there accepts with probability 0 or 1 (p equal to q, p
# one-hot, supports disjoint), and 1.02 clamps back to 1 where 0.98 does not.
_UNMOVED = {1.02: {(c, m) for c in ("disjoint", "equal", "p_one_hot") for m in ("with_replacement",
                                                                               "without_replacement")}
            | {("p_one_hot", "topk")},
            0.98: {("disjoint", "with_replacement"), ("disjoint", "without_replacement")}}


@pytest.mark.parametrize("factor", [1.02, 0.98])
def test_a_batched_rule_off_by_two_percent_is_caught(monkeypatch, factor):
    plain = sampling.acceptance_probability
    monkeypatch.setattr(sampling, "acceptance_probability", lambda r_x, q_x: plain(r_x, q_x) * factor)
    passed = set()
    for case, mode in itertools.product(sorted(CASES), SAMPLING_MODES):
        try:
            check_batched(*CASES[case], mode)
            passed.add((case, mode))
        except AssertionError:
            pass
    assert passed == _UNMOVED[factor]


def test_a_residual_without_the_max_is_caught(monkeypatch):
    """(p - q) normalised without max(., 0): its total is 0 for two distributions, so the rule falls back to p."""
    def unclamped(p, q, x):
        r = p.scatter(-1, x, 0.0) if q is None else p - q
        total = r.sum(-1, keepdim=True)
        return torch.where(total.abs() > 1e-12, r / total, p)

    monkeypatch.setattr(sampling, "_residual", unclamped)
    with pytest.raises(AssertionError, match="max error"):
        check_batched(*CASES["skewed"], "without_replacement")


# ------------------------------------------------------------------ the device walk on small trees
TREES = {
    "two_levels": Tree((-1, 0, 0, 1, 1)),                # root: 2 children; node 1: 2 children
    "uneven": Tree((-1, 0, 0, 0, 1, 1, 2, 4)),           # widths 3, 2, 1, 1 over four rows, depth 3
}
# A bigram target and draft over 4 tokens: p at a node is TARGET[its token], q is DRAFT[its token].
TARGET = torch.tensor([[4, 3, 2, 1], [1, 1, 5, 3], [0, 2, 2, 6], [3, 0, 0, 7]], dtype=torch.float64)
DRAFT = torch.tensor([[1, 4, 3, 2], [2, 2, 2, 4], [5, 1, 0, 4], [3, 3, 3, 1]], dtype=torch.float64)
TARGET, DRAFT = TARGET / TARGET.sum(1, keepdim=True), DRAFT / DRAFT.sum(1, keepdim=True)
SAMPLING = SamplingConfig(temperature=1.0)


def _draft(tree: Tree, tokens: list[int]) -> tuple[Draft, torch.Tensor]:
    """The draft (q by the bigram draft) and the target's logits at each node.  logits: [n_nodes, V]"""
    q = {v: DRAFT[tokens[v]].float() for v in range(tree.n_nodes) if tree.children[v]}
    return Draft(tree, list(tokens), q, [1.0] * tree.n_nodes), TARGET[torch.tensor(tokens)].log()


def device_outcomes(draft: Draft, logits: torch.Tensor, mode: str, grid=GRID_DEVICE) -> dict[tuple, float]:
    """Exact P(accepted path, bonus token) of the device walk, over its uniforms."""
    lay = walk_layout(draft.tree, "cpu")
    n_rows, k = len(lay.rows), len(lay.widths)
    t = thresholds(lambda u: walk_verdicts(draft, logits, SAMPLING, mode, u)[0], n_rows, k, torch.float32, grid)
    probs = verdict_probs(t)                                                               # [R, k + 1]
    out: dict[tuple, float] = defaultdict(float)
    for verdicts in itertools.product(*(range(-1, len(draft.tree.children[v])) for v in lay.rows)):
        weight = float(torch.prod(probs[torch.arange(n_rows), torch.tensor(verdicts)]))  # -1 picks P(none)
        if weight <= 0.0:
            continue
        u = torch.ones(n_rows, k)                  # uniforms that give these verdicts: 1 rejects, 0 accepts
        for row, f in enumerate(verdicts):
            if f >= 0:
                u[row, f] = 0.0
        got, dist = walk_verdicts(draft, logits, SAMPLING, mode, u)
        assert got.tolist() == list(verdicts)
        walk = PendingWalk(draft.tree, lay, torch.zeros(1), got).finish(StepReadback(bonus=(0,), verdicts=verdicts))
        for y in range(len(dist)):
            out[(tuple(walk.path), y)] += weight * float(dist[y])
    return out


def host_outcomes(draft: Draft, logits: torch.Tensor, mode: str) -> dict[tuple, float]:
    """Exact P(accepted path, bonus token) of the host walk (the scalar rule node by node), from the same float32
    p and q the device walk sees."""
    out: dict[tuple, float] = defaultdict(float)

    def walk(node, path, weight):
        p = warp(logits[node], SAMPLING).double()
        kids = draft.tree.children[node]
        if not kids:
            for y in range(len(p)):
                out[(path, y)] += weight * float(p[y])
            return
        probs, residual = scalar_outcome(p, draft.q[node].double(), [draft.tokens[c] for c in kids], mode)
        for i, c in enumerate(kids):
            if probs[i] > 0:
                walk(c, path + (c,), weight * float(probs[i]))
        for y in range(len(p)):
            out[(path, y)] += weight * float(probs[-1]) * float(residual[y])

    walk(0, (0,), 1.0)
    return out


def _max_gap(a: dict, b: dict) -> float:
    return max(abs(a.get(key, 0.0) - b.get(key, 0.0)) for key in set(a) | set(b))


# Children of each node with children: distinct siblings, including a token q gives 0 (DRAFT[2][2]).
GIVEN = {"two_levels": [[0, 1, 2, 3, 2], [3, 2, 0, 2, 1]],
         "uneven": [[1, 3, 2, 0, 1, 0, 3, 2], [2, 0, 2, 1, 3, 2, 0, 1], [0, 1, 3, 2, 0, 2, 1, 3]]}


@pytest.mark.parametrize("name", sorted(GIVEN))
@pytest.mark.parametrize("mode", SAMPLING_MODES)
def test_the_device_walk_follows_the_host_walk_exactly(name, mode):
    for tokens in GIVEN[name]:
        draft, logits = _draft(TREES[name], tokens)
        gap = _max_gap(device_outcomes(draft, logits, mode), host_outcomes(draft, logits, mode))
        assert gap < TOL_DEVICE, f"{name}, tokens {tokens}: P(path, bonus) off by {gap:.3g}"


def emitted_chain_error(mode: str, tree: Tree = TREES["two_levels"], root: int = 1) -> float:
    """Over every draw of the tree's tokens: the largest gap between P(first depth + 1 tokens emitted, completed
    by the target where the step emitted fewer) and the target's own chain probability of them."""
    n = tree.depth + 1
    got: dict[tuple, float] = defaultdict(float)
    for tokens, w in _tree_draws(tree, root, mode):
        draft, logits = _draft(tree, tokens)
        for (path, y), pr in device_outcomes(draft, logits, mode, grid=()).items():   # thresholds: checked above
            emitted = tuple(tokens[v] for v in path[1:]) + (y,)
            for rest in itertools.product(range(4), repeat=n - len(emitted)):   # the target goes on alone
                seq = emitted + rest
                got[seq] += w * pr * _chain(seq[len(emitted) - 1:], 1.0)
    return max(abs(got.get(seq, 0.0) - _chain((root,) + seq, 1.0)) for seq in itertools.product(range(4), repeat=n))


def _chain(seq: tuple, w: float) -> float:
    """w times the target's probability of seq[1:] after seq[0], token by token."""
    for a, b in zip(seq, seq[1:]):
        w *= float(TARGET[a, b])
    return w


def _tree_draws(tree: Tree, root: int, mode: str):
    """(tokens of every node, probability) for every way ``mode`` draws each node's children from q at the node."""
    def fill(tokens, w, node):
        if node == tree.n_nodes:
            yield tokens, w
            return
        kids = tree.children[node]
        if not kids:
            yield from fill(tokens, w, node + 1)
            return
        for drawn, wd in sequences(DRAFT[tokens[node]].float().double(), len(kids), mode):
            new = list(tokens)
            for c, x in zip(kids, drawn):
                new[c] = x
            yield from fill(new, w * wd, node + 1)

    yield from fill([root] + [0] * tree.size, 1.0, 0)


@pytest.mark.parametrize("mode", SAMPLING_MODES)
def test_the_device_walk_emits_the_targets_chain_exactly(mode):
    assert emitted_chain_error(mode) < TOL_DEVICE


def test_a_device_walk_off_by_two_percent_is_caught(monkeypatch):
    plain = sampling.acceptance_probability
    monkeypatch.setattr(sampling, "acceptance_probability", lambda r_x, q_x: plain(r_x, q_x) * 1.02)
    draft, logits = _draft(TREES["uneven"], GIVEN["uneven"][0])
    assert _max_gap(device_outcomes(draft, logits, "without_replacement"),
                    host_outcomes(draft, logits, "without_replacement")) > 100 * TOL_DEVICE
    assert emitted_chain_error("topk") > 100 * TOL_DEVICE
