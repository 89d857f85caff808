"""The Gradio layer on a tiny random-weight pair: handlers, errors, API endpoints, loading, queueing."""

import asyncio
import statistics
import threading
import time
from dataclasses import replace
from types import SimpleNamespace

import gradio as gr
import pytest

from sequoia.core.requests.request import BY_NAME as METHOD_INFO

import app
from components.app_state import validation
from components.app_state.acceptance_choice import (DEFAULT_ACCEPTANCE_LABEL, acceptance_catalogue,
                                                    default_acceptance_label, parse_acceptance)
from components.app_state.context import AppContext, LoadStatus
from components.app_state.decode_inputs import DecodeInputs
from components.compare import compare_run, compare_tab
from components.dp_explorer import dp_tab
from components.hardware import hardware_tab
from components.live import live_tab, no_tree_view
from components.loopback import serve_here
from sequoia.runtime.methods import DEFAULT_ACCEPTANCE
from sequoia.runtime.proposers.dynamic import MAX_DEPTH

CODE = DEFAULT_ACCEPTANCE_LABEL


@pytest.fixture(scope="module")
def pair(tiny_app_pair):
    return tiny_app_pair


@pytest.fixture(scope="module")
def demo(pair, tmp_path_factory, lanes):
    # a cache of its own: the profiles this machine's cache holds (the CLI's, the app's) must not decide the tests
    return app.build_demo(pair, assets_dir=tmp_path_factory.mktemp("assets"), max_budget=24, lanes=lanes,
                          cache_dir=tmp_path_factory.mktemp("cache"))


@pytest.fixture()
def ctx(demo) -> AppContext:
    return demo.sequoia_context


def _stream(ctx, prompt="def f(x):", method="Sequoia (budget & depth)", budget=8, depth=3, temperature=0.0,
            top_p=1.0, max_new=12, seed=0):
    """The stream's view frames (the frames after the run only update the summary: the ratio's measurement)."""
    inputs = DecodeInputs.from_page(prompt, method, budget, depth, temperature, top_p, max_new, seed, CODE, True)
    return [out for out in live_tab.decode_stream(ctx, inputs) if out[0] != gr.skip()]


def _proposer(ctx, method, budget, depth):
    """(proposer, note) of a page request, as the Live tab builds and words them."""
    req = validation.decode_request(ctx, "x", method, budget, depth, 0.0, 1.0, 4, 0, True, DEFAULT_ACCEPTANCE)
    job = validation.engine_inputs(ctx, req)
    return job.proposer, no_tree_view.fallback_note(ctx.profile, req.method.name, job.proposer, ctx.profile_note)


def test_build_demo_names_api_endpoints(demo):
    names = {fn.api_name for fn in demo.fns.values()}
    assert {"decode", "decode_stream", "dp", "compare"} <= names


def test_loader_is_lazy(tmp_path, lanes):
    calls = []
    demo = app.build_demo(lambda: calls.append(1), assets_dir=tmp_path, lanes=lanes)
    assert isinstance(demo, gr.Blocks) and calls == []


def test_queue_serialises_model_work_and_leaves_the_dp_explorer_free(demo):
    by_name = {fn.api_name: fn for fn in demo.fns.values() if fn.api_name}
    for name in ("decode", "decode_stream", "compare"):
        assert by_name[name].concurrency_id == "model" and by_name[name].concurrency_limit == 1
    # The DP explorer has its own group (bounded on a small CPU so it cannot starve the model).
    assert by_name["dp"].concurrency_id == "light" and by_name["dp"].concurrency_limit >= 1
    assert demo._queue.max_size == app.QUEUE_MAX_SIZE
    model_fns = [fn for fn in demo.fns.values() if fn.concurrency_id == "model"]
    assert len(model_fns) >= 5  # + the Compare button, Profile now, Measure


def test_background_loading_shows_progress_and_refuses_politely(tmp_path, pair, lanes):
    gate, status = threading.Event(), LoadStatus()

    def loader():
        status(0.5, "converting the target")
        assert gate.wait(30)
        return pair

    demo = app.build_demo(loader, assets_dir=tmp_path, status=status, lanes=lanes)
    ctx = demo.sequoia_context
    assert "Loading the model pair: 0%" in app._banner(ctx) and not ctx.loaded
    thread = ctx.models.start_loading()
    try:
        for _ in range(200):
            if status.fraction == 0.5:
                break
            time.sleep(0.01)
        assert "Loading the model pair: 50%" in app._banner(ctx)
        with pytest.raises(gr.Error, match=r"still loading \(50%, converting the target"):
            _stream(ctx)
        assert hardware_tab.views(ctx, CODE, 16, 4, None)[1].startswith("*The models are still loading")
    finally:
        gate.set()
        thread.join(30)
    assert status.ready and "tiny-target" in app._banner(ctx)
    assert sum(r.n_new for r in _stream(ctx, max_new=4)[-1][-1].records) == 4


