"""The slot -> sequence-id plan of the llama.cpp runner, checked on a model of llama.cpp's unified KV cache.

No llama.cpp needed: :class:`CellModel` mirrors what ``llama_memory_seq_cp/rm/keep``
do to cells, the checks ``llama_batch_allocr::init`` makes on a batch, and the
mask rule (a token sees the cells carrying its *first* sequence id at positions
<= its own).  Random sessions of forwards (trees, forests, levels, chains,
split into chunks), keeps and crops must make every token see exactly itself
and its ancestors.
"""

from __future__ import annotations

import random

import pytest

from sequoia.runners.llamacpp.plan import MAX_SEQ, MemoryOp, SlotTable


class CellModel:
    """Cells of a unified KV cache: (label, position, set of sequence ids)."""

    def __init__(self) -> None:
        self.cells: list[tuple[int, int, set[int]]] = []

    def seq_cp(self, src: int, dst: int, p0: int, p1: int) -> None:
        p1 = p1 if p1 >= 0 else 1 << 30
        for _, pos, seqs in self.cells:
            if src in seqs and p0 <= pos < p1:
                seqs.add(dst)

    def seq_rm(self, seq: int, p0: int, p1: int) -> None:
        p1 = p1 if p1 >= 0 else 1 << 30
        for _, pos, seqs in self.cells:
            if p0 <= pos < p1:
                seqs.discard(seq)
        self.cells = [c for c in self.cells if c[2]]

    def seq_keep(self, seq: int) -> None:
        for c in self.cells:
            c[2].intersection_update({seq})
        self.cells = [c for c in self.cells if c[2]]

    def span(self, seq: int) -> tuple[int, int]:
        pos = [p for _, p, s in self.cells if seq in s]
        return (min(pos), max(pos)) if pos else (-1, -1)

    def apply(self, ops: list[MemoryOp]) -> None:
        for op in ops:
            {"rm": self.seq_rm, "cp": self.seq_cp, "keep": self.seq_keep}[op.kind](*op.args)

    def decode(self, labels: list[int], positions: list[int], tags: list[list[int]]) -> list[set[int]]:
        """Validate like llama.cpp, store the tokens, return the labels each token attends to."""
        seqs = {s for t in tags for s in t}
        for s in seqs:
            mine = sorted(p for p, t in zip(positions, tags) if s in t)
            top = self.span(s)[1]
            assert top < 0 or mine[0] == top + 1, f"seq {s}: batch starts at {mine[0]}, cache ends at {top}"
            assert mine == list(range(mine[0], mine[0] + len(mine))), f"seq {s}: positions not continuous"
        for t in tags:  # coupled sequences must hold the same span before the batch
            assert all(self.span(s) == self.span(t[0]) for s in t), f"coupled {t} diverged"
            assert len(set(t)) == len(t), f"repeated sequence id in {t}"
        for s in seqs:  # no partial sequence sub-sets
            common = set.intersection(*(set(t) for t in tags if s in t))
            assert common, f"seq {s} belongs to incompatible sequence sets"
        assert all(0 <= s < MAX_SEQ for s in seqs)
        self.cells += [(lab, p, set(t)) for lab, p, t in zip(labels, positions, tags)]
        return [{lab for lab, p, s in self.cells if t[0] in s and p <= pos} for pos, t in zip(positions, tags)]


class Harness:
    """A SlotTable driven like the runner, over a CellModel, with each slot's true ancestors beside it."""

    def __init__(self, chunk: int) -> None:
        self.table, self.cells, self.chunk = SlotTable(), CellModel(), chunk
        self.labels: list[int] = []      # [slots] label of each slot's cell
        self.parents: list[int] = []     # [slots]
        self.next_label = 0

    def ancestors(self, slot: int) -> set[int]:
        out = set()
        while slot >= 0:
            out.add(self.labels[slot])
            slot = self.parents[slot]
        return out

    def forward(self, parents: list[int]) -> None:
        n0 = len(self.table)
        plan = self.table.plan(parents)
        for c in plan.copies:
            self.cells.seq_cp(c.src, c.dst, 0, c.end)
        labels = list(range(self.next_label, self.next_label + len(parents)))
        self.next_label += len(parents)
        seen = []
        for a in range(0, len(parents), self.chunk):
            b = a + self.chunk
            seen += self.cells.decode(labels[a:b], plan.positions[a:b], plan.tags[a:b])
        self.table.commit(parents, plan)
        self.labels += labels
        self.parents += parents
        for i in range(len(parents)):
            assert seen[i] == self.ancestors(n0 + i), f"slot {n0 + i} attends to the wrong cells"
            depth = len(self.ancestors(n0 + i)) - 1
            assert plan.positions[i] == depth, f"slot {n0 + i}: position {plan.positions[i]}, depth {depth}"

    def keep(self, prefix: int, slots: list[int]) -> None:
        self.cells.apply(self.table.keep_ops(prefix, slots))
        kept = list(range(prefix)) + slots
        self.table.reset_to_chain(len(kept))
        self.labels = [self.labels[s] for s in kept]
        self.parents = list(range(-1, len(kept) - 1))
        assert sorted(lab for lab, _, _ in self.cells.cells) == sorted(self.labels), "keep left stray cells"

    def crop(self, length: int) -> None:
        self.cells.apply(self.table.crop_ops(length))
        self.table.reset_to_chain(length)
        self.labels, self.parents = self.labels[:length], self.parents[:length]
        assert len(self.cells.cells) == length, "crop left stray cells"


