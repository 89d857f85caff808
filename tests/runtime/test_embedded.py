"""Integration on the embedded Qwen2.5-Coder pair: exact greedy equality and a sampled run."""

from __future__ import annotations

import pytest
import torch

from sequoia.core.config import GenerationConfig, SamplingConfig
from sequoia.core.statistics.stats import summarize
from sequoia.runtime.engine import SpeculativeEngine
from sequoia.runtime.methods import make_method
from sequoia.runtime.texts import generate_with_texts

pytestmark = [pytest.mark.embedded, pytest.mark.slow]

PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number.",
    "Explain in one sentence what a hash map is.",
]


def _target_greedy(pair, ids, n):
    with torch.inference_mode():
        out = pair.target.model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                   max_new_tokens=n, do_sample=False, eos_token_id=list(pair.eos_token_ids),
                                   pad_token_id=pair.eos_token_ids[0])
    return out[0, len(ids):].tolist()


@pytest.mark.parametrize("prompt", PROMPTS)
def test_sequoia_greedy_equals_target_greedy(embedded_pair_fp32, prompt):
    pair = embedded_pair_fp32
    ids = pair.encode_prompt(prompt)
    reference = _target_greedy(pair, ids, 24)
    records = list(SpeculativeEngine(pair).generate(ids, make_method("sequoia", budget=12, depth=5),
                                                    GenerationConfig(max_new_tokens=24)))
    tokens = [t for r in records for t in r.new_tokens]
    assert tokens == reference
    # A real draft is right often enough that the tree pays off.
    assert summarize(records).tokens_per_step > 1.5


def test_sampled_run_streams_consistent_records(embedded_pair_fp32):
    pair = embedded_pair_fp32
    ids = pair.encode_prompt(PROMPTS[0])
    cfg = GenerationConfig(max_new_tokens=16, sampling=SamplingConfig(temperature=0.6, top_p=0.95), seed=1)
    records = list(generate_with_texts(SpeculativeEngine(pair), pair.tokenizer, ids,
                                       make_method("specinfer", width=2, depth=3), cfg))
    assert sum(r.n_new for r in records) == 16 or records[-1].finish_reason == "eos"
    text = pair.tokenizer.decode([t for r in records for t in r.new_tokens], skip_special_tokens=True)
    assert text.strip()
    assert all(r.texts[0] == pair.tokenizer.decode([r.tokens[0]]) for r in records)