def test_failed_load_is_shown_and_the_dp_explorer_still_works(tmp_path, lanes):
    def loader():
        raise RuntimeError("no such model: nobody/nothing")

    demo = app.build_demo(loader, assets_dir=tmp_path, lanes=lanes)
    ctx = demo.sequoia_context
    ctx.models.start_loading().join(30)
    assert "could not be loaded" in app._banner(ctx) and "nobody/nothing" in app._banner(ctx)
    with pytest.raises(gr.Error, match="could not be loaded: RuntimeError: no such model"):
        _stream(ctx)
    assert dp_tab.dp_api_fn(ctx.lanes)("0.8, 0.1", 8, 3)["budget"] == 8


def test_stopping_a_decode_closes_the_engine_generator(ctx, monkeypatch):
    closed, real = [], live_tab.run_decode

    def spy(ctx, req, should_stop=None):
        gen = real(ctx, req, should_stop)
        try:
            yield from gen
        finally:
            closed.append(gen.gi_frame is None)  # a closed generator has no frame (its KV caches are gone)

    monkeypatch.setattr(live_tab, "run_decode", spy)
    inputs = DecodeInputs.from_page("def f(x):", "Chain", 4, 4, 0.0, 1.0, 200, 0, CODE, True)
    stream = live_tab.decode_stream(ctx, inputs)
    next(stream)   # the session, into the state before anything runs
    next(stream)   # the first step
    assert closed == []
    stream.close()  # what Gradio does on Stop
    assert closed == [True]


def test_stop_ends_the_run_within_a_step_and_its_views_say_so(ctx, monkeypatch):
    """Issue 37: Stop's own handler settles every output from the steps done so far (also before the first),
    and the engine, reading the flag between steps, ends after the step in flight."""
    inputs = DecodeInputs.from_page("def f(x):", "Chain", 4, 4, 0.0, 1.0, 200, 0, CODE, True)
    stream = live_tab.decode_stream(ctx, inputs)
    session = next(stream)[-1]
    assert session.running and not session.records
    text, tree, stats, summary, slider, node, fig, words = live_tab.stop_views(session)   # in the first step
    assert summary.startswith("**Stopped** before the first step") and "def f(x):" in text and tree is None
    assert "reading the prompt" not in text and node.choices == []
    rest = list(stream)   # the engine's generator ends after the step in flight: no run to 200 tokens
    # Issue 42: that step is dropped, never drawn: Stop's message is the last the page gets (the run draws Stop's
    # very views once more, last, so that no frame it sent before it saw the flag lands after them).
    assert [frame[3] for frame in rest] == [summary] and session.records == [] and not session.running
    assert rest[0][0] == text and rest[0][-1] is session and live_tab.summary(session) == summary

    monkeypatch.setattr(live_tab, "FRAME_S", 0.0)   # one frame a step: Stop comes after the third
    stream = live_tab.decode_stream(ctx, inputs)
    session = next(stream)[-1]
    for _ in range(3):
        next(stream)
    text, tree, stats, summary, slider, node, fig, words = live_tab.stop_views(session)   # a later Stop
    n = sum(len(r.new_tokens) for r in session.records)
    assert f"**Stopped** after {n} tokens" in summary and tree is not None and node.value is not None
    rest = list(stream)   # the engine runs ahead in a worker thread (frames.paced); what it did after Stop is dropped
    assert [frame[3] for frame in rest] == [summary] and rest[0][0] == text
    assert sum(len(r.new_tokens) for r in session.records) == n and not session.running
    assert live_tab.summary(session) == summary
    # Pressed with no run on, Stop changes nothing.
    assert live_tab.stop_views(session) == (gr.skip(),) * 8
    assert live_tab.stop_views(live_tab.LiveSession()) == (gr.skip(),) * 8


def test_the_first_frame_says_what_the_first_step_does(ctx):
    inputs = DecodeInputs.from_page("def f(x):", "Target alone", 4, 4, 0.0, 1.0, 8, 0, CODE, True)
    text, summary, session, refusal = live_tab.checked_first_frame(ctx, inputs, None)
    assert "draft" not in summary.lower() and "target alone" in summary and session.waiting
    assert not refusal.visible   # a taken request hides the refusal line
    text, summary, _, _ = live_tab.checked_first_frame(ctx, replace(inputs, method="Chain"), None)
    assert "drafting and verifying the first step" in summary
    # a refused request leaves the page as it is and says why under Decode; a click while this page's run is on
    # changes nothing
    *kept, refusal = live_tab.checked_first_frame(ctx, replace(inputs, temperature=5), None)
    assert kept == [gr.skip()] * 3 and refusal.visible
    assert refusal.value.startswith("**Not decoded:**") and "temperature" in refusal.value
    assert live_tab.checked_first_frame(ctx, inputs, live_tab.LiveSession(running=True)) == (gr.skip(),) * 4
    # Stop while the run waits in the queue: Stop's handler settles the page and the run never starts
    _, _, waiting, _ = live_tab.checked_first_frame(ctx, inputs, None)
    assert live_tab.stop_views(waiting)[3].startswith("**Stopped** before the first step")
    assert list(live_tab.decode_stream(ctx, inputs, waiting)) == [(gr.skip(),) * 6] and not waiting.records
    # not stopped: the run takes the first frame's session (the one Stop would find)
    _, _, waiting, _ = live_tab.checked_first_frame(ctx, inputs, None)
    assert list(live_tab.decode_stream(ctx, inputs, waiting))[0][-1] is waiting and len(waiting.records) == 8


