"""Exact mode, the first-divergence report and the distribution panel, on tiny models (and the embedded pair)."""

from __future__ import annotations

import copy

import gradio as gr
import pytest
import torch

import app
from components.app_state.context import AppContext
from components.app_state.decode_inputs import DecodeInputs
from components.compare import compare_tab
from components.distribution import distribution_tab, distribution_view
from components.widgets import divergence_view
from sequoia.core.config import GenerationConfig, SamplingConfig
from sequoia.core.verification.distribution import RULES, check_rule
from sequoia.runners.hf.attention import use_few_query_attention
from sequoia.runners.hf.loading import wrap_model
from sequoia.runtime.checks.distribution_check import root_distributions, run_check
from sequoia.runtime.checks.divergence import explain, explain_all, first_divergence, kernel_views
from sequoia.runtime.checks.exactness import (certify, exact_copy, exact_pair, exact_runner, is_exact, kernel_gap,
                                               load_exact_pair)
from sequoia.runtime.engine import SpeculativeEngine
from sequoia.runtime.measuring.timing import run_method
from sequoia.runtime.methods import make_method

from conftest import app_pair, make_pair, perturbed, runner, tiny_model

ENGINE = {"chain": dict(budget=4), "specinfer": dict(width=2, depth=3), "kary": dict(width=2, depth=3),
          "sequoia": dict(budget=12, depth=4)}


def _greedy(pair, method: str, ids, n: int = 24) -> tuple[int, ...]:
    kwargs = ENGINE.get(method, {})
    return run_method(SpeculativeEngine(pair), pair, method, ids, GenerationConfig(max_new_tokens=n),
                      make_method(method, **kwargs)).tokens


@pytest.fixture(scope="module")
def low_precision_pair():
    """A bf16 target on the project's few-query attention (not exact) and a noisy fp32 draft."""
    target = tiny_model(0)
    draft = perturbed(target, 0.5, 1)
    low = copy.deepcopy(target).to(torch.bfloat16)
    return app_pair(draft, wrap_model(low, "tiny-target", "target", plain=False))


# ------------------------------------------------------------------ exact mode
def test_exact_pair_is_float32_plain_and_shares_the_draft(low_precision_pair):
    assert not is_exact(low_precision_pair)
    exact = exact_pair(low_precision_pair, exact_copy(low_precision_pair.target))
    assert is_exact(exact) and exact.draft is low_precision_pair.draft
    assert exact.target.model.dtype == torch.float32 and exact.target.config._attn_implementation == "sdpa"
    assert exact.target_name.endswith("(fp32, exact)")
    assert low_precision_pair.target.model.dtype == torch.bfloat16      # the pair itself is left as it was


@pytest.mark.parametrize("prompt_seed", [0, 1, 2])
def test_every_method_equals_the_target_alone_in_exact_mode(low_precision_pair, prompt_seed):
    exact = exact_pair(low_precision_pair, exact_copy(low_precision_pair.target))
    ids = torch.randint(1, 48, (12,), generator=torch.Generator().manual_seed(prompt_seed)).tolist()
    ref = _greedy(exact, "ar", ids)
    for method in ENGINE:
        assert _greedy(exact, method, ids) == ref, method


def test_kernel_gap_certifies_a_float32_run(tiny_target):
    ids = list(range(1, 20))
    ref = _greedy(make_pair(tiny_target, tiny_target, 48), "ar", ids, 16)
    gap = certify(runner(tiny_target), ids, ref, 48)
    assert gap.rows == 16 and gap.same_argmax == gap.rows
    assert gap.max_abs < 1e-3 and gap.certified
    low = runner(copy.deepcopy(tiny_target).to(torch.bfloat16))
    assert kernel_gap(low, ids, list(ref), 48).max_abs > gap.max_abs   # bf16 kernels are further apart


