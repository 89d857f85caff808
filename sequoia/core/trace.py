"""One record per decoding step, and everything derived from a stream of them.

The engine yields a :class:`StepRecord` per target call.  Final text,
statistics, benchmarks and every UI view are computed from these records
alone, so a method is comparable with any other as soon as it emits them.

Node status vocabulary (see :mod:`sequoia.core.sampling` for the terms):
``accepted``  on the accepted path (the root is always accepted);
``rejected``  verified by the target and rejected;
``unreached`` never verified, because an ancestor or an earlier sibling
              decided the step first.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .tree import Tree

ACCEPTED, REJECTED, UNREACHED = "accepted", "rejected", "unreached"


@dataclass(frozen=True)
class StepRecord:
    step: int                         # 0-based index of the target call
    tree: Tree                        # shape of this step's speculation
    tokens: tuple[int, ...]           # [n_nodes] token id of every node; tokens[0] is the root
    texts: tuple[str, ...]            # [n_nodes] decoded text of each token
    q: tuple[float, ...]              # [n_nodes] draft prob of the node's token given its parent (root: 1.0)
    p: tuple[float, ...]              # [n_nodes] target prob of the node's token given its parent (root: 1.0)
    accepted: tuple[int, ...]         # accepted path, node indices from the root (root included)
    status: tuple[str, ...]           # [n_nodes] ACCEPTED / REJECTED / UNREACHED
    bonus: int                        # token sampled from the target (residual or plain) after the path
    bonus_text: str
    new_tokens: tuple[int, ...]       # tokens committed by this step: accepted drafts + bonus (after stop trimming)
    draft_s: float                    # wall time growing the draft tree
    verify_s: float                   # wall time of the one target forward
    other_s: float                    # sampling, verification walk, cache compaction
    method: str = "sequoia"
    finished: bool = False            # True on the last step (EOS, stop string or length)
    finish_reason: str | None = None  # "eos" | "stop" | "length" | None
    extra: dict = field(default_factory=dict, compare=False)  # method-specific annotations (e.g. dynamic pruning)

    @property
    def n_accepted(self) -> int:
        """Draft tokens accepted (root excluded)."""
        return len(self.accepted) - 1

    @property
    def n_new(self) -> int:
        return len(self.new_tokens)

    @property
    def total_s(self) -> float:
        return self.draft_s + self.verify_s + self.other_s

    @property
    def accepted_ranks(self) -> tuple[int, ...]:
        """Sibling rank (0-based) of each accepted draft node, by depth."""
        return tuple(self.tree.ranks[i] for i in self.accepted[1:])

    @classmethod
    def fake(cls, tree: Tree, accepted: tuple[int, ...], step: int = 0, bonus: int = 7) -> "StepRecord":
        """Cheap record for tests of views and statistics (no model needed)."""
        n = tree.n_nodes
        on_path = set(accepted)
        status = []
        for i in range(n):
            if i in on_path:
                status.append(ACCEPTED)
            elif tree.parents[i] in on_path:
                status.append(REJECTED)
            else:
                status.append(UNREACHED)
        toks = tuple(100 + i for i in range(n))
        return cls(
            step=step, tree=tree, tokens=toks, texts=tuple(f"t{i}" for i in range(n)),
            q=tuple([1.0] + [0.5] * (n - 1)), p=tuple([1.0] + [0.4] * (n - 1)),
            accepted=tuple(accepted), status=tuple(status), bonus=bonus, bonus_text=f"b{bonus}",
            new_tokens=tuple(toks[i] for i in accepted[1:]) + (bonus,),
            draft_s=0.01, verify_s=0.02, other_s=0.001,
        )
