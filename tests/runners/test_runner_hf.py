"""The Hugging Face runner behind the seam: slots, parents, keep and crop give the logits a chain would.

Runs on tiny fp32 models through the plain path (the model's own forward with a
tree mask: what a GPU runs) and through the CPU path (few-query attention and the
lean forward), so the path a GPU Space takes is exercised on every CI run.
"""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_model

from sequoia.runners.base import Runner, Session
from sequoia.runners.hf.lean import lean_forward, model_forward
from sequoia.runners.hf.loading import wrap_model

# A tree hanging off the last cached slot: 0 -> (1, 2), 1 -> (3, 4), 2 -> 5, 3 -> 6.
PARENTS = (-1, 0, 0, 1, 1, 2, 3)
TOKENS = [5, 9, 11, 3, 17, 21, 8]
PROMPT = [2, 7, 1, 30, 4]


def _path(node: int) -> list[int]:
    out = []
    while node >= 0:
        out.append(node)
        node = PARENTS[node]
    return out[::-1]


def _chain_logits(runner, tokens: list[int]) -> torch.Tensor:
    return runner.session().forward(tokens)   # [len, V]


@pytest.fixture(params=["plain", "cpu"])
def runner(request):
    model = tiny_model(3, vocab=64)
    return wrap_model(model, "tiny", role="draft", plain=request.param == "plain")


def test_runner_satisfies_the_protocol(runner):
    assert isinstance(runner, Runner) and isinstance(runner.session(), Session)
    assert runner.info.runtime == "hf" and runner.vocab_size == 64 and runner.max_context == 512
    plain = runner.forward_fn is model_forward
    # The plain path is the model's own forward; the CPU path runs a draft through the lean forward.
    assert plain or runner.forward_fn is lean_forward


def test_a_tree_in_one_forward_equals_each_nodes_path_as_a_chain(runner):
    session = runner.session()
    session.forward(PROMPT, keep=1)
    start = len(session)
    parents = [start - 1] + [start + p for p in PARENTS[1:]]
    tree = session.forward(TOKENS, parents)                                        # [7, V]
    assert len(session) == start + len(TOKENS)
    for node in range(len(TOKENS)):
        chain = _chain_logits(runner, PROMPT + [TOKENS[v] for v in _path(node)])
        torch.testing.assert_close(tree[node], chain[-1], atol=1e-5, rtol=1e-5)


def test_level_by_level_forwards_over_cached_levels_equal_the_chain(runner):
    """The drafter's pattern: each level's parents are slots of earlier calls."""
    session = runner.session()
    session.forward(PROMPT)
    slot = {0: len(session) - 1}                                       # the root is the last prompt token
    levels = [[1, 2], [3, 4, 5], [6]]
    tokens = {1: 9, 2: 11, 3: 3, 4: 17, 5: 21, 6: 8}
    got = {}
    for level in levels:
        start = len(session)
        rows = session.forward([tokens[v] for v in level], [slot[PARENTS[v]] for v in level])
        for j, v in enumerate(level):
            slot[v], got[v] = start + j, rows[j]
    for v, row in got.items():
        path = [tokens[u] for u in _path(v)[1:]]
        torch.testing.assert_close(row, _chain_logits(runner, PROMPT + path)[-1], atol=1e-5, rtol=1e-5)


def test_keep_a_path_then_continue_equals_the_chain(runner):
    session = runner.session()
    session.forward(PROMPT[:-1])
    prefix = len(session)
    session.forward(TOKENS, [prefix - 1] + [prefix + p for p in PARENTS[1:]])
    path = _path(6)                                                     # 0 -> 1 -> 3 -> 6
    session.keep(prefix, [prefix + v for v in path])
    assert len(session) == prefix + len(path)
    more = session.forward([13, 14])
    want = _chain_logits(runner, PROMPT[:-1] + [TOKENS[v] for v in path] + [13, 14])
    torch.testing.assert_close(more, want[-2:], atol=1e-5, rtol=1e-5)


def test_keep_rows_crop_and_bad_arguments(runner):
    session = runner.session()
    last = session.forward(PROMPT, keep=1)
    assert last.shape == (1, 64)
    torch.testing.assert_close(last[0], _chain_logits(runner, PROMPT)[-1], atol=1e-5, rtol=1e-5)
    session.forward([8, 9])
    session.crop(len(PROMPT))
    torch.testing.assert_close(session.forward([10])[0], _chain_logits(runner, PROMPT + [10])[-1],
                               atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="no tokens"):
        session.forward([])
    with pytest.raises(ValueError, match="parent"):
        session.forward([1, 2], [0, 99])
    with pytest.raises(ValueError, match="keep must be"):
        session.forward([1], keep=2)
    n = len(session)
    session.forward([3, 4], [n - 1, n - 1])                             # two siblings
    with pytest.raises(ValueError, match="not a child"):
        session.keep(n, [n, n + 1])                                     # siblings are no path
    with pytest.raises(ValueError, match="sorted"):
        session.keep(n, [n + 1, n])
    with pytest.raises(ValueError, match="crop"):
        session.crop(n + 5)


def test_forward_calls_are_counted(runner):
    before = runner.forward_calls
    session = runner.session()
    session.forward(PROMPT)
    session.forward([1])
    assert runner.forward_calls == before + 2


def test_the_shared_conformance_checks_pass(runner):
    from runner_checks import check_runner_conformance

    check_runner_conformance(runner, atol=1e-5)