def test_decode_stream_yields_as_steps_arrive(ctx, monkeypatch):
    outs = _stream(ctx)
    session = outs[-1][-1]
    assert 1 <= len(outs) <= len(session.records)  # page updates are throttled, the last step always shown
    assert sum(r.n_new for r in session.records) == 12
    html, tree, stats, summary, slider, _ = outs[-1]
    assert "draft token accepted by the target" in html and "**12 tokens**" in summary
    assert tree is not None and stats is not None
    assert slider.maximum == max(len(session.records) - 1, 1)
    monkeypatch.setattr(live_tab, "FRAME_S", 0.0)
    unthrottled = _stream(ctx)   # a frame whenever the page is ready, with every step since the last one
    assert 1 <= len(unthrottled) <= len(session.records) and \
        [r.new_tokens for r in unthrottled[-1][-1].records] == [r.new_tokens for r in session.records]
    monkeypatch.setattr(live_tab, "FRAME_S", 1e9)
    assert len(_stream(ctx)) == min(2, len(session.records))  # the first step and the last


@pytest.mark.parametrize("kwargs, message", [
    (dict(prompt="   "), "prompt is empty"),
    (dict(budget=500), "above this server's cap of 24"),
    (dict(temperature=-1), "temperature"),
    (dict(temperature=5), "temperature must be in 0..2"),
    (dict(depth=0), "depth must be a whole number in 1..64"),
    (dict(budget=100000), "budget 100000 is above this server's cap of 24"),
    (dict(top_p=0), "top-p"),
    (dict(max_new=0), "max new tokens"),
    (dict(seed=1.5), "seed"),
    (dict(method="beam search"), "unknown method"),
])
def test_decode_errors_are_readable(ctx, kwargs, message):
    with pytest.raises(gr.Error, match=message):
        _stream(ctx, **kwargs)


def test_every_method_streams(ctx):
    for method in live_tab.METHOD_OF_LABEL:
        final = _stream(ctx, method=method, max_new=6)[-1]
        assert sum(r.n_new for r in final[-1].records) == 6


def test_show_step_revisits_a_step(ctx):
    session = _stream(ctx)[-1][-1]
    tree, html = live_tab.show_step(0, session)
    assert "step 0" in tree.layout.title.text and "outline:2px" in html
    assert live_tab.show_step(0, live_tab.LiveSession())[0] is None


def test_decode_api_returns_text_and_steps(ctx, pair):
    text, steps = asyncio.run(live_tab.decode_api_fn(ctx)("abc", "chain", 4, 4, 0.0, 1.0, 8, 0))  # async: cancellable
    ids = [t for s in steps for t in s["new_tokens"]]
    assert len(ids) == 8 and text == pair.tokenizer.decode(ids)
    assert {"parents", "accepted", "status", "q", "p", "bonus"} <= set(steps[0])
    _, steps = asyncio.run(live_tab.decode_api_fn(ctx)("abc", "sequoia", 6, 6, 0.0, 1.0, 4, 0, True, "1.0"))
    assert steps[0]["parents"] == [-1]                     # step 0: the prompt's forward, no tree
    assert steps[1]["parents"] == [-1, 0, 1, 2, 3, 4, 5]  # p = (1.0,): the optimal tree is a chain
    with pytest.raises(gr.Error, match="sum to at most 1"):
        asyncio.run(live_tab.decode_api_fn(ctx)("abc", "sequoia", 6, 6, 0.0, 1.0, 4, 0, True, "0.9, 0.9"))


def test_compare_identical_at_greedy(ctx):
    seen = []
    rows, notes = compare_tab.run_comparison(ctx, "x = 1", 8, 3, 0.0, 1.0, 10, 0,
                                             progress=lambda f, desc: seen.append(f))
    assert [r.method for r in rows][:4] == ["Target alone", "Chain", "SpecInfer", "Sequoia (budget & depth)"]
    assert all(r.identical for r in rows)
    assert all(0 < r.first_token_s <= r.seconds for r in rows)   # every row, HF ones included, times it
    assert seen[0] == 0 and seen[-1] == 1.0
    md = compare_tab._notes_markdown(rows, notes, 0.0)
    assert "reproduce the target-only output" in md


