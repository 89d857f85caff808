"""A real browser on the app: headless Debian Chromium, driven by Playwright, on the tiny random-weight pair.

The server runs in this process (so a test can watch the engine's generators),
the browser is the system's ``/usr/bin/chromium`` (never a downloaded one) with
a fresh profile.  Screenshots go to pytest's tmp dir, and also to
``out/screenshots/`` when ``SEQUOIA_SCREENSHOTS`` is set.

``SEQUOIA_SCREENSHOT=1`` also runs the last test, which redraws the README's figure
``docs/figures/live-tab.png`` on the embedded pair (the only test here that loads it):

    SEQUOIA_SCREENSHOT=1 python -m pytest tests/app/test_browser.py -q -k readme_figure
"""

import os
import re
import shutil
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

import app
from components.compare import compare_run, compare_tab
from components.dp_explorer import dp_tab
from components.live import live_tab
from components.loopback import serve_here
from sequoia.core.trees.sglang_family import best_launch
from sequoia.runtime.memory import human, machine_available_bytes

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--no-first-run", "--disable-quic", "--disable-sync"]
SCREENSHOTS = Path(__file__).resolve().parents[2] / "out" / "screenshots"
README_FIGURE = Path(__file__).resolve().parents[2] / "docs" / "figures" / "live-tab.png"

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="no /usr/bin/chromium (apt-get install chromium)"),
]
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")


#: In every page: ``window.sqEvents.tokens`` holds one entry per event the page sent to the queue (its
#: ``fn_index``, ``done`` once it answered: a refusal or error at the join, or its ``process_completed``);
#: ``window.sqEvents.completed`` counts the ``process_completed`` messages; ``window.sqSettled(ms)``: every
#: event done, the last for at least ``ms``.
EVENTS = r"""(() => {
    if (window.sqEvents) return;
    const ev = window.sqEvents = {tokens: [], byId: {}, completed: 0, last: performance.now()};
    const touch = () => { ev.last = performance.now(); };
    const end = (id) => {
        ev.completed += 1;
        const token = ev.byId[id];
        if (token && token !== "ended") token.done = true;
        else ev.byId[id] = "ended";     // its completion came before its join's answer was read
        touch();
    };
    const real = window.fetch;
    window.fetch = async (...args) => {
        const url = String(args[0] && args[0].url || args[0]);
        if (url.includes("/queue/join")) {
            let fn = null;
            try { fn = JSON.parse(args[1].body).fn_index; } catch (e) {}
            const token = {fn, done: false};
            ev.tokens.push(token);
            touch();
            let response;
            try { response = await real(...args); } catch (e) { token.done = true; touch(); throw e; }
            if (response.status !== 200) { token.done = true; touch(); return response; }
            response.clone().json().then(body => {
                if (ev.byId[body.event_id] === "ended") token.done = true;
                else ev.byId[body.event_id] = token;
                touch();
            }).catch(() => { token.done = true; touch(); });
            return response;
        }
        const response = await real(...args);
        if (!url.includes("/queue/data") || !response.body) return response;
        const [mine, theirs] = response.body.tee();
        (async () => {
            const reader = mine.getReader(), text = new TextDecoder();
            let rest = "";
            for (let part = await reader.read(); !part.done; part = await reader.read()) {
                const lines = (rest + text.decode(part.value, {stream: true})).split("\n");
                rest = lines.pop();
                for (const line of lines) {
                    if (!line.startsWith("data:")) continue;
                    let msg;
                    try { msg = JSON.parse(line.slice(5)); } catch (e) { continue; }
                    if (msg.msg === "process_completed") end(msg.event_id);
                }
            }
        })();
        return new Response(theirs, response);
    };
    window.sqSettled = (ms) => ev.tokens.every(t => t.done) && performance.now() - ev.last >= ms;
})()"""


#: A gradio_client's requests before its job streams (the app's config and API info): a hang guard.  Its default of
#: 20 s was once too short on a busy 2-core machine (a full test run beside a busy loop).
CLIENT_TIMEOUT = {"timeout": 120}


@pytest.fixture(scope="module")
def server(tiny_app_pair, tmp_path_factory, lanes):
    demo = app.build_demo(tiny_app_pair, assets_dir=tmp_path_factory.mktemp("assets"), max_budget=24, lanes=lanes)
    url = serve_here(demo, css_paths=[app.CSS_PATH])
    yield url
    demo.close()


@pytest.fixture(scope="module")
def browser_context(tmp_path_factory, lanes):
    # The apps' DP process is forked before the browser's driver starts: a child forked later keeps the driver's
    # pipe open, and the driver then never sees it close at the end.
    lanes.dp.prepare()
    with sync_api.sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")), executable_path=str(CHROMIUM), headless=True,
            args=CHROMIUM_ARGS, viewport={"width": 1400, "height": 1000})
        # Generous: on a busy 2-core machine the first Plotly render alone can take several seconds.
        context.add_init_script(EVENTS)
        context.set_default_timeout(30_000)
        sync_api.expect.set_options(timeout=30_000)
        yield context
        context.close()


@pytest.fixture()
def page(server, browser_context):
    page = browser_context.new_page()
    page.goto(server, wait_until="domcontentloaded")
    page.locator("#sq-prompt textarea").wait_for()
    yield page
    page.close()


def _screenshot(page, tmp_path: Path, name: str) -> Path:
    path = tmp_path / f"{name}.png"
    page.screenshot(path=str(path), full_page=True, timeout=60_000)
    if os.environ.get("SEQUOIA_SCREENSHOTS"):
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, SCREENSHOTS / path.name)
    return path


def _decode(page, prompt: str, max_new: int, method: str | None = None) -> None:
    page.locator("#sq-prompt textarea").fill(prompt)
    box = page.get_by_label(re.compile(r"^max new tokens"))
    box.fill(str(max_new))
    box.press("Enter")
    if method:
        page.get_by_label("Method").first.click()
        page.get_by_role("option", name=method).click()
    _click_decode(page)


