"""Frozen configuration, validated once at the edge (CLI, app) and passed down."""

from __future__ import annotations

from dataclasses import dataclass

from .tree import MAX_TREE_SIZE

#: Hard caps that keep one request from exhausting memory or starving a server.
MAX_NEW_TOKENS = 4096
MAX_DEPTH = 64
MAX_PROMPT_TOKENS = 8192

#: How children are drawn from the draft at each node.
SAMPLING_MODES = ("without_replacement", "with_replacement", "topk")


@dataclass(frozen=True)
class SamplingConfig:
    """Warping applied identically to target (p) and draft (q) logits.

    ``temperature == 0`` means greedy: the output is exactly the target's argmax
    sequence.  ``top_k == 0`` and ``top_p == 1`` disable those filters.
    """

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.temperature, (int, float)) or not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature!r}")
        if self.temperature > 100:
            raise ValueError(f"temperature must be <= 100, got {self.temperature!r}")
        if not isinstance(self.top_p, (int, float)) or not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k must be an integer >= 0, got {self.top_k!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass(frozen=True)
class GenerationConfig:
    max_new_tokens: int = 128
    sampling: SamplingConfig = SamplingConfig()
    stop_strings: tuple[str, ...] = ()
    stop_at_eos: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.max_new_tokens, int) or not 1 <= self.max_new_tokens <= MAX_NEW_TOKENS:
            raise ValueError(f"max_new_tokens must be in 1..{MAX_NEW_TOKENS}, got {self.max_new_tokens!r}")
        if not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {self.seed!r}")


def check_budget(budget: int, depth: int | None = None) -> None:
    """Validate a tree budget (draft tokens per step) and optional depth limit."""
    if not isinstance(budget, int) or not 1 <= budget <= MAX_TREE_SIZE:
        raise ValueError(f"budget must be an integer in 1..{MAX_TREE_SIZE}, got {budget!r}")
    if depth is not None and (not isinstance(depth, int) or not 1 <= depth <= MAX_DEPTH):
        raise ValueError(f"depth must be an integer in 1..{MAX_DEPTH}, got {depth!r}")
