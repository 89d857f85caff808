"""Issue 42, part 4, the Live tab's defects that need no browser: each string function's words, the refusal of a
max new tokens of 0 or -1 naming its field, and a stopped run that never writes after Stop.

The browser side (the page on its default runtime with the embedded pair) is ``tests/app/test_browser_default.py``.
"""

import re
import threading
from dataclasses import replace

import gradio as gr
import pytest

import app
from components.app_state import validation
from components.app_state.decode_inputs import PAGE_FIELDS, DecodeInputs
from components.app_state.target_rate import TargetRate
from components.live import live_tab, stats_view
from components.widgets import dp_view, runtime_view, tree_view
from sequoia.core.statistics.trace import StepRecord
from sequoia.core.statistics.words import counted
from sequoia.core.trees.sglang_family import best_launch
from sequoia.core.trees.tree import Tree
from sequoia.runners.base import RunnerInfo

CHAIN = Tree.chain(5)


# ------------------------------------------------------------------ counts in words
@pytest.mark.parametrize("n, noun, words", [(0, "token", "0 tokens"), (1, "token", "1 token"),
                                             (2, "token", "2 tokens"), (1, "target call", "1 target call"),
                                             (3, "target call", "3 target calls"), (2, "child", "2 children"),
                                             (2, "draft node", "2 draft nodes")])
def test_counted_says_one_in_the_singular(n, noun, words):
    assert counted(n, noun) == words


def test_a_run_of_one_step_says_1_token_and_1_target_call():
    one = [StepRecord.fake(Tree.root_only(), (0,), step=0)]
    md = stats_view.summary_markdown(one)
    assert "**1 token** in **1 target call**" in md
    assert "**Stopped** after 1 token (1 target call)" in live_tab.stopped_line(one)
    two = one + [StepRecord.fake(CHAIN, (0, 1), step=1)]
    assert "after 3 tokens (2 target calls)" in live_tab.stopped_line(two)


def test_the_tokens_per_step_histogram_hovers_in_words():
    runs = [StepRecord.fake(Tree.root_only(), (0,), step=0), StepRecord.fake(CHAIN, (0, 1), step=1)]
    hover = list(stats_view.figure(runs).data[0].hovertext)
    assert hover[0] == "1 token a step: 1 step" and hover[1] == "2 tokens a step: 1 step"


# ------------------------------------------------------------------ the tree's title
def test_the_tree_title_says_drafted_accepted_and_bonus_in_order():
    rec = StepRecord.fake(CHAIN, (0, 1), step=3)
    assert tree_view.step_title(rec).endswith("5 drafted, 1 accepted, +1 bonus")


def test_a_cut_step_says_what_the_limit_kept_apart_from_what_was_accepted():
    full = StepRecord.fake(CHAIN, tuple(range(6)), step=2)       # 5 drafted, 5 accepted, + bonus
    cut = replace(full, new_tokens=(7,), finished=True, finish_reason="length")
    title = tree_view.step_title(cut)
    assert "5 drafted, 5 accepted, +1 bonus · the length limit kept 1 token" in title
    assert " of " not in title and "kept (" not in title
    stopped = replace(full, new_tokens=(7, 8), finished=True, finish_reason="stop")
    assert "a stop string kept 2 tokens" in tree_view.step_title(stopped)
    assert "kept" not in tree_view.step_title(full)


def test_the_prompts_forward_counts_its_tokens_in_words():
    rec = replace(StepRecord.fake(Tree.root_only(), (0,), step=0), prompt_tokens=1)
    assert "the prompt's forward (1 token)" in tree_view.step_title(rec)


# ------------------------------------------------------------------ one multiplier a line
def test_the_speedup_line_has_one_multiplier():
    runs = [StepRecord.fake(CHAIN, (0, 1, 2), step=i) for i in range(3)]
    line = stats_view.speedup_markdown(runs, TargetRate(1000.0, True, "measured on this prompt (3 target calls)"))
    assert len(re.findall(r"\d[\d.]*\s*[×x]", line)) == 1   # no second "0.2x" beside "0.17×"
    assert "tokens per target call at" in line