def test_compare_streams_rows_and_stops(ctx, monkeypatch):
    picked = ["Chain", "SpecInfer", "Sequoia (budget & depth)"]  # Target only runs anyway
    ctx.warmed.clear()   # a first comparison on this pair: every row warms up (later ones skip what is warm)
    outs = list(compare_tab.on_compare(ctx, DecodeInputs("x = 1", "", 8, 3, max_new_tokens=6, acceptance=CODE),
                                      picked))
    tables = [o[1] for o in outs if not isinstance(o[1], type(gr.skip()))]
    # cleared, then one method at a time in round 1, as each finishes; rounds 2 and 3 update the four rows
    assert [len(t) for t in tables] == [0, 1, 2, 3, 4] + [4] * 4 * (compare_run.DEFAULT_ROUNDS - 1)
    lines = [o[2] for o in outs]
    assert lines[0].startswith("*Warm-up round (untimed, a few tokens each): **Target alone**, 1 of 4")
    assert any(line.startswith("*Round 1 of 3: running **Chain**, 2 of 4: ") for line in lines)
    assert "Identical at T=0" in lines[-1]
    # the table shows Target alone's row while Chain runs: each row appears as its first round finishes
    first = next(i for i, o in enumerate(outs) if isinstance(o[1], list) and o[1])
    assert "Target alone" == outs[first][1][0][0] and "running **Chain**, 2 of 4" in outs[first][2]
    closed, real = [], compare_run.iter_run

    def spy(*args):
        gen = real(*args)
        try:
            return (yield from gen)
        finally:
            closed.append(gen.gi_frame is None)

    monkeypatch.setattr(compare_run, "iter_run", spy)
    it = compare_tab.iter_comparison(ctx, DecodeInputs("x = 1", "", 8, 3, max_new_tokens=50), include_hf=False)
    while next(it).tokens == 0:
        pass
    it.close()
    assert closed == [True]  # the interrupted run is closed (its caches freed) at once


def test_compares_stop_ends_the_run_at_a_step_and_keeps_its_rows(ctx):
    """Stop (issue 42) flags the session instead of cancelling the event: its handler draws the rows so far at
    once, the run ends at its next step and draws the same again, last; no near-tie check runs after it."""
    inputs = DecodeInputs("x = 1", validation.COMPARE_METHOD, 8, 3, max_new_tokens=6, acceptance=CODE)
    picked = ["Chain", "Sequoia (budget & depth)"]
    session, _ = compare_tab.begin_comparison(ctx, inputs, picked, compare_tab.CompareSession())
    assert session.waiting and not session.running
    outs, said = [], None
    run = compare_tab.on_compare(ctx, inputs, picked, session)
    for out in run:
        outs.append(out)
        assert session.running
        if said is None and isinstance(out[1], list) and len(out[1]) == 2:   # two rows of round 1 are in
            said = compare_tab.stop_comparison(session)
    assert said is not None and not session.running and session.stopped
    bars, table, notes = outs[-1]
    assert notes == said[2] and notes.startswith("**Stopped** in round 1 of 3: the rows show the 2 timed runs")
    assert [row[0] for row in table] == ["Target alone", "Chain"] == [row[0] for row in said[1]]
    assert "checking" not in notes and "Identical at T=0" in notes
    # Stop again, with no run on: nothing changes
    assert all(isinstance(v, type(gr.skip())) for v in compare_tab.stop_comparison(session))


def test_compares_stop_during_the_near_tie_check_ends_it(ctx, monkeypatch):
    """At T=0 a differing row's check replays the prefix after the rounds: Stop ends that too, its words last."""
    session = compare_tab.CompareSession(waiting=True)

    def check(*args):
        yield gr.skip(), gr.skip(), "*Finding where the outputs part (replaying the prefix)…*"
        compare_tab.stop_comparison(session)   # pressed while the replay runs
        yield gr.skip(), gr.skip(), "the replay's answer"

    monkeypatch.setattr(compare_tab, "after_comparison", check)
    inputs = DecodeInputs("x = 1", validation.COMPARE_METHOD, 8, 3, max_new_tokens=3, acceptance=CODE)
    notes = [out[2] for out in compare_tab.on_compare(ctx, inputs, [], session, rounds=1)]
    assert "the replay's answer" not in notes and notes[-1].startswith("**Stopped** in round 1 of 1")


