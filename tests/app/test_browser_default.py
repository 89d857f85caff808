"""The page as ``python app.py`` serves it: its default runtime (chosen by measurement; llama.cpp on an AVX2-only
CPU) with the embedded pair, in headless Debian Chromium.  Issue 42, part 4: the Live tab's defects, each seen
where a class sees it.

One server for the module, built by :func:`app.build_from_env` from this environment (``SEQUOIA_BACKEND`` names
another runtime; ``SEQUOIA_CACHE`` the converted models); the browser is test_browser's (one Chromium profile).

    python -m pytest -q tests/app/test_browser_default.py              # ~5 min on a 2-core CPU
    SEQUOIA_STOP_TRIES=20 python -m pytest -q -s tests/app/test_browser_default.py -k stop   # docs/benchmarks.md's
"""

import os
import re
import time
from types import SimpleNamespace

import pytest

import app
from components.compare import compare_tab
from components.hardware import hardware_tab
from components.live import after_run, live_tab, live_teaching
from components.loopback import serve_loaded
from components.widgets import runtime_view
from sequoia.core.requests.request import METHOD_OF_LABEL
from test_browser import (_click_decode, _compare_rows, _event_ended, _screenshot, _settled,
                          _settled_text, _unsettled, _wait_for, browser_context, sync_api)

pytestmark = [pytest.mark.browser, pytest.mark.embedded, pytest.mark.slow,
              pytest.mark.skipif(not os.path.exists("/usr/bin/chromium"), reason="no /usr/bin/chromium")]
__all__ = ["browser_context"]   # test_browser's fixture, shared: one Chromium for both modules

#: Stop tries during the prompt's forward: 5 in the test command; SEQUOIA_STOP_TRIES=20 for the settle times
#: docs/benchmarks.md reports (20 of 20 within 2 s: the product's promise, measured, not asserted here).
STOP_TRIES = int(os.environ.get("SEQUOIA_STOP_TRIES", "5"))
#: The most seconds a Stop may take to settle the page here: 10x the larger median measured (0.23 s on an idle
#: Zen 3, docs/benchmarks.md; 0.37 s on a busy 2-vCPU Xeon with AMX, llama.cpp), so a busy machine cannot break it.
STOP_SETTLE_BOUND_S = 10 * 0.37
#: The Hardware tab's Measure in the walk: rounds of this many tokens (the page's 48 take ~40 s on 2 cores).
WALK_MEASURE_TOKENS = 8
#: Gradio's toasts and the red "Error" of an output's status tracker: what a class must never see.
ERROR_BADGES = "[data-testid='toast-body'].error, span.error"
#: A prompt long enough that the target's forward over it takes a second or more on a 2-core CPU (~120 tokens).
LONG_PROMPT = "Explain, line by line, what this Python code does:\n" + "\n".join(
    f"def step_{i}(values, factor={i}):\n    return [v * factor + {i} for v in values if v % {i + 2}]"
    for i in range(3))


@pytest.fixture(scope="module")
def default_server(lanes):
    """The app from this environment, as ``python app.py`` builds it, its models loaded before the first test."""
    # no background timing of the runtimes (its children load the targets again, niced, and outlive the
    # module; test_browser_fresh keeps it): the background profile still measures beside the visits
    demo = app.build_from_env({**os.environ, "SEQUOIA_PROBE": "0"}, lanes=lanes)
    ctx = demo.sequoia_context
    url = serve_loaded(demo, css_paths=[app.CSS_PATH])
    yield SimpleNamespace(url=url, ctx=ctx, backend=ctx.pair().backend)
    demo.close()


@pytest.fixture()
def page(default_server, browser_context):
    page = browser_context.new_page()
    page.set_viewport_size({"width": 1280, "height": 720})
    page.goto(default_server.url, wait_until="domcontentloaded")
    page.locator("#sq-prompt textarea").wait_for()
    yield page
    page.close()


