"""The n-gram source (sequoia.core.ngrams.ngram) and the methods built on it (ngram, sequoia-ngram)."""

from __future__ import annotations

import random

import pytest

from sequoia.core.ngrams.ngram import NgramIndex, NgramTrie
from sequoia.core.ngrams.ngram_acceptance import ngram_prior


def _index(seq, max_n=3, min_n=1):
    return NgramIndex(max_n=max_n, min_n=min_n, tokens=list(seq))


def test_longest_match_first_and_its_continuation():
    #        0  1  2  3  4  5  6  7  8  9
    seq = [1, 2, 3, 4, 5, 9, 2, 3, 7, 2, 3]   # tail (2, 3): after it came 4 (pos 3) and 7 (pos 8)
    trie = _index(seq).lookup(length=3)
    assert trie.tokens[0] == 3 and trie.parents[0] == -1
    # most recent occurrence first: 7 2 3, then 4 5 9
    assert trie.branches()[:2] == [(7, 2, 3), (4, 5, 9)]
    first = trie.children(0)
    assert [trie.tokens[v] for v in first][:2] == [7, 4]
    assert all(trie.match_len[v] == 2 for v in first[:2])
    assert [trie.depths[v] for v in trie.children(first[0])] == [2]


def test_shorter_matches_only_add_new_branches():
    seq = [5, 3, 8, 6, 3, 8, 1, 4, 8]   # tail 8: (3, 8) never ends the tail, 1-gram 8 -> 6 (pos 3), 1 (pos 6)
    trie = _index(seq).lookup(length=2)
    assert sorted(trie.branches()) == [(1, 4), (6, 3)]
    assert all(m == 1 for m in trie.match_len[1:])
    seq = [1, 2, 3, 9, 2, 3, 9, 5, 3]   # 2-gram (2, 3)? tail is (5, 3): no; 1-gram 3 -> 9 (twice, merged)
    trie = _index(seq).lookup(length=2, max_branches=1)
    assert trie.branches() == [(9, 5)]   # the most recent occurrence (pos 6) first
    trie = _index(seq).lookup(length=2)
    assert trie.branches() == [(9, 5), (9, 2)]   # the older one shares the node 9
    assert len(trie.children(0)) == 1


def test_identical_continuations_merge_into_one_trie():
    seq = [7, 1, 2, 3, 7, 1, 2, 3, 7, 1]
    trie = _index(seq, max_n=2).lookup(length=4)
    assert trie.branches() == [(2, 3, 7, 1)]
    assert trie.size == 4 and trie.match_len[1:] == (2, 2, 2, 2) and trie.depths == (0, 1, 2, 3, 4)


def test_no_match_gives_the_root_only():
    trie = _index([1, 2, 3, 4]).lookup(length=5)
    assert trie.size == 0 and trie.branches() == []
    assert NgramIndex().lookup(3).size == 0


def test_trie_is_breadth_first_with_contiguous_siblings():
    rng = random.Random(0)
    for _ in range(50):
        seq = [rng.randrange(4) for _ in range(60)]
        trie = _index(seq, max_n=4).lookup(length=5, max_branches=5)
        for v in range(1, len(trie.parents)):
            assert trie.parents[v] < v and trie.parents[v] >= trie.parents[v - 1]
            assert trie.depths[v] == trie.depths[trie.parents[v]] + 1
        kids = [(trie.parents[v], trie.tokens[v]) for v in range(1, len(trie.parents))]
        assert len(set(kids)) == len(kids)   # identical tokens at one node are merged
        assert len(trie.branches()) <= 5


def test_every_branch_really_follows_a_match():
    rng = random.Random(1)
    for _ in range(30):
        seq = [rng.randrange(5) for _ in range(80)]
        trie = _index(seq, max_n=3).lookup(length=4, max_branches=6)
        text = ",".join(map(str, seq)) + ","
        for branch in trie.branches():
            # the tail's last token followed by the branch occurs earlier in the sequence
            assert ",".join(map(str, (seq[-1],) + branch)) + "," in text


def test_incremental_index_equals_a_fresh_one():
    rng = random.Random(2)
    seq = [rng.randrange(6) for _ in range(300)]
    inc = NgramIndex(max_n=4)
    for i in range(0, 300, 7):
        inc.sync(seq[:i + 1])
        fresh = NgramIndex(max_n=4, tokens=seq[:i + 1])
        assert inc.lookup(6, max_branches=4) == fresh.lookup(6, max_branches=4)
    inc.sync([3, 3, 3])   # a different context (a new generation): re-indexed
    assert inc.tokens == [3, 3, 3] and inc.lookup(2).branches() == [(3, 3)]


def test_lookup_is_fast_on_an_8k_context():
    import time

    rng = random.Random(3)
    seq = [rng.randrange(50) for _ in range(8000)]
    t0 = time.perf_counter()
    idx = NgramIndex(max_n=4, tokens=seq)
    for _ in range(200):
        idx.extend([rng.randrange(50)])
        idx.lookup(8, max_branches=4)
    # 5 s: over 100x the median measured (0.036 s, 2-vCPU Xeon with AMX): it catches a lookup that grows with the
    # context (a rescan per token), never a busy machine
    assert time.perf_counter() - t0 < 5.0


def test_prior_grows_with_the_context_matched():
    """A node at depth d of a branch found by an n-token match has matched n + d - 1 tokens of context."""
    assert ngram_prior(4, 1) > ngram_prior(2, 1) > ngram_prior(1, 1)
    assert ngram_prior(3, 4) > ngram_prior(3, 1) and ngram_prior(1, 4) == ngram_prior(4, 1) == ngram_prior(2, 3)
    assert ngram_prior(9, 1) == ngram_prior(3, 9) == ngram_prior(1, 30) < 1.0
    with pytest.raises(ValueError):
        NgramIndex(max_n=1, min_n=2)
    assert isinstance(NgramIndex(tokens=[1, 1]).lookup(2), NgramTrie)


