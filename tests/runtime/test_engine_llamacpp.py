"""The engine on the llama.cpp runner: lossless greedy and sampled decoding on tiny random-weight GGUF files.

The same engine, proposers and verification rule as on the Hugging Face runner; only the
runner differs.  Greedy output of every method must equal that runner's target alone (its
one-row forwards): on these f32 models few-row and one-row products round alike closely
enough that no near-tie flips; the embedded Q4_K_M pair is where they may (see
docs/benchmarks.md).  Sampled output must follow the target's distribution (chi-square on
the joint of the two tokens after the prompt's own, as in test_engine.py).
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("llama_cpp")

from conftest import make_pair  # noqa: E402
from llamacpp_fixtures import tiny_qwen2, write_tiny_gguf  # noqa: E402
from test_engine import _joint_pvalue  # noqa: E402

from sequoia.core.config import GenerationConfig, SamplingConfig  # noqa: E402
from sequoia.core.profiles.profile import HardwareProfile  # noqa: E402
from sequoia.core.verification.sampling import warp  # noqa: E402
from sequoia.runners.llamacpp import LlamaCppOptions, load_llamacpp_runner  # noqa: E402
from sequoia.runtime.engine import SpeculativeEngine  # noqa: E402
from sequoia.runtime.methods import make_method  # noqa: E402

SMALL = LlamaCppOptions(n_threads=1, n_ctx=512)
PROMPT = [5, 17, 3, 99, 42, 7, 7, 250]
#: Verification as cheap as a plain step: every dynamic and n-gram method drafts.
CHEAP = HardwareProfile.hand_made(lambda n: 10.0 + 0.01 * n, lambda w: 0.5)


def _runners(tmp_path_factory, vocab: int, seeds=(0, 1)):
    folder = tmp_path_factory.mktemp("gguf")
    paths = [write_tiny_gguf(folder / f"m{s}.gguf", tiny_qwen2(seed=s, vocab=vocab)) for s in seeds]
    return [load_llamacpp_runner(p, SMALL) for p in paths]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    target, draft = _runners(tmp_path_factory, 320)
    yield make_pair(draft, target, 320)
    draft.close(), target.close()


def _tokens(pair, method, cfg):
    return [t for r in SpeculativeEngine(pair).generate(PROMPT, method, cfg) for t in r.new_tokens]


METHODS = [("chain", {"budget": 4}), ("specinfer", {"width": 2, "depth": 3}), ("kary", {"width": 2, "depth": 3}),
           ("sequoia", {"budget": 12, "depth": 4}), ("sequoia-dynamic", {"profile": CHEAP}),
           ("ngram", {"profile": CHEAP}), ("sequoia-ngram", {"profile": CHEAP})]


@pytest.mark.parametrize("name,kwargs", METHODS, ids=[m[0] for m in METHODS])
def test_greedy_output_of_every_method_equals_the_runners_target_alone(pair, name, kwargs):
    cfg = GenerationConfig(max_new_tokens=24, stop_at_eos=False)
    alone = _tokens(pair, make_method("ar"), cfg)
    assert _tokens(pair, make_method(name, **kwargs), cfg) == alone


def test_trees_are_drafted_and_verified_on_this_runner(pair):
    records = list(SpeculativeEngine(pair).generate(PROMPT, make_method("sequoia", budget=12, depth=4),
                                                    GenerationConfig(max_new_tokens=16, stop_at_eos=False)))
    assert any(r.tree.size > 1 for r in records[1:])
    assert pair.target.forward_calls > 0


def _exact_joint(runner, prompt, sampling) -> torch.Tensor:
    """P(x1, x2) after ``prompt`` under the target alone, from the runner's own chain forwards.  # [V, V]"""
    p1 = warp(runner.session().forward(prompt, keep=1)[-1], sampling)
    rows = [warp(runner.session().forward(prompt + [x], keep=1)[-1], sampling) for x in range(p1.shape[0])]
    return p1[:, None] * torch.stack(rows)


@pytest.fixture(scope="module")
def small_vocab_pair(tmp_path_factory):
    target, draft = _runners(tmp_path_factory, 8, seeds=(0, 3))
    yield make_pair(draft, target, 8)
    draft.close(), target.close()


@pytest.mark.parametrize("name,kwargs", [("sequoia", {"budget": 6, "depth": 3}), ("specinfer", {"width": 2, "depth": 2})])
def test_sampled_output_matches_the_targets_distribution(small_vocab_pair, name, kwargs):
    pair, sampling = small_vocab_pair, SamplingConfig(temperature=1.0)
    prompt = [1, 5, 3, 0]
    engine = SpeculativeEngine(pair)
    counts, firsts = torch.zeros(8, 8), torch.zeros(8)
    for seed in range(1000):
        cfg = GenerationConfig(max_new_tokens=3, sampling=sampling, seed=seed, stop_at_eos=False)
        toks = [t for r in engine.generate(prompt, make_method(name, **kwargs), cfg)
                for t in r.new_tokens]
        firsts[toks[0]] += 1
        counts[toks[1], toks[2]] += 1
    shares = firsts / firsts.sum()
    exact = sum(share * _exact_joint(pair.target, prompt + [x1], sampling)
                for x1, share in enumerate(shares.tolist()) if share > 0)
    assert _joint_pvalue(counts, exact) > 1e-6


@pytest.mark.parametrize("name,kwargs", METHODS[:5], ids=[m[0] for m in METHODS[:5]])
def test_a_llamacpp_draft_beside_a_hugging_face_target_keeps_its_greedy_output(tmp_path_factory, name, kwargs):
    """The mixed runtime: the draft on llama.cpp, the target a Hugging Face model (plain path, f32)."""
    from llamacpp_fixtures import TINY_VOCAB
    from sequoia.runtime.measuring.fingerprint import machine_fingerprint

    draft = _runners(tmp_path_factory, TINY_VOCAB, seeds=(1,))[0]
    pair = make_pair(draft, tiny_qwen2(seed=0), TINY_VOCAB)
    try:
        assert machine_fingerprint(pair).runtime == "llamacpp+hf"
        cfg = GenerationConfig(max_new_tokens=24, stop_at_eos=False)
        assert _tokens(pair, make_method(name, **kwargs), cfg) == _tokens(pair, make_method("ar"), cfg)
    finally:
        draft.close()
