"""Slots -> llama.cpp sequence ids: the bookkeeping behind one session's KV cache (pure Python).

llama.cpp has no per-token attention mask.  In its unified KV cache every cell
holds one token at one position and carries a set of *sequence ids*; a token
of a batch attends to the cells that carry its *first* sequence id and sit at a
position <= its own.  A tree therefore becomes sequences:

* **Invariant**: the cells of every live sequence form one root-to-node path,
  one cell per position 0..top.  So each slot has a *representative* sequence
  (``rep``): one whose cells at positions <= the slot's are exactly the slot
  and its ancestors.  Committed chain slots all live in sequence 0.
* **Forward**: token i with parent p gets position ``pos(p) + 1``.  If p is the
  top of its representative sequence (nothing hangs off p there yet), i simply
  *extends* that sequence -- a chain stays in sequence 0 and costs no id.
  Otherwise i opens a *fresh* sequence f: f is added to the tags of i's
  ancestors inside the same call, and the cached ancestors are shared into f
  with ``seq_cp(rep(c), f, 0, pos(c) + 1)`` where c is i's nearest cached
  ancestor (a metadata-only copy in a unified cache).  A token's tags are thus
  its own sequence first, then the fresh sequences of its in-call descendants.
  This also satisfies llama.cpp's batch checks: positions of each sequence are
  consecutive after what the cache holds, and sequences that share a token
  hold the same cells before the batch.
* **Keep / crop** copy the surviving path into sequence 0 and ``seq_keep(0)``,
  which drops every other sequence and frees their cells; the id pool restarts.

Sequence ids are 0..255 (llama.cpp's ``LLAMA_MAX_SEQ``); a session between two
keeps may open at most 255 branches (about the number of leaves it grows).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

MAX_SEQ = 256  # LLAMA_MAX_SEQ in llama.cpp's src/llama-cparams.h


@dataclass(frozen=True)
class SeqCopy:
    """``llama_memory_seq_cp(mem, src, dst, 0, end)``: share cells at positions < end of src into dst."""

    src: int
    dst: int
    end: int


@dataclass(frozen=True)
class ForwardPlan:
    """What one forward call hands llama.cpp: done as copies first, then the batch."""

    positions: list[int]        # [n]
    tags: list[list[int]]       # [n][k_i]; tags[i][0] is the sequence llama.cpp masks token i with
    copies: list[SeqCopy]       # applied before the first llama_decode of the call
    reps: list[int]             # [n] representative sequence of each new slot
    top: dict[int, int]         # sequence -> top position after the call (only those it touched)
    next_id: int                # first unused sequence id after the call


@dataclass(frozen=True)
class MemoryOp:
    """One ``llama_memory_seq_*`` call: ("rm", seq, p0, p1) | ("cp", src, dst, p0, p1) | ("keep", seq)."""

    kind: str
    args: tuple[int, ...]


@dataclass
class SlotTable:
    """Per-slot position, parent and representative sequence of one session.

    Slots ``[0, chain)`` are a chain in sequence 0 at positions 0..chain-1 and
    are not stored one by one (a long prompt costs nothing per step); only the
    *tail* -- slots forwarded as a tree since the last keep -- is.
    """

    chain: int = 0                                        # slots forming the committed chain
    tail_pos: list[int] = field(default_factory=list)     # [len - chain]
    tail_parent: list[int] = field(default_factory=list)  # [len - chain]
    tail_rep: list[int] = field(default_factory=list)     # [len - chain]
    top: dict[int, int] = field(default_factory=dict)     # live sequence -> its top position
    next_id: int = 1                                      # sequence ids handed out: 1..next_id-1

    def __len__(self) -> int:
        return self.chain + len(self.tail_pos)

    def slot(self, s: int) -> tuple[int, int, int]:
        """(position, parent, rep) of slot ``s``; s = -1 is the virtual parent of a root (position -1)."""
        if s < 0:
            return -1, -1, 0
        if s < self.chain:
            return s, s - 1, 0
        i = s - self.chain
        return self.tail_pos[i], self.tail_parent[i], self.tail_rep[i]

    # -------------------------------------------------------------- forward
    def plan(self, parents: Sequence[int]) -> ForwardPlan:
        """Positions, sequence tags and copies for tokens with these (already validated) parents."""
        n0 = len(self)
        positions: list[int] = []
        tags: list[list[int]] = []
        reps: list[int] = []
        copies: list[SeqCopy] = []
        top: dict[int, int] = {}
        next_id = self.next_id
        for i, p in enumerate(parents):
            if p >= n0:  # a parent from this call
                p_pos, p_rep = positions[p - n0], reps[p - n0]
            else:
                p_pos, _, p_rep = self.slot(p)
            if top.get(p_rep, self.top.get(p_rep, -1)) == p_pos:
                seq = p_rep  # p is the top of its sequence: extend it
            else:
                if next_id >= MAX_SEQ:
                    raise ValueError(
                        f"forward: the tree needs more than {MAX_SEQ - 1} branches since the last keep/crop "
                        f"(llama.cpp allows {MAX_SEQ} sequence ids); keep or crop the session more often")
                seq, next_id = next_id, next_id + 1
                a = p
                while a >= n0:  # in-call ancestors carry the new sequence too
                    tags[a - n0].append(seq)
                    a = parents[a - n0]
                if a >= 0:  # share the cached ancestors (a and up) into the new sequence
                    a_pos, _, a_rep = self.slot(a)
                    copies.append(SeqCopy(a_rep, seq, a_pos + 1))
            positions.append(p_pos + 1)
            tags.append([seq])
            reps.append(seq)
            top[seq] = p_pos + 1
        return ForwardPlan(positions, tags, copies, reps, top, next_id)

    def commit(self, parents: Sequence[int], plan: ForwardPlan) -> None:
        """Record the slots of a forward that llama.cpp accepted."""
        n0 = len(self)
        start = 0
        if not self.tail_pos:  # a leading chain continuation joins the committed chain
            while (start < len(parents) and parents[start] == n0 + start - 1
                   and plan.reps[start] == 0):
                start += 1
            self.chain += start
        self.tail_pos += plan.positions[start:]
        self.tail_parent += list(parents[start:])
        self.tail_rep += plan.reps[start:]
        self.top.update(plan.top)
        self.next_id = plan.next_id

    # -------------------------------------------------------------- keep / crop
    def keep_ops(self, prefix: int, slots: Sequence[int]) -> list[MemoryOp]:
        """Memory calls that leave slots [0, prefix) + ``slots`` as a chain in sequence 0 (checked args)."""
        if prefix > self.chain:
            raise ValueError(f"keep: slots 0..{prefix - 1} are not a chain (the committed chain ends at slot "
                             f"{self.chain - 1}); keep needs prefix <= {self.chain}")
        prev = prefix - 1
        for s in slots:
            if self.slot(s)[1] != prev:
                raise ValueError(f"keep: slot {s} has parent {self.slot(s)[1]}, not {prev}: the kept slots "
                                 f"must be a path hanging off slot {prefix - 1}")
            prev = s
        if not slots:
            return [MemoryOp("rm", (0, prefix, -1)), MemoryOp("keep", (0,))]
        last_pos, _, last_rep = self.slot(slots[-1])
        if last_rep == 0:  # the path already lives in sequence 0: drop what lies beyond it
            ops = [MemoryOp("rm", (0, last_pos + 1, -1))]
        else:
            ops = [MemoryOp("rm", (0, prefix, -1)), MemoryOp("cp", (last_rep, 0, prefix, last_pos + 1))]
        return ops + [MemoryOp("keep", (0,))]

    def crop_ops(self, length: int) -> list[MemoryOp]:
        if not 0 <= length <= len(self):
            raise ValueError(f"crop: length {length} outside 0..{len(self)}")
        if length > self.chain:
            raise ValueError(f"crop: slots 0..{length - 1} are not a chain (the committed chain ends at slot "
                             f"{self.chain - 1}); use keep(prefix, path) to keep a tree path")
        return [MemoryOp("rm", (0, length, -1)), MemoryOp("keep", (0,))]

    def reset_to_chain(self, length: int) -> None:
        """After keep/crop: ``length`` slots, all a chain in sequence 0; every other id is free again."""
        self.chain = length
        self.tail_pos, self.tail_parent, self.tail_rep = [], [], []
        self.top = {0: length - 1}
        self.next_id = 1
