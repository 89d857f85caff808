"""One context limit, checked where the prompt is typed (issue 58): a request whose prompt, new tokens and tree
run past the target's context is refused by the validator on the prompt field, naming the cap that binds
(never the engine's toast after the run started, never a prompt cap the server does not have)."""

import pytest

from components.app_state import validation
from sequoia.core.requests.request import METHOD_OF_LABEL, Limits, MethodSpec, RequestError, parse_decode

LIMITS = Limits(budget_cap=24, max_new_tokens=256, max_prompt_tokens=4096)


def _request(method="Sequoia (budget & depth)", budget=12, depth=5, new=128):
    return parse_decode("hi", method, budget, depth, 0.0, 1.0, new, 0, limits=LIMITS)


@pytest.mark.parametrize("label", list(METHOD_OF_LABEL))
@pytest.mark.parametrize("budget, depth", [(1, 1), (12, 5), (24, 4), (24, 8)])
def test_the_positions_counted_before_the_queue_cover_the_engines(ctx, label, budget, depth):
    req = validation.decode_request(ctx, "def f(x):", label, budget, depth, 0.0, 1.0, 8, 0)
    proposer = validation.engine_inputs(ctx, req).proposer
    assert validation.tree_positions(req.method) >= proposer.max_nodes, (label, budget, depth)
    if req.method.info.shape not in ("tree",):   # the DP's tree may use fewer nodes than its budget
        assert validation.tree_positions(req.method) == proposer.max_nodes, (label, budget, depth)


def test_a_prompt_over_the_context_names_the_real_cap():
    req = _request()
    validation.check_context(req, 3955, 4096, LIMITS)            # 3955 + 128 + 13 = 4096: fits
    with pytest.raises(RequestError) as refused:
        validation.check_context(req, 4028, 4096, LIMITS)      # the 4,028-token prompt on llama.cpp
    message = refused.value.errors["prompt"]
    assert message == ("prompt has 4028 tokens; with 128 new tokens and a tree of up to 13 positions it needs 4169 "
                       "positions, which exceeds the target's context of 4096: at most 3955 prompt tokens fit "
                       "these settings (fewer new tokens or a smaller budget leave more)")
    assert validation.context_cap(req, 4096, LIMITS) == 3955
    assert validation.context_cap(req, None, LIMITS) == 4096      # no known context: the server's cap
    assert validation.context_cap(req, 32768, LIMITS) == 4096     # a long context: the server's cap binds


def test_a_prompt_over_every_cap_names_this_servers_not_8192():
    with pytest.raises(RequestError) as refused:
        validation.check_context(_request(), 15000, 4096, LIMITS)
    message = refused.value.errors["prompt"]
    assert message.startswith("prompt has 15000 tokens; this server takes at most 4096 per request on cpu, and ")
    assert "at most 3955 prompt tokens fit" in message and "8192" not in message
    with pytest.raises(RequestError) as refused:
        validation.check_context(_request(), 5000, 32768, LIMITS)   # a long context: the server's cap alone
    assert refused.value.errors["prompt"] == "prompt has 5000 tokens; this server takes at most 4096 per request on cpu"


def test_the_validator_refuses_it_on_the_prompt_field(ctx):
    """The tiny target has 512 positions: 400 prompt characters, 200 new tokens and a tree do not fit."""
    answers = validation.validators(ctx)["decode"]("x" * 400, "Chain", 4, 4, 0.0, 1.0, 200, 0, False)
    bad = {i: a["message"] for i, a in enumerate(answers) if not a["is_valid"]}
    assert list(bad) == [0] and "which exceeds the target's context of 512: at most 307 prompt tokens fit" in bad[0]
    # a prompt of more than any request's 8192 tokens is refused with this server's caps, not that number
    answers = validation.validators(ctx)["decode"]("x" * 9000, "Chain", 4, 4, 0.0, 1.0, 8, 0, False)
    message = answers[0]["message"]
    assert message.startswith("prompt has 9000 tokens; this server takes at most 4096 per request on cpu, and ")
    assert "8192" not in message


def test_every_page_method_has_a_tree_size():
    for label, name in METHOD_OF_LABEL.items():
        assert validation.tree_positions(MethodSpec(name, 8, 4)) >= 1, label


def test_a_comparison_is_checked_with_the_widest_tree_it_may_run(ctx):
    """Compare runs every ticked method on one prompt: Sequoia + n-gram copies verifies the budget's draft tokens
    and up to 32 copied ones, so a prompt that fits the Sequoia tree may not fit that row."""
    spec = MethodSpec("sequoia", 12, 5)
    assert validation.widest_tree(spec) == 12 + 32 + 1 > validation.tree_positions(spec)
    fits_one = "x" * (512 - 8 - 13 - 30)   # room for the Sequoia tree, not for the copies beside it
    assert not [a for a in validation.validators(ctx)["decode"](fits_one, "Sequoia (budget & depth)", 12, 5, 0.0,
                                                                 1.0, 8, 0, False) if not a["is_valid"]]
    answers = validation.validators(ctx)["compare"](fits_one, 12, 5, 0.0, 1.0, 8, 0)
    assert "a tree of up to 45 positions" in answers[0]["message"] and not answers[0]["is_valid"]
