"""Frozen configuration, validated once at the edge (CLI, app) and passed down."""

from __future__ import annotations

from dataclasses import dataclass

from .trees.tree import MAX_TREE_SIZE

#: Hard caps that keep one request from exhausting memory or starving a server.
MAX_NEW_TOKENS = 4096
MAX_DEPTH = 64
MAX_PROMPT_TOKENS = 8192

#: Longest acceptance vector a request may carry (measured vectors have 6 to 30 useful entries).
MAX_ACCEPTANCE_LEN = 64

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


@dataclass(frozen=True)
class ServerCaps:
    """What one decode request may ask of a shared server, by device kind; the app checks it at its edge."""

    device: str                 # "cpu" or "cuda"
    max_new_tokens: int         # per decode request (Live, /decode, each method of /compare)
    max_prompt_tokens: int      # the prefill is one forward over the prompt: quadratic attention memory

    def check_new_tokens(self, n: int) -> None:
        if n > self.max_new_tokens:
            raise ValueError(f"max new tokens {n} is above this server's cap of {self.max_new_tokens} per request "
                             f"on {self.device} (so that one request cannot hold the model for minutes)")

    def check_prompt_tokens(self, n: int) -> None:
        if n > self.max_prompt_tokens:
            raise ValueError(f"the prompt has {n} tokens; this server takes at most {self.max_prompt_tokens} "
                             f"per request on {self.device}")


CPU_CAPS = ServerCaps(device="cpu", max_new_tokens=256, max_prompt_tokens=4096)
GPU_CAPS = ServerCaps(device="cuda", max_new_tokens=2048, max_prompt_tokens=MAX_PROMPT_TOKENS)

#: DP work one request may ask for: the solve costs budget^2 x depth x (vector length) steps of numpy on
#: the CPU whatever the model's device; 2^30 is about one second on one core of a small CPU.
MAX_DP_WORK = 2 ** 30


def caps_for(device) -> ServerCaps:
    """The caps for a device (a torch.device or its name): GPU_CAPS on CUDA, CPU_CAPS elsewhere."""
    return GPU_CAPS if str(device).startswith("cuda") else CPU_CAPS


def check_acceptance_length(values) -> None:
    """A request's acceptance vector must have at most MAX_ACCEPTANCE_LEN entries."""
    if len(values) > MAX_ACCEPTANCE_LEN:
        raise ValueError(f"the acceptance vector has {len(values)} entries; the maximum is {MAX_ACCEPTANCE_LEN} "
                         "(entries past the first few change the tree very little)")


def check_dp_work(budget: int, depth: int, width: int) -> None:
    """Refuse a DP solve above MAX_DP_WORK, with the numbers and what to lower."""
    work = budget * budget * depth * min(width, budget)
    if work > MAX_DP_WORK:
        raise ValueError(f"budget {budget} x depth {depth} with a {width}-entry acceptance vector is more DP work "
                         f"than this server allows per request (budget² × depth × entries = {work:.3g}, cap "
                         f"{MAX_DP_WORK:.3g}); lower the budget, the depth or the vector length")