@pytest.mark.parametrize("exact", [False, True])
def test_compares_replays_at_t0_hold_the_pairs_model_lock(monkeypatch, exact):
    """Where the outputs part (and exact mode's certificate) replays the target outside the engine: under the
    pair's one model lock, as every step is, so the background profiler never runs on the same runners at once."""
    from components.compare import exact_compare, compare_view

    class Lock:
        held = 0

        def __enter__(self):
            self.held += 1

        def __exit__(self, *exc):
            self.held -= 1

    lock, seen = Lock(), []
    pair = SimpleNamespace(lock=lock, tokenizer=None, target="target", encode_prompt=lambda prompt, chat: [1, 2])
    monkeypatch.setattr(exact_compare, "shared_vocab", lambda p: 8)
    monkeypatch.setattr(exact_compare, "certify", lambda *a: seen.append(("certify", lock.held)) or None)
    monkeypatch.setattr(exact_compare, "explain_all", lambda *a: seen.append(("explain", lock.held)) or [])
    rows = [compare_view.CompareRow(compare_view.REFERENCE, 2, 1.0, token_ids=(3, 4)),
            compare_view.CompareRow("Chain", 2, 1.0, token_ids=(3, 5), identical=exact)]
    list(exact_compare.after_comparison(SimpleNamespace(pair=lambda: pair), "x", True, rows, 0.0, exact,
                                        lambda rows: ""))
    assert seen == ([("certify", 1)] if exact else []) + ([] if exact else [("explain", 1)]) and lock.held == 0


def test_compares_stop_in_the_queue_runs_nothing_and_a_second_click_is_ignored(ctx, monkeypatch):
    inputs = DecodeInputs("x = 1", validation.COMPARE_METHOD, 8, 3, max_new_tokens=4, acceptance=CODE)
    monkeypatch.setattr(compare_tab, "iter_comparison", lambda *a, **k: pytest.fail("nothing may run"))
    waiting, line = compare_tab.begin_comparison(ctx, inputs, [], None)
    assert not line.visible   # a taken request hides the refusal line
    notes = compare_tab.stop_comparison(waiting)[2]
    assert notes == "**Stopped** before a timed run finished: nothing was timed."
    assert [all(isinstance(v, type(gr.skip())) for v in out) for out in compare_tab.on_compare(ctx, inputs, [],
                                                                                              waiting)] == [True]
    on = compare_tab.CompareSession(running=True)   # this page's run is on: a click leaves it alone
    assert compare_tab.begin_comparison(ctx, inputs, [], on) == (gr.skip(),) * 2
    assert len(list(compare_tab.on_compare(ctx, inputs, [], on))) == 1 and on.running and not on.stopped
    on.stopped = True   # ... but after Stop a click starts a new run (it waits for the stopped one's last step)
    assert compare_tab.begin_comparison(ctx, inputs, [], on)[0].waiting
    kept, line = compare_tab.begin_comparison(ctx, replace(inputs, max_new_tokens=0), [], None)   # refused: says why
    assert kept == gr.skip() and line.visible and line.value.startswith("**Not run:** max new tokens")


def test_compare_api_rows(ctx):
    rows = asyncio.run(compare_tab.compare_api_fn(ctx)("x", 4, 2, 0.0, 1.0, 4, 0, False))
    assert [r["method"] for r in rows] == ["target only", "chain", "specinfer", "sequoia", "sequoia-auto",
                                            "sequoia-dynamic", "sequoia-ngram", "ngram"]   # the API's names, every method
    assert rows[5]["label"] == "Sequoia (dynamic)" and isinstance(rows[0]["latency (s)"], float)
    assert all(r["identical"] == "✓ identical" for r in rows)


def test_compare_runs_all_three_kinds_of_drafting(ctx):
    """Copies only, copies + draft model, and Hugging Face prompt lookup beside the target; identical at T=0."""
    picked = ["HF prompt lookup", "n-gram copies only", "Sequoia + n-gram copies"]
    prompt = "a b c a b c a b c a b"  # repeats: the context holds n-gram matches to copy
    rows, notes = compare_tab.run_comparison(ctx, prompt, 8, 3, 0.0, 1.0, 10, 0, methods=picked)
    assert [r.method for r in rows] == ["Target alone", "Sequoia + n-gram copies", "n-gram copies only",
                                        "HF prompt lookup"] and not notes
    assert all(r.identical for r in rows) and all(r.tokens == 10 for r in rows)
    assert set(compare_tab.offered(ctx)) >= set(picked) and set(compare_tab.FULL_METHODS) <= {
        m.label for m in compare_tab.METHODS} and set(compare_tab.DEFAULT_METHODS) <= set(compare_tab.FULL_METHODS)
    with pytest.raises(ValueError, match="unknown method"):
        compare_tab.choose_methods(ctx, ["Medusa"])
    assert [m.key for m in compare_tab.choose_methods(ctx, picked, include_hf=False)] == [
        "target only", "sequoia-ngram", "ngram"]