def _errors(page) -> list[str]:
    """The error toasts and error badges on the page (their text)."""
    return [e.text_content().strip()[:200] for e in page.locator(ERROR_BADGES).all() if e.is_visible()]


def _badge_check(page, seen: list):
    """``check(what)``: once the events a control sent (and those chained after them) have answered, any error
    toast or badge on the page is added to ``seen`` under ``what`` (a toast comes with its event's answer)."""
    def check(what: str) -> None:
        _settled(page, 300)
        bad = _errors(page)
        if bad:
            seen.append((what, bad))
    return check


def _set(page, selector: str, value: str) -> None:
    box = page.locator(selector)
    box.fill(value)
    box.press("Enter")


def _max_new(page):
    return page.locator(".sq-max-new input").first


def _type_then_click(page, label: str, value: str, button: str) -> None:
    """Type ``value`` into the visible field whose label starts with ``label``, then click ``button`` as a visitor
    does (after the field's own events have answered)."""
    box = page.get_by_label(re.compile("^" + re.escape(label))).filter(visible=True).first
    box.fill(value)
    box.press("Enter")
    _settled(page)
    page.get_by_role("button", name=button, exact=True).filter(visible=True).click()


def _refused(page, line: str, words: str) -> None:
    """The refusal ``line`` under the tab's buttons (its CSS selector) says ``words`` once the page's events
    have answered: the server's line stays where Gradio's message beside the field goes at the page's next
    status (components.app_state.validation.refusal_line)."""
    sync_api.expect(page.locator(line)).to_contain_text(words)
    _settled(page)
    sync_api.expect(page.locator(line)).to_contain_text(words)


def _run_over(page, ctx) -> None:
    """Once a stopped run is over: its last step done and the models free (the lease), and the page quiet, so the
    next run's timings start from a quiet machine (a click before then runs after the stopped one)."""
    lease = ctx.pair().lock
    _wait_for(lambda: not lease.owned, 300)
    _event_ended(page)


def _pick(page, label: str, option: str) -> None:
    page.get_by_label(label).first.click()
    page.get_by_role("option", name=option, exact=True).click()


def _watched_runs(monkeypatch) -> SimpleNamespace:
    """Times of each run's start and of its first step (the prompt's forward ends there), and the runs closed;
    the engine's steps pass through untouched."""
    runs, real = SimpleNamespace(started=[], first=[], closed=0), live_tab.run_decode

    def watched(ctx, req, should_stop=None):
        runs.started.append(time.monotonic())
        try:
            for rec in real(ctx, req, should_stop):
                if rec.step == 0:
                    runs.first.append(time.monotonic())
                yield rec
        finally:
            runs.closed += 1

    monkeypatch.setattr(live_tab, "run_decode", watched)
    return runs


def _after_runs(monkeypatch) -> list:
    """One entry per finished Live run whose after-run events have ended (:mod:`components.live.after_run`: its
    words, then the target alone measured on its prompt, once per prompt and settings)."""
    ended, real = [], after_run.measure

    def counted(ctx, session):
        try:
            yield from real(ctx, session)
        finally:
            ended.append(time.monotonic())

    monkeypatch.setattr(after_run, "measure", counted)
    return ended


def _after_run_ended(page, ended: list, before: int) -> None:
    """Once the run clicked when ``ended`` held ``before`` entries has had its after-run events (a "finished"
    summary may still be the last run's) and the page is quiet."""
    _wait_for(lambda: len(ended) > before, 600)
    _event_ended(page)


# ------------------------------------------------------------------ max new tokens 0 and -1
@pytest.mark.parametrize("value", ["0", "-1"])
def test_max_new_tokens_0_or_negative_is_refused_by_the_app_naming_the_field(page, value, monkeypatch):
    runs = _watched_runs(monkeypatch)
    page.locator("#sq-prompt textarea").fill("def f():")
    box = _max_new(page)
    box.fill(value)
    box.press("Enter")
    _click_decode(page)
    # the line under Decode says why, after every event of the page answered: no toast, no run, the value as typed
    _refused(page, "#sq-refused", f"Not decoded: max new tokens must be a whole number >= 1, got {value}")
    assert _errors(page) == [] and page.get_by_text("less than minimum value").count() == 0
    assert box.input_value() == value and runs.started == []


