"""Copies anywhere in the tree (sequoia-ngram): continuations grafted below draft nodes, merged with the draft's."""

from __future__ import annotations

import random

import pytest
import torch
from conftest import make_pair, tiny_model
from test_engine import _empirical_joint, _hf_greedy, _joint_pvalue

from sequoia.core.config import GenerationConfig, SamplingConfig
from sequoia.core.ngrams.ngram import NgramIndex
from sequoia.core.ngrams.ngram_acceptance import ngram_prior
from sequoia.core.profiles.profile import HardwareProfile
from sequoia.core.statistics.trace import DRAFT, NGRAM, ROOT, UNREACHED
from sequoia.runtime.drafter import Draft
from sequoia.runtime.engine import SpeculativeEngine
from sequoia.runtime.proposers.ngram_dynamic import NgramDynamicProposer
from sequoia.runtime.proposers.ngram_proposer import NgramSettings

#: Verification nearly free next to a step: copies (and drafts) pay.
CHEAP = HardwareProfile.hand_made(lambda n: 30 + 0.5 * n, lambda w: 3 + 0.1 * w)


# ------------------------------------------------------------------ the index: lookups of a hypothetical extension
def test_lookup_matches_the_tail_of_context_plus_extra():
    #      0  1  2  3  4  5  6  7  8
    seq = [1, 2, 3, 4, 9, 2, 3, 7, 5]
    trie = NgramIndex(max_n=3, tokens=seq).lookup(length=3, extra=(2, 3))
    assert trie.tokens[0] == 3                       # the root stands for the extension's last token
    # after (2, 3) came 7 5 (pos 7; the continuation runs on into the extension: 2) and 4 9 2 (pos 3)
    assert trie.branches() == [(7, 5, 2), (4, 9, 2)]
    assert all(m == 2 for m in trie.match_len[1:])
    # the extension's tail need not be all hypothetical: (5, 2) spans the context's end
    assert NgramIndex(max_n=3, tokens=seq + [5]).lookup(2, extra=(2,), min_match=2).size == 0
    assert NgramIndex(max_n=3, tokens=[5, 2, 8] + seq).lookup(2, extra=(2,), min_match=2).branches() == [(8, 1)]


def test_min_match_leaves_out_short_matches_and_extra_only_adds_a_suffix():
    rng = random.Random(4)
    for _ in range(40):
        seq = [rng.randrange(5) for _ in range(60)]
        extra = [rng.randrange(5) for _ in range(rng.randrange(1, 4))]
        idx = NgramIndex(max_n=4, tokens=seq)
        trie = idx.lookup(4, max_branches=4, extra=extra, min_match=2)
        assert all(m >= 2 for m in trie.match_len[1:])
        virtual = seq + extra
        for v in trie.children(0):
            n = trie.match_len[v]
            tail = virtual[len(virtual) - n:]
            # the match lies inside the committed context and is followed there by the copied token
            assert any(seq[i:i + n] == tail and seq[i + n] == trie.tokens[v] for i in range(len(seq) - n))
    assert NgramIndex(max_n=3, tokens=[1, 2, 1]).lookup(2, extra=()) == NgramIndex(max_n=3, tokens=[1, 2, 1]).lookup(2)


# ------------------------------------------------------------------ the tree
class _Recording(NgramDynamicProposer):
    """Keeps every Draft it proposes, to check the match lengths it carries."""

    def propose(self, drafter, generator) -> Draft:
        draft = super().propose(drafter, generator)
        self.drafts.append(draft)
        return draft


def _proposer(budget: int, **settings) -> _Recording:
    p = _Recording(profile=CHEAP, budget=budget, max_children=3, settings=NgramSettings(**settings))
    p.drafts = []
    return p