def test_app_context_loads_the_exact_pair_once(low_precision_pair, tmp_path):
    calls = []

    def loader(pair, progress):
        calls.append(1)
        progress(0.5, "half")
        return exact_copy(pair.target)

    ctx = AppContext.from_pair_or_loader(low_precision_pair, assets_dir=tmp_path, exact_loader=loader)
    view = ctx.exact_context()
    assert ctx.exact_context() is view and view.exact_context() is view and calls == [1]
    assert is_exact(view.pair()) and view.pair().draft is ctx.pair().draft and view.engine() is not ctx.engine()
    assert ctx.extras.exact_status.ready and not is_exact(ctx.pair())


def test_compare_in_exact_mode_says_identical_and_certifies(low_precision_pair, tmp_path):
    ctx = AppContext.from_pair_or_loader(low_precision_pair, assets_dir=tmp_path)
    frames = list(compare_tab.on_compare(ctx, DecodeInputs("def f(x):", "", 8, 3, max_new_tokens=16),
                                         ["Chain", "SpecInfer", "Sequoia (budget & depth)"], exact=True))
    rows = [f[1] for f in frames if isinstance(f[1], list)][-1]
    assert rows and all(r[-1] == "✓ identical" for r in rows)
    notes = frames[-1][2]
    assert "guarantee, not a hope" in notes and "certified" in notes


# ------------------------------------------------------------------ the first divergence, on a forced near-tie
A, B = 5, 9


def near_tie(model, eps: float = 1e-3):
    """``model`` whose tokens A and B tie at the top within ``eps``: one-row forwards pick A, wider ones B.

    What two kernels' rounding does to a real near-tie, made deterministic."""
    out = copy.deepcopy(model)

    def hook(module, args, kwargs, output):
        rows = kwargs["input_ids"].shape[-1]
        top = output.logits.max(-1).values + 1.0
        output.logits[..., A] = top + (eps if rows == 1 else 0.0)
        output.logits[..., B] = top + (0.0 if rows == 1 else eps)
        return output

    out.register_forward_hook(hook, with_kwargs=True)
    return out


def test_first_divergence():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 4, 3]) == 1
    assert first_divergence([1, 2], [1, 2, 3]) == 2


def test_kernel_views_from_forced_logits():
    one = torch.tensor([0.0, 3.0, 2.9995, 1.0])
    many = torch.tensor([0.0, 2.9995, 3.0, 1.0])
    v1, vm = kernel_views(one, many, ref_tok=1, other_tok=2)
    assert (v1.argmax, vm.argmax) == (1, 2)
    assert v1.margin == pytest.approx(5e-4, abs=1e-6) and v1.lead == pytest.approx(5e-4, abs=1e-6)
    assert vm.lead == pytest.approx(-5e-4, abs=1e-6)


def test_divergence_report_on_a_forced_near_tie(tiny_target):
    tied = near_tie(tiny_target)
    pair = make_pair(tied, tied, 48)
    ids = list(range(1, 15))
    ref, other = _greedy(pair, "ar", ids, 8), _greedy(pair, "chain", ids, 8)
    assert ref[0] == other[0] == B          # the prompt's forward is many-row for both
    assert ref != other
    d = explain(pair.target, pair.tokenizer, ids, ref, other, "chain", 48)
    assert d.position == 1 and (d.reference_token, d.other_token) == (A, B)
    assert d.one_row.argmax == A and d.many_row.argmax == B and d.kernels_disagree
    assert d.one_row.margin == pytest.approx(1e-3, rel=1e-2) and d.many_row.margin == pytest.approx(1e-3, rel=1e-2)
    found = explain_all(pair.target, pair.tokenizer, ids, ref, {"chain": other, "same": ref}, 48)
    text = divergence_view.markdown(found)   # a near-tie within the measured kernel gap: one paragraph
    assert found[0].near_tie and "Identical up to a kernel near-tie" in text and "chain" in text
    assert "**same**" not in text and ": chain)" in text and "exact mode" in text and "token 2" in text and "<5>" in text and "<9>" in text
    assert "one-row forward" in divergence_view.describe(found[0])