# ------------------------------------------------------------------ the runtime beside the pair
def test_the_pair_line_names_the_runtime_and_quantisation_not_the_logits_dtype():
    gguf = RunnerInfo(runtime="llamacpp", weights="Q4_K_M", device="cpu")
    assert runtime_view.pair_words(gguf, gguf) == "llama.cpp, Q4_K_M, CPU"
    hf_t = RunnerInfo(runtime="hf", weights="bf16", device="cpu")
    hf_d = RunnerInfo(runtime="hf", weights="bf16", device="cpu", quant="int8")
    assert runtime_view.pair_words(hf_t, hf_d) == "Hugging Face (torch), target bf16, draft int8, CPU"
    gpu = RunnerInfo(runtime="hf", weights="bf16", device="cuda:0")
    assert runtime_view.pair_words(gpu, gpu) == "Hugging Face (torch), bf16, cuda:0"


def test_the_banner_pair_line_says_no_torch_dtype(tiny_app_pair, tmp_path, lanes):
    demo = app.build_demo(tiny_app_pair, assets_dir=tmp_path, max_budget=24, lanes=lanes)
    ctx = demo.sequoia_context
    ctx.pair()
    label = ctx.models.label()
    assert "torch." not in label and label.endswith("· Hugging Face (torch), fp32, CPU"), label


# ------------------------------------------------------------------ the DP tab's SGLang words
def test_sglang_words_count_in_the_singular():
    launch = best_launch((0.6, 0.2), 2, 1)   # depth 1: one step
    assert launch.args.steps == 1
    assert "SGLang: 1 step," in dp_view.sglang_tree_figure(launch, (0.6, 0.2)).layout.title.text
    assert "1 step," in dp_view.sglang_markdown(launch)


# ------------------------------------------------------------------ max new tokens 0 or -1
def _live_number(demo, label_start: str) -> gr.Number:
    found = [b for b in demo.blocks.values() if isinstance(b, gr.Number) and (b.label or "").startswith(label_start)]
    return found[0]   # the Live tab's comes first (Compare's has the same label)


@pytest.mark.parametrize("label", ["max new tokens", "seed"])
def test_the_live_number_boxes_leave_the_range_to_the_request_check(demo, label):
    """Gradio refuses a value under a Number's ``minimum`` itself ("Value 0 is less than minimum value 1.", an
    error toast, HTTP 422) before the app's check can name the field."""
    box = _live_number(demo, label)
    assert box.minimum is None and box.maximum is None
    assert box.preprocess(0) == 0 and box.preprocess(-1) == -1   # reaches the validator unrefused


def test_no_number_box_on_the_page_has_a_range_gradio_would_enforce(demo):
    """Every tab's number boxes (Compare's max new tokens and seed, the Distribution check's trials and seed
    included): a range Gradio enforces itself answers with its own toast, naming no field."""
    boxes = [b for b in demo.blocks.values() if isinstance(b, gr.Number)]
    assert len(boxes) >= 8
    ranged = [b.label for b in boxes if b.minimum is not None or b.maximum is not None]
    assert ranged == [], ranged


@pytest.mark.parametrize("trials, seed, field", [(50, 0, "trials N per rule"), (10 ** 9, 0, "trials N per rule"),
                                                 (400, -1, "seed"), ("", 0, "trials N per rule")])
def test_the_distribution_check_refuses_trials_and_seed_naming_the_field(trials, seed, field):
    from components.distribution import distribution_tab

    class NoPair:   # the refusal comes before the pair is asked for
        def get(self):
            raise AssertionError("the pair was used before the inputs were checked")

    with pytest.raises(gr.Error) as err:
        list(distribution_tab.on_check(NoPair(), "hello", 1.0, 1.0, trials, 3, seed, True))
    assert str(err.value.message).startswith(f"{field} must be a whole number"), err.value.message


def test_the_distribution_checks_validator_puts_each_message_on_its_field():
    from components.distribution import distribution_tab

    answers = distribution_tab.validator("hello", 0, 1.0, 50, 3, -1, True)
    bad = {distribution_tab.FIELDS[i]: a["message"] for i, a in enumerate(answers) if not a["is_valid"]}
    assert set(bad) == {"temperature", "trials", "seed"}, bad
    assert bad["trials"].startswith("trials N per rule must be a whole number in 100..")
    assert all(a["is_valid"] for a in distribution_tab.validator("hello", 1.0, 0.95, 400, 3, 0, True))


