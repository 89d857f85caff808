"""One record per decoding step, and everything derived from a stream of them.

The engine yields a :class:`StepRecord` per target call, with token ids only: the text fields are
filled by whoever shows them (:mod:`sequoia.runtime.texts`, one batch decode a step).  Final text,
statistics, benchmarks and every UI view are computed from these records
alone, so a method is comparable with any other as soon as it emits them.

Node status vocabulary (see :mod:`sequoia.core.verification.sampling` for the terms):
``accepted``  on the accepted path (the root is always accepted);
``rejected``  verified by the target and rejected;
``unreached`` never verified, because an ancestor or an earlier sibling
              decided the step first.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ..trees.tree import Tree

ACCEPTED, REJECTED, UNREACHED = "accepted", "rejected", "unreached"

#: Who proposed a node (StepRecord.sources): the root, the draft model, or a copy from the context
#: (:mod:`sequoia.core.ngrams.ngram`; verified as a fixed proposal, see :mod:`sequoia.core.verification.sampling`).
ROOT, DRAFT, NGRAM = "root", "draft", "ngram"


@dataclass(frozen=True)
class DynamicInfo:
    """What a dynamic tree (``sequoia-dynamic``) decided in one step, against the static DP tree.

    Nodes of the two trees are matched by their path of sibling ranks from the root.
    """

    static_tree_parents: tuple[int, ...]  # [m] parents of the static DP tree of the same size (root: -1)
    added: tuple[int, ...]                # indices of this step's nodes the static tree lacks
    pruned: tuple[int, ...]               # indices of static-tree nodes this step left out
    predicted_tokens: float               # 1 + sum of the nodes' estimated acceptance
    predicted_ms: float                   # the cost model's price of the step
    widths: tuple[int, ...]               # draft forward widths, the root's begin() first
    # The price gate's level for this step (sequoia.runtime.proposers.price): "full", "small" or "plain" (a step it kept
    # to the target alone); "" without a gate.  gate_note says why, from the measured cost of past steps.
    gate: str = ""
    gate_note: str = ""

    def to_dict(self) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}


@dataclass(frozen=True)
class NodeCheck:
    """What verification saw at one node, for the inspector (recorded with ``generate(..., inspect=True)``).

    One per tested child, in verification order, plus one for the bonus draw
    (``node == tree.n_nodes``, the index the tree view gives the bonus).  The
    ``top_*`` tuples share one token axis: the parent's most likely tokens
    under p and q at the moment of the test, and the child's own token.
    """

    node: int                         # the tested child (tree.n_nodes: the bonus)
    parent: int
    u: float | None                   # uniform draw; accepted iff u * q_token < p_token (None: T=0 / bonus)
    p_token: float                    # target prob of the child's token at the test (after earlier siblings)
    q_token: float                    # draft prob of it at the test (renormalised after earlier siblings)
    accepted: bool
    top_ids: tuple[int, ...]          # [k] token ids on the shared axis
    top_texts: tuple[str, ...]        # [k] their decoded text; () until the caller decodes them
    top_p: tuple[float, ...]          # [k] target distribution at the test
    top_q: tuple[float, ...]          # [k] draft distribution at the test (() for the bonus)
    residual: tuple[float, ...] = ()  # [k] norm(max(p - q, 0)) after this rejection (() if accepted)


@dataclass(frozen=True)
class StepRecord:
    step: int                         # 0-based index of the target call
    tree: Tree                        # shape of this step's speculation
    tokens: tuple[int, ...]           # [n_nodes] token id of every node; tokens[0] is the root
    texts: tuple[str, ...]            # [n_nodes] decoded text of each token; () until the caller decodes them
    q: tuple[float, ...]              # [n_nodes] draft prob of the node's token given its parent (root: 1.0)
    p: tuple[float, ...]              # [n_nodes] target prob of the node's token given its parent (root: 1.0)
    accepted: tuple[int, ...]         # accepted path, node indices from the root (root included)
    status: tuple[str, ...]           # [n_nodes] ACCEPTED / REJECTED / UNREACHED
    bonus: int                        # token sampled from the target (residual or plain) after the path
    bonus_text: str                   # the bonus token's text; "" until the caller decodes it
    new_tokens: tuple[int, ...]       # tokens committed by this step: accepted drafts + bonus (after stop trimming)
    draft_s: float                    # wall time growing the draft tree
    verify_s: float                   # wall time of the one target forward
    other_s: float                    # sampling, verification walk, cache compaction
    method: str = "sequoia"
    finished: bool = False            # True on the last step (EOS, stop string or length)
    finish_reason: str | None = None  # "eos" | "stop" | "length" | None
    dynamic: DynamicInfo | None = None  # a dynamic tree's decisions (None: static trees, skipped drafts)
    checks: tuple[NodeCheck, ...] = ()  # what verification saw (only with generate(..., inspect=True))
    sources: tuple[str, ...] = ()     # [n_nodes] ROOT / DRAFT / NGRAM per node; () when every node is the draft's
    match_len: tuple[int, ...] = ()   # [n_nodes] n of the match that proposed each copied node (0: not copied)
    prompt_tokens: int = 0            # prompt tokens this step's forward read: the prompt's length in step 0, else 0

    def source(self, node: int) -> str:
        """Who proposed ``node`` (ROOT for node 0, DRAFT when the record names no sources)."""
        if node == 0:
            return ROOT
        return self.sources[node] if self.sources else DRAFT

    @property
    def n_accepted(self) -> int:
        """Draft tokens accepted (root excluded)."""
        return len(self.accepted) - 1

    @property
    def n_new(self) -> int:
        return len(self.new_tokens)

    @property
    def ended_on_leaf(self) -> bool:
        """The accepted path ended on a leaf of the tree: a token the draft proposed but never forwarded, so the next
        step's first draft forward feeds it beside the new root (the cost model's catch-up)."""
        return len(self.accepted) > 1 and not self.tree.children[self.accepted[-1]]

    @property
    def total_s(self) -> float:
        return self.draft_s + self.verify_s + self.other_s

    def to_dict(self) -> dict:
        """A JSON-ready view (lists, numbers, strings); the tree as its parent list."""
        return {
            "step": self.step, "method": self.method, "parents": list(self.tree.parents),
            "tokens": list(self.tokens), "texts": list(self.texts), "q": list(self.q), "p": list(self.p),
            "accepted": list(self.accepted), "status": list(self.status), "bonus": self.bonus,
            "bonus_text": self.bonus_text, "new_tokens": list(self.new_tokens), "draft_s": self.draft_s,
            "verify_s": self.verify_s, "other_s": self.other_s, "finished": self.finished,
            "finish_reason": self.finish_reason,
            "dynamic": self.dynamic.to_dict() if self.dynamic is not None else None,
            "sources": list(self.sources),
            "match_len": list(self.match_len),
            "prompt_tokens": self.prompt_tokens,
        }

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
