"""Measured acceptance of copied tokens: the fit from step records, the prior fallback, the file format."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from sequoia.core.config import GenerationConfig, SamplingConfig
from sequoia.core.ngrams.ngram_acceptance import NgramAcceptance, RequestAcceptance, fit_ngram_acceptance, ngram_prior
from sequoia.core.profiles.profile import HardwareProfile
from sequoia.core.statistics.trace import ACCEPTED, DRAFT, NGRAM, REJECTED, ROOT, UNREACHED, StepRecord
from sequoia.core.trees.tree import Tree
from sequoia.runtime.engine import SpeculativeEngine
from sequoia.runtime.measuring.finder import find_ngram_acceptance
from sequoia.runtime.measuring.ngram_acceptance import ngram_records
from sequoia.runtime.methods import make_method


def _record(parents, status, sources, match_len, p=None) -> StepRecord:
    tree = Tree(tuple(parents))
    rec = StepRecord.fake(tree, accepted=(0,))
    acc = tuple(v for v in range(tree.n_nodes) if status[v] == ACCEPTED)
    return replace(rec, status=tuple(status), accepted=acc, sources=tuple(sources), match_len=tuple(match_len),
                   p=tuple(p) if p is not None else rec.p)


# root -> a (n=3, accepted) -> b (n=3, rejected); root -> c (n=1, unreached: a was accepted);
# a -> d (draft, rejected: not counted); c -> e (n=1, parent not accepted: not counted)
PARENTS = (-1, 0, 0, 1, 1, 2)    # root, a, c, b, d, e (breadth-first)
STATUS = (ACCEPTED, ACCEPTED, UNREACHED, REJECTED, REJECTED, UNREACHED)
SOURCES = (ROOT, NGRAM, NGRAM, NGRAM, DRAFT, NGRAM)
MATCH = (0, 3, 1, 3, 0, 1)


def test_greedy_fit_counts_children_of_accepted_parents():
    rec = _record(PARENTS, STATUS, SOURCES, MATCH)
    acc = fit_ngram_acceptance([rec, rec], temperature=0.0, max_n=4, max_depth=3)
    assert acc.shape == (4, 3)
    assert acc.counts[2][0] == 2 and acc.table[2][0] == 1.0      # a: n=3, depth 1, accepted twice
    assert acc.counts[2][1] == 2 and acc.table[2][1] == 0.0      # b: n=3, depth 2, rejected
    assert acc.counts[0][0] == 2 and acc.table[0][0] == 0.0      # c: unreached sibling counts as not accepted
    assert acc.counts[0][1] == 0                                  # e: its parent was not accepted
    assert sum(map(sum, acc.counts)) == 6
    assert acc.tokens == 2 * rec.n_new


def test_sampled_fit_scores_target_probability():
    p = (1.0, 0.7, 0.1, 0.2, 0.3, 0.5)
    acc = fit_ngram_acceptance([_record(PARENTS, STATUS, SOURCES, MATCH, p)], temperature=0.6, max_depth=2)
    assert acc.table[2][0] == pytest.approx(0.7) and acc.table[2][1] == pytest.approx(0.2)
    assert acc.table[0][0] == pytest.approx(0.1) and acc.temperature == 0.6


def test_long_matches_and_deep_nodes_go_to_last_cell():
    parents = (-1, 0, 1, 2)
    rec = _record(parents, (ACCEPTED,) * 4, (ROOT, NGRAM, NGRAM, NGRAM), (0, 6, 6, 6))
    acc = fit_ngram_acceptance([rec], 0.0, max_n=4, max_depth=2)
    assert acc.counts[3] == (1, 2)


def test_records_without_match_lengths_are_skipped_and_bad_ones_refused():
    rec = _record(PARENTS, STATUS, SOURCES, MATCH)
    assert sum(map(sum, fit_ngram_acceptance([replace(rec, match_len=())], 0.0).counts)) == 0
    with pytest.raises(ValueError, match="match_len"):
        fit_ngram_acceptance([replace(rec, match_len=(0, 1))], 0.0)


def test_prob_is_prior_on_empty_cells_and_shrinks_toward_it():
    acc = NgramAcceptance(table=((0.9, 0.0), (1.0, 0.5)), counts=((10, 0), (1000, 0)), pseudo_count=10.0)
    assert acc.prob(1, 2) == ngram_prior(1, 2)                     # empty cell: the prior
    assert acc.prob(1, 1) == pytest.approx((10 * 0.9 + 10 * ngram_prior(1, 1)) / 20)
    assert acc.prob(2, 1) == pytest.approx(1.0, abs=0.01)         # many observations: the measurement
    assert acc.prob(7, 1) == pytest.approx(1.0, abs=0.01)         # longer matches use the last row
    assert acc.prob(1, 9) == ngram_prior(1, 9)                    # deeper nodes use the last column (empty)


def test_save_load_round_trip(tmp_path):
    acc = NgramAcceptance(table=((0.25, 0.5),), counts=((4, 8),), pair="a / b", prompt_set="code",
                          temperature=0.6, tokens=96, note="hand-built")
    path = tmp_path / "ngram.json"
    acc.save(path)
    assert NgramAcceptance.load(path) == acc


@pytest.mark.parametrize("body, message", [
    ({"format": "sequoia-acceptance/1", "values": [0.5]}, "expected a n-gram acceptance file"),
    ({"format": "sequoia-ngram-acceptance/1", "counts": [[1]], "temperature": 0}, "missing field 'table'"),
    ({"format": "sequoia-ngram-acceptance/1", "table": [[0.5]], "counts": [[1.5]], "temperature": 0},
     "list of lists"),
    ({"format": "sequoia-ngram-acceptance/1", "table": [[1.5]], "counts": [[1]], "temperature": 0},
     "probabilities"),
    ({"format": "sequoia-ngram-acceptance/1", "table": [[0.5, 0.5]], "counts": [[1]], "temperature": 0},
     "same shape"),
])
def test_malformed_files_are_refused(tmp_path, body, message):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(body))
    with pytest.raises(ValueError, match=message):
        NgramAcceptance.load(path)


#: A repeating prompt the tiny target goes on repeating (its first token, from the prompt's forward, is 6).
REPEATING = [2, 11, 6, 5] * 3 + [2, 11]


@pytest.mark.parametrize("temperature", [0.0, 0.6])
def test_ngram_decodes_record_every_copied_node(tiny_pairs, temperature):
    pair = tiny_pairs["random"]
    ids = REPEATING    # every step finds matches
    recs = ngram_records(pair, [ids], SamplingConfig(temperature), max_new_tokens=12)
    copied = [r for r in recs if r.tree.size]
    assert copied and all(len(r.match_len) == r.tree.n_nodes for r in recs[1:])   # step 0: the prompt's forward
    assert all((m > 0) == (r.source(v) == NGRAM) for r in copied for v, m in enumerate(r.match_len) if v)
    acc = fit_ngram_acceptance(recs, temperature)
    assert sum(map(sum, acc.counts)) >= len(copied) and acc.tokens == sum(r.n_new for r in recs)


def test_finder_takes_same_kind_then_nearest_temperature(tmp_path):
    folder = tmp_path / "acceptance"
    folder.mkdir()
    assert find_ngram_acceptance("code", 0.0, tmp_path) is None            # nothing measured: the prior
    for kind, t in (("code", 0.0), ("code", 0.6), ("chat", 0.0)):
        NgramAcceptance(table=((0.5,),), counts=((1,),), prompt_set=kind, temperature=t, pair="d / t").save(
            folder / f"ngram-embedded-{kind}-{t}.json")
    (folder / "ngram-broken.json").write_text("{")                        # unreadable: skipped
    pick = lambda kind, t, pair=None: find_ngram_acceptance(kind, t, tmp_path, pair)
    assert (pick("code", 0.0).prompt_set, pick("code", 0.0).temperature) == ("code", 0.0)
    assert pick("code", 1.0).temperature == 0.6
    assert (pick("chat", 0.7).prompt_set, pick("chat", 0.7).temperature) == ("chat", 0.0)
    assert pick("rag", 0.0).temperature == 0.0                            # no such kind: nearest temperature
    assert pick("code", 0.0, pair="other / pair") is None


# ------------------------------------------------------------------ a request's own evidence
#: Costs of the same proportions as the embedded pair on a CPU (as in test_dynamic).
CPU_LIKE = HardwareProfile.hand_made(target=lambda n: 100.0 + 4.0 * n, draft=lambda w: 17.0 + 1.5 * w)

def test_request_acceptance_counts_what_the_table_counts():
    own = RequestAcceptance()   # on the prior
    own.observe(_record(PARENTS, STATUS, SOURCES, MATCH))
    # a (n=3, depth 1) accepted; b (n=3, depth 2 in its branch) rejected; c (n=1) unreached: 1 hit of 3.
    assert own.hits == 1
    assert own.expected == pytest.approx(ngram_prior(3, 1) + ngram_prior(3, 2) + ngram_prior(1, 1))
    assert own.ratio == pytest.approx((1 + 5) / (own.expected + 5))


def test_request_acceptance_depth_restarts_below_a_draft_node():
    # root -> draft x (accepted) -> copy y (n=2, accepted) -> copy z (n=2, rejected)
    rec = _record((-1, 0, 1, 2), (ACCEPTED, ACCEPTED, ACCEPTED, REJECTED), (ROOT, DRAFT, NGRAM, NGRAM),
                  (0, 0, 2, 2))
    seen = []
    own = RequestAcceptance(base=lambda n, d: seen.append((n, d)) or 0.5)
    own.observe(rec)
    assert seen == [(2, 1), (2, 2)] and own.hits == 1 and own.expected == 1.0


def test_request_acceptance_moves_prices_with_the_outcomes():
    table = lambda n, d: 0.6
    quoting, fresh = RequestAcceptance(table), RequestAcceptance(table)
    hit = _record((-1, 0, 1), (ACCEPTED,) * 3, (ROOT, NGRAM, NGRAM), (0, 4, 4))
    miss = _record((-1, 0, 1), (ACCEPTED, REJECTED, UNREACHED), (ROOT, NGRAM, NGRAM), (0, 4, 4))
    assert quoting(4, 1) == fresh(4, 1) == 0.6          # no evidence yet: the table
    for _ in range(10):
        quoting.observe(hit)
        fresh.observe(miss)
    assert quoting(4, 1) == pytest.approx(0.6 * 25 / 17)  # 20 hits of 12 expected
    assert RequestAcceptance(lambda n, d: 0.9, hits=20.0, expected=12.0)(4, 1) == 1.0   # capped
    assert fresh(4, 1) == pytest.approx(0.6 * 5 / (10 * 0.6 + 5))   # 0 hits of 6 expected: 0.27
    fresh.reset()
    assert fresh(4, 1) == 0.6


def test_ngram_proposers_price_by_the_request(tiny_pairs):
    pair = tiny_pairs["random"]
    ids = REPEATING
    for method in ("ngram", "sequoia-ngram"):
        proposer = make_method(method, profile=CPU_LIKE)
        records = list(SpeculativeEngine(pair).generate(ids, proposer, GenerationConfig(max_new_tokens=12)))
        assert any(r.source(v) == NGRAM for r in records for v in range(1, r.tree.n_nodes))
        assert proposer._priced.expected > 0           # it learnt from the request's copies
        fixed = make_method(method, profile=CPU_LIKE)
        fixed.adapt = False
        fixed.start()
        assert fixed._priced is fixed.accept