COMPARE, CHECK = ("Compare", "Run comparison", "#sq-compare-refused"), ("Distribution check", "Run the check",
                                                                       "#sq-check-refused")


@pytest.mark.parametrize("tab, button, line, label, value, words", [
    (*COMPARE, "max new tokens", "0", "max new tokens must be a whole number >= 1, got 0"),
    (*COMPARE, "seed", "-1", "seed must be a whole number in 0.."),
    (*CHECK, "trials N per rule", "50", "trials N per rule must be a whole number in 100.."),
    (*CHECK, "seed", "-1", "seed must be a whole number in 0.."),
])
def test_the_other_tabs_number_boxes_are_refused_by_the_app_naming_the_field(page, tab, button, line, label, value,
                                                                             words):
    """Compare's and the Distribution check's boxes leave their range to the app (Gradio's own "less than minimum"
    toast names no field): the app's words in the line under the tab's buttons, no toast, no run."""
    page.get_by_role("tab", name=tab, exact=True).click()
    _type_then_click(page, label, value, button)
    _refused(page, line, "Not run: " + words)
    assert _errors(page) == [] and page.get_by_text("less than minimum value").count() == 0
    assert page.get_by_text("Round 1 of").count() == 0 and page.get_by_text("Forwarding the prompt").count() == 0


def test_compares_stop_shows_no_error_badge(page, default_server):
    """Stop during a comparison (in its warm-up and in a timed round): the notes say so within 2 s, the rows so
    far stay, no Error badge (issue 42: cancelling the event mid-step put a red Error on every output), and no
    frame of the run lands over the Stop line."""
    page.get_by_role("tab", name="Compare", exact=True).click()
    run = page.get_by_role("button", name="Run comparison", exact=True)
    stop = page.get_by_role("button", name="Stop", exact=True).filter(visible=True)
    notes = page.locator("#sq-compare-notes")
    seen, took = [], []
    # Stop in the warm-up, at a timed round's start, and past a timed run (its row kept): a later round would only
    # cost a whole round more
    for phase in ("Warm-up round", "Round 1 of", re.compile(r"Round 1 of \d+: running .+, [2-9]\d* of")):
        run.click()
        sync_api.expect(notes).to_contain_text(phase, timeout=600_000)
        clicked = time.monotonic()
        stop.click()
        # 10 s: 10x the slowest settle measured idle (0.68 s, docs/benchmarks.md), a bound only against a hang
        sync_api.expect(notes).to_contain_text("Stopped", timeout=10_000)
        took.append(time.monotonic() - clicked)
        _run_over(page, default_server.ctx)   # an Error badge, or a late frame, would have come by the run's end
        seen += [(phase, e) for e in _errors(page)]
        said = notes.text_content().strip()
        assert said.startswith("Stopped"), (phase, said)
        print(f"\nStop in a comparison's {getattr(phase, 'pattern', phase)!r}: {took[-1]:.2f} s, {said[:70]!r}",
              flush=True)
    assert seen == [], seen


def test_the_distribution_checks_stop_shows_no_error_badge(page, default_server):
    """Stop during the distribution check (the models' forward, a rule's trials): the verdicts say so within 2 s,
    the rules done stay, no Error badge and no later frame over the Stop line (its Stop used to cancel the event,
    as Compare's did)."""
    page.get_by_role("tab", name="Distribution check", exact=True).click()
    run = page.get_by_role("button", name="Run the check", exact=True)
    verdicts = page.locator("#sq-check-verdicts")
    seen = []
    for phase in ("Forwarding the prompt", "Running"):   # Stop in the models' forward, then in a rule's trials
        run.click()
        sync_api.expect(verdicts).to_contain_text(phase, timeout=120_000)
        clicked = time.monotonic()
        page.locator("#sq-check-stop").click()
        # 10 s: over 10x the settles measured idle (0.22-0.24 s, docs/benchmarks.md), a bound only against a hang
        sync_api.expect(verdicts).to_contain_text("Stopped", timeout=10_000)
        took = time.monotonic() - clicked
        _run_over(page, default_server.ctx)   # an Error badge, or a late frame, would have come by the run's end
        seen += [(phase, e) for e in _errors(page)]
        said = verdicts.text_content().strip()
        assert said.startswith("Stopped"), (phase, said)
        print(f"\nStop in the distribution check's {phase!r}: {took:.2f} s, {said[:60]!r}", flush=True)
    assert seen == [], seen