def random_forest(rng: random.Random, n0: int, n: int, chain: int) -> list[int]:
    """Parents of n new tokens: mostly in-call, some off cached slots (any of them), now and then a root."""
    parents = []
    for i in range(n):
        r = rng.random()
        if i == 0 or r < 0.15:
            parents.append(rng.choice([n0 - 1, rng.randrange(-1, n0)]) if n0 else -1)
        else:
            parents.append(rng.randrange(n0, n0 + i))
    return parents


def path_to(h: Harness, leaf: int, prefix: int) -> list[int]:
    path = []
    while leaf >= prefix:
        path.append(leaf)
        leaf = h.parents[leaf]
    return path[::-1] if leaf == prefix - 1 else []


@pytest.mark.parametrize("seed", range(12))
def test_random_sessions_attend_to_ancestors_only(seed):
    rng = random.Random(seed)
    h = Harness(chunk=rng.choice([3, 7, 512]))
    h.forward(list(range(-1, rng.randrange(1, 20) - 1)))  # a prompt
    for _ in range(8):
        n0 = len(h.table)
        h.forward(random_forest(rng, n0, rng.randrange(1, 25), h.table.chain))
        if rng.random() < 0.5:  # grow another level off the new slots
            n1 = len(h.table)
            h.forward([rng.randrange(n0, n1) for _ in range(rng.randrange(1, 6))])
        action = rng.random()
        prefix = h.table.chain
        if action < 0.6:
            leaf = rng.randrange(prefix, len(h.table)) if len(h.table) > prefix else prefix - 1
            h.keep(prefix, path_to(h, leaf, prefix) if leaf >= prefix else [])
        elif action < 0.8:
            h.crop(rng.randrange(0, prefix + 1))
        h.forward([len(h.table) - 1] if len(h.table) else [-1])  # continue the chain


def test_a_chain_stays_in_sequence_zero_and_joins_the_committed_chain():
    t = SlotTable()
    plan = t.plan([-1, 0, 1, 2])
    assert plan.tags == [[0]] * 4 and plan.copies == [] and plan.positions == [0, 1, 2, 3]
    t.commit([-1, 0, 1, 2], plan)
    assert t.chain == 4 and t.tail_pos == []


def test_first_child_extends_the_parent_sequence_siblings_open_new_ones():
    t = SlotTable()
    t.commit([-1, 0], t.plan([-1, 0]))  # chain of 2
    plan = t.plan([1, 1, 2, 3])  # two children of slot 1, a grandchild under each
    assert plan.positions == [2, 2, 3, 3]
    assert plan.tags == [[0], [1], [0], [1]]
    assert [(c.src, c.dst, c.end) for c in plan.copies] == [(0, 1, 2)]  # slots 0, 1 shared into sequence 1


def test_in_call_ancestors_carry_a_descendant_branch():
    t = SlotTable()
    t.commit([-1], t.plan([-1]))
    plan = t.plan([0, 1, 1])  # slot 1 off the chain, then two children of slot 1
    assert plan.tags == [[0, 1], [0], [1]]


def test_running_out_of_sequence_ids_is_a_clear_error():
    t = SlotTable()
    t.commit([-1], t.plan([-1]))
    with pytest.raises(ValueError, match="more than 255 branches"):
        t.plan([0] * (MAX_SEQ + 1))


def test_keep_and_crop_refuse_a_non_chain():
    t = SlotTable()
    t.commit([-1, 0, 0], t.plan([-1, 0, 0]))  # slot 2 forks off slot 0
    assert t.chain == 2
    with pytest.raises(ValueError, match="not a chain"):
        t.crop_ops(3)
    with pytest.raises(ValueError, match="must be a path hanging off slot 1"):
        t.keep_ops(2, [2])
    assert t.keep_ops(1, [2])[-1] == MemoryOp("keep", (0,))