def _click_decode(page) -> None:
    """Decode, as a visitor clicks it: once the page is settled (:func:`_settled`)."""
    _settled(page)
    try:
        page.get_by_role("button", name="Decode", exact=True).click()
    except sync_api.TimeoutError as exc:
        # once, in a loaded run, the settled page's button was not found visible, enabled and stable for 30 s:
        # the machine's state then tells a starved or thrashing browser from a page that keeps moving its button
        raise AssertionError(f"Decode could not be clicked; the machine then: {machine_pressure()}") from exc


def machine_pressure() -> str:
    """This machine's load now, in one line: load average, memory available, and the kernel's pressure stall
    figures (the share of the last 10 s that some task waited for a core, memory or I/O)."""
    available = machine_available_bytes()
    words = [f"load {os.getloadavg()[0]:.2f}", f"{human(available) if available is not None else 'unknown'} available"]
    for kind in ("cpu", "memory", "io"):
        try:
            some = Path(f"/proc/pressure/{kind}").read_text().split()[1]     # "avg10=26.87"
            words.append(f"{kind} stalled {some.split('=')[1]}% of 10 s")
        except (OSError, IndexError):
            words.append(f"no {kind} pressure figures")
    renderers = []      # Chromium lowers some renderers' priority (nice 5) even with renderer backgrounding off
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if b"--type=renderer" in (stat.parent / "cmdline").read_bytes():
                fields = stat.read_text().rsplit(")", 1)[1].split()     # after the command's name: state, ...
                renderers.append(f"{fields[0]} nice {fields[16]}")
        except (OSError, IndexError):
            continue        # ended meanwhile
    return ", ".join(words + [f"Chromium renderers: {'; '.join(renderers) or 'none'}"])


def _settled(page, timeout_s: float = 60.0) -> None:
    """Wait until every event this page sent has answered (its load events, a field's own events), and none
    for 0.5 s (an event's chained events join just after it ends, within milliseconds on a quiet machine).

    Any status the page receives redraws every field's status, which wipes the validator's message beside a
    field: a refusal shown while the page's load events still ran vanished when they ended (under load, the
    DP explorer's first solve ended 1.3 s after a refused click, and the test waited 30 s on a blank page).
    Other visitors' events do not count; this page's own run does, so never call it while the test holds one.
    """
    try:
        page.wait_for_function("() => window.sqSettled(500)", timeout=timeout_s * 1000, polling=50)
    except sync_api.TimeoutError:
        pending = page.evaluate("window.sqEvents.tokens.filter(t => !t.done).map(t => t.fn)")
        raise AssertionError(f"the page's events {pending} (fn_index) had not answered after {timeout_s:g} s; "
                             f"the machine then: {machine_pressure()}")


def _settled_text(locator, quiet_s: float = 0.5, timeout_s: float = 10.0) -> str:
    """The element's text once it has stopped changing for ``quiet_s``: one update's outputs may render in
    separate browser frames (the summary before the generated text), so a text read as soon as the summary
    shows the run's end can be a frame early."""
    text, since, deadline = locator.text_content(), time.monotonic(), time.monotonic() + timeout_s
    while time.monotonic() - since < quiet_s and time.monotonic() < deadline:
        time.sleep(0.1)
        now = locator.text_content()
        if now != text:
            text, since = now, time.monotonic()
    return text


def _slow_steps(monkeypatch, delay_s: float, release: threading.Event | None = None,
                hold: threading.Event | None = None, hold_at: int = 0) -> SimpleNamespace:
    """Make every engine step take ``delay_s`` longer, and end the run early once ``release`` is set.  With
    ``hold``, step ``hold_at`` (the first by default) waits for it (at most 60 s): the test decides when it ends.

    Returns counters: ``steps`` taken, ``closed`` (True per run whose engine generator was closed) and
    ``most`` (the most runs of the engine at once).
    """
    runs, real = SimpleNamespace(steps=0, closed=[], running=0, most=0), live_tab.run_decode

    def slow(ctx, req, should_stop=None):
        gen = real(ctx, req, should_stop)
        runs.running += 1
        runs.most = max(runs.most, runs.running)
        try:
            for rec in gen:
                if hold is not None and rec.step == hold_at:
                    hold.wait(timeout=60)
                time.sleep(delay_s)
                runs.steps += 1
                yield rec
                if release is not None and release.is_set():
                    return
        finally:
            gen.close()
            runs.running -= 1
            runs.closed.append(gen.gi_frame is None)

    monkeypatch.setattr(live_tab, "run_decode", slow)
    return runs


def _wait_for(condition, timeout_s: float = 30.0, what: str = "timed out") -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


_BUSY = r"""() => document.querySelectorAll('.pending, .generating').length > 0
    || [...document.querySelectorAll('.progress-text, .eta-bar, .loader')].some(e => e.offsetParent !== null)"""


def _event_ended(page, timeout_s: float = 60, quiet_s: float = 0.3) -> None:
    """Once no output shows Gradio's progress, and none for ``quiet_s`` (an event's chained events start within
    milliseconds of it): call it after a state the event itself drew (then it was under way); nothing of that
    event or its chain can land after it returns (the state a "room for a stray frame" sleep waited for)."""
    deadline, idle_since = time.monotonic() + timeout_s, None
    while True:
        now = time.monotonic()
        if page.evaluate(_BUSY):
            idle_since = None
        elif idle_since is None:
            idle_since = now
        elif now - idle_since >= quiet_s:
            return
        assert now < deadline, f"the page was still busy after {timeout_s:g} s"
        time.sleep(0.05)