# ------------------------------------------------------------------ Stop during the prompt's forward
def test_stop_during_the_prompts_forward_settles_at_once_with_one_message(page, default_server, monkeypatch,
                                                                          tmp_path):
    runs = _watched_runs(monkeypatch)
    summary, took, late = page.locator("#sq-summary"), [], []
    _set(page, ".sq-max-new input", "64")
    for attempt in range(STOP_TRIES):
        page.locator("#sq-prompt textarea").fill(f"# try {attempt}\n{LONG_PROMPT}")   # new text: no cached prefix
        _click_decode(page)
        _wait_for(lambda: len(runs.started) == attempt + 1)
        time.sleep(0.3)                 # inside the forward, not at its first instruction
        clicked = time.monotonic()
        page.get_by_role("button", name="Stop", exact=True).click()
        took.append(_settle_s(page))
        said = _message(summary)
        print(f"try {attempt}: settled in {took[-1]:.2f} s: {said[:60]!r}", flush=True)
        _wait_for(lambda: runs.closed == attempt + 1, 300)   # the forward ends, and the engine stops there
        # Stop came during the prompt's forward: the run had started and its first step had not ended.
        assert len(runs.first) <= attempt + 1
        if len(runs.first) == attempt + 1:
            assert runs.first[-1] > clicked, f"try {attempt}: the first step ended before Stop"
        _event_ended(page)   # the run's event over: nothing of it can land after this
        if _message(summary) != said or _unsettled(page):
            late.append((attempt, said, _message(summary)))
        assert "Stopped before the first step finished" in said
    # The prompt is read in chunks with Stop read between two (issue 49): most tries end inside the forward, with
    # no first step at all; a first step that does end came from the last chunk, already in flight.
    forwards = [f - s for f, s in zip(runs.first, runs.started)]
    print(f"\n{len(forwards)} of {STOP_TRIES} tries finished the prompt's forward after Stop"
          + (f" (run start to first step: {min(forwards):.2f}-{max(forwards):.2f} s)" if forwards else ""))
    print(f"\n{default_server.backend}: {STOP_TRIES} Stops during the prompt's forward settled in "
          f"{min(took):.2f}-{max(took):.2f} s (median {sorted(took)[len(took) // 2]:.2f} s)")
    _screenshot(page, tmp_path, "default-stopped-in-the-prompts-forward")
    assert late == [], f"the message changed after Stop: {late}"
    assert max(took) <= STOP_SETTLE_BOUND_S, f"settle times {[round(t, 2) for t in took]}"
    assert _errors(page) == []


def _message(locator) -> str:
    """The summary's words, without the elapsed-time counter Gradio's status tracker may draw in the same element
    for a moment (seen once as "0.0s" before the unchanged message, in a module run: not the message changing)."""
    return re.sub(r"^\s*\d+(\.\d+)?s\s+", "", locator.text_content()).strip()


def _settle_s(page, limit_s: float = 30.0) -> float:
    """Seconds until the summary says the run stopped and every output is settled."""
    summary, t0 = page.locator("#sq-summary"), time.monotonic()
    while (_unsettled(page) or "Stopped" not in summary.text_content()) and time.monotonic() - t0 < limit_s:
        time.sleep(0.02)
    return time.monotonic() - t0


