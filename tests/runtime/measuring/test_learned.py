"""The acceptance a server learns from its own decodes over a prior (sequoia.runtime.measuring.learned)."""

import multiprocessing

import pytest
from conftest import make_pair, perturbed, tiny_model

from sequoia.core.config import GenerationConfig, SamplingConfig
from sequoia.core.statistics.stats import empirical_acceptance
from sequoia.core.trees.dp import check_acceptance, optimal_tree
from sequoia.runtime.engine import SpeculativeEngine
from sequoia.runtime.measuring.learned import PRIOR_WEIGHT, LearnedAcceptance
from sequoia.runtime.methods import make_method

PRIOR = (0.5, 0.2, 0.1)


@pytest.fixture(scope="module")
def records():
    target = tiny_model(0)
    pair = make_pair(perturbed(target, 0.5, 1), target, target.config.vocab_size)
    return list(SpeculativeEngine(pair).generate([1, 5, 9, 3], make_method("sequoia", budget=12, depth=4),
                                                 GenerationConfig(max_new_tokens=40)))


def test_the_prior_alone_until_a_decode_is_seen(tmp_path):
    learnt = LearnedAcceptance(tmp_path, "a -> b").vector(PRIOR, 0.0)
    assert learnt.values == PRIOR and learnt.nodes == 0 and "prior alone" in learnt.words()


def test_decodes_move_the_vector_from_the_prior_to_the_servers_own_rates(tmp_path, records):
    store = LearnedAcceptance(tmp_path, "a -> b")
    store.observe(records, 0.0)
    once = store.vector(PRIOR, 0.0)
    assert once.decodes == 1 and once.nodes > 0 and once.values != PRIOR
    for _ in range(200):
        store.observe(records, 0.0)
    many = LearnedAcceptance(tmp_path, "a -> b").vector(PRIOR, 0.0)   # read back from the file
    own = empirical_acceptance(records, len(many.values))
    assert many.decodes == 201 and many.nodes == 201 * once.nodes
    check_acceptance(many.values)
    # the server's rates now weigh 201 * nodes against the prior's PRIOR_WEIGHT
    share = PRIOR_WEIGHT / (PRIOR_WEIGHT + many.nodes)
    assert abs(many.values[0] - ((1 - share) * own[0] + share * PRIOR[0])) < 0.05
    assert store.vector(PRIOR, 0.6).values == PRIOR          # another temperature: counted apart


def test_the_target_alones_steps_teach_nothing(tmp_path):
    target = tiny_model(0)
    pair = make_pair(target, target, target.config.vocab_size)
    steps = list(SpeculativeEngine(pair).generate([1, 2], make_method("ar"), GenerationConfig(max_new_tokens=5)))
    store = LearnedAcceptance(tmp_path, "a -> b")
    store.observe(steps, 0.0)
    assert not store.path.exists()


def _observe(folder, records):
    LearnedAcceptance(folder, "a -> b").observe(records, 0.6)


def test_calls_ending_at_once_lose_no_count(tmp_path, records):
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_observe, args=(tmp_path, records)) for _ in range(6)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert LearnedAcceptance(tmp_path, "a -> b").vector(PRIOR, 0.6).decodes == 6


def test_a_server_that_learns_builds_its_trees_from_the_learnt_vector(tmp_path, tiny_app_pair, lanes, records):
    import app
    from components.app_state import validation
    from components.app_state.decode_inputs import DecodeInputs

    store = LearnedAcceptance(tmp_path / "learned", "tiny")
    demo = app.build_demo(tiny_app_pair, assets_dir=tmp_path / "assets", lanes=lanes, learned=store)
    ctx = demo.sequoia_context
    inputs = DecodeInputs("def f(x):", "Sequoia (budget & depth)", 8, 3, 0.0, 1.0, 8, 0, True, "0.5, 0.2, 0.1")
    before = validation.engine_inputs(ctx, validation.parse_inputs(ctx, inputs)).proposer
    for _ in range(50):
        ctx.learn(records, 0.0)
    after = validation.engine_inputs(ctx, validation.parse_inputs(ctx, inputs)).proposer
    learnt = store.vector(PRIOR, 0.0).values
    assert learnt != PRIOR
    assert before.tree == optimal_tree(PRIOR, 8, 3).tree(8, 3)
    assert after.tree == optimal_tree(learnt, 8, 3).tree(8, 3)
    demo.close()


def test_a_live_decode_teaches_the_server_once_it_ends(tmp_path, tiny_app_pair, lanes):
    import app
    from components.app_state import validation
    from components.app_state.decode_inputs import DecodeInputs
    from components.live import live_tab

    store = LearnedAcceptance(tmp_path / "learned", "tiny")
    demo = app.build_demo(tiny_app_pair, assets_dir=tmp_path / "assets", lanes=lanes, learned=store)
    ctx = demo.sequoia_context
    inputs = DecodeInputs("def f(x):", "Sequoia (budget & depth)", 8, 3, 0.0, 1.0, 12, 0, True, "")
    job = validation.engine_inputs(ctx, validation.parse_inputs(ctx, inputs))
    steps = live_tab.run_decode(ctx, job)
    next(steps)
    steps.close()                                        # closed early (a closed page): nothing learnt
    assert not store.path.exists()
    assert list(live_tab.run_decode(ctx, job))
    assert store.vector(PRIOR, 0.0).decodes == 1
    demo.close()