def test_machine_pressure_names_the_load_the_memory_and_each_stall():
    words = machine_pressure()
    assert re.match(r"load [\d.]+, [\d.]+ GB available, cpu ", words), words
    assert all(kind in words for kind in ("cpu", "memory", "io")), words


def test_live_decode_streams_text_and_draws_the_tree(page, tmp_path):
    _decode(page, "def add(a, b):", 12, method="Sequoia (budget & depth)")  # the default may draft nothing
    summary = page.locator("#sq-summary")
    sync_api.expect(summary).to_contain_text("12 tokens")
    sync_api.expect(summary).to_contain_text("finished: length")
    text = page.locator("#sq-text")
    sync_api.expect(text).to_contain_text("def add(a, b):")          # the prompt, greyed
    assert text.locator('span[title="draft token accepted by the target"]').count() >= 1
    assert text.locator('span[title="bonus token sampled from the target"]').count() >= 1
    tree_svg = page.locator("#sq-tree .js-plotly-plot svg.main-svg").first
    sync_api.expect(tree_svg).to_be_visible()
    sync_api.expect(page.locator("#sq-tree .gtitle")).to_contain_text("Sequoia")
    assert page.locator("#sq-tree .scatterlayer .point").count() >= 2  # root + drafted nodes
    sync_api.expect(page.locator("#sq-stats .js-plotly-plot")).to_be_visible()
    assert _screenshot(page, tmp_path, "live-decode").stat().st_size > 10_000


def test_the_inspector_explains_a_node_of_the_step(page, tmp_path):
    _decode(page, "def add(a, b):", 12, method="Sequoia (budget & depth)")
    sync_api.expect(page.locator("#sq-summary")).to_contain_text("finished: length")
    # The picker follows the step shown and preselects a node; its figure and plain-words text follow it.
    explain = page.locator("#sq-inspect-text")
    sync_api.expect(explain).to_contain_text("target")
    sync_api.expect(page.locator("#sq-inspect-plot .js-plotly-plot svg.main-svg").first).to_be_visible()
    assert page.locator("#sq-inspect-plot .barlayer .point").count() >= 1   # the bars of p (and q)
    assert _screenshot(page, tmp_path, "inspector").stat().st_size > 10_000


def test_errors_show_in_the_page_then_a_good_request_works(page, tmp_path):
    _decode(page, "   ", 8)
    sync_api.expect(page.get_by_text("prompt is empty").first).to_be_visible()
    _decode(page, "x" * 400, 200)  # prompt + 200 new tokens + tree do not fit the tiny target's 512 positions
    sync_api.expect(page.get_by_text("exceeds the target's context of 512").first).to_be_visible()
    _screenshot(page, tmp_path, "live-error")
    _decode(page, "def ok():", 6)
    sync_api.expect(page.locator("#sq-summary")).to_contain_text("6 tokens")


def test_stop_cancels_a_running_decode(page, tmp_path, monkeypatch):
    hold = threading.Event()
    runs = _slow_steps(monkeypatch, 0.0, hold=hold, hold_at=1)   # the run waits at its second step for Stop
    try:
        _decode(page, "while True:", 250, method="Target alone")
        summary = page.locator("#sq-summary")
        sync_api.expect(summary).to_contain_text("1 token in 1 target call")   # the first step on the page
        page.get_by_role("button", name="Stop", exact=True).click()
        sync_api.expect(summary).to_contain_text("Stopped", timeout=STOP_HANG_GUARD_S * 1000)
    finally:
        hold.set()
    _wait_for(lambda: runs.closed)
    assert runs.closed == [True]  # Gradio closed the handler, which closed the engine's generator
    assert runs.steps <= 3   # the held step, and at most the one under way when the run read Stop (unstopped: 250)
    sync_api.expect(summary).not_to_contain_text("finished")
    # issue 37: a later Stop says so in the summary, and the text shows every step done
    sync_api.expect(summary).to_contain_text(re.compile(r"Stopped after \d+ tokens?\b"))
    n = int(re.search(r"Stopped after (\d+) token", summary.text_content()).group(1))
    assert 0 < n <= runs.steps
    _screenshot(page, tmp_path, "live-stopped")


def test_the_dp_explorer_answers_while_another_client_decodes(page, server, monkeypatch):
    from gradio_client import Client

    release = threading.Event()
    runs = _slow_steps(monkeypatch, 0.1, release)
    job = Client(server, verbose=False, httpx_kwargs=CLIENT_TIMEOUT).submit(
        "while True:", "ar", 8, 3, 0.0, 1.0, 250, 0, api_name="/decode")
    try:
        _wait_for(lambda: runs.steps > 0)
        page.get_by_role("tab", name="DP explorer").click()
        page.get_by_label("p_1, p_2, … (editable)").fill("0.5, 0.2")
        page.get_by_role("button", name="Solve", exact=True).click()
        value = dp_tab.solve("0.5, 0.2", 128, 16).value(32, 8)  # at the tab's default sliders
        sync_api.expect(page.locator("#sq-dp-cell")).to_contain_text(f"{value:.3f} expected tokens/step")
        assert not job.done() and not runs.closed  # answered while the model was busy
    finally:
        release.set()
    _, steps = job.result(timeout=60)
    assert 0 < sum(len(s["new_tokens"]) for s in steps) < 250


def test_the_first_frame_arrives_before_the_first_step(page, monkeypatch):
    hold = threading.Event()
    runs = _slow_steps(monkeypatch, 0.0, hold=hold)  # the first step ends only once the test lets it
    _decode(page, "def first():", 2)
    try:
        sync_api.expect(page.locator("#sq-text")).to_contain_text("def first():")
        assert runs.steps == 0  # the prompt was on the page before any step was done
    finally:
        hold.set()
    sync_api.expect(page.locator("#sq-summary")).to_contain_text("2 tokens", timeout=30_000)