# ------------------------------------------------------------------ the wording, where a class reads it
def test_the_banner_says_the_runtime_and_quantisation_not_a_torch_dtype(page, default_server):
    banner = page.locator(".sq-status-ready")
    sync_api.expect(banner).to_be_visible(timeout=60_000)
    text = banner.text_content()
    assert "torch." not in text and "float32" not in text, text
    pair = default_server.ctx.pair()    # every runtime: its name, weights as loaded and device, as its runners say
    assert runtime_view.pair_words(pair.target.info, pair.draft.info) in text, text
    if default_server.backend == "llamacpp":
        assert re.search(r"llama\.cpp, Q\d\w*, CPU", text), text


def test_a_one_token_run_says_1_token_and_its_tree_says_drafted_accepted_bonus(page):
    page.locator("#sq-prompt textarea").fill("def add(a, b):")
    _set(page, ".sq-max-new input", "1")
    _click_decode(page)
    summary = page.locator("#sq-summary")
    sync_api.expect(summary).to_contain_text("finished", timeout=120_000)
    text = _settled_text(summary)
    assert "1 token in 1 target call" in text and not re.search(r"(?<![\d.])1 (tokens|target calls)\b", text), text
    _pick(page, "Method", "Sequoia (budget & depth)")
    _set(page, "#sq-budget input", "5")
    _set(page, "#sq-depth input", "5")
    _set(page, ".sq-max-new input", "12")
    _click_decode(page)
    sync_api.expect(summary).to_contain_text("12 tokens in", timeout=300_000)   # this run's end, not the last's
    sync_api.expect(page.locator("#sq-tree .gtitle").first).to_contain_text("5 drafted")
    title = page.locator("#sq-tree .gtitle").first.text_content()
    assert re.search(r"5 drafted, \d+ accepted, \+1 bonus", title) and " of " not in title, title
    _settled_text(summary, timeout_s=120)
    for reading in summary.inner_text().split("\n"):   # rendered lines: each projection line is a paragraph
        assert len(re.findall(r"\d[\d.]*\s*[×x]\b", reading)) <= 1, reading   # one multiplier a line
    assert _errors(page) == []


def test_the_dp_tab_clears_the_sglang_command_when_it_cannot_choose(page):
    page.get_by_role("tab", name="DP explorer").click()
    command = page.locator("#sq-dp-sglang-command")
    sync_api.expect(command).to_contain_text("--speculative-num-draft-tokens")
    page.get_by_label("p_1, p_2, … (editable)").fill("0.9, 0.5")     # sums past 1: refused
    sync_api.expect(page.locator("#sq-dp-sglang")).to_contain_text("Cannot choose the SGLang launch")
    sync_api.expect(command).not_to_contain_text("--speculative")
    assert _errors(page) == []