def _check_tree(draft: Draft, min_match_below: int = 2) -> int:
    """The tree's invariants; returns how many copies hang below draft nodes."""
    tree, src = draft.tree, draft.sources
    assert src[0] == ROOT and set(src[1:]) <= {DRAFT, NGRAM}
    assert len(draft.match_len) == tree.n_nodes
    below = 0
    for v in range(tree.n_nodes):
        kids = tree.children[v]
        toks = [draft.tokens[c] for c in kids]
        assert len(set(toks)) == len(toks), f"duplicate token among node {v}'s children: {toks}"
        kinds = [src[c] for c in kids]
        assert kinds == sorted(kinds, key=lambda s: s != NGRAM), "copies must come first"
        assert draft.n_fixed(v) == kinds.count(NGRAM)
        if v and src[v] == NGRAM:
            assert all(k == NGRAM for k in kinds)      # copies are never forwarded by the draft
            assert draft.match_len[v] >= 1
            if src[tree.parents[v]] == DRAFT:
                below += 1
                assert draft.match_len[v] >= min_match_below
        elif v:
            assert draft.match_len[v] == 0
        if any(k == DRAFT for k in kinds):
            assert v in draft.q                        # draft children were drawn from this node's q
    return below


#: The first token (the target's greedy choice after this prompt: 8) was followed by several different
#: continuations; with one branch per lookup the draft proposes the others, and the continuations of its paths
#: are grafted below it.
BRANCHY = [8, 11, 12, 13, 8, 21, 22, 23, 8, 31, 32, 33, 8, 41, 42, 43, 8, 11, 12, 14, 7, 38]


@pytest.mark.parametrize("pair_name", ["same", "noisy", "random"])
@pytest.mark.parametrize("max_branches", [1, 4])
def test_greedy_output_equals_target_greedy(tiny_pairs, tiny_target, pair_name, max_branches):
    reference = _hf_greedy(tiny_target, BRANCHY, 40)
    proposer = _proposer(16, max_branches=max_branches)
    records = list(SpeculativeEngine(tiny_pairs[pair_name]).generate(BRANCHY, proposer,
                                                                     GenerationConfig(max_new_tokens=40)))
    assert [t for r in records for t in r.new_tokens] == reference
    below = sum(_check_tree(d) for d in proposer.drafts)
    assert [r.match_len for r in records[1:]] == [d.match_len for d in proposer.drafts]   # records carry it
    if max_branches == 1:
        assert below > 0   # copies really grew below draft nodes


@pytest.fixture(scope="module")
def small_vocab_pair():
    target = tiny_model(0, vocab=8, init=0.2)
    return make_pair(tiny_model(3, vocab=8, init=0.2), target, 8)


#: For every first token x (drawn from the prompt's forward, step 0), x was followed by 7, 3, 6 and 0 and "x 7" by 7:
#: the draft proposes 7 at the root x (likely under p too), and the copy below it is verified in ~20-30% of the
#: first trees (T = 0.7 to 1): a copy verified as if the draft had drawn it fails the chi-square (p ~ 0).
SMALL_BRANCHY = [t for x in range(8) for t in (x, 7, 7, x, 3, 4, x, 6, 7, x, 0, 2)] + [7]


@pytest.mark.parametrize("sampling", [SamplingConfig(temperature=1.0), SamplingConfig(temperature=0.7, top_p=0.9)])
def test_sampled_output_matches_target_distribution(small_vocab_pair, sampling):
    """Copies below draft nodes, beside the draft's children of the same node, at T > 0: still p exactly."""
    proposer = _proposer(12, max_branches=1, length=3)
    seen = {"below": 0, "mixed": 0, "reached": 0}

    def first_tree(records):   # the first draft, and its step (step 1: step 0 is the prompt's forward)
        first, r1 = proposer.drafts[0], records[1]
        proposer.drafts.clear()
        seen["below"] += _check_tree(first) > 0
        seen["mixed"] += any(first.sources[v] == DRAFT and {first.sources[c] for c in first.tree.children[v]}
                             == {DRAFT, NGRAM} for v in range(1, first.tree.n_nodes))
        seen["reached"] += any(r1.sources[v] == NGRAM and r1.sources[r1.tree.parents[v]] == DRAFT
                               and r1.status[v] != UNREACHED for v in range(1, r1.tree.n_nodes))

    counts, exact = _empirical_joint(small_vocab_pair, proposer, sampling, 1000, SMALL_BRANCHY, first_tree)
    # the first tree really had copies below draft nodes, beside drafts, and verification tested them
    assert seen["below"] > 500 and seen["mixed"] > 300 and seen["reached"] > 100, seen
    assert _joint_pvalue(counts, exact) > 1e-6