def test_typing_too_many_new_tokens_shows_the_cap(page):
    _decode(page, "def f():", 100000)
    sync_api.expect(page.get_by_text("cap of 256").first).to_be_visible()


def test_a_refusal_stays_under_decode_after_the_pages_other_events_answer(browser_context, tiny_app_pair,
                                                                           tmp_path, lanes, monkeypatch):
    """Gradio wipes the validator's message beside a field whenever any event of the page answers (the banner's
    poll, once a second while the models load or the profile measures; the page's first events): the line
    under Decode, drawn by the server, stays.  Here the DP explorer's first solve ends 4 s after the page opens,
    after the refused click."""
    from components.dp_explorer import dp_tab

    real, held, solved = dp_tab.on_solve, threading.Event(), []

    def slow(*args, **kwargs):
        held.wait(60)
        solved.append(real(*args, **kwargs))
        return solved[-1]

    monkeypatch.setattr(dp_tab, "on_solve", slow)
    demo = app.build_demo(tiny_app_pair, assets_dir=tmp_path, max_budget=24, lanes=lanes)
    url = serve_here(demo, css_paths=[app.CSS_PATH])
    page = browser_context.new_page()
    try:
        page.goto(url, wait_until="domcontentloaded")
        page.locator("#sq-prompt textarea").fill("def f():")
        box = page.locator(".sq-max-new input")
        box.fill("100000")
        box.press("Enter")
        page.get_by_role("button", name="Decode", exact=True).click()   # while the first solve is held
        line = page.locator("#sq-refused")
        sync_api.expect(line).to_contain_text("Not decoded: max new tokens 100000 is above this server's cap")
        held.set()
        _wait_for(lambda: solved)
        _settled(page)                                                   # the solve's answer reached the page
        sync_api.expect(line).to_contain_text("cap of 256")
        box.fill("4")
        box.press("Enter")
        _click_decode(page)
        sync_api.expect(page.locator("#sq-summary")).to_contain_text("4 tokens")
        sync_api.expect(line).to_be_hidden()                            # a taken request clears it
    finally:
        held.set()
        page.close()
        demo.close()


def test_too_many_new_tokens_are_refused_with_the_cap(server):
    from gradio_client import Client

    client = Client(server, verbose=False, httpx_kwargs=CLIENT_TIMEOUT)   # its start is not the refusal's time
    t0 = time.monotonic()
    with pytest.raises(Exception, match="cap of 256"):
        client.predict("x", "ar", 8, 3, 0.0, 1.0, 100000, 0, api_name="/decode")
    assert time.monotonic() - t0 < 5   # 150x a refusal before the queue (median 0.03 s, Xeon AMX), against a hang


@pytest.fixture(scope="module")
def long_server(tmp_path_factory, lanes):
    """The app on a tiny pair with 4,096 positions: room for a prompt longer than any tree."""
    from test_server import _long_context_model

    from conftest import app_pair

    target = _long_context_model()
    demo = app.build_demo(app_pair(target, target), assets_dir=tmp_path_factory.mktemp("assets-long"),
                          max_budget=24, lanes=lanes)
    url = serve_here(demo, css_paths=[app.CSS_PATH])
    yield url
    demo.close()


def test_a_long_prompt_decodes(long_server, browser_context):
    page = browser_context.new_page()
    try:
        page.goto(long_server, wait_until="domcontentloaded")
        page.locator("#sq-prompt textarea").wait_for()
        _decode(page, "a long prompt; " * 140, 4)  # ~2,100 tokens: more than the largest tree (1,024 nodes)
        sync_api.expect(page.locator("#sq-summary")).to_contain_text("4 tokens")
        assert page.get_by_text("draft nodes; the maximum is").count() == 0
    finally:
        page.close()


@pytest.mark.embedded
@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("SEQUOIA_SCREENSHOT"),
                    reason="set SEQUOIA_SCREENSHOT=1 to redraw docs/figures/live-tab.png on the embedded pair")
def test_readme_figure_the_live_tab_mid_decode(browser_context, monkeypatch, tmp_path, lanes):
    """The README's figure: the guided example on the embedded pair, caught while it decodes."""
    from sequoia.runtime.models import load_pair

    demo = app.build_demo(load_pair(), max_budget=32, lanes=lanes)
    url = serve_here(demo, css_paths=[app.CSS_PATH])
    runs = _slow_steps(monkeypatch, 1.5)  # hold each step on screen, so the page is caught mid-decode
    page = browser_context.new_page()
    try:
        page.goto(url, wait_until="domcontentloaded")
        page.locator("#sq-prompt textarea").wait_for()
        page.get_by_role("button", name=re.compile("Guided example")).click()
        _wait_for(lambda: runs.steps >= 4, timeout_s=600)
        sync_api.expect(page.locator("#sq-text")).to_contain_text("fizzbuzz")
        assert page.locator("#sq-tree .scatterlayer .point").count() >= 3
        page.wait_for_timeout(500)  # the last frame's layout
        shot = _screenshot(page, tmp_path, "live-tab")
        sync_api.expect(page.locator("#sq-summary")).not_to_contain_text("finished", timeout=1_000)
        README_FIGURE.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, README_FIGURE)
        page.get_by_role("button", name="Stop", exact=True).click()
    finally:
        page.close()
        demo.close()


# ------------------------------------------------------------------ one test per defect of issue 31
def _tree_step(page) -> int:
    """The step whose tree is on screen, from the tree's title ("step 11 · …")."""
    title = page.locator("#sq-tree .gtitle").first.text_content()
    return int(re.match(r"step (\d+)", title).group(1))


