"""The engine on tiny random-weight models: exact greedy equality, lossless sampling, tree masks."""

from __future__ import annotations

import itertools

import pytest
import torch
from conftest import make_pair, tiny_model
from scipy import stats

from sequoia.core.config import GenerationConfig, SamplingConfig
from sequoia.core.statistics.trace import ACCEPTED, UNREACHED
from sequoia.core.trees.masks import verify_mask
from sequoia.core.trees.tree import Tree
from sequoia.runtime.checks.joint_check import joint_pvalue
from sequoia.runtime.engine import SpeculativeEngine
from sequoia.runtime.methods import make_method
from sequoia.runtime.texts import generate_with_texts, with_texts

PROMPT = [1, 5, 9, 3, 7]
SMALL_PROMPT = [1, 5, 3]  # for the 8-token vocabulary
METHODS = [
    ("ar", {}),
    ("chain", {"budget": 4}),
    ("specinfer", {"width": 3, "depth": 3}),
    ("kary", {"width": 2, "depth": 3}),
    ("sequoia", {"budget": 16, "depth": 5}),
    ("sequoia", {"budget": 40, "depth": 8}),
]


def _run(pair, method, config, prompt=PROMPT):
    records = list(SpeculativeEngine(pair).generate(prompt, method, config))
    return [t for r in records for t in r.new_tokens], records


def _hf_greedy(model, prompt, n):
    out = model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False,
                         eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("pair_name", ["same", "noisy", "random"])
@pytest.mark.parametrize("name,kwargs", METHODS)
def test_greedy_output_equals_target_greedy(tiny_pairs, tiny_target, pair_name, name, kwargs):
    reference = _hf_greedy(tiny_target, PROMPT, 40)
    tokens, records = _run(tiny_pairs[pair_name], make_method(name, **kwargs), GenerationConfig(max_new_tokens=40))
    assert tokens == reference
    assert records[-1].finished and records[-1].finish_reason == "length"
    if pair_name == "same" and name != "ar":
        # An identical draft is accepted all the way down every step.
        assert all(r.n_accepted == r.tree.depth for r in records[:-1])


def test_greedy_file_tree(tiny_pairs, tiny_target, tmp_path):
    path = tmp_path / "tree.json"
    Tree.from_children_counts([3, 2, 1, 1, 0, 1]).to_json(path)
    tokens, _ = _run(tiny_pairs["noisy"], make_method("file", tree_path=str(path)), GenerationConfig(max_new_tokens=25))
    assert tokens == _hf_greedy(tiny_target, PROMPT, 25)


def test_step_records_are_consistent(tiny_pairs):
    _, records = _run(tiny_pairs["noisy"], make_method("sequoia", budget=12, depth=4),
                      GenerationConfig(max_new_tokens=30, sampling=SamplingConfig(temperature=0.9), seed=3))
    assert sum(r.n_new for r in records) == 30
    for r in records:
        assert r.status[0] == ACCEPTED
        assert [r.tokens[v] for v in r.accepted[1:]] + [r.bonus] == list(r.new_tokens) or r.finished
        for v in range(1, r.tree.n_nodes):
            if r.status[v] == ACCEPTED:
                assert r.tree.parents[v] in r.accepted
            assert 0.0 <= r.q[v] <= 1.0 and 0.0 <= r.p[v] <= 1.0
        assert r.draft_s >= 0 and r.verify_s > 0 and r.texts == () and r.bonus_text == ""
    assert any(UNREACHED in r.status for r in records)


def test_the_caller_fills_the_texts(tiny_pairs):
    """The engine leaves texts empty; with_texts decodes every node's token, the bonus and the checks' tokens."""
    pair = tiny_pairs["noisy"]
    cfg = GenerationConfig(max_new_tokens=12, sampling=SamplingConfig(temperature=0.9), seed=3)
    records = list(generate_with_texts(SpeculativeEngine(pair), pair.tokenizer, PROMPT,
                                       make_method("sequoia", budget=8, depth=3), cfg, inspect=True))
    for r in records:
        assert r.texts == tuple(f"<{t}>" for t in r.tokens) and r.bonus_text == f"<{r.bonus}>"
        assert r.checks and all(c.top_texts == tuple(f"<{i}>" for i in c.top_ids) for c in r.checks)
    assert with_texts(records[0], pair.tokenizer.batch_decode) == records[0]