def test_the_distribution_check_takes_the_servers_prompt_and_temperature_limits():
    """Its prompt is capped as a decode request's (a megabyte of text is refused before tokenizing, naming the
    prompt), its temperature and top-p ranges are the request's, and a prompt over the token cap is refused after
    tokenizing: the check forwards it through both models."""
    from components.distribution import distribution_tab
    from sequoia.core.requests.request import Limits

    limits = Limits(max_prompt_tokens=8)
    answers = distribution_tab.validator("x" * 10 ** 6, 500.0, 1.5, 400, 3, 0, "maybe", limits=limits)
    bad = {distribution_tab.FIELDS[i]: a["message"] for i, a in enumerate(answers) if not a["is_valid"]}
    assert set(bad) == {"prompt", "temperature", "top_p", "chat"}, bad
    assert bad["prompt"].startswith("prompt has 1000000 characters; this server takes at most 8 tokens")

    class Pair:
        def encode_prompt(self, prompt, chat):
            return list(range(len(prompt.split())))

    class Models:
        def get(self):
            return Pair()

    with pytest.raises(gr.Error, match="prompt has 9 tokens; this server takes at most 8"):
        list(distribution_tab.on_check(Models(), "a b c d e f g h i", 1.0, 1.0, 400, 3, 0, True, limits=limits))


@pytest.mark.parametrize("value", [0, -1])
def test_max_new_tokens_0_or_negative_is_refused_naming_the_field(demo, value):
    ctx = demo.sequoia_context
    inputs = DecodeInputs.from_page("def f():", "Target alone", 8, 3, 0.0, 1.0, value, 0, "", True)
    answers = validation.answer(validation.INPUT_FIELDS["decode_stream"], lambda: validation.page_request(ctx, inputs))
    bad = [(PAGE_FIELDS[i], a["message"]) for i, a in enumerate(answers) if not a["is_valid"]]
    assert bad == [("max_new_tokens", f"max new tokens must be a whole number >= 1, got {value}")], bad


def test_seed_below_0_is_refused_naming_the_field(demo):
    ctx = demo.sequoia_context
    inputs = DecodeInputs.from_page("def f():", "Target alone", 8, 3, 0.0, 1.0, 4, -1, "", True)
    answers = validation.answer(validation.INPUT_FIELDS["decode_stream"], lambda: validation.page_request(ctx, inputs))
    bad = [(PAGE_FIELDS[i], a["message"]) for i, a in enumerate(answers) if not a["is_valid"]]
    assert len(bad) == 1 and bad[0][0] == "seed" and bad[0][1].startswith("seed must be a whole number"), bad


# ------------------------------------------------------------------ Stop: one message, never replaced
def _held_steps(records, hold: threading.Event, after: int):
    """The records, the ones after the first ``after`` only once ``hold`` is set (a step still in flight)."""
    for i, rec in enumerate(records):
        if i == after:
            assert hold.wait(10)
        yield rec


def test_a_step_finished_after_stop_is_never_drawn():
    """Stop during the prompt's forward: Stop's handler said "before the first step finished"; the forward that
    ends afterwards adds no record and no frame (it used to redraw "Stopped after 1 tokens" 1-2 s later)."""
    session, hold = live_tab.LiveSession(prompt="p", running=True), threading.Event()
    records = [StepRecord.fake(CHAIN, (0, 1), step=i) for i in range(3)]
    frames = live_tab._stream_views(session, _held_steps(records, hold, 0))
    said = live_tab.stop_views(session)[3]
    assert said.startswith("**Stopped** before the first step finished")
    hold.set()
    assert list(frames) == [] and session.records == []
    assert live_tab.summary(session) == said


def test_steps_finished_after_a_later_stop_are_never_drawn():
    session, hold = live_tab.LiveSession(prompt="p", running=True), threading.Event()
    records = [StepRecord.fake(CHAIN, (0, 1), step=i) for i in range(4)]
    frames = live_tab._stream_views(session, _held_steps(records, hold, 1))
    next(frames)                                   # the first step's frame
    said = live_tab.stop_views(session)[3]
    assert "Stopped** after 2 tokens (1 target call)" in said
    hold.set()
    assert list(frames) == [] and len(session.records) == 1
    assert live_tab.summary(session) == said