# ------------------------------------------------------------------ the methods on tiny models
import torch  # noqa: E402
from conftest import make_pair, tiny_model  # noqa: E402
from test_engine import _empirical_joint, _hf_greedy, _joint_pvalue  # noqa: E402

from sequoia.core.config import GenerationConfig, SamplingConfig  # noqa: E402
from sequoia.core.profiles.profile import HardwareProfile  # noqa: E402
from sequoia.core.statistics.stats import accepted_by_source, summarize  # noqa: E402
from sequoia.core.statistics.trace import DRAFT, NGRAM, ROOT  # noqa: E402
from sequoia.runtime.engine import SpeculativeEngine  # noqa: E402
from sequoia.runtime.methods import make_method  # noqa: E402

REPEATING = [1, 5, 9, 3, 7, 2, 1, 5, 9, 3, 7, 2, 1, 5, 9]
#: Verification nearly free next to a step: copies (and drafts) pay.
CHEAP = HardwareProfile.hand_made(lambda n: 30 + 0.5 * n, lambda w: 3 + 0.1 * w)


@pytest.mark.parametrize("pair_name", ["same", "noisy", "random"])
@pytest.mark.parametrize("name", ["ngram", "sequoia-ngram"])
def test_greedy_output_equals_target_greedy(tiny_pairs, tiny_target, pair_name, name):
    reference = _hf_greedy(tiny_target, REPEATING, 40)
    method = make_method(name, profile=CHEAP, budget=12)
    records = list(SpeculativeEngine(tiny_pairs[pair_name]).generate(REPEATING, method,
                                                                     GenerationConfig(max_new_tokens=40)))
    assert [t for r in records for t in r.new_tokens] == reference
    for r in records:
        assert len(r.sources) in (0, r.tree.n_nodes)
        if r.sources:
            assert r.sources[0] == ROOT and set(r.sources[1:]) <= {DRAFT, NGRAM}
            for v in range(1, r.tree.n_nodes):   # copies have only copied children
                if r.sources[v] == NGRAM:
                    assert all(r.sources[c] == NGRAM for c in r.tree.children[v])
    by_source = accepted_by_source(records)
    assert sum(1 for r in records for s in r.sources if s == NGRAM) > 0
    if name == "ngram":
        assert set(by_source) <= {NGRAM} and by_source.get(NGRAM, 0) > 0
        assert all(r.dynamic is None for r in records)
    assert dict(summarize(records).accepted_by_source) == by_source


def test_ngram_never_runs_the_draft_model(tiny_pairs):
    pair = tiny_pairs["noisy"]
    calls = []
    handle = pair.draft.model.register_forward_pre_hook(lambda *_: calls.append(1))
    try:
        list(SpeculativeEngine(pair).generate(REPEATING, make_method("ngram", profile=CHEAP),
                                              GenerationConfig(max_new_tokens=12)))
    finally:
        handle.remove()
    assert calls == []


def test_without_a_profile_nothing_is_copied(tiny_pairs):
    records = list(SpeculativeEngine(tiny_pairs["noisy"]).generate(REPEATING, make_method("ngram"),
                                                                   GenerationConfig(max_new_tokens=6)))
    assert all(r.tree.size == 0 for r in records)


@pytest.fixture(scope="module")
def small_vocab_pair():
    target = tiny_model(0, vocab=8, init=0.2)
    return make_pair(tiny_model(3, vocab=8, init=0.2), target, 8)


# Whatever the first token x (drawn from the prompt's forward), "7 x" occurred before: the first tree has copies.
SMALL_REPEATING = [7, 0, 7, 1, 7, 2, 7, 3, 7, 4, 7, 5, 7, 6, 7, 7]


@pytest.mark.parametrize("name,sampling", [
    ("ngram", SamplingConfig(temperature=1.0)),
    ("sequoia-ngram", SamplingConfig(temperature=1.0)),
    ("sequoia-ngram", SamplingConfig(temperature=0.7, top_p=0.9)),
])
def test_sampled_output_matches_target_distribution(small_vocab_pair, name, sampling):
    method = make_method(name, profile=CHEAP, budget=6)
    mixed = []

    def first_tree(records):   # step 0 is the prompt's forward; step 1 the first tree
        r1 = records[1]
        mixed.append(bool(r1.sources) and NGRAM in r1.sources and (DRAFT in r1.sources or name == "ngram"))

    counts, exact = _empirical_joint(small_vocab_pair, method, sampling, 1000, SMALL_REPEATING, first_tree)
    assert sum(mixed) > 500, sum(mixed)   # the first tree really had copied children (and drafted ones)
    assert _joint_pvalue(counts, exact) > 1e-6


# ------------------------------------------------------------------ the Hugging Face prompt lookup baseline
def test_hf_prompt_lookup_runs_and_equals_target_greedy(tiny_pairs, tiny_target):
    from sequoia.runtime.measuring.timing import HF_METHODS, run_method

    assert "hf-prompt-lookup" in HF_METHODS
    pair = tiny_pairs["noisy"]
    result = run_method(SpeculativeEngine(pair), pair, "hf-prompt-lookup", REPEATING,
                        GenerationConfig(max_new_tokens=30, stop_at_eos=False))
    assert list(result.tokens) == _hf_greedy(tiny_target, REPEATING, 30)
    assert result.target_calls < 30   # copied drafts were accepted: fewer target calls than tokens