def test_compare_explains_a_divergence(tiny_target, tmp_path):
    tied = near_tie(tiny_target)
    ctx = AppContext.from_pair_or_loader(app_pair(tied, tied), assets_dir=tmp_path)
    frames = list(compare_tab.on_compare(ctx, DecodeInputs("def f(x):", "", 8, 3, max_new_tokens=8), ["Chain"]))
    # The forced tie is within the kernels' measured gap: the row reads identical up to it, one explanation.
    last = [f[1] for f in frames if isinstance(f[1], list)][-1]
    assert any(r[-1].startswith("≈ identical up to a kernel near-tie at token 2") for r in last)
    notes = frames[-1][2]
    assert "Identical up to a kernel near-tie" in notes and "differs" not in notes


# ------------------------------------------------------------------ the distribution panel
def test_distribution_check_on_the_tiny_pair(tiny_pairs):
    pair = tiny_pairs["noisy"]
    cfg = SamplingConfig(temperature=1.0)
    p, q = root_distributions(pair, [1, 2, 3, 4], cfg)
    assert p.shape == q.shape == (48,) and float(p.sum()) == pytest.approx(1.0, abs=1e-5)
    state = run_check(pair, [1, 2, 3, 4], cfg, n=600, k=3, seed=1)
    assert [r.rule.name for r in state.results] == [r.name for r in RULES]
    assert all(r.fit.n == 600 for r in state.results) and state.running is None
    with pytest.raises(ValueError, match="temperature"):
        run_check(pair, [1, 2], SamplingConfig(temperature=0.0))


def test_distribution_figure_and_summary():
    p = torch.tensor([0.5, 0.3, 0.1, 0.05, 0.05], dtype=torch.float64)
    q = torch.tensor([0.2, 0.5, 0.1, 0.1, 0.1], dtype=torch.float64)
    results = [check_rule(p, q, rule, 2, 3000, seed=i) for i, rule in enumerate(RULES)]
    fig = distribution_view.figure(p, results, lambda t: f"tok{t}", "title")
    assert len(fig.data) == 2 * len(RULES)
    assert list(fig.data[0].x)[-1] == "other" and "'tok0'" in list(fig.data[0].x)
    assert sum(fig.data[0].y) == pytest.approx(1.0) and sum(fig.data[1].y) == pytest.approx(1.0)
    assert "p-value" in fig.layout.annotations[0].text
    md = distribution_view.summary(results, p, 1.5)
    assert md.count("\n| ") == len(RULES) and "teaching foil" in md and "1.5 s" in md
    assert len(distribution_view.figure(p, []).data) == 0


def test_distribution_tab_handler_and_app(tiny_pairs, tmp_path, lanes):
    ctx = AppContext.from_pair_or_loader(app_pair(tiny_pairs["noisy"].draft, tiny_pairs["noisy"].target),
                                         assets_dir=tmp_path)
    frames = list(distribution_tab.on_check(ctx.models, "hello", 1.0, 1.0, 400, 3, 0, True))
    assert "Finished in" in frames[-1][1] and len(frames[-1][0].data) == 2 * len(RULES)
    with pytest.raises(Exception, match="temperature"):
        list(distribution_tab.on_check(ctx.models, "hello", 0.0, 1.0, 400, 3, 0, True))
    demo = app.build_demo(ctx.pair(), assets_dir=tmp_path, max_budget=24, lanes=lanes)
    assert "Distribution check" in demo.config["components"].__repr__()
    # Stop flags the session (no cancelled event, no red Error): the check ends after its current chunk of
    # trials, the rules done keep their lines, and the check draws Stop's words again, last
    args = ("hello", 1.0, 1.0, 400, 3, 0, True)
    session, line = distribution_tab.begin_check(*args, None)
    assert not line.visible   # a taken request hides the refusal line
    frames, said = [], None
    for frame in distribution_tab.on_check(ctx.models, *args, session):
        frames.append(frame)
        if said is None and "| Sequoia" in str(frame[1]):   # the first rule's verdict is in
            said = distribution_tab.stop_check(session)[1]
    assert said.startswith("**Stopped**: the rules below") and frames[-1][1] == said and not session.running
    assert "Finished in" not in said and said.count("\n| ") < len(RULES)
    assert all(isinstance(v, type(gr.skip())) for v in distribution_tab.stop_check(session))   # no check on
    waiting, _ = distribution_tab.begin_check(*args, None)   # stopped in the queue: nothing runs
    assert distribution_tab.stop_check(waiting)[1] == "**Stopped** before a rule finished: nothing was tested."
    assert len(list(distribution_tab.on_check(None, *args, waiting))) == 1
    kept, line = distribution_tab.begin_check("hello", 0.0, 1.0, 400, 3, 0, True, None)   # refused: says why
    assert kept == gr.skip() and line.visible and line.value.startswith("**Not run:**") and "temperature" in line.value