def test_stop_strings_need_the_callers_test(tiny_pairs):
    with pytest.raises(ValueError, match="stop test"):
        next(SpeculativeEngine(tiny_pairs["noisy"]).generate(PROMPT, make_method("chain", budget=5),
                                                             GenerationConfig(stop_strings=("x",))))


def test_eos_and_stop_strings_end_generation(tiny_target, tiny_pairs):
    reference = _hf_greedy(tiny_target, PROMPT, 30)
    eos = reference[6]
    pair = make_pair(tiny_pairs["noisy"].draft, tiny_target, 48, eos=(eos,))
    tokens, records = _run(pair, make_method("chain", budget=5), GenerationConfig(max_new_tokens=30))
    assert tokens == reference[: reference.index(eos) + 1] and records[-1].finish_reason == "eos"
    stop = f"<{reference[3]}>"
    pair = tiny_pairs["noisy"]
    records = list(generate_with_texts(SpeculativeEngine(pair), pair.tokenizer, PROMPT,
                                       make_method("chain", budget=5),
                                       GenerationConfig(max_new_tokens=30, stop_strings=(stop,))))
    tokens = [t for r in records for t in r.new_tokens]
    assert records[-1].finish_reason == "stop" and reference[3] in tokens
    assert reference[3] not in [t for r in records[:-1] for t in r.new_tokens]


def test_tree_forward_matches_each_path_alone(tiny_target):
    """One forward over the tree with the 4D mask equals running every root-to-leaf path on its own."""
    tree = Tree.from_children_counts([3, 2, 1, 0, 2, 1])
    tokens = [11, 4, 17, 30, 8, 9, 21, 2, 40, 13]
    prefix = PROMPT[:-1]
    with torch.no_grad():
        past = tiny_target(torch.tensor([prefix]), use_cache=True).past_key_values
        mask = verify_mask(tree, len(prefix), torch.float32, "cpu")
        tree_logits = tiny_target(torch.tensor([tokens]), past_key_values=past, attention_mask=mask,
                                  position_ids=tree.position_ids(len(prefix))[None]).logits[0]
        for leaf in (v for v in range(tree.n_nodes) if not tree.children[v]):
            path = tree.path(leaf)
            alone = tiny_target(torch.tensor([prefix + [tokens[v] for v in path]])).logits[0, len(prefix):]
            torch.testing.assert_close(tree_logits[list(path)], alone, atol=2e-5, rtol=1e-4)


def test_step_zero_is_the_prompts_forward(tiny_pairs, tiny_target):
    """The prompt's forward gives the first token (no draft); trees start at step 1; one forward per step."""
    from sequoia.runtime.checks.baselines import count_forwards

    engine = SpeculativeEngine(tiny_pairs["noisy"])
    with count_forwards(tiny_target) as calls:
        records = list(engine.generate(PROMPT, make_method("sequoia", budget=6), GenerationConfig(max_new_tokens=12)))
    first = records[0]
    assert first.step == 0 and first.tree.size == 0 and first.draft_s == 0.0 and first.dynamic is None
    assert first.prompt_tokens == len(PROMPT) and list(first.new_tokens) == _hf_greedy(tiny_target, PROMPT, 1)
    assert records[1].tree.size > 0 and all(r.prompt_tokens == 0 for r in records[1:])
    assert calls[0] == len(records)
    one = list(engine.generate(PROMPT[:1], make_method("chain", budget=3), GenerationConfig(max_new_tokens=1)))
    assert len(one) == 1 and one[0].finished and one[0].prompt_tokens == 1   # a one-token prompt and answer


# --------------------------------------------------------------- distribution
def _exact_two_token_joint(model, prompt, sampling) -> torch.Tensor:
    """P(x1, x2) under the target alone.  # [V, V]"""
    from sequoia.core.verification.sampling import warp

    with torch.no_grad():
        p1 = warp(model(torch.tensor([prompt])).logits[0, -1], sampling)
        vocab = p1.shape[0]
        ctx = torch.tensor([prompt + [x] for x in range(vocab)])
        p2 = warp(model(ctx).logits[:, -1], sampling)
    return p1[:, None] * p2