def test_the_ratio_is_measured_on_the_prompt_and_the_target_alone_is_1x(page):
    _decode(page, "def add(a, b):", 12, method="Chain")
    summary = page.locator("#sq-summary")
    sync_api.expect(summary).to_contain_text("finished: length")
    # no profile on this server: nothing to predict with, so the ratio waits for the measurement
    sync_api.expect(summary).to_contain_text("the latter measured on this prompt")
    sync_api.expect(summary).to_contain_text("tokens per target call at")
    _decode(page, "def add(a, b):", 12, method="Target alone")
    sync_api.expect(summary).to_contain_text("1.00× the target alone")
    assert "0." not in summary.text_content().split("× the target alone")[0][-6:]


def test_the_inspector_explains_the_selected_step_after_the_run(page):
    # The target alone's every step has one node, the bonus: the picker's value never changes between steps,
    # which is where the words used to stay on an early step.
    _decode(page, "def add(a, b):", 10, method="Target alone")
    sync_api.expect(page.locator("#sq-summary")).to_contain_text("finished: length")
    sync_api.expect(page.locator("#sq-tree .gtitle")).to_contain_text("step 9")
    last = _tree_step(page)
    sync_api.expect(page.locator("#sq-inspect-text")).to_contain_text(f"step {last} · bonus")
    sync_api.expect(page.locator("#sq-inspect-plot .gtitle")).to_contain_text(f"step {last} · bonus")
    sync_api.expect(page.locator("#sq-inspect-node input")).to_have_value(re.compile(r"^bonus"))


def test_a_refused_request_keeps_the_last_output_and_no_placeholder(page):
    _decode(page, "def ok():", 6)
    summary = page.locator("#sq-summary")
    sync_api.expect(summary).to_contain_text("6 tokens")
    before = _settled_text(page.locator("#sq-text"))
    _decode(page, "   ", 8)
    sync_api.expect(page.get_by_text("prompt is empty").first).to_be_visible()
    _decode(page, "def ok():", 5000)
    sync_api.expect(page.get_by_text("cap of 256").first).to_be_visible()
    _settled(page)   # a stray first frame would have come by the time every event of the page answered
    sync_api.expect(summary).to_contain_text("6 tokens")
    sync_api.expect(summary).not_to_contain_text("first step")
    assert page.locator("#sq-text").text_content() == before


def test_a_negative_temperature_is_refused_and_nothing_runs(page, monkeypatch):
    runs = _slow_steps(monkeypatch, 0.0)
    page.locator("#sq-prompt textarea").fill("def f():")
    box = page.locator("#sq-temperature input")
    box.fill("-1")
    box.press("Enter")
    _click_decode(page)
    sync_api.expect(page.get_by_text("temperature must be in 0..2").first).to_be_visible()
    _settled(page)   # a stray run would have started by the time every event of the page answered
    assert runs.steps == 0 and box.input_value() == "-1"     # not set to 0 behind the visitor's back
    sync_api.expect(page.locator("#sq-summary")).not_to_contain_text("first step")


def test_the_dp_figures_follow_the_vector_without_solve(page):
    page.get_by_role("tab", name="DP explorer").click()
    cell = page.locator("#sq-dp-cell")
    sync_api.expect(cell).to_contain_text("expected tokens/step")
    box = page.get_by_label("p_1, p_2, … (editable)")
    box.fill("0.6, 0.2")
    value = dp_tab.solve("0.6, 0.2", 128, 16).value(32, 8)
    sync_api.expect(cell).to_contain_text(f"{value:.3f} expected tokens/step")
    # the SGLang launch of the cell follows too: its command line and the two expectations side by side
    launch = best_launch((0.6, 0.2), 32, 8)
    command = page.locator("#sq-dp-sglang-command")
    sync_api.expect(command).to_contain_text(f"--speculative-num-draft-tokens {launch.args.num_draft_tokens}")
    sync_api.expect(command).to_contain_text("--speculative-algorithm STANDALONE")
    sync_api.expect(page.locator("#sq-dp-sglang")).to_contain_text(f"{launch.sequoia_tokens:.3f}")
    box.fill("0.9, 0.5")     # sums past 1: refused, the last good figures stay
    sync_api.expect(cell).to_contain_text("Cannot solve the DP")
    sync_api.expect(page.locator("#sq-dp-heat .js-plotly-plot")).to_be_visible()
    assert page.locator("#sq-dp-heat").get_by_text("Error", exact=True).count() == 0
    sync_api.expect(page.locator("#sq-dp-sglang")).to_contain_text("Cannot choose the SGLang launch")
    sync_api.expect(command).not_to_contain_text("--speculative")   # issue 42: no command it did not choose


@pytest.fixture(scope="module")
def tie_server(tmp_path_factory, tiny_target, lanes):
    """The app on a tiny target whose one-row and many-row forwards break a near-tie differently."""
    from test_exact_mode import near_tie

    from conftest import app_pair

    tied = near_tie(tiny_target)
    demo = app.build_demo(app_pair(tied, tied), assets_dir=tmp_path_factory.mktemp("assets-tie"), max_budget=24,
                          lanes=lanes)
    url = serve_here(demo, css_paths=[app.CSS_PATH])
    yield url
    demo.close()


def test_compare_reads_a_kernel_near_tie_as_identical(tie_server, browser_context):
    page = browser_context.new_page()
    try:
        page.goto(tie_server, wait_until="domcontentloaded")
        page.get_by_role("tab", name="Compare").click()
        box = page.get_by_label(re.compile(r"^max new tokens")).last
        box.fill("8")
        box.press("Enter")
        page.get_by_role("button", name="Run comparison", exact=True).click()
        notes = page.locator("#sq-compare-notes")
        sync_api.expect(notes).to_contain_text("Identical up to a kernel near-tie", timeout=120_000)
        sync_api.expect(page.locator("#sq-compare-table")).to_contain_text("identical up to a kernel near-tie at token")
        assert notes.get_by_text("Identical up to a kernel near-tie").count() == 1   # one explanation for all rows
        sync_api.expect(page.locator("#sq-compare-table")).not_to_contain_text("✗ differs")
    finally:
        page.close()