def test_dp_tab_solve_and_cell(lanes):
    heat, tree, md, curves, n, d, session = dp_tab.on_solve(lanes, "0.8, 0.1", 16, 4, 40, 2, dp_tab.DPSession())
    assert n.value == 16 and d.value == 2 and "n = 16, d = 2" in md
    assert len(curves.data) == 4
    heat, tree, md = dp_tab.on_cell(lanes, 5, 1, session)
    assert "n = 5, d = 1" in md
    # A refused vector or budget keeps the last good figures and sliders, with the message beside them.
    bad = dp_tab.on_solve(lanes, "0.9, 0.5", 16, 4, 4, 2, session)
    assert "sum to at most 1" in bad[2] and "last good vector" in bad[2]
    assert all(x == gr.skip() for i, x in enumerate(bad) if i != 2)
    assert "budget" in dp_tab.on_solve(lanes, "0.5", 5000, 4, 4, 2, dp_tab.DPSession())[2]
    out = dp_tab.dp_api_fn(lanes)("[0.8, 0.1]", 8, 3)
    assert out["budget"] == 8 and set(out["curves"]) >= {"sequoia", "chain"}
    assert out["sglang"]["command"].startswith("python -m sglang.launch_server --model-path")


def test_dp_tab_sglang_launch(lanes):
    from sequoia.core.trees.sglang_family import best_launch

    fig, md, command = dp_tab.sglang_views(lanes, "0.8, 0.1", 16, 4, "my/target", "my/draft", "EAGLE3")
    args = best_launch((0.8, 0.1), 16, 4, algorithm="EAGLE3").args
    assert command == args.command_line("my/target", "my/draft") and "--speculative-algorithm EAGLE3" in command
    assert "Sequoia DP" in md and fig.layout.title.text.startswith("SGLang")
    # Nothing to draft, a refused vector, a missing path: a message, never an error badge
    assert dp_tab.sglang_views(lanes, "0.8, 0.1", 0, 4, "t", "d", "STANDALONE")[2] == ""
    bad = dp_tab.sglang_views(lanes, "0.9, 0.5", 16, 4, "t", "d", "STANDALONE")
    assert "sum to at most 1" in bad[1] and bad[0] == gr.skip() and bad[2] == ""   # no command it did not choose
    no_path = dp_tab.sglang_views(lanes, "0.8, 0.1", 16, 4, " ", "d", "STANDALONE")
    assert "model paths" in no_path[1] and no_path[2] == ""


def test_acceptance_catalogue_reads_assets(tmp_path):
    from sequoia.core.profiles.acceptance import AcceptanceVector
    from sequoia.core.profiles.calibration import Calibration

    AcceptanceVector((0.6, 0.2), temperature=0.6, prompt_set="chat").save(tmp_path / "acceptance" / "mine.json")
    Calibration(knots=(0.0, 1.0), values=((0.0, 1.0),), temperature=0.0).save(
        tmp_path / "acceptance" / "calibration-x-t0.json")
    (tmp_path / "acceptance" / "broken.json").write_text("{")
    cat = acceptance_catalogue(tmp_path)
    assert list(cat) == ["chat, T=0.6 (mine)", CODE] and cat["chat, T=0.6 (mine)"] == (0.6, 0.2)
    assert default_acceptance_label("chat", 0.6, tmp_path) == "chat, T=0.6 (mine)"
    assert default_acceptance_label("code", 0.0, tmp_path) == CODE  # no greedy vector: the built-in one
    assert parse_acceptance("0.5, 0.25") == (0.5, 0.25)
    with pytest.raises(ValueError):
        parse_acceptance("a, b")


def _machine_with(features: tuple[str, ...], monkeypatch) -> None:
    """The Hardware tab decides for a CPU of this kind, whatever this machine is (CI's kind varies)."""
    from components.app_state import runtimes_here
    from sequoia.core.profiles.runtimes import Machine

    machine = Machine(device_kind="cpu", cpu_features=features, llamacpp_installed=True)
    monkeypatch.setattr(runtimes_here, "machine_here", lambda *a, **k: machine)


def test_hardware_tab_stars_llamacpp_by_rule_on_a_cpu_without_bf16_kernels(ctx, monkeypatch):
    from sequoia.core.profiles.profile import HardwareProfile

    _machine_with(("avx2",), monkeypatch)
    ctx.profile = HardwareProfile.hand_made(lambda n: 30 + 0.5 * n, lambda w: 3 + 0.1 * w)
    try:
        runtimes_md = hardware_tab.views(ctx, CODE, 16, 4, hardware_tab.HardwareSession())[5]
        assert "| ★ llama.cpp |" in runtimes_md and "by rule: this CPU has no bf16 matrix kernels" in runtimes_md
        assert "| Hugging Face (torch)<br><small>costs: in use" in runtimes_md
    finally:
        ctx.profile = None


