"""The seam to the models: what the engine, drafter, teacher, profiler and bench know of a model.

A :class:`Runner` is one loaded model on one runtime (Hugging Face / torch,
llama.cpp, ...).  It hands out :class:`Session` objects, each owning a KV cache
for one sequence.  Everything above this module speaks token ids, logits rows
and cache *slots*; nothing above it imports a framework's model class.

Vocabulary (the same on every runtime):

* **slot** -- one cached token, numbered ``0 .. len(session) - 1`` in the order
  it was forwarded.  Every slot has a **parent** slot (``-1``: none, the first
  token of the text) and a **position** (its parent's position + 1; 0 for a
  token without a parent).  A token attends to itself and its ancestors only.
  A plain text is a chain (each slot's parent is the slot before it); a draft
  or verification tree hangs several slots off one parent.
* **forward(tokens, parents, keep)** -- append ``tokens`` as new slots
  ``len(self) .. len(self) + n - 1`` and return the logits predicting the token
  after each.  ``parents[i]`` is the slot of token i's parent: an earlier slot
  of the session or a slot of the same call (always lower than its own slot,
  so the call is in topological order).  ``parents=None`` continues the
  session as a chain.  ``keep`` = k > 0 returns only the last k rows (a
  prefill wants the last one); 0 returns all of them.
* **keep(prefix, slots)** -- keep slots ``[0, prefix)`` followed by ``slots``
  (sorted, all >= prefix, a chain from slot ``prefix - 1``: the accepted path),
  renumbered ``prefix, prefix + 1, ...``.  What the engine does after a walk.
* **crop(length)** -- keep the first ``length`` slots (which must be a chain).

Logits rows are ``[rows, runner.vocab_size]`` torch tensors on the runner's
``device`` (any float dtype); callers cut them to the vocabulary both models
share.  Shapes of a pair: the tokenizer lives at the edge (:class:`ModelPair`),
runners never see text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch


@runtime_checkable
class Session(Protocol):
    """One sequence's KV cache on one runner (see the module docstring for slots and parents)."""

    def __len__(self) -> int:
        """Cached slots."""

    def forward(self, tokens: Sequence[int], parents: Sequence[int] | None = None,
                keep: int = 0) -> torch.Tensor:
        """Append ``tokens`` as new slots; logits after each (the last ``keep`` only if > 0).  # [rows, V]"""

    def keep(self, prefix: int, slots: Sequence[int]) -> None:
        """Keep slots ``[0, prefix)`` then ``slots`` (sorted, >= prefix), renumbered contiguously."""

    def crop(self, length: int) -> None:
        """Keep the first ``length`` slots."""


@dataclass(frozen=True)
class RunnerInfo:
    """What a fingerprint, a profile and the page say about a runner."""

    runtime: str            # "hf" | "llamacpp"
    weights: str            # the weight type as loaded: "bf16", "fp32", "fp16" (hf), "Q4_K_M", "Q4_0", ... (GGUF)
    device: str             # "cpu", "cuda:0", ...
    threads: int | None = None  # CPU threads the runtime uses (None: the runtime's default)
    kernels: str = ""       # free text: which kernels or options the runner chose
    quant: str = "none"     # hf only: weight-only quantization of the linears ("none" | "int8" | "int4")
    single_row_kernel: str = ""  # hf only: "aten" (one-token forwards skip oneDNN) or "onednn-blocked" (see runners/hf/cpu.py)
    multi_row_kernel: str = ""   # hf only: "onednn-blocked" when many-row products read blocked weight copies


@runtime_checkable
class Runner(Protocol):
    """One loaded model on one runtime."""

    name: str                   # for display ("Qwen2.5-Coder-1.5B-Instruct (Q4_K_M)")
    vocab_size: int             # logit columns (an embedding may be padded beyond the tokenizer)
    device: torch.device        # where logits rows come back
    max_context: int | None     # positions the model supports (None: unknown)
    info: RunnerInfo
    forward_calls: int          # session forwards so far (the bench counts target calls with it)
    end_tokens: tuple[int, ...]  # the model's own end-of-sequence ids (the pair merges them with the tokenizer's)

    def session(self) -> Session:
        """A fresh, empty cache.  A runtime with one cache per model may invalidate earlier sessions."""


def upload(t: torch.Tensor, device) -> torch.Tensor:
    """A small host tensor on ``device`` without waiting for the device's queue (pinned memory, asynchronous
    copy: a plain copy to a GPU first drains every queued kernel)."""
    if torch.device(device).type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


def shared_vocab(pair) -> int:
    """Logit columns both runners of a pair share (embedding matrices are often padded beyond the tokenizer)."""
    return min(int(r.vocab_size) for r in (pair.draft, pair.target))


def chain_parents(start: int, n: int) -> list[int]:
    """Parents of ``n`` tokens continuing a chain whose last slot is ``start - 1``.  # [n]"""
    return list(range(start - 1, start + n - 1))


def check_forward_args(length: int, tokens: Sequence[int], parents: Sequence[int] | None,
                       keep: int) -> list[int]:
    """Validate one forward call; the parents as a list (a chain when None).  # [n]"""
    n = len(tokens)
    if n == 0:
        raise ValueError("forward: no tokens")
    if parents is None:
        parents = chain_parents(length, n)
    parents = [int(p) for p in parents]
    if len(parents) != n:
        raise ValueError(f"forward: {n} tokens but {len(parents)} parents")
    for i, p in enumerate(parents):
        if not -1 <= p < length + i:
            raise ValueError(f"forward: token {i} (slot {length + i}) has parent {p}; "
                             f"a parent must be an earlier slot or -1")
    if not 0 <= keep <= n:
        raise ValueError(f"forward: keep must be in 0..{n}, got {keep}")
    return parents


def new_positions(positions: Sequence[int], parents: Sequence[int]) -> list[int]:
    """Positions of new slots: each its parent's + 1 (0 without one).  ``positions``: the cached slots';
    ``parents``: the new slots', checked (:func:`check_forward_args`).  # [n]"""
    start, out = len(positions), []
    for p in parents:
        out.append(0 if p < 0 else (positions[p] if p < start else out[p - start]) + 1)
    return out


def check_path(parents: Sequence[int], prefix: int, slots: Sequence[int]) -> None:
    """A kept tail must be a path hanging off slot ``prefix - 1`` (else its positions would be wrong)."""
    previous = prefix - 1
    for s in slots:
        if parents[s] != previous:
            raise ValueError(f"keep: slot {s} is not a child of slot {previous}; kept slots must form a path "
                             f"from slot {prefix - 1}")
        previous = s


def check_keep_args(length: int, prefix: int, slots: Sequence[int]) -> list[int]:
    """Validate a keep call; the slots as a list.  # [k]"""
    slots = [int(s) for s in slots]
    if not 0 <= prefix <= length:
        raise ValueError(f"keep: prefix {prefix} outside 0..{length}")
    if any(s < prefix or s >= length for s in slots) or sorted(slots) != slots or len(set(slots)) != len(slots):
        raise ValueError(f"keep: slots must be sorted, distinct and in {prefix}..{length - 1}, got {slots}")
    return slots