# ------------------------------------------------------------------ Compare, issue 37: a run a class can wait for
COMPARE_VIEWPORT = {"width": 1280, "height": 720}   # a laptop, or a projector's usual mode

#: (table root) -> one entry per header and cell whose text is clipped by its box or breaks inside a word: each
#: word's line boxes (a Range over it) must all sit on one line.
_BROKEN_CELLS_JS = """(root) => {
  const bad = [];
  for (const span of root.querySelectorAll("span.text")) {
    const text = span.textContent.trim();
    if (!text) continue;
    const broken = [];
    const walker = document.createTreeWalker(span, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      for (const m of node.data.matchAll(/\\S+/g)) {
        const range = document.createRange();
        range.setStart(node, m.index);
        range.setEnd(node, m.index + m[0].length);
        const tops = new Set([...range.getClientRects()].filter(r => r.width > 0).map(r => Math.round(r.top)));
        if (tops.size > 1) broken.push(m[0]);
      }
    }
    if (broken.length || span.scrollWidth > span.clientWidth + 1) bad.push(`${text}: ${broken.join(" ") || "clipped"}`);
  }
  return bad;
}"""
#: (table root) -> the rows its own scroll area hides (drawn outside the area's visible box), and the rows drawn.
_HIDDEN_ROWS_JS = """(root) => {
  const area = root.querySelector(".virtual-table-viewport").getBoundingClientRect();
  const rows = [...root.querySelectorAll(".virtual-row")];
  const hidden = rows.filter(r => { const b = r.getBoundingClientRect(); return b.top < area.top - 1 ||
                                    b.bottom > area.bottom + 1; }).map(r => r.textContent.trim().slice(0, 30));
  return {hidden, drawn: rows.length};
}"""
#: (plot root) -> pairs of texts of the figure (bar labels, tick labels, panel titles) whose boxes overlap.
_OVERLAPS_JS = """(root) => {
  const texts = [...root.querySelectorAll(".textpoint text, .ytick text, .xtick text, .annotation-text, .gtitle")]
    .map(e => [e.textContent, e.getBoundingClientRect()]).filter(([t, b]) => t && b.width > 0);
  const out = [];
  for (let i = 0; i < texts.length; i++)
    for (let j = i + 1; j < texts.length; j++) {
      const [a, p] = texts[i], [b, q] = texts[j];
      const w = Math.min(p.right, q.right) - Math.max(p.left, q.left);
      const h = Math.min(p.bottom, q.bottom) - Math.max(p.top, q.top);
      if (w > 1 && h > 1) out.push(`${a} / ${b}`);
    }
  return out;
}"""


@pytest.fixture(scope="module")
def compare_server(tiny_app_pair, tiny_target, tmp_path_factory, lanes):
    """The app with Compare's llama.cpp reference (the tiny target as a GGUF); ``gate`` holds its load."""
    pytest.importorskip("llama_cpp")
    from llamacpp_fixtures import write_tiny_gguf

    from sequoia.runners.llamacpp import LlamaCppOptions, load_llamacpp_runner

    gguf = write_tiny_gguf(tmp_path_factory.mktemp("ref") / "tiny-target.gguf", tiny_target)
    gate = threading.Event()
    gate.set()

    def loader(pair, progress):
        assert gate.wait(60)
        return load_llamacpp_runner(gguf, LlamaCppOptions(n_threads=1, n_ctx=512), name="tiny-target (f32)")

    demo = app.build_demo(tiny_app_pair, assets_dir=tmp_path_factory.mktemp("assets-ref"), max_budget=24,
                          lanes=lanes, reference_loader=loader)
    url = serve_here(demo, css_paths=[app.CSS_PATH])
    yield SimpleNamespace(url=url, gate=gate, ctx=demo.sequoia_context)
    demo.close()


@pytest.fixture()
def compare_page(compare_server, browser_context):
    page = browser_context.new_page()
    page.set_viewport_size(COMPARE_VIEWPORT)
    page.goto(compare_server.url, wait_until="domcontentloaded")
    page.get_by_role("tab", name="Compare").click()
    yield page
    page.close()


def _compare_rows(page) -> list[str]:
    return [c.strip() for c in page.locator("#sq-compare-table .virtual-row .first-column").all_text_contents()]


def _hold_a_row(monkeypatch, key: str, hold: threading.Event) -> None:
    """Compare's run of the method ``key`` (its API name) waits for ``hold`` before its first step."""
    real = compare_run.iter_run

    def held(engine, pair, method, *args):
        if method == key:
            assert hold.wait(60)
        return (yield from real(engine, pair, method, *args))

    monkeypatch.setattr(compare_run, "iter_run", held)


def test_compare_says_loading_apart_from_running_and_shows_rows_as_they_finish(compare_server, compare_page,
                                                                                monkeypatch):
    page, notes = compare_page, compare_page.locator("#sq-compare-notes")
    compare_server.ctx.extras.free("reference")   # its load is what this test watches
    compare_server.gate.clear()
    hold = threading.Event()
    _hold_a_row(monkeypatch, "sequoia", hold)
    try:
        page.get_by_role("button", name="Run comparison", exact=True).click()
        sync_api.expect(notes).to_contain_text("Loading the llama.cpp reference")
        assert " of " not in notes.text_content()               # loading is not "row 2 of 4"
        assert _compare_rows(page) == []                          # it loads in the warm-up round, before any timing
        compare_server.gate.set()
        sync_api.expect(notes).to_contain_text("Round 1 of 3: running Sequoia (budget & depth), 3 of 5")
        assert _compare_rows(page) == ["Target alone", "llama.cpp target alone"]
    finally:
        compare_server.gate.set()
        hold.set()
    sync_api.expect(notes).to_contain_text("Identical at T=0")
    assert _compare_rows(page) == ["Target alone", "llama.cpp target alone", "Sequoia (budget & depth)",
                                   "Sequoia (auto)", "Sequoia (dynamic)"]