def test_hardware_tab_with_hand_made_profile(ctx, monkeypatch):
    from sequoia.core.profiles.profile import HardwareProfile

    _machine_with(("avx2", "avx512_bf16"), monkeypatch)

    assert hardware_tab.views(ctx, CODE, 16, 4, None)[0] is None  # no profile yet
    ctx.profile = HardwareProfile.hand_made(lambda n: 30 + 0.5 * n, lambda w: 3 + 0.1 * w)
    try:
        cost, md, grid, pred, runtimes, runtimes_md, runners, runners_md = hardware_tab.views(
            ctx, CODE, 16, 4, hardware_tab.HardwareSession())
        assert "Chosen tree" in md and len(pred.data) == 1 and "measured: not yet" in pred.layout.annotations[0].text
        # the profile's predicted target rate beside the page's measured one (Compare's rounds, the Live probe)
        assert "**The target alone here**: predicted **" in runtimes_md and "measured" in runtimes_md
        # A CPU pair: the eager runner's curves (this profile's), and graphs said not to apply.
        assert runners.data[0].name == "eager runner: verify (target forward)"
        assert "CUDA graphs do not apply on a CPU" in runners_md
        # The pair in use (hf) with its profile, beside any other runtime profiled on this machine.
        assert runtimes.data[0].name == "Hugging Face (torch): target" and "Fastest here" in runtimes_md
        assert "| ★ Hugging Face (torch)<br><small>" in runtimes_md and "costs: in use" in runtimes_md
        said = []
        measured = hardware_tab.measure(ctx, 16, 4, DEFAULT_ACCEPTANCE, progress=lambda f, w: said.append((f, w)))
        assert set(measured) == {"target only", "sequoia (chosen)"}
        assert all(len(v) == hardware_tab.MEASURE_ROUNDS and min(v) > 0 for v in measured.values())
        assert said[0] == (0.0, "round 1 of 3: target only") and said[-1][1] == "round 3 of 3: sequoia (chosen)"
        pred = hardware_tab.views(ctx, CODE, 16, 4, hardware_tab.HardwareSession(measured))[3]
        assert [t.name for t in pred.data] == ["predicted", "measured (median, range over rounds)"]
        alone = statistics.median(measured["target only"])   # the bar: the median, the whisker the range
        assert pred.data[1].y[0] == alone and pred.data[1].error_y.array[0] == max(measured["target only"]) - alone
        # Measure's button: the cores' sharing read from the kernel's accounting of its threads (issue 58)
        *_, session = hardware_tab._on_measure(ctx, CODE, 16, 4, None, progress=lambda *a, **k: None)
        assert set(session.measured) == set(measured) and 0.0 <= session.cores.waited <= 1.0
    finally:
        ctx.profile = None


@pytest.mark.slow
def test_gradio_client_end_to_end(demo):
    from gradio_client import Client

    demo.queue(default_concurrency_limit=1, max_size=8)
    url = serve_here(demo)
    try:
        client = Client(url, verbose=False)
        text, steps = client.predict("hi", "sequoia", 8, 3, 0.0, 1.0, 6, 0, True, api_name="/decode")
        assert isinstance(text, str) and sum(len(s["new_tokens"]) for s in steps) == 6
        with pytest.raises(Exception, match="prompt is empty"):
            client.predict("", api_name="/decode")
        out = client.predict("0.8, 0.1", 8, 3, api_name="/dp")  # the server still serves after the error
        assert out["budget"] == 8
    finally:
        demo.close()


def test_dynamic_method_uses_the_profile_and_says_when_it_drafts_nothing(ctx, tmp_path):
    from sequoia.core.profiles.calibration import Calibration
    from sequoia.core.profiles.profile import HardwareProfile

    method, note = _proposer(ctx, "Sequoia (dynamic)", 8, 3)
    assert method.name == "sequoia-dynamic" and "until this machine's profile is measured" in note
    # the depth slider (a static tree's depth) caps the dynamic tree only above the dynamic tree's own cap
    assert method.max_depth == MAX_DEPTH and method.budget == 8
    assert _proposer(ctx, "Sequoia (dynamic)", 8, 30)[0].max_depth == 30
    ctx.profile = HardwareProfile.hand_made(lambda n: 100.0 * n, lambda w: 20.0)  # verification never cheap
    try:
        method, note = _proposer(ctx, "Sequoia (dynamic)", 8, 3)
        assert not method.can_pay and "drafts nothing" in note
        final = _stream(ctx, method="Sequoia (dynamic)", max_new=6)[-1][-1]
        assert all(r.tree.size == 0 for r in final.records)
    finally:
        ctx.profile = None
    # calibration files next to the acceptance vectors, nearest temperature wins
    old = ctx.assets_dir
    (tmp_path / "acceptance").mkdir()
    for t in (0.0, 0.6):
        Calibration(knots=(0.0, 1.0), values=((0.0, 1.0),), temperature=t).save(
            tmp_path / "acceptance" / f"calibration-x-t{t:g}.json")
    (tmp_path / "acceptance" / "calibration-broken.json").write_text("{")
    ctx.assets_dir = tmp_path
    try:
        dynamic = METHOD_INFO["sequoia-dynamic"]
        assert ctx.method_state(dynamic, 0.7)["calibration"].temperature == 0.6
        assert ctx.method_state(dynamic, 0.1)["calibration"].temperature == 0.0
    finally:
        ctx.assets_dir = old