# ------------------------------------------------------------------ every control, no Error badge
def test_a_walk_of_every_live_tab_control_shows_no_error_badge(page, default_server, tmp_path, monkeypatch):
    """Each control of the Live tab used as a visitor would, on the default runtime: never an error toast or an
    Error badge (refusals are the app's words beside their field; Stop settles).  Every method decodes 2 tokens of
    a short prompt without the chat template (a prompt's forward on a busy 2-core CPU takes seconds a token).
    Exact mode: its own test below."""
    seen, summary = [], page.locator("#sq-summary")
    runs, after = _watched_runs(monkeypatch), _after_runs(monkeypatch)
    check = _badge_check(page, seen)

    page.get_by_role("button", name=re.compile("^How to read this")).click()
    check("How to read this")
    page.locator("#sq-guided").click()                 # the guided example, stopped once its first step is in
    sync_api.expect(summary).to_contain_text(re.compile(r"\d+ tokens? in"), timeout=600_000)
    page.get_by_role("button", name="Stop", exact=True).click()
    sync_api.expect(summary).to_contain_text("Stopped", timeout=10_000)
    check("the guided example, then Stop")
    page.locator("#sq-prompt textarea").fill("def f(x):")
    page.get_by_label("apply the chat template").uncheck()
    for selector, bad in (("#sq-budget input", "0"), ("#sq-depth input", "-1"), ("#sq-temperature input", "-1"),
                          ("#sq-seed input", "-1"), (".sq-max-new input", "0"), (".sq-max-new input", "-1"),
                          (".sq-max-new input", "100000")):
        good = page.locator(selector).input_value()
        _set(page, selector, bad)
        _click_decode(page)
        check(f"{selector} = {bad}")
        _set(page, selector, good)
    top_p = page.get_by_label("top-p").last          # the slider's number box
    top_p.fill("0.9")
    top_p.press("Enter")
    check("top-p")
    for selector, value in ((".sq-max-new input", "2"), ("#sq-budget input", "8"), ("#sq-depth input", "4")):
        _set(page, selector, value)
    for label in METHOD_OF_LABEL:                     # the Method dropdown's choices
        _pick(page, "Method", label)
        before = len(after)
        _click_decode(page)
        _after_run_ended(page, after, before)        # finished, and the target alone measured after it, once
        sync_api.expect(summary).to_contain_text("finished")
        check(f"a decode with {label}")
    page.get_by_label("acceptance vector (for the DP tree)").first.click()
    page.get_by_role("option").nth(1).click()
    _set(page, "#sq-temperature input", "0.6")
    _pick(page, "Method", "Sequoia (budget & depth)")
    before = len(after)
    _click_decode(page)
    _after_run_ended(page, after, before)
    sync_api.expect(summary).to_contain_text("finished")
    check("the acceptance vector and a temperature")
    step = page.get_by_label("step (tree shown below)").first
    step.fill("0")
    step.press("Enter")
    check("the step slider")
    page.locator("#sq-inspect-node input").click()
    option = page.get_by_role("option").last     # the picker lists the shown step's tested nodes and its bonus
    sync_api.expect(option).to_be_visible()
    option.click()
    check("the inspector's node")
    _set(page, ".sq-max-new input", "64")
    started = len(runs.started)
    _click_decode(page)
    _wait_for(lambda: len(runs.started) > started, 120)   # Stop during the run, not before it reached the server
    page.get_by_role("button", name="Stop", exact=True).click()
    sync_api.expect(summary).to_contain_text("Stopped", timeout=10_000)
    check("Stop")
    page.get_by_role("button", name="Stop", exact=True).click()      # with no run on: nothing happens
    check("Stop with no run")
    _screenshot(page, tmp_path, "default-walk")
    assert seen == [], seen


def test_exact_mode_on_the_default_runtime_shows_no_error_badge(page):
    """Exact mode on the default runtime: it finishes or says why it cannot (memory), never an Error badge."""
    if not os.environ.get("SEQUOIA_WALK_EXACT"):
        pytest.skip("exact mode's first use converts the target and loads it in float32 (~6 GB, minutes on 2 cores):"
                    " SEQUOIA_WALK_EXACT=1 runs it (tests/app/test_browser.py covers exact mode on the tiny pair)")
    seen, summary = [], page.locator("#sq-summary")
    page.locator("#sq-prompt textarea").fill("def f(x):")
    _set(page, ".sq-max-new input", "2")
    page.locator("#sq-exact").click()
    sync_api.expect(summary).to_contain_text(re.compile("finished|Cannot"), timeout=600_000)
    _badge_check(page, seen)("exact mode")
    assert seen == [], seen


def _quiet(page, timeout_s: float = 600) -> None:
    """Once no output of the page shows Gradio's progress (the event clicked has ended): first its progress, for an
    event that draws none yet (up to 5 s; an event done sooner never shows it), then its end."""
    try:
        page.locator(".pending, .generating").first.wait_for(state="attached", timeout=5_000)
    except sync_api.TimeoutError:
        pass   # already over
    _event_ended(page, timeout_s)


