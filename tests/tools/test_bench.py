"""The bench library on tiny random-weight models: structure, equality flags, JSON and Markdown.

No timing is asserted: only that every number is there and consistent.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from sequoia._meta import write_json
from sequoia.core.profiles.profile import HardwareProfile
from sequoia.core.trees.tree import Tree
from sequoia.core.verification.sampling import first_accepted
from sequoia.runtime.measuring.acceptance import rejection_curves
from sequoia.runtime.measuring.timing import RunResult, process_clock
from sequoia.tools.bench import BenchConfig, PromptSet, TreeChoice, _compare_with_reference, load_prompt_sets, run_bench
from sequoia.tools.bench_report import FORMAT, markdown_report, markdown_table, summarize_runs, to_dict

PROMPTS = (PromptSet("code", ((3, 5, 7, 9), (11, 2, 4))), PromptSet("chat", ((1, 8, 20, 6, 2),)))


def _pair(base):
    """A tiny pair whose eos is a token that random models rarely emit (runs reach max_new_tokens)."""
    return SimpleNamespace(**{**vars(base), "eos_token_ids": (47,)})


def _trees(temps=(0.0,), tree=Tree.k_ary(2, 2)):
    return [TreeChoice(s.name, t, tree, (0.8, 0.1), "test", 1.5, 2.0) for s in PROMPTS for t in temps]


@pytest.fixture(scope="module")
def greedy_result(tiny_pairs, tmp_path_factory):
    from sequoia.tools.bench_trees import dynamic_proposers

    config = BenchConfig(max_new_tokens=8, temperatures=(0.0,), warmup_tokens=2)
    no_assets = tmp_path_factory.mktemp("no-assets")  # no calibration: the identity
    dynamic = dynamic_proposers(PROMPTS, (0.0,), [], None, no_assets, budget=8, max_depth=4)
    return run_bench(_pair(tiny_pairs["noisy"]), PROMPTS, config, _trees(), progress=lambda *a: None,
                     dynamic=dynamic)


def test_every_method_runs_on_every_prompt(greedy_result):
    runs = greedy_result.runs
    assert len(runs) == 3 * len(BenchConfig().methods)
    for r in runs:
        assert 1 <= r.new_tokens <= 8 and r.seconds > 0 and r.target_calls >= 1
        assert r.tokens_per_s > 0 and 0 < r.tokens_per_call <= r.new_tokens
    keys = {(r.prompt_set, r.prompt_index) for r in runs}
    assert keys == {("code", 0), ("code", 1), ("chat", 0)}


def test_engine_runs_carry_a_time_split_and_hf_runs_do_not(greedy_result):
    for r in greedy_result.runs:
        if r.method.startswith("hf-"):
            assert r.steps is None and r.draft_s is None and r.outside_steps_s is None
        else:
            assert r.steps >= 1 and r.draft_s >= 0 and r.verify_s > 0 and r.other_s >= 0
            assert r.outside_steps_s >= 0
            # one forward per step, step 0 being the prompt's
            assert r.target_calls == r.steps
    ar = [r for r in greedy_result.runs if r.method == "ar"]
    assert all(r.tree_size == 0 for r in ar)


def test_every_run_times_its_first_output(greedy_result):
    """Step 0 (the prompt's forward) for engine methods, generate's first streamed tokens for HF methods."""
    for r in greedy_result.runs:
        assert 0 < r.first_token_s <= r.seconds
        assert 1 <= r.first_tokens <= r.new_tokens
        if r.method in ("hf-generate", "ar") or not r.method.startswith("hf-"):
            assert r.first_tokens == 1      # a plain forward of the prompt gives one token
        if r.new_tokens > r.first_tokens:
            rate = (r.new_tokens - r.first_tokens) / (r.seconds - r.first_token_s)
            assert r.decode_tokens_per_s == pytest.approx(rate)
    summary = summarize_runs(greedy_result.runs)
    assert all(s.first_token_s > 0 and s.decode_tokens_per_s > 0 for s in summary)
    assert all(s.decode_speedup > 0 for s in summary)


def test_decode_ratios_leave_out_the_first_output():
    """The same 5 s prompt forward for both: end to end 10 / 6 s, after the first token 5 / 1 s."""
    def run(method, secs, first=5.0):
        return RunResult(method, "s", 0, 0.0, 3, (1,) * 11, secs, 11, first_token_s=first, first_tokens=1)

    by = {s.method: s for s in summarize_runs([run("hf-generate", 10.0), run("sequoia-ngram", 6.0)])}
    s = by["sequoia-ngram"]
    assert s.speedup == pytest.approx(10 / 6) and s.decode_speedup == pytest.approx(5.0)
    assert s.first_token_s == 5.0 and s.decode_tokens_per_s == pytest.approx(10.0)
    assert math.isnan(s.decode_vs_best_hf)            # neither HF drafting baseline ran
    head, *_, row = markdown_table(list(by.values())).strip().splitlines()
    assert "| first token (s) | decode tokens/s | decode vs target |" in head and "| 5.00 | 10.00 | 5.00x |" in row
    # runs from a bench file that predates the field: no decode figures, the table says "-"
    old = summarize_runs([run("hf-generate", 10.0, None), run("sequoia-ngram", 6.0, None)])
    assert all(math.isnan(x.first_token_s) and math.isnan(x.decode_speedup) for x in old)
    assert "| - | - | - |" in markdown_table(old)


def test_tree_size_is_what_the_steps_drafted(greedy_result):
    """sequoia-dynamic drafts its own trees (at most its budget of 8), not the static tree of its budget."""
    chain = [r for r in greedy_result.runs if r.method == "chain"]
    assert all(r.tree_size == BenchConfig().chain_budget for r in chain)
    dyn = [r for r in greedy_result.runs if r.method == "sequoia-dynamic"]
    assert dyn and all(0 <= r.tree_size <= 8 for r in dyn)


def test_greedy_outputs_equal_target_only(greedy_result):
    """In fp32 every method reproduces target-only greedy decoding, and the flags say so."""
    for r in greedy_result.runs:
        if r.method == "hf-generate":
            assert r.matches_reference is None
        else:
            assert r.reference == "hf-generate"
            assert r.matches_reference is True and r.agree_prefix == r.new_tokens


def test_equality_flag_catches_a_difference():
    ref = RunResult("hf-generate", "code", 0, 0.0, 4, (1, 2, 3, 4), 1.0, 4)
    other = replace(ref, method="chain", tokens=(1, 2, 9, 4))
    out = {r.method: r for r in _compare_with_reference([other, ref])}
    assert out["chain"].matches_reference is False and out["chain"].agree_prefix == 2
    assert out["hf-generate"].matches_reference is None
    # without a target-only run there is nothing to compare with
    assert _compare_with_reference([other])[0].matches_reference is None


def test_sampled_runs_are_not_compared(tiny_pairs):
    config = BenchConfig(max_new_tokens=6, temperatures=(0.6,), methods=("hf-generate", "sequoia"),
                         warmup_tokens=0)
    res = run_bench(_pair(tiny_pairs["noisy"]), PROMPTS[:1], config, _trees((0.6,)), progress=lambda *a: None)
    assert len(res.runs) == 4
    assert all(r.matches_reference is None for r in res.runs)


def test_summaries_medians_and_ratios(greedy_result):
    sums = summarize_runs(greedy_result.runs)
    assert len(sums) == 2 * len(BenchConfig().methods)
    by = {(s.prompt_set, s.method): s for s in sums}
    hf = by[("code", "hf-generate")]
    assert hf.speedup == pytest.approx(1.0) and hf.runs == 2 and hf.mismatches is None
    seq = by[("code", "sequoia")]
    assert seq.mismatches == 0 and seq.compared == 2
    assert math.isclose(seq.draft_frac + seq.verify_frac + seq.other_frac, 1.0)
    assert by[("code", "hf-assisted")].vs_assisted == pytest.approx(1.0)
    assert by[("code", "hf-assisted")].draft_frac is None


def test_summary_ratio_is_per_prompt():
    def run(method, idx, secs):
        return RunResult(method, "s", idx, 0.0, 3, (1,) * 10, secs, 10)

    runs = [run("hf-generate", 0, 10.0), run("hf-generate", 1, 1.0), run("ar", 0, 5.0), run("ar", 1, 0.5)]
    ar = next(s for s in summarize_runs(runs) if s.method == "ar")
    assert ar.speedup == pytest.approx(2.0)           # both prompts 2x, whatever their speeds
    assert ar.tokens_per_s == pytest.approx((2 + 20) / 2)
    assert math.isnan(ar.vs_assisted)


def test_rounds_pair_each_run_with_the_reference_of_its_own_round():
    def run(method, idx, rnd, secs):
        return RunResult(method, "s", idx, 0.0, 3, (1,) * 10, secs, 10, round=rnd)

    # prompt 0: the reference's speed drifts round to round and the method follows it (1.0x every round,
    # though across rounds its runs range 10-20 tokens/s); prompt 1: the method is 2x, 2x and 2.4x
    runs = [run("hf-generate", 0, 0, 1.0), run("ar", 0, 0, 1.0),
            run("hf-generate", 0, 1, 0.5), run("ar", 0, 1, 0.5),
            run("hf-generate", 0, 2, 1.0), run("ar", 0, 2, 1.0),
            run("hf-generate", 1, 0, 2.0), run("ar", 1, 0, 1.0),
            run("hf-generate", 1, 1, 2.0), run("ar", 1, 1, 1.0),
            run("hf-generate", 1, 2, 2.4), run("ar", 1, 2, 1.0)]
    ar = next(s for s in summarize_runs(runs) if s.method == "ar")
    assert (ar.prompts, ar.rounds, ar.runs) == (2, 3, 6)
    assert (ar.speedup_lo, ar.speedup_hi) == pytest.approx((1.0, 2.0))   # per-prompt medians over the rounds
    assert ar.speedup == pytest.approx(1.5)
    assert ar.round_spread == pytest.approx((0.0 + 0.1) / 2)           # prompt 1: (2.4 - 2.0) / 2 / 2.0
    assert ar.tokens_per_s == pytest.approx(10.0)                      # both prompts' median round: 10 tokens/s
    table = markdown_table([ar])
    assert "round to round" in table.splitlines()[0] and "(2 x 3 rounds)" in table and "±5%" in table
    one = summarize_runs([r for r in runs if r.round == 0])            # one round: no such column
    assert all(s.rounds == 1 and math.isnan(s.round_spread) for s in one)
    assert "round to round" not in markdown_table(one)


def test_a_bench_of_rounds_runs_every_method_once_a_round_in_one_order(tiny_pairs):
    config = BenchConfig(max_new_tokens=4, temperatures=(0.0,), methods=("hf-generate", "ar", "chain"),
                         warmup_tokens=0, rounds=3)
    result = run_bench(_pair(tiny_pairs["noisy"]), PROMPTS[:1], config, progress=lambda *a: None)
    runs = result.runs
    assert len(runs) == 2 * 3 * 3 and [r.round for r in runs[:9]] == [0] * 3 + [1] * 3 + [2] * 3
    for i in (0, 1):   # each prompt: the same order every round (the order rotates from prompt to prompt)
        assert len({tuple(r.method for r in runs if r.prompt_index == i and r.round == k) for k in range(3)}) == 1
    assert all(r.matches_reference for r in runs if r.method != "hf-generate")
    assert "3 interleaved rounds per prompt" in markdown_report(result) and "round to round" in markdown_report(result)
    with pytest.raises(ValueError, match="rounds"):
        BenchConfig(rounds=0)


def test_json_and_markdown(greedy_result, tmp_path):
    path = tmp_path / "bench.json"
    write_json(path, to_dict(greedy_result))
    data = json.loads(path.read_text())
    assert data["format"] == FORMAT
    assert len(data["runs"]) == len(greedy_result.runs) and len(data["summary"]) == 2 * len(BenchConfig().methods)
    assert data["trees"][0]["budget"] == 6 and data["config"]["max_new_tokens"] == 8
    assert all(s["vs_assisted"] is not None for s in data["summary"])
    assert isinstance(data["runs"][0]["tokens"], list)
    table = markdown_table(summarize_runs(greedy_result.runs))
    lines = table.strip().splitlines()
    assert len(lines) == 2 + 2 * len(BenchConfig().methods) and lines[0].startswith("| prompts |")
    assert all(line.count("|") == lines[0].count("|") for line in lines)
    assert "| sequoia |" in table and "2/2" in table
    report = markdown_report(greedy_result)
    assert "Sequoia trees" in report and table in report
    json.dumps(to_dict(greedy_result))  # no NaN sneaks into the JSON
    from sequoia.tools.bench_report import read_runs

    assert read_runs(path) == greedy_result.runs


def test_config_validation():
    with pytest.raises(ValueError, match="unknown bench method"):
        BenchConfig(methods=("ar", "medusa"))
    with pytest.raises(ValueError, match="temperature"):
        BenchConfig(temperatures=(-1.0,))
    with pytest.raises(ValueError, match="max_new_tokens"):
        BenchConfig(max_new_tokens=0)


def test_sequoia_needs_a_tree(tiny_pairs):
    config = BenchConfig(max_new_tokens=4, methods=("sequoia",), warmup_tokens=0)
    with pytest.raises(ValueError, match="no Sequoia tree"):
        run_bench(_pair(tiny_pairs["same"]), PROMPTS, config, [], progress=lambda *a: None)


def test_load_prompt_sets(tmp_path):
    from sequoia.tools.cli import ASSETS

    sets = load_prompt_sets("code,chat", ASSETS / "prompts", limit=2)
    assert [s.name for s in sets] == ["code", "chat"] and all(len(s.prompts) == 2 for s in sets)
    mine = tmp_path / "mine.jsonl"
    mine.write_text('{"prompt": "hello"}\n{"prompt": "world"}\n')
    (own,) = load_prompt_sets(str(mine), ASSETS / "prompts")
    assert own == PromptSet("mine", ("hello", "world"))
    with pytest.raises(ValueError, match="no prompt set"):
        load_prompt_sets("nope", ASSETS / "prompts")


def test_tree_choice_from_files(tmp_path):
    from sequoia.core.profiles.acceptance import AcceptanceVector
    from sequoia.runtime.measuring.finder import list_acceptance
    from sequoia.tools.bench_trees import choose_trees

    AcceptanceVector((0.9, 0.05), temperature=0.0, prompt_set="code").save(tmp_path / "acceptance" / "code-t0.json")
    AcceptanceVector((0.6, 0.2), temperature=0.6, prompt_set="chat").save(tmp_path / "acceptance" / "chat-t06.json")
    (tmp_path / "acceptance" / "junk.json").write_text("{}")
    entries = list_acceptance(tmp_path)
    assert len(entries) == 2  # the finder's rules are tested in test_finder.py
    prof = HardwareProfile.hand_made(lambda n: 100.0 + n, lambda w: 10.0 + w)
    trees = choose_trees([PromptSet("code", ("x",))], (0.0, 0.6), entries, prof, max_budget=32)
    assert [t.temperature for t in trees] == [0.0, 0.6]
    assert all(t.tree.size >= 1 and t.predicted_speedup > 1 for t in trees)
    assert trees[0].acceptance_source == "code, T=0 (code-t0)" and trees[1].acceptance == (0.6, 0.2)


def test_figures_are_built_from_summaries(greedy_result, tmp_path):
    pytest.importorskip("plotly")
    from sequoia.tools.bench_figures import (robustness_figure, scalability_figure, speed_figure, speedup_figure,
                                             time_split_figure, write_figures)

    sums = summarize_runs(greedy_result.runs)
    assert len(speed_figure(sums).data) == len(BenchConfig().methods)
    assert len(speedup_figure(sums).data) == len(BenchConfig().methods)
    assert [t.name for t in time_split_figure(sums).data] == ["draft", "verify", "other"]
    rows = [{"shape": s, "size": n, "tokens_per_call": 1 + n / 10} for s in ("chain", "sequoia") for n in (1, 2, 4)]
    assert len(scalability_figure(rows, {"chain": [1, 2, 3]}, [1, 2, 4]).data) == 3
    rob = [{"temperature": t, "mode": m, "children": k, "rejection": 1 / k}
           for t in (0.2, 1.0) for m in ("topk", "with_replacement") for k in (1, 2)]
    assert len(robustness_figure(rob).data) == 4
    paths, _ = write_figures({"speed": speed_figure(sums)}, tmp_path, png=False)
    assert paths == [tmp_path / "speed.html"] and (tmp_path / "plotly.min.js").exists()


def test_robustness_monte_carlo_matches_the_verification_rule():
    """The vectorised rule behind scripts/page/robustness.py (sequoia.core.verification.sampling.first_accepted, run by
    sequoia.runtime.measuring.acceptance.rejection_curves): rank-1 acceptance is sum(min(p, q)) in expectation."""
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(6, generator=g) * 1.5, -1)
    q = torch.softmax(torch.randn(6, generator=g) * 1.5, -1)
    rows = 20000
    first = {m: first_accepted(p.expand(rows, 6).contiguous(), q.expand(rows, 6).contiguous(), 3, m, g)
             for m in ("without_replacement", "with_replacement", "topk")}
    exact = float(torch.minimum(p, q).sum())
    for m in ("without_replacement", "with_replacement"):
        assert float((first[m] == 0).float().mean()) == pytest.approx(exact, abs=0.02)
    top = int(q.argmax())
    assert float((first["topk"] == 0).float().mean()) == pytest.approx(float(p[top]), abs=0.02)
    # more children never reject more often, and sampling without replacement rejects least here
    rej = {m: float((f < 0).float().mean()) for m, f in first.items()}
    assert rej["without_replacement"] <= rej["with_replacement"] + 0.01
    curves = rejection_curves(p.log()[None], q.log()[None], 1.0, [1, 3], samples=rows, gen=g, tail=0.0)
    assert curves["without_replacement"][0] == pytest.approx(1 - exact, abs=0.02)
    assert curves["without_replacement"][1] == pytest.approx(rej["without_replacement"], abs=0.02)


def test_cli_rejects_bad_settings_before_loading_models(capsys):
    from sequoia.tools.cli import build_parser, main

    args = build_parser().parse_args(["bench", "--quick"])
    assert args.quick and args.prompts == "code,chat"
    assert main(["bench", "--methods", "ar,medusa"]) == 2
    assert "unknown bench method" in capsys.readouterr().err
    assert main(["bench", "--temperatures", "0,hot"]) == 2


def test_the_cli_prices_every_method_that_takes_a_profile(tmp_path):
    """``generate --method sequoia-ngram`` once ran under the stand-in profile (nothing pays): plain target steps."""
    from sequoia.core.profiles.profile import HardwareProfile
    from sequoia.runtime.methods import ENGINE_METHODS, PRICED_METHODS, make_method

    prof = HardwareProfile.hand_made(lambda n: 100.0 + n, lambda w: 5.0)
    tree = tmp_path / "tree.json"
    Tree.chain(2).to_json(tree)

    def uses_profile(name):
        with_it, without = (make_method(name, profile=p, tree_path=str(tree)) for p in (prof, None))
        return getattr(with_it, "profile", None) is prof or with_it.tree != without.tree  # auto: chosen at build

    priced = {name for name in ENGINE_METHODS if uses_profile(name)}
    assert priced == set(PRICED_METHODS)


@pytest.mark.embedded
@pytest.mark.slow
def test_bench_on_the_embedded_pair_matches_target_greedy_in_fp32(embedded_pair_fp32):
    """fp32 target: every method's greedy output equals target-only greedy (HF generate), token for token."""
    config = BenchConfig(max_new_tokens=10, temperatures=(0.0,), warmup_tokens=0,
                         methods=("hf-generate", "hf-assisted", "sequoia"))
    sets = [PromptSet("code", ("Write a Python function that returns the n-th Fibonacci number.",))]
    trees = [TreeChoice("code", 0.0, Tree((-1, 0, 0, 1, 1, 3, 5)), (0.8, 0.1), "test", 1.5, 2.5)]
    res = run_bench(embedded_pair_fp32, sets, config, trees, progress=lambda *a: None)
    assert [r.method for r in res.runs] == list(config.methods)
    for r in res.runs:
        assert r.new_tokens == 10 or r.tokens[-1] in embedded_pair_fp32.eos_token_ids
        if r.method != "hf-generate":
            assert r.matches_reference is True, (r.method, r.agree_prefix)
    seq = next(r for r in res.runs if r.method == "sequoia")
    assert seq.tokens_per_call > 1.0 and seq.steps < seq.new_tokens


def test_process_clock_needs_one_thread_and_times_the_engine_steps(tiny_pairs):
    """The clock is passed in (no global patching): the run and the engine's step split both read it."""
    import time

    from sequoia.core.config import GenerationConfig
    from sequoia.runtime.engine import SpeculativeEngine
    from sequoia.runtime.methods import make_method
    from sequoia.runtime.measuring.timing import run_method

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert process_clock() is time.process_time
        ticks = iter(range(10_000))
        engine = SpeculativeEngine(_pair(tiny_pairs["noisy"]), clock=lambda: float(next(ticks)))
        run = run_method(engine, engine.pair, "chain", [3, 5, 7], GenerationConfig(max_new_tokens=4),
                         make_method("chain", budget=2))
        assert time.perf_counter is not time.process_time
        # every clock read is one tick: the engine reads 4 a step (3 in step 0, which drafts nothing), the runner
        # 2 around each of them (and the end)
        assert run.draft_s + run.verify_s + run.other_s == 3 * run.steps - 1
        assert run.seconds == 5 * run.steps
        torch.set_num_threads(2)
        with pytest.raises(ValueError, match="one torch thread"):
            process_clock()
    finally:
        torch.set_num_threads(before)


def test_fixed_budget_trees_ignore_the_optimizer():
    from sequoia.tools.bench_trees import choose_trees

    slow_verify = HardwareProfile.hand_made(lambda n: 100.0 * n, lambda w: 50.0)  # speculation never pays
    sets = [PromptSet("code", ("x",))]
    (auto,) = choose_trees(sets, (0.0,), [], slow_verify, max_budget=16)
    assert auto.tree.size == 0 and auto.predicted_speedup == 1.0
    (fixed,) = choose_trees(sets, (0.0,), [], slow_verify, fixed_budget=8)
    assert fixed.tree.size == 8 and fixed.predicted_speedup < 1.0


def test_dynamic_method_needs_its_proposers(tiny_pairs):
    config = BenchConfig(max_new_tokens=4, methods=("sequoia-dynamic",), warmup_tokens=0)
    with pytest.raises(ValueError, match="no dynamic proposer"):
        run_bench(_pair(tiny_pairs["noisy"]), PROMPTS[:1], config, progress=lambda *a: None)


def test_dynamic_proposers_pick_the_nearest_calibration(tmp_path):
    from sequoia.core.profiles.calibration import Calibration
    from sequoia.tools.bench_trees import dynamic_proposers

    for t, name in ((0.0, "greedy"), (1.0, "hot")):
        Calibration(knots=(0.0, 1.0), values=((0.0, 1.0),), temperature=t, prompt_set=name).save(
            tmp_path / "acceptance" / f"calibration-x-t{t:g}.json")
    found = dynamic_proposers(PROMPTS[:1], (0.0, 0.8), [], None, tmp_path, budget=8, max_depth=4)
    assert found[("code", 0.0)].calibration.prompt_set == "greedy"
    assert found[("code", 0.8)].calibration.prompt_set == "hot"
    assert found[("code", 0.8)].budget == 8 and found[("code", 0.8)].max_depth == 4


# ---------------------------------------------------------------------------- n-gram methods
REPEATS = (PromptSet("echo", ((3, 5, 7, 9, 3, 5, 7, 9, 3, 5, 7), (11, 2, 4, 11, 2, 4, 11, 2))),)
PAYS = HardwareProfile.hand_made(lambda n: 100.0 + n, lambda w: 10.0 + w)  # wide verification is nearly free


@pytest.fixture(scope="module")
def ngram_result(tiny_pairs, tmp_path_factory):
    from sequoia.tools.bench_trees import dynamic_proposers

    config = BenchConfig(max_new_tokens=10, temperatures=(0.0,), warmup_tokens=2,
                         methods=("hf-generate", "hf-assisted", "hf-prompt-lookup", "ngram", "sequoia-ngram"))
    dynamic = dynamic_proposers(REPEATS, (0.0,), [], PAYS, tmp_path_factory.mktemp("no-assets"), budget=8,
                                max_depth=4)
    return run_bench(_pair(tiny_pairs["noisy"]), REPEATS, config, progress=lambda *a: None, dynamic=dynamic)


def test_ngram_methods_equal_target_greedy_in_fp32(ngram_result):
    """Copies only, copies + draft and HF prompt lookup all reproduce target-only greedy decoding token for token."""
    assert len(ngram_result.runs) == 2 * 5
    for r in ngram_result.runs:
        assert r.new_tokens == 10
        if r.method != "hf-generate":
            assert r.matches_reference is True and r.agree_prefix == r.new_tokens, r.method
    lookup = [r for r in ngram_result.runs if r.method == "hf-prompt-lookup"]
    assert lookup and all(r.steps is None for r in lookup)  # a Hugging Face baseline: no step records
    ngram = [r for r in ngram_result.runs if r.method == "ngram"]
    assert any(r.tree_size > 0 for r in ngram)  # repeating prompts: copies were proposed and verified
    assert all(r.draft_s == 0 or r.draft_s < r.verify_s for r in ngram)


def test_ngram_methods_share_the_dynamic_trees_settings():
    from sequoia.core.profiles.calibration import Calibration
    from sequoia.runtime.methods import make_method
    from sequoia.tools.bench import make_proposers

    cal = Calibration(knots=(0.0, 1.0), values=((0.0, 1.0),), temperature=0.0, prompt_set="x")
    dyn = make_method("sequoia-dynamic", acceptance=(0.7, 0.1), profile=PAYS, budget=12, depth=5, calibration=cal)
    config = BenchConfig(temperatures=(0.0,), methods=("sequoia-dynamic", "ngram", "sequoia-ngram"))
    out = make_proposers(config, REPEATS, [], {("echo", 0.0): dyn})
    assert out[("sequoia-dynamic", "echo", 0.0)] is dyn
    combined, copies = out[("sequoia-ngram", "echo", 0.0)], out[("ngram", "echo", 0.0)]
    assert combined.name == "sequoia-ngram" and copies.name == "ngram"
    assert (combined.profile, combined.calibration, combined.acceptance, combined.budget, combined.max_depth) == (
        PAYS, cal, (0.7, 0.1), 12, 5)
    assert copies.profile is PAYS and copies.max_depth == 5
    with pytest.raises(ValueError, match="needed by ngram"):
        make_proposers(replace(config, methods=("ngram",)), REPEATS, [], {})
    # Sequoia (auto) as the page runs it: the optimizer's tree for that vector and profile, under the price gate.
    auto = make_proposers(replace(config, methods=("sequoia-auto",)), REPEATS, [], {("echo", 0.0): dyn})
    auto = auto[("sequoia-auto", "echo", 0.0)]
    assert auto.name == "sequoia-auto" and auto.tree.size > 0 and auto.gate.profile is PAYS


def test_vs_best_hf_is_per_prompt_against_the_faster_baseline():
    def run(method, idx, secs):
        return RunResult(method, "s", idx, 0.0, 3, (1,) * 10, secs, 10)

    runs = [run("hf-generate", 0, 2.0), run("hf-generate", 1, 2.0),
            run("hf-assisted", 0, 1.0), run("hf-assisted", 1, 2.0),          # 10 and 5 tokens/s
            run("hf-prompt-lookup", 0, 0.5), run("hf-prompt-lookup", 1, 5.0),  # 20 and 2 tokens/s
            run("sequoia-ngram", 0, 1 / 3), run("sequoia-ngram", 1, 1.0)]      # 30 and 10 tokens/s
    by = {s.method: s for s in summarize_runs(runs)}
    assert by["sequoia-ngram"].vs_best_hf == pytest.approx((30 / 20 + 10 / 5) / 2)
    assert by["sequoia-ngram"].speedup == pytest.approx((6 + 2) / 2)
    table = markdown_table(list(by.values()))
    head = table.splitlines()[0]
    assert "vs best HF" in head and "vs target alone" in head and "| tokens/s |" in head
    assert "1.75x" in table
    # without prompt lookup there is no "best of" to compare with: no column
    rest = summarize_runs([r for r in runs if r.method != "hf-prompt-lookup"])
    assert all(math.isnan(s.vs_best_hf) for s in rest) and "vs best HF" not in markdown_table(rest)


def test_report_names_the_combined_method_against_the_best_baseline(ngram_result):
    report = markdown_report(ngram_result)
    assert "vs best HF" in report and "Combined method" in report
    assert "- echo, T=0: " in report and "the better of HF prompt lookup and HF assisted" in report
    assert "`hf-prompt-lookup` HF prompt lookup" in report and "`sequoia-ngram` Sequoia + n-gram" in report
    json.dumps(to_dict(ngram_result))


def test_every_bench_method_has_a_label_and_a_colour():
    import components
    from sequoia.tools.bench import BENCH_METHODS
    from sequoia.tools.bench_figures import _COLORS
    from sequoia.tools.bench_report import LABEL_OF

    for m in BENCH_METHODS:
        assert LABEL_OF[m] == components.LABEL_OF[m], m  # the bench and the app say the same
        assert m in _COLORS and components.method_color(m) != components.method_color("?"), m  # not the fallback
    new = ("hf-prompt-lookup", "ngram", "sequoia-ngram")
    assert len({_COLORS[m] for m in new} | {_COLORS[m] for m in ("hf-assisted", "sequoia", "sequoia-dynamic")}) == 6
    assert len({components.method_color(m) for m in (*new, "hf assisted", "sequoia")}) == 5
    assert {"hf-prompt-lookup", "sequoia-ngram"} <= set(BenchConfig().methods)  # in the default run


def test_the_load_note_counts_the_benchs_own_threads():
    """Load 2.0 on 2 cores is the bench itself, not a competitor (the note once said so at any load)."""
    from sequoia.tools.bench_report import load_line

    assert "no sign of competing" in load_line([1.2, 2.0, 1.9], cores=2)
    assert "other processes were competing" in load_line([1.2, 3.4], cores=2)


def test_rows_of_another_runtime_compare_with_their_own_target_alone():
    """One table for two runtimes: llamacpp:* rows carry the ratio to llamacpp:ar beside the one to hf-generate."""
    from sequoia.tools.bench_report import markdown_table, summarize_runs

    def run(method, secs):
        return RunResult(method, "s", 0, 0.0, 3, (1,) * 10, secs, 10)

    rows = summarize_runs([run("hf-generate", 4.0), run("ar", 4.0), run("llamacpp:ar", 1.0),
                           run("llamacpp:sequoia-dynamic", 1.25)])
    assert [s.method for s in rows] == ["hf-generate", "ar", "llamacpp:ar", "llamacpp:sequoia-dynamic"]
    by = {s.method: s for s in rows}
    assert by["llamacpp:ar"].speedup == pytest.approx(4.0) and by["llamacpp:ar"].vs_runtime_alone == 1.0
    assert by["llamacpp:sequoia-dynamic"].vs_runtime_alone == pytest.approx(0.8)
    assert by["ar"].vs_runtime_alone == pytest.approx(1.0)
    table = markdown_table(rows)
    assert "vs its runtime alone" in table and "| 8.00 |" in table   # absolute tokens/s beside the ratios


def test_bench_refuses_unknown_backends():
    from types import SimpleNamespace

    from sequoia.tools.bench_cli import _backends

    assert _backends(SimpleNamespace(backends="hf,llamacpp", backend=None)) == ["hf", "llamacpp"]
    with pytest.raises(ValueError, match="distinct runtimes"):
        _backends(SimpleNamespace(backends="hf,vllm", backend=None))