def test_cli_exact_flag_loads_the_exact_pair(monkeypatch):
    from sequoia.tools import bench_cli, cli

    seen = {}
    monkeypatch.setattr(bench_cli, "load_exact_pair", lambda *a, **k: seen.update(k) or "exact pair")
    for argv in (["generate", "--prompt", "x", "--exact"], ["bench", "--exact"]):
        assert bench_cli.load_pair_for(cli.build_parser().parse_args(argv)) == "exact pair"
    assert seen["device"] is None and seen["blocked_weights"]
    with pytest.raises(ValueError, match="--exact"):
        argv = ["generate", "--prompt", "x", "--exact", "--dtype", "bf16"]
        bench_cli.load_pair_for(cli.build_parser().parse_args(argv))


# ------------------------------------------------------------------ the embedded pair
def test_load_exact_pair_loads_a_float32_unquantized_target_behind_the_plain_runner(monkeypatch):
    """What the CLI's ``--exact`` loads (the load itself is load_pair's, tested in tests/runners/test_models.py)."""
    from sequoia.runtime.checks import exactness

    seen, low = {}, tiny_model(0)
    low_pair = app_pair(low, wrap_model(copy.deepcopy(low), "tiny-target", "target", plain=False))
    monkeypatch.setattr(exactness, "load_pair", lambda *a, **k: seen.update(k) or low_pair)
    pair = load_exact_pair("d", "t", device="cpu")
    assert seen["dtype"] == "fp32" and seen["target_quant"] == "none" and seen["blocked_weights"]
    assert is_exact(pair) and pair.draft is low_pair.draft and pair.target.model is low_pair.target.model


@pytest.mark.embedded
@pytest.mark.slow
def test_exact_mode_on_the_embedded_pair(embedded_pair_fp32, full_threads):
    """Two prompts, 16 tokens: chain, SpecInfer and Sequoia print the float32 target alone's greedy text.

    The session's float32 pair (conftest), its target behind exact mode's plain runner as :func:`load_exact_pair`
    puts it (a second 6 GB float32 load held beside the session's peaked the suite's memory); its own
    attention back after."""
    model = embedded_pair_fp32.target.model
    pair = exact_pair(embedded_pair_fp32, exact_runner(model, embedded_pair_fp32.target.name))
    try:
        assert is_exact(pair)
        for prompt in ("Write a Python function that reverses a list.", "What is the capital of France?"):
            ids = pair.encode_prompt(prompt)
            ref = _greedy(pair, "ar", ids, 16)
            for method in ("chain", "specinfer", "sequoia"):
                assert _greedy(pair, method, ids, 16) == ref, (prompt, method)
    finally:
        use_few_query_attention(model)
        assert not is_exact(embedded_pair_fp32)   # the session's pair runs its own kernels again