def test_the_guided_example_reaches_a_rejection_and_its_residual_in_two_presses(page, monkeypatch):
    """Issue 51: the guided example's first three target calls held no rejection, so a teacher pressed Next target
    call three times to reach a residual.  Next rejection jumps to the first rejected draft; Step shows its
    residual (T=0.6: a rejection is followed by the residual it leaves)."""
    runs = _watched_runs(monkeypatch)
    page.locator("#sq-guided").click()
    summary, words = page.locator("#sq-summary"), page.locator("#sq-step-text")
    _wait_for(lambda: runs.closed == 1, 900)
    _event_ended(page)                                                # the run's last frame is in
    sync_api.expect(summary).to_contain_text("finished")
    page.locator("#sq-next-rejection").click()                        # press 1
    sync_api.expect(words).to_contain_text("rejected")
    text = words.text_content()
    assert "a child's test" in text
    # the printed test redoes by hand: min(1, p / q) from the printed p and q rounds to the printed chance
    number = r"([0-9]+(?:\.[0-9]+)?(?:e[+-]?[0-9]+)?)"   # a sentence's full stop may follow
    m = re.search(rf"min\(1, p/q\) = min\(1, {number} / {number}\) = {number}", text)
    assert m, text
    p, q, chance = m.groups()
    mantissa, _, exponent = chance.partition("e")
    unit = 10.0 ** (int(exponent or 0) - (len(mantissa.split(".")[1]) if "." in mantissa else 0))
    assert abs(min(1.0, float(p) / float(q)) - float(chance)) <= unit / 2 * (1 + 1e-9), text
    page.locator("#sq-step-btn").click()                              # press 2
    sync_api.expect(words).to_contain_text("the residual")
    sync_api.expect(words).to_contain_text("norm(max(p − q, 0))")


def test_a_walk_of_every_other_control_shows_no_error_badge(page, default_server, tmp_path, monkeypatch):
    """The controls the Live walk above leaves, used as a visitor would on the default runtime with the embedded
    pair, each to its end: step mode and the next target call, the worked example, projector view, "Run the
    fastest here" (where this runtime has one), Compare's run (3 rounds of 4 tokens), the DP explorer's Solve and
    a cell, the distribution check (1,000 trials) and the Hardware tab's Measure (its rounds of
    :data:`WALK_MEASURE_TOKENS` tokens: scripts/page/one_visit.py presses it at its own length).  Never an error
    toast or an Error badge.  (Full comparison and both Stops: their own tests above; exact mode: its own test, with
    SEQUOIA_WALK_EXACT=1; Profile now is the server owner's, off on a shared page.)  A step this runtime cannot
    take ends the test as skipped, naming it, once the rest is checked."""
    seen, summary, after = [], page.locator("#sq-summary"), _after_runs(monkeypatch)
    check = _badge_check(page, seen)

    page.locator("#sq-prompt textarea").fill("def add(a, b):")
    _set(page, ".sq-max-new input", "6")
    _click_decode(page)
    _after_run_ended(page, after, 0)
    sync_api.expect(summary).to_contain_text("finished")
    words = page.locator("#sq-step-text")
    last = int(page.locator("#sq-step-slider input[type=number]").input_value())
    page.locator("#sq-step-btn").click()              # the replay starts at the call the slider shows
    sync_api.expect(words).to_contain_text(f"Target call {max(last, 1)} · phase 1 of")
    for _ in range(3):
        page.locator("#sq-step-btn").click()
        check("Step")
    page.locator("#sq-next-call").click()
    check("Next target call")
    page.locator("#sq-next-rejection").click()
    sync_api.expect(words).to_contain_text(re.compile(r"rejected|No draft was rejected"))
    check("Next rejection")
    page.get_by_text(live_teaching.WORKED_LABEL).click()
    sync_api.expect(page.locator("#sq-worked-text")).to_be_visible()
    check("the worked example")
    page.get_by_label("Projector view").check()
    page.wait_for_function("document.body.classList.contains('sq-projector')")
    check("projector view")
    page.get_by_label("Projector view").uncheck()
    fastest = page.locator("#sq-fastest")
    vector = page.get_by_label("acceptance vector (for the DP tree)").first.input_value()
    if live_teaching.preset_here(default_server.ctx, vector) is None:   # no profile of this runtime here
        sync_api.expect(fastest).to_be_hidden()     # as it must be: nothing measured to name (asserted, not walked)
    else:
        before = len(after)
        fastest.click()
        _after_run_ended(page, after, before)
        sync_api.expect(summary).to_contain_text("finished")
        check("Run the fastest here")

    page.get_by_role("tab", name="Compare", exact=True).click()
    _type_then_click(page, "max new tokens", "4", "Run comparison")
    notes = page.locator("#sq-compare-notes")
    sync_api.expect(notes).to_contain_text("interleaved rounds", timeout=900_000)
    _quiet(page)
    rows = _compare_rows(page)
    check("Run comparison")
    assert rows[0] == "Target alone" and len(rows) >= 2, rows

    page.get_by_role("tab", name="DP explorer", exact=True).click()
    page.get_by_role("button", name="Solve", exact=True).click()
    _quiet(page, 120)
    cell = page.get_by_label("tree size n").filter(visible=True).last
    cell.fill("12")
    cell.press("Enter")
    _quiet(page, 120)
    check("the DP explorer's Solve and a cell")

    page.get_by_role("tab", name="Distribution check", exact=True).click()
    _type_then_click(page, "trials N per rule", "1000", "Run the check")
    sync_api.expect(page.locator("#sq-check-verdicts")).to_contain_text("Finished in", timeout=600_000)
    check("the distribution check")

    page.get_by_role("tab", name="Hardware", exact=True).click()
    not_walked = []
    if default_server.ctx.profile is not None:
        monkeypatch.setattr(hardware_tab, "MEASURE_TOKENS", WALK_MEASURE_TOKENS)
        page.get_by_role("button", name="Measure predicted vs real", exact=True).click()
        _quiet(page)
        check("Measure predicted vs real")
    else:
        not_walked.append("the Hardware tab's Measure (no hardware profile here: it answers with the reason, "
                          "tests/app/test_app.py)")
    _screenshot(page, tmp_path, "default-walk-other-tabs")
    assert seen == [], seen
    if not_walked:   # said, not passed over: the rest was walked without an error badge
        pytest.skip("not walked here: " + "; ".join(not_walked))


