"""The peers: Hugging Face ``generate`` with the target alone, its assisted generation and its prompt lookup.

They run outside the engine loop (that is the point of a peer), so they yield
no step records; what a comparison needs from them is the output tokens, the
wall time, how many times the target model was called, and when the first new
tokens came out (a streamer on ``generate`` notes it): the time to the first
token is mostly the prompt's forward, which every method pays alike.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from transformers.generation.streamers import BaseStreamer

from ...core.config import GenerationConfig
from ...runners.hf.lean import plain_head_rows
from ...runners.hf.onednn import single_rows_routed


@dataclass(frozen=True)
class BaselineRun:
    name: str                  # "hf-generate" | "hf-assisted" | "hf-prompt-lookup"
    tokens: tuple[int, ...]    # generated tokens (prompt excluded)
    seconds: float
    target_calls: int          # forwards of the target model
    first_token_s: float | None = None   # from the call to the first new tokens generate handed out
    first_tokens: int = 0      # how many came out then (assisted generation's first call verifies a draft)

    @property
    def tokens_per_s(self) -> float:
        return len(self.tokens) / self.seconds if self.seconds > 0 else 0.0


#: Draft tokens Hugging Face prompt lookup copies from an n-gram match of the prompt (its documented example value).
PROMPT_LOOKUP_TOKENS = 10


def hf_generate(pair, prompt_ids: list[int], config: GenerationConfig, assisted: bool = False,
                prompt_lookup: bool = False, clock: Callable[[], float] = time.perf_counter) -> BaselineRun:
    """Run the target model's ``generate`` (with the draft as ``assistant_model`` when ``assisted``; with
    ``prompt_lookup_num_tokens`` when ``prompt_lookup``: drafts copied from the prompt, no draft model).

    Hugging Face sampling draws from torch's global generator, so it is seeded
    here with ``config.seed``; the engine itself never touches global state.
    ``clock`` times the call and its first tokens (the engine's clock, for comparable numbers).
    """
    if not prompt_ids:
        raise ValueError("the prompt is empty")
    kwargs = _generate_kwargs(pair, config)
    if assisted and prompt_lookup:
        raise ValueError("choose assisted generation or prompt lookup, not both")
    target = hf_model(pair.target, "target")
    if assisted:
        kwargs["assistant_model"] = hf_model(pair.draft, "draft")
    if prompt_lookup:
        kwargs["prompt_lookup_num_tokens"] = PROMPT_LOOKUP_TOKENS
    ids = torch.tensor([prompt_ids], device=pair.device)
    torch.manual_seed(config.seed)
    with count_forwards(target) as calls, torch.inference_mode(), \
            single_rows_routed(target, pair.target.single_row_kernel), \
            plain_head_rows(target, *([kwargs["assistant_model"]] if assisted else [])):
        start = clock()
        first = _FirstTokens(clock, start)
        out = target.generate(ids, attention_mask=torch.ones_like(ids), streamer=first, **kwargs)
        if pair.device.type == "cuda":
            torch.cuda.synchronize(pair.device)
        seconds = clock() - start
    tokens = _trim(out[0, len(prompt_ids):].tolist(), pair.eos_token_ids if config.stop_at_eos else ())
    name = "hf-assisted" if assisted else "hf-prompt-lookup" if prompt_lookup else "hf-generate"
    return BaselineRun(name, tuple(tokens), seconds, calls[0], first.seconds, min(first.tokens, len(tokens)))


def hf_model(runner, role: str):
    """The transformers model behind a Hugging Face runner; a clear error for any other runtime."""
    model = getattr(runner, "model", None)
    if runner.info.runtime != "hf" or model is None:
        raise ValueError(f"Hugging Face generate baselines need the hf backend; this pair's {role} runs on "
                         f"{runner.info.runtime}")
    return model


class _FirstTokens(BaseStreamer):
    """Notes when ``generate`` hands out its first new tokens, and how many (its first ``put`` is the prompt).

    Tokens reach a streamer on the host (``.cpu()``), so on a GPU the time includes the wait for them.
    """

    def __init__(self, clock: Callable[[], float], start: float) -> None:
        self.clock, self.start = clock, start
        self.puts, self.seconds, self.tokens = 0, None, 0

    def put(self, value: torch.Tensor) -> None:
        self.puts += 1
        if self.puts == 2:
            self.seconds, self.tokens = self.clock() - self.start, int(value.numel())

    def end(self) -> None:
        pass


def _generate_kwargs(pair, config: GenerationConfig) -> dict:
    s = config.sampling
    eos = list(pair.eos_token_ids) if config.stop_at_eos and pair.eos_token_ids else None
    kwargs = dict(max_new_tokens=config.max_new_tokens, do_sample=not s.greedy, eos_token_id=eos,
                  pad_token_id=(eos or [0])[0])
    if s.greedy:
        kwargs.update(temperature=None, top_p=None, top_k=None)
    else:
        kwargs.update(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k or None)
    if config.stop_strings:
        kwargs.update(stop_strings=list(config.stop_strings), tokenizer=pair.tokenizer)
    return kwargs


def _trim(tokens: list[int], eos) -> list[int]:
    for i, t in enumerate(tokens):
        if t in eos:
            return tokens[: i + 1]
    return tokens


@contextmanager
def count_forwards(model):
    """Count forwards of ``model`` (the same hook for every method, so counts are comparable)."""
    calls = [0]

    def hook(*_):
        calls[0] += 1

    handle = model.register_forward_pre_hook(hook)
    try:
        yield calls
    finally:
        handle.remove()
