"""Token texts and stop strings: the caller's side of the engine, which sees token ids only.

The engine yields records whose text fields are empty (``texts``, ``bonus_text``, each check's
``top_texts``) and ends a generation on a caller's ``stop`` test over the new ids.  Who shows
texts (the app, the command line) fills them with :func:`with_texts`, one batch decode per step;
:func:`stop_test` turns ``GenerationConfig.stop_strings`` into such a test, and
:func:`generate_with_texts` does both around ``engine.generate``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from contextlib import closing

from ..core.config import GenerationConfig
from ..core.statistics.trace import StepRecord
from ..core.verification.checks import with_texts as checks_with_texts
from .drafter import Proposer
from .engine import SpeculativeEngine

#: Decodes each id list to its text, e.g. a Hugging Face tokenizer's ``batch_decode``.
DecodeBatch = Callable[[list[list[int]]], list[str]]
#: The engine's stop test: True once the ids generated so far end the generation.
StopTest = Callable[[Sequence[int]], bool]


def with_texts(record: StepRecord, decode_batch: DecodeBatch) -> StepRecord:
    """``record`` with the text of every node's token, of the bonus and of each check's tokens."""
    names = decode_batch([[t] for t in record.tokens] + [[record.bonus]])
    checks = checks_with_texts(record.checks, decode_batch) if record.checks else record.checks
    return dataclasses.replace(record, texts=tuple(names[:-1]), bonus_text=names[-1], checks=checks)


def stop_test(tokenizer, strings: Sequence[str]) -> StopTest | None:
    """True once the new ids' text (special tokens skipped) holds one of ``strings``; None without any."""
    wanted = tuple(s for s in strings if s)
    if not wanted:
        return None

    def hit(new_ids: Sequence[int]) -> bool:
        tail = tokenizer.decode(list(new_ids), skip_special_tokens=True)
        return any(s in tail for s in wanted)

    return hit


def generate_with_texts(engine: SpeculativeEngine, tokenizer, prompt_ids: list[int], proposer: Proposer,
                        config: GenerationConfig, should_stop: Callable[[], bool] | None = None,
                        inspect: bool = False) -> Iterator[StepRecord]:
    """``engine.generate`` stopping at ``config.stop_strings``, each record with its texts filled in.

    Closing this generator closes the engine's at once, which frees its KV caches.
    """
    steps = engine.generate(prompt_ids, proposer, config, should_stop=should_stop,
                            stop=stop_test(tokenizer, config.stop_strings), inspect=inspect)
    with closing(steps):
        for record in steps:
            yield with_texts(record, tokenizer.batch_decode)