def test_accept_callable_prices_the_copies(tiny_pairs):
    """A copy that is never accepted is never worth its width: no copies at all."""
    never = _Recording(profile=CHEAP, budget=8, accept=lambda n, d: 0.0)
    never.drafts = []
    list(SpeculativeEngine(tiny_pairs["noisy"]).generate(BRANCHY, never, GenerationConfig(max_new_tokens=8)))
    assert all(NGRAM not in d.sources for d in never.drafts)
    assert ngram_prior(2, 1) > 0.0


#: The draft model costs as much as a third of a target step a level: copies alone win when the match is long.
DEAR_DRAFT = HardwareProfile.hand_made(lambda n: 30 + 0.5 * n, lambda w: 10 + 0.1 * w)
REPEATED = [3, 4, 5, 6, 7, 8, 9, 10] * 6


@pytest.mark.parametrize("pair_name", ["same", "noisy"])
def test_long_matches_skip_the_draft_model_and_stay_exact(tiny_pairs, tiny_target, pair_name):
    """Where copies alone are predicted to beat the draft model's steps, the step runs no draft forward."""
    proposer = _Recording(profile=DEAR_DRAFT, budget=16, max_children=3, settings=NgramSettings())
    proposer.drafts = []
    engine = SpeculativeEngine(tiny_pairs[pair_name])
    records = list(engine.generate(REPEATED, proposer, GenerationConfig(max_new_tokens=40)))
    assert [t for r in records for t in r.new_tokens] == _hf_greedy(tiny_target, REPEATED, 40)
    copies_only = [d for d in proposer.drafts if DRAFT not in d.sources and NGRAM in d.sources]
    with_draft = [d for d in proposer.drafts if DRAFT in d.sources]
    assert with_draft, "the first steps run the draft model (no evidence yet)"
    assert copies_only, "some steps verify copies alone"
    for d in proposer.drafts:
        _check_tree(d)


class _TopK:
    """A drafter stand-in for pricing: children are the top of q."""

    def sample(self, rows, k, mode, generator):
        return torch.topk(rows, k, dim=-1).indices


@pytest.mark.parametrize("held", [False, True])
def test_draft_children_behind_copies_are_priced_at_the_drafts_own_probability(held):
    """The draft agrees with a copy (q 0.9 on the copied token): its next choice is worth 0.08, not 0.8.

    Priced at q without the copy (renormalised: 0.8) and at rank 0, the second choice drew draft chains
    that the copy, verified first, left out of reach.
    """
    from sequoia.core.profiles.calibration import Calibration
    from sequoia.core.verification.sampling import without_tokens
    from sequoia.runtime.proposers.dynamic import _Growth

    cal = Calibration(knots=(0.0, 1.0), values=((0.0, 1.0), (0.0, 0.5)))   # rank 1: half of rank 0
    prop = NgramDynamicProposer(profile=CHEAP, calibration=cal, budget=8, max_children=1)
    q = torch.tensor([0.9, 0.08, 0.02])
    g = _Growth(parents=[-1], depths=[0], tokens=[5], q_token=[1.0], f=[1.0],
                q={0: without_tokens(q, torch.tensor([0]))})
    if held:
        g.held[0] = (0.9, 1)
    (child,) = prop._add_children(g, [0], _TopK(), None)
    assert g.tokens[child] == 1
    assert g.f[child] == pytest.approx(0.08 * 0.5 if held else 0.8)