def _empirical_joint(pair, method, sampling, n, prompt=None, each=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Counts of the 2nd and 3rd tokens over ``n`` seeds, and what the target alone gives them.  # [V, V] x 2

    The first token comes from the prompt's forward (step 0, no draft), so the tokens that went through a
    tree are the next ones: the expected joint of (x2, x3) is P(x2, x3 | prompt, x1) summed over the x1 drawn.
    ``each(records)`` sees every run's step records.
    """
    prompt = SMALL_PROMPT if prompt is None else prompt
    vocab = pair.target.config.vocab_size
    counts, firsts = torch.zeros(vocab, vocab), torch.zeros(vocab)
    engine = SpeculativeEngine(pair)
    for seed in range(n):
        cfg = GenerationConfig(max_new_tokens=3, sampling=sampling, seed=seed, stop_at_eos=False)
        records = list(engine.generate(prompt, method, cfg))
        if each is not None:
            each(records)
        toks = [t for r in records for t in r.new_tokens]
        firsts[toks[0]] += 1
        counts[toks[1], toks[2]] += 1
    return counts, _exact_after_first(pair.target.model, prompt, sampling, firsts)


def _exact_after_first(model, prompt, sampling, firsts: torch.Tensor) -> torch.Tensor:
    """P(x2, x3) given the first tokens drawn: sum over x1 of (share of x1) * P(x2, x3 | prompt + [x1]).  # [V, V]"""
    shares = firsts / firsts.sum()
    return sum(share * _exact_two_token_joint(model, prompt + [x1], sampling)
               for x1, share in enumerate(shares.tolist()) if share > 0)


_joint_pvalue = joint_pvalue   # the library's chi-square, under the name the n-gram and llama.cpp tests import


@pytest.fixture(scope="module")
def small_vocab_pair():
    # init 0.2 gives spread-out p and q that overlap partly (TV ~0.46): rejections are
    # frequent and a wrong residual moves the output by TV ~0.2, easy to detect.
    target = tiny_model(0, vocab=8, init=0.2)
    return make_pair(tiny_model(3, vocab=8, init=0.2), target, 8)


@pytest.mark.parametrize("name,kwargs,sampling", [
    ("sequoia", {"budget": 6, "depth": 3}, SamplingConfig(temperature=1.0)),
    ("specinfer", {"width": 2, "depth": 2}, SamplingConfig(temperature=0.7, top_p=0.9)),
])
def test_sampled_output_matches_target_distribution(small_vocab_pair, name, kwargs, sampling):
    counts, exact = _empirical_joint(small_vocab_pair, make_method(name, **kwargs), sampling, n=1000)
    assert joint_pvalue(counts, exact) > 1e-6


def test_distribution_test_catches_a_wrong_rule(small_vocab_pair, monkeypatch):
    import sequoia.core.verification.sampling as sampling_mod

    monkeypatch.setattr(sampling_mod, "_residual", lambda p, q, x: p)
    sampling = SamplingConfig(temperature=1.0)
    counts, exact = _empirical_joint(small_vocab_pair, make_method("chain", budget=2), sampling, n=1000)
    assert joint_pvalue(counts, exact) < 1e-6


# --------------------------------------------------------------- bad input
@pytest.mark.parametrize("build", [
    lambda: make_method("sequoia", budget=0),
    lambda: make_method("sequoia", budget=100_000),
    lambda: make_method("sequoia", budget=8, depth=0),
    lambda: make_method("chain", budget=-1),
    lambda: make_method("warp-drive"),
    lambda: make_method("file"),
    lambda: GenerationConfig(max_new_tokens=0),
    lambda: GenerationConfig(sampling=SamplingConfig(temperature=-1)),
    lambda: GenerationConfig(sampling=SamplingConfig(top_p=0)),
])
def test_bad_parameters_raise_clear_errors(build):
    with pytest.raises(ValueError):
        build()


def test_empty_and_huge_prompts_are_rejected(tiny_pairs):
    engine = SpeculativeEngine(tiny_pairs["same"])
    with pytest.raises(ValueError, match="empty"):
        next(engine.generate([], make_method("ar"), GenerationConfig()))
    with pytest.raises(ValueError, match="exceeds|maximum"):
        next(engine.generate([1] * 600, make_method("ar"), GenerationConfig()))
    # The engine keeps working after a rejected request.
    assert next(engine.generate(PROMPT, make_method("ar"), GenerationConfig(max_new_tokens=2))).n_new == 1


def test_seeds_make_sampling_reproducible(tiny_pairs):
    cfg = GenerationConfig(max_new_tokens=20, sampling=SamplingConfig(temperature=1.0), seed=11)
    a, _ = _run(tiny_pairs["noisy"], make_method("sequoia", budget=8), cfg)
    b, _ = _run(tiny_pairs["noisy"], make_method("sequoia", budget=8), cfg)
    assert a == b
    assert list(itertools.islice(a, 3))