def test_profiles_are_matched_to_the_machine_fingerprint(pair, tmp_path):
    from dataclasses import replace

    from sequoia.core.profiles.profile import HardwareProfile
    from sequoia.runtime.measuring.fingerprint import machine_fingerprint

    here = machine_fingerprint(pair)
    other = replace(here, threads=here.threads + 7)
    hand = HardwareProfile.hand_made(lambda n: 10.0 + n, lambda w: 1.0 + w)
    replace(hand, fingerprint=other).save(tmp_path / "profiles" / "a-other.json")
    ctx = AppContext.from_pair_or_loader(pair, assets_dir=tmp_path, cache_dir=tmp_path / "cache")
    choice = ctx.find_profile()
    assert choice.source == "none" and ctx.profile is None and "a-other.json" in choice.reason
    assert "until this machine's profile is measured" in ctx.profile_note()
    replace(hand, fingerprint=here).save(tmp_path / "profiles" / "b-this.json")
    assert ctx.find_profile().path.name == "b-this.json" and ctx.profile is not None
    assert "b-this.json" in ctx.profile_note() and str(tmp_path) not in ctx.profile_note()
    with pytest.raises(ValueError, match="SEQUOIA_OWNER"):
        hardware_tab.profile_now(ctx, quick=True)  # visitors cannot change the server's profile


def test_auto_says_when_the_optimizer_keeps_the_target_alone(ctx):
    from sequoia.core.profiles.profile import HardwareProfile

    method, note = _proposer(ctx, "Sequoia (auto)", 8, 3)  # no profile yet
    assert method.name == "sequoia-auto" and method.tree.size == 0
    assert "until this machine's profile is measured" in note
    ctx.profile = HardwareProfile.hand_made(lambda n: 100.0 * n, lambda w: 20.0)
    try:
        method, note = _proposer(ctx, "Sequoia (auto)", 8, 3)
        assert method.tree.size == 0 and "root-only" in note
        ctx.profile = HardwareProfile.hand_made(lambda n: 100.0 + 0.1 * n, lambda w: 1.0)
        method, note = _proposer(ctx, "Sequoia (auto)", 8, 3)
        assert method.tree.size > 0 and note == ""
    finally:
        ctx.profile = None


def test_live_summary_names_the_fastest_configuration_when_it_is_another(ctx):
    from sequoia.core.profiles.profile import HardwareProfile

    from components.app_state.runtimes_here import fastest_elsewhere

    ctx.profile = HardwareProfile.hand_made(lambda n: 30.0 * n, lambda w: 10.0)   # compute-bound: no tree pays
    try:
        line = fastest_elsewhere(ctx, DEFAULT_ACCEPTANCE, "sequoia")
        assert "the target alone on Hugging Face (torch)" in line and "tokens/s" in line
        ctx.profile = HardwareProfile.hand_made(lambda n: 30.0 + 0.1 * n, lambda w: 1.0)  # trees pay: Sequoia is it
        assert fastest_elsewhere(ctx, DEFAULT_ACCEPTANCE, "sequoia") == ""
    finally:
        ctx.profile = None


def test_the_fastest_configuration_is_solved_once_per_profile(ctx, monkeypatch):
    from sequoia.core.profiles.profile import HardwareProfile

    from components.app_state import runtimes_here
    from sequoia.runtime.measuring import runtime_choice

    solves, real = [], runtime_choice.choose_tree
    monkeypatch.setattr(runtime_choice, "choose_tree", lambda *a, **k: solves.append(1) or real(*a, **k))
    ctx.profile = HardwareProfile.hand_made(lambda n: 30.0 * n, lambda w: 10.0)
    try:
        first = runtimes_here.fastest_elsewhere(ctx, DEFAULT_ACCEPTANCE, "sequoia")
        n = len(solves)
        assert n >= 1 and runtimes_here.fastest_elsewhere(ctx, DEFAULT_ACCEPTANCE, "chain") == first
        assert len(solves) == n                                  # the second decode reads the kept answer
        ctx.profile = HardwareProfile.hand_made(lambda n: 30.0 + 0.1 * n, lambda w: 1.0)
        runtimes_here.fastest_elsewhere(ctx, DEFAULT_ACCEPTANCE, "sequoia")
        assert len(solves) > n                                   # a new profile: solved again
    finally:
        ctx.profile = None