def test_full_comparison_starts_on_the_default_runtime_with_every_method_ticked(page, default_server, tmp_path):
    """Issue 42: on the default runtime Full comparison failed at once (HTTP 400, "Value: 'Sequoia (auto)'"): the
    full list named a method the checkboxes, fixed before the pair loaded, did not offer.  Clicked as a visitor
    does, once the models are ready: every method of the full list is ticked and the run starts (its warm-up round),
    with no error anywhere; Stop then ends it.  (The whole run is minutes on a CPU: timed apart, not here.)  This
    module's server, loaded before the first test (tests/app/test_browser.py once loaded a second one for this)."""
    ctx = default_server.ctx
    page.get_by_role("tab", name="Compare", exact=True).click()
    page.get_by_role("button", name=re.compile("^Full comparison")).click()
    notes = page.locator("#sq-compare-notes")
    sync_api.expect(notes).to_contain_text("Warm-up round", timeout=120_000)   # the request was accepted
    boxes = page.locator("#sq-compare-methods label")
    ticked = [boxes.nth(i).text_content().strip() for i in range(boxes.count())
              if boxes.nth(i).locator("input").is_checked()]
    assert ticked == compare_tab.ticked(ctx, full=True) and "Sequoia (auto)" in ticked
    assert _errors(page) == [] and page.get_by_text("Error", exact=True).count() == 0   # no toast, no red badge
    _screenshot(page, tmp_path, "compare-full-default-runtime")
    page.locator("#sq-compare-stop").click()   # the rest of the run is minutes of two busy cores
    sync_api.expect(notes).to_contain_text("Stopped", timeout=60_000)
    _run_over(page, ctx)