def test_compare_full_run_reads_at_1280x720(compare_page, tmp_path):
    page = compare_page
    page.get_by_role("button", name=re.compile("^Full comparison")).click()
    sync_api.expect(page.locator("#sq-compare-notes")).to_contain_text("Identical at T=0", timeout=300_000)
    boxes = page.locator("#sq-compare-methods label")
    offered = [boxes.nth(i).text_content().strip() for i in range(boxes.count())]
    table = page.locator("#sq-compare-table")
    rows = _compare_rows(page)
    assert rows == [m for m in compare_tab.FULL_METHODS if m in offered]   # every method offered, named as its box
    assert "n-gram copies only" in rows and "Sequoia (dynamic)" in rows
    # ...and the default ticks and tokens are back for the next Run comparison (issue 51)
    tokens = page.get_by_label(re.compile(r"^max new tokens")).last
    sync_api.expect(tokens).to_have_value(str(compare_tab.DEFAULT_TOKENS))
    ticked = [boxes.nth(i).text_content().strip() for i in range(boxes.count())
              if boxes.nth(i).locator("input").is_checked()]
    assert ticked == [m for m in compare_tab.DEFAULT_METHODS if m in offered]
    page.wait_for_timeout(500)   # the last frame's layout
    assert table.evaluate(_BROKEN_CELLS_JS) == []                       # "toke ns", "laten cy (s)", "53.72 5"
    assert table.evaluate(_HIDDEN_ROWS_JS) == {"hidden": [], "drawn": len(rows)}
    plot = page.locator("#sq-compare-bars")
    assert plot.locator(".textpoint text").count() == 4 * len(rows)   # each bar's value, a text trace past its whisker
    assert plot.evaluate(_OVERLAPS_JS) == []
    _screenshot(page, tmp_path, "compare-full-1280x720")


# ------------------------------------------------------------------ one test per defect of issue 37
#: A hang guard, not the promise: Stop's handler first waits for the run's frame in flight (at most
#: run_flags.FRAME_WAIT_S, 2 s), and beside a CPU-bound job one settle took 3.4 s.  How fast Stop settles is
#: measured with its spread by scripts/page/stop_settle.py (medians 0.03-0.61 s, docs/data/stop-settle-xeon-amx.json).
STOP_SETTLE_BOUND_S = 10.0
#: Where a test holds the run until Stop has drawn, a late Stop cannot lose a race: the bound is a hang guard only
#: (in a loaded full run, a starved page once took over 10 s to show Stop's words).
STOP_HANG_GUARD_S = 60.0
#: The Live tab's outputs that Stop must leave settled.
OUTPUTS = ("#sq-text", "#sq-summary", "#sq-tree", "#sq-stats", "#sq-inspect-text", "#sq-inspect-plot")
_UNSETTLED = r"""(ids) => ids.flatMap(id => {
    const el = document.querySelector(id);
    if (!el) return [id + ": missing"];
    const shown = e => e.offsetParent !== null;
    const why = [];
    if ([...el.querySelectorAll('.progress-text, .eta-bar, .loader')].some(shown)) why.push(id + ": busy");
    if ([...el.querySelectorAll('.error')].some(shown) || /(^|\s)Error(\s|$)/.test(el.innerText)) why.push(id + ": error");
    if (/reading the prompt|first step…/.test(el.innerText)) why.push(id + ": waiting");
    return why;
})"""


def _unsettled(page) -> list[str]:
    """The outputs still drawn as busy (Gradio's progress), as an error, or as waiting for a first step."""
    return page.evaluate(_UNSETTLED, list(OUTPUTS))


def test_stop_in_the_first_step_settles_every_output_before_the_step_ends(page, tmp_path, monkeypatch):
    hold = threading.Event()
    runs = _slow_steps(monkeypatch, 0.05, hold=hold)   # the first step ends only once the test lets it
    summary = page.locator("#sq-summary")
    for attempt, method in enumerate(("Chain", "Target alone", "Sequoia (budget & depth)")):
        hold.clear()
        _decode(page, f"def first_{attempt}():", 200, method=method)
        try:
            sync_api.expect(summary).to_contain_text("reads the prompt" if method == "Target alone" else "first step")
            if method == "Target alone":   # it drafts nothing, and its first frame says nothing of drafting
                assert "draft" not in summary.text_content().lower()
            _wait_for(lambda: runs.running == 1)   # the run's handler is in its first step (not queued behind it)
            page.get_by_role("button", name="Stop", exact=True).click()
            _settles_within(page, STOP_SETTLE_BOUND_S)
            sync_api.expect(summary).to_contain_text("Stopped before the first step finished")
            sync_api.expect(page.locator("#sq-text")).to_contain_text(f"def first_{attempt}():")
            assert runs.steps == attempt   # the step in flight had not ended when the page settled
        finally:
            hold.set()                     # the step ends now
        _wait_for(lambda: len(runs.closed) == attempt + 1)   # and the engine stops there
        assert runs.steps == attempt + 1 and runs.closed[-1]
        _settled(page)                 # the run's events and those chained after it have answered
        assert not _unsettled(page)    # nothing the run did after Stop unsettled the page again
        sync_api.expect(summary).to_contain_text("Stopped before the first step finished")
    assert runs.most == 1              # never two runs of the model at once
    _screenshot(page, tmp_path, "live-stopped-first-step")
    runs = _slow_steps(monkeypatch, 0.0)
    _decode(page, "def ok():", 6)      # and the next run works
    sync_api.expect(summary).to_contain_text("6 tokens")


def _settles_within(page, seconds: float) -> float:
    """Seconds until every output is settled and the summary says the run stopped (fails past ``seconds``)."""
    summary, t0 = page.locator("#sq-summary"), time.monotonic()
    while (_unsettled(page) or "Stopped" not in summary.text_content()) and time.monotonic() - t0 < 2 * seconds:
        time.sleep(0.05)
    took = time.monotonic() - t0
    print(f"\nStop settled in {took:.2f} s", flush=True)
    assert took < seconds, f"still unsettled after {took:.1f} s: {_unsettled(page)}"
    return took


def test_stop_while_waiting_behind_another_decode_settles_and_the_run_never_starts(page, server, monkeypatch):
    from gradio_client import Client

    release = threading.Event()
    runs = _slow_steps(monkeypatch, 0.1, release)
    job = Client(server, verbose=False, httpx_kwargs=CLIENT_TIMEOUT).submit(
        "while True:", "ar", 8, 3, 0.0, 1.0, 250, 0, api_name="/decode")
    summary = page.locator("#sq-summary")
    try:
        _wait_for(lambda: runs.steps > 0)   # another visitor's decode holds the model
        _decode(page, "def queued():", 20)
        sync_api.expect(summary).to_contain_text("first step")
        page.get_by_role("button", name="Stop", exact=True).click()
        _settles_within(page, STOP_SETTLE_BOUND_S)
    finally:
        release.set()
    job.result(timeout=60)
    _event_ended(page)                      # the page's run, had it been left in the queue, would run to its end
    assert len(runs.closed) == 1            # the API's run only
    sync_api.expect(summary).to_contain_text("Stopped before the first step finished")
    # the stopped run's chained events (the inspector's picker) settle once it leaves the queue: seconds under a
    # full test run's load (seen once at 2 s), at once here
    _wait_for(lambda: not _unsettled(page), 20)


def test_out_of_range_inputs_are_refused_naming_the_field_and_nothing_runs(page, monkeypatch):
    _decode(page, "def ok():", 6)
    summary = page.locator("#sq-summary")
    sync_api.expect(summary).to_contain_text("6 tokens")
    before = _settled_text(page.locator("#sq-text"))
    runs = _slow_steps(monkeypatch, 0.0)
    for selector, value, message in (("#sq-temperature input", "5", "temperature must be in 0..2"),
                                     ("#sq-budget input", "100000", "budget 100000 is above this server's cap of 24"),
                                     ("#sq-depth input", "0", "depth must be a whole number in 1..64, got 0")):
        box = page.locator(selector)
        good = box.input_value()
        box.fill(value)
        box.press("Enter")
        _click_decode(page)
        sync_api.expect(page.get_by_text(message).first).to_be_visible()
        _settled(page)   # a stray run or frame would have come by the time every event of the page answered
        assert box.input_value() == value     # neither clamped nor reset behind the visitor's back
        assert runs.steps == 0
        sync_api.expect(summary).to_contain_text("6 tokens")
        assert page.locator("#sq-text").text_content() == before
        box.fill(good)
        box.press("Enter")


@pytest.mark.parametrize("width, height", [(1280, 720), (1440, 900)])
def test_the_guided_example_is_above_the_fold_and_its_output_in_view(page, width, height, tmp_path):
    page.set_viewport_size({"width": width, "height": height})
    page.evaluate("window.scrollTo(0, 0)")
    button = page.locator("#sq-guided")
    box = button.bounding_box()
    assert 0 <= box["y"] and box["y"] + box["height"] <= height, f"the button at y={box['y']:.0f} is below the fold"
    t0 = time.monotonic()
    button.click()
    text = page.locator("#sq-text")
    # The first frame soon: 5 s is over 10x the median measured (0.40 s, tiny pair, a busy
    # 2-vCPU Xeon with AMX); the page's promise on
    # the embedded pair is timed with its spread by scripts/page/page_wait.py (first_step_frame_s), not here.
    sync_api.expect(text).to_contain_text("fizzbuzz", timeout=5_000)
    took = time.monotonic() - t0
    print(f"\nthe guided example's first frame in {took:.2f} s", flush=True)
    assert took < 5.0
    sync_api.expect(page.locator("#sq-summary")).to_contain_text("finished", timeout=60_000)
    top = page.evaluate("document.getElementById('sq-text').getBoundingClientRect().top")
    _screenshot(page, tmp_path, f"guided-{width}x{height}")
    assert -2 <= top < height / 3, f"the output's top is at {top:.0f} px of {height}"
    _wait_for(lambda: page.locator("#sq-tree .scatterlayer .point").count() >= 3, 10)   # a tree, not a lone token


def test_the_tree_title_clears_its_badge(page):
    _decode(page, "def add(a, b):", 30, method="Sequoia (budget & depth)")
    sync_api.expect(page.locator("#sq-summary")).to_contain_text("finished: length")
    time.sleep(0.5)
    title = page.locator("#sq-tree .gtitle").first.bounding_box()
    badge = page.locator("#sq-tree").get_by_text("Speculated tree").first.bounding_box()
    assert title["height"] > 25          # two lines: the step cut by the length limit says why
    assert title["y"] >= badge["y"] + badge["height"] - 1, (title, badge)


def test_exact_mode_shows_its_first_frame_and_decodes(page):
    page.locator("#sq-prompt textarea").fill("def exact():")
    box = page.get_by_label(re.compile(r"^max new tokens"))
    box.fill("6")
    box.press("Enter")
    page.locator("#sq-exact").click()
    sync_api.expect(page.locator("#sq-text")).to_contain_text("def exact():")
    sync_api.expect(page.locator("#sq-summary")).to_contain_text("6 tokens", timeout=60_000)
    _wait_for(lambda: not _unsettled(page), 60)   # the inspector follows the run's end (a light event); a hang guard
