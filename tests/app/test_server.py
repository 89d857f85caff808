"""The server side on tiny random-weight models: long prompts, caps before the queue, cancellation of plain
API calls, the bounded light-work queue, the tree and SGLang exports and the ZeroGPU wrapper."""

import asyncio
import json
import os
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import gradio as gr
import pytest
import torch
from conftest import app_pair, make_pair
from transformers import Qwen2Config, Qwen2ForCausalLM

import app
from components.app_state import serving, validation
from components.app_state.acceptance_choice import DEFAULT_ACCEPTANCE_LABEL
from components.app_state.context import LIGHT_WORK, MODEL_WORK
from components.app_state.lanes import DP_LANE, LIGHT_NICE, LightLane
from components.app_state.memo import RequestMemo
from components.dp_explorer import dp_tab
from components.loopback import serve_here
from sequoia.core.config import CPU_CAPS, MAX_ACCEPTANCE_LEN, GenerationConfig, caps_for
from sequoia.core.trees.dp import optimal_tree
from sequoia.core.trees.tree import MAX_TREE_SIZE, Tree
from sequoia.runtime.engine import SpeculativeEngine
from sequoia.runtime.measuring import gpu_call
from sequoia.runtime.methods import make_method

CODE = DEFAULT_ACCEPTANCE_LABEL


# ------------------------------------------------------------------ long prompts
def _long_context_model(seed: int = 0):
    cfg = Qwen2Config(vocab_size=48, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                      tie_word_embeddings=False, initializer_range=0.3, attn_implementation="sdpa")
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(cfg).eval().float()


@torch.inference_mode()
def _plain_greedy(model, prompt: list[int], n: int) -> list[int]:
    ids = list(prompt)
    for _ in range(n):
        ids.append(int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt):]


def test_a_prompt_longer_than_any_tree_decodes_and_matches_the_target():
    target = _long_context_model()
    pair = make_pair(target, target, 48)
    prompt = [int(x) for x in torch.randint(1, 48, (2000,), generator=torch.Generator().manual_seed(3))]
    assert len(prompt) > MAX_TREE_SIZE  # the prefill used to be a chain-shaped tree, refused past 1024 nodes
    recs = list(SpeculativeEngine(pair).generate(prompt, make_method("chain", budget=4),
                                                 GenerationConfig(max_new_tokens=6)))
    out = [t for r in recs for t in r.new_tokens]
    assert out == _plain_greedy(target, prompt, 6)


# ------------------------------------------------------------------ caps and validation
def test_the_request_limits_are_derived_once_from_the_device(lanes):
    from components.app_state.context import GPU_MAX_BUDGET, server_limits

    gpu = server_limits("cuda:0")
    assert gpu.budget_cap == GPU_MAX_BUDGET and gpu.max_new_tokens == caps_for("cuda").max_new_tokens
    assert server_limits("cpu", 24).budget_cap == 24 and server_limits("cpu", 10 ** 6).budget_cap == MAX_TREE_SIZE
    demo = app.build_demo(lambda: None, device="cuda", lanes=lanes)   # the sliders are laid out before the pair loads
    assert demo.sequoia_context.limits == gpu and demo.sequoia_context.budget_cap() == GPU_MAX_BUDGET


def test_new_tokens_are_capped_by_device_with_a_message(ctx):
    assert caps_for("cpu") == CPU_CAPS and caps_for("cuda:0").max_new_tokens > CPU_CAPS.max_new_tokens
    with pytest.raises(ValueError, match=r"max new tokens 100000 .* cap of 256 per request on cpu"):
        validation.decode_request(ctx, "x", "chain", 4, 4, 0.0, 1.0, 100000, 0)
    with pytest.raises(ValueError, match="cap of 256"):
        validation.decode_request(ctx, "x", "chain", 4, 4, 0.0, 1.0, 257, 0)
    assert validation.decode_request(ctx, "x", "chain", 4, 4, 0.0, 1.0, 256, 0).config.max_new_tokens == 256
    with pytest.raises(ValueError, match="prompt has 5000 tokens; this server takes at most 4096"):
        validation.decode_request(ctx, "x" * 5000, "chain", 4, 4, 0.0, 1.0, 8, 0, chat=False)


def test_acceptance_vectors_and_dp_work_are_capped(lanes):
    long = ", ".join(["0.001"] * (MAX_ACCEPTANCE_LEN + 1))
    with pytest.raises(gr.Error, match=f"has {MAX_ACCEPTANCE_LEN + 1} entries; the maximum is {MAX_ACCEPTANCE_LEN}"):
        dp_tab.dp_api_fn(lanes)(long, 32, 8)
    wide = ", ".join(["0.01"] * MAX_ACCEPTANCE_LEN)
    with pytest.raises(gr.Error, match="more DP work than this server allows"):
        dp_tab.dp_api_fn(lanes)(wide, 1024, 64)
    with pytest.raises(ValueError, match="maximum is 64"):
        validation.check_dp_request(lanes.dp_requests, long, 8, 4)


def test_dp_reply_is_a_summary_not_the_table(lanes):
    out = dp_tab.dp_api_fn(lanes)("0.8, 0.1, 0.05", 1024, 16)
    assert len(json.dumps(out)) < 100_000  # the whole table was 1.1 MB at budget 1024, depth 64
    assert "table" not in out and len(out["value_by_size"]) == 1025
    assert out["value"] == pytest.approx(out["value_by_size"][-1], rel=1e-5)
    tree = Tree.from_dict(out["tree"])
    assert tree.size <= 1024 and out["sglang"]["speculative_num_draft_tokens"] - 1 <= 1024
    assert out["sglang"]["sequoia_expected_tokens"] >= out["sglang"]["expected_tokens"] - 1e-9


def test_validators_refuse_bad_requests_with_the_handlers_message(ctx, demo):
    checks = validation.validators(ctx)
    def invalid(answers):  # the inputs refused
        return [i for i, v in enumerate(answers) if not v["is_valid"]]

    bad = checks["decode"]("hi", "chain", 4, 4, 0.0, 1.0, 100000, 0, True, "")
    assert invalid(bad) == [6] and bad[6]["message"].startswith("max new tokens") and "cap of 256" in bad[6]["message"]
    assert all(v["is_valid"] for v in checks["decode"]("hi", "chain", 4, 4, 0.0, 1.0, 8, 0, True, "0.8"))
    assert invalid(checks["decode_stream"]("  ", "Chain", 4, 4, 0.0, 1.0, 8, 0, CODE, True)) == [0]
    assert invalid(checks["compare"]("x", 500, 4, 0.0, 1.0, 8, 0, False)) == [1]  # above the budget cap
    assert invalid(checks["dp"]("0.9, 0.9", 8, 3)) == [0]
    guarded = {fn.api_name for fn in demo.fns.values() if fn.validator is not None}
    assert invalid(checks["compare_stream"]("x", 8, 3, 0.0, 1.0, 100000, 0, CODE, True, False)) == [5]
    assert {"decode", "decode_stream", "compare", "compare_stream", "compare_full", "dp"} <= guarded


#: Issue 37: inputs the page used to clamp and run, each refused naming its field (index in /decode's inputs).
OUT_OF_RANGE = [("temperature", 4, 5.0, "temperature must be in 0..2"),
                ("budget", 2, 100000, "budget 100000 is above this server's cap of 24"),
                ("depth", 3, 0, "depth must be a whole number in 1..64, got 0")]


def test_out_of_range_inputs_are_refused_naming_the_field(ctx):
    checks = validation.validators(ctx)
    for _, i, value, message in OUT_OF_RANGE:
        api = ["hi", "chain", 4, 4, 0.6, 1.0, 8, 0, True, ""]
        api[i] = value
        answers = checks["decode"](*api)
        assert [j for j, v in enumerate(answers) if not v["is_valid"]] == [i] and answers[i]["message"].startswith(message)
        page = ["hi", "Chain", 4, 4, 0.6, 1.0, 8, 0, CODE, True]
        page[i] = value
        answers = checks["decode_stream"](*page)
        assert [j for j, v in enumerate(answers) if not v["is_valid"]] == [i] and answers[i]["message"].startswith(message)
    assert all(v["is_valid"] for v in checks["decode"]("hi", "chain", 4, 4, 2.0, 1.0, 8, 0, True, ""))  # the page's max


def test_the_decode_api_refuses_out_of_range_inputs_before_anything_runs(tiny_app_pair, tmp_path, lanes, monkeypatch):
    from gradio_client import Client

    from components.live import live_tab

    runs = []
    monkeypatch.setattr(live_tab, "run_decode", lambda *a, **k: runs.append(1) or iter(()))
    demo = app.build_demo(tiny_app_pair, assets_dir=tmp_path, max_budget=24, lanes=lanes)
    url = serve_here(demo)
    try:
        client = Client(url, verbose=False)
        for name, i, value, message in OUT_OF_RANGE:
            args = ["hi", "chain", 4, 4, 0.6, 1.0, 8, 0, True, ""]
            args[i] = value
            with pytest.raises(Exception, match=f"{name}: {message}"):
                client.predict(*args, api_name="/decode")
        assert runs == []
    finally:
        demo.close()


def test_server_wide_profile_is_refused_without_the_owner_switch(ctx):
    from components.hardware import hardware_tab

    assert not ctx.owner  # build_demo's default; main() sets it from SEQUOIA_OWNER=1
    with pytest.raises(ValueError, match="SEQUOIA_OWNER=1"):
        hardware_tab.profile_now(ctx, True)  # the handler itself refuses, whatever the page shows


def test_light_work_is_one_bounded_group_apart_from_the_model():
    assert LIGHT_WORK["concurrency_id"] == "light" != MODEL_WORK["concurrency_id"]
    assert 1 <= LIGHT_WORK["concurrency_limit"] <= 4


# ------------------------------------------------------------------ cancellation
def test_run_cancellable_stops_the_work_and_waits_for_it():
    steps, finished = [], threading.Event()

    def work(stop):
        while not stop.is_set():
            steps.append(1)
            time.sleep(0.01)
        time.sleep(0.05)  # the last step finishing
        finished.set()
        return len(steps)

    async def main():
        task = asyncio.ensure_future(serving.run_cancellable(work))
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return finished.is_set()

    assert asyncio.run(main())  # the awaiting task ended only after the work had stopped
    n = len(steps)
    time.sleep(0.1)
    assert len(steps) == n


class _Meter:
    """Counts the target's forwards and the most that ever ran at once; each forward sleeps a little so a
    decode of a tiny model lasts seconds."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s, self.calls, self.active, self.most = delay_s, 0, 0, 0
        self.lock = threading.Lock()

    def pre(self, *_):
        with self.lock:
            self.calls += 1
            self.active += 1
            self.most = max(self.most, self.active)
        time.sleep(self.delay_s)

    def post(self, *_):
        with self.lock:
            self.active -= 1


@pytest.mark.slow
def test_cancelled_api_decodes_stop_and_never_overlap(tmp_path, lanes):
    from conftest import tiny_model
    from gradio_client import Client
    from gradio_client.exceptions import AppError

    target = tiny_model(11)
    meter = _Meter(delay_s=0.02)
    target.register_forward_pre_hook(meter.pre)
    target.register_forward_hook(meter.post)
    demo = app.build_demo(app_pair(target, target), assets_dir=tmp_path, max_budget=24, lanes=lanes)
    url = serve_here(demo)
    try:
        client = Client(url, verbose=False)
        args = ("hello", "ar", 4, 4, 0.0, 1.0, 200, 0, True, "")
        job = client.submit(*args, api_name="/decode")
        deadline = time.monotonic() + 30
        while meter.calls < 5 and time.monotonic() < deadline:
            time.sleep(0.02)
        # A bad request is refused at once, while the model is busy: the 200-token decode (>= 4 s of metered
        # forwards) is still running when the refusal comes back, so it did not wait its turn in the queue.
        with pytest.raises((AppError, ValueError, Exception), match="cap of 256"):
            client.predict("hi", "ar", 4, 4, 0.0, 1.0, 100000, 0, True, "", api_name="/decode")
        assert not job.done() and meter.calls < 200
        job.cancel()
        time.sleep(0.3)
        n = meter.calls
        time.sleep(0.5)
        assert meter.calls == n < 150  # the engine stopped instead of computing on to 200 tokens
        # Submitting and cancelling does not run decodes side by side.
        for _ in range(3):
            j = client.submit(*args, api_name="/decode")
            time.sleep(0.2)
            j.cancel()
        text, steps = client.predict("hi", "ar", 4, 4, 0.0, 1.0, 5, 0, True, "", api_name="/decode")
        assert sum(len(s["new_tokens"]) for s in steps) == 5
        assert meter.most == 1
    finally:
        demo.close()


# ------------------------------------------------------------------ rank paths
@pytest.mark.parametrize("tree", [
    Tree.root_only(), Tree.chain(5), Tree.k_ary(2, 3), Tree.specinfer(3, 4),
    optimal_tree([0.6, 0.2, 0.1, 0.05], 40, 6).tree(), optimal_tree([0.8, 0.1], 128, 16).tree(),
], ids=["root", "chain", "binary", "specinfer", "dp40", "dp128"])
def test_rank_paths_round_trip_to_the_same_parents(tree):
    paths = tree.rank_paths()[1:]
    assert len(paths) == tree.size and paths == sorted(paths, key=lambda t: (len(t), t))
    assert Tree.from_rank_paths(paths).parents == tree.parents
    assert Tree.from_rank_paths(str(paths)).parents == tree.parents


def test_rank_paths_refuse_what_is_not_a_tree():
    assert Tree((-1, 0, 0, 1)).rank_paths() == [(), (0,), (1,), (0, 0)]
    with pytest.raises(ValueError, match="no parent or no older sibling"):
        Tree.from_rank_paths([(0,), (0, 1)])
    with pytest.raises(ValueError, match="sorted"):
        Tree.from_rank_paths([(0, 0), (0,)])


# ------------------------------------------------------------------ ZeroGPU
def test_zerogpu_wraps_model_work_only_where_spaces_says_so(monkeypatch):
    def work(stop, n):
        return n * 2

    monkeypatch.setattr(serving, "spaces", None)
    assert not serving.zerogpu() and serving.on_gpu(work, lambda *a: 60) is work
    asked = []

    def gpu(duration):
        def wrap(fn):
            def run(*args):
                asked.append(duration(*args))
                return fn(*args)
            return run
        return wrap

    fake = SimpleNamespace(config=SimpleNamespace(Config=SimpleNamespace(zero_gpu=True)), GPU=gpu)
    monkeypatch.setattr(serving, "spaces", fake)
    wrapped = serving.on_gpu(work, lambda stop, n: serving.gpu_seconds(n))
    assert serving.zerogpu() and wrapped(None, 100) == 200
    # priced with the H100's graph replays (no profile of this card): the 20 s floor, then growing with the tokens
    assert asked == [serving.gpu_seconds(100)] and serving.gpu_seconds(100) < serving.gpu_seconds(2000)
    assert serving.gpu_seconds(10 ** 6) == gpu_call.MAX_S


# ------------------------------------------------------------------ the load test script
def test_load_test_refuses_other_hosts_and_draws_valid_dp_requests(monkeypatch):
    import importlib.util

    import numpy as np

    path = Path(__file__).resolve().parents[2] / "scripts" / "page" / "load_test.py"
    spec = importlib.util.spec_from_file_location("load_test", path)
    load_test = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "load_test", load_test)  # its dataclasses look their module up there
    spec.loader.exec_module(load_test)
    with pytest.raises(SystemExit, match="only runs against 127.0.0.1"):
        load_test.run_load("http://example.com:7860", 1, 1, 1.0, 1.0, 4, None)
    rng = np.random.default_rng(0)
    for _ in range(20):
        vec, budget, depth = load_test.random_dp_args(rng)
        validation.check_dp_request(RequestMemo(1), vec, budget, depth)  # every drawn request is one the server accepts
    # --mixed: the decode clients alone, then beside the DP clients; the slowdown is the ratio of the p50s
    phases = []

    def fake_run_load(url, dp_clients, decode_clients, *rest):
        phases.append((dp_clients, decode_clients))
        return {"endpoints": {"/decode": {"p50_s": 2.0 if dp_clients else 1.0}}}

    monkeypatch.setattr(load_test, "run_load", fake_run_load)
    report = load_test.run_mixed("http://127.0.0.1:1", 8, 3, 1.0, 1.0, 4, None)
    assert phases == [(0, 3), (8, 3)] and report["slowdown"] == 2.0
    assert report["reference_issue_24"]["slowdown"] == 2.9 and "cores" in report["machine"]


def test_cli_tree_writes_the_sglang_launch(tmp_path, capsys):
    from sequoia.core.profiles.acceptance import AcceptanceVector
    from sequoia.core.trees.sglang_family import best_launch
    from sequoia.tools.cli import main

    vector = sorted((Path(__file__).resolve().parents[2] / "assets" / "acceptance").glob("embedded-*.json"))[0]
    out = tmp_path / "sglang.json"
    assert main(["tree", "--acceptance", str(vector), "--budget", "12", "--depth", "4", "--out", str(out),
                 "--format", "sglang", "--target", "some/target", "--draft", "some/drafter"]) == 0
    cfg = json.loads(out.read_text())
    want = best_launch(AcceptanceVector.load(vector).values, 12, 4)
    assert cfg["format"] == "sequoia-sglang/1" and cfg["speculative_num_draft_tokens"] == want.args.num_draft_tokens
    assert cfg["expected_tokens"] == pytest.approx(want.family.expected_tokens)
    assert cfg["sequoia_expected_tokens"] == pytest.approx(want.sequoia_tokens)
    assert Tree.from_dict(cfg["tree"]) == want.family.tree
    command = want.args.command_line("some/target", "some/drafter")
    assert cfg["command"] == command and command in capsys.readouterr().out
    assert main(["tree", "--acceptance", str(vector), "--out", str(out), "--format", "sglang",
                 "--profile", str(out)]) == 2      # this machine's profile does not price an SGLang server


def test_light_work_runs_on_one_low_priority_thread():
    import os
    import threading

    light = LightLane()
    seen = [light.run(lambda: (threading.get_native_id(), threading.current_thread().name)) for _ in range(3)]
    assert len(set(seen)) == 1 and seen[0][1].startswith("sequoia-light")   # one worker, reused
    assert seen[0][0] != threading.get_native_id()
    with pytest.raises(ZeroDivisionError):   # an error in light work reaches the handler
        light.run(lambda: 1 / 0)
    if not hasattr(os, "getpriority"):
        pytest.skip("no per-thread priority on this OS: the light thread runs at plain priority")
    nice = light.run(lambda: os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
    if not light.priority.startswith("nice"):   # the lane says why it could not (e.g. already niced past 19)
        pytest.skip(f"this process may not lower a thread's priority: {light.priority}")
    assert light.priority == f"nice {LIGHT_NICE}" and nice == LIGHT_NICE


def test_dp_work_runs_in_its_own_low_priority_process(lanes):
    """Issue 24: /dp solves on a thread of the server held the GIL its decodes need; they run in a child process
    (own GIL, nice 19) where fork exists, and a failure there still reaches the handler."""
    import os

    if DP_LANE != "process":
        pytest.skip("no fork on this platform: DP work runs on the light-work thread")
    assert lanes.dp.run(os.getpid) != os.getpid()
    assert lanes.dp.run(os.nice, 0) >= min(LIGHT_NICE, os.nice(0) + LIGHT_NICE)
    with pytest.raises(ZeroDivisionError):
        lanes.dp.run(divmod, 1, 0)
    out = dp_tab.dp_api_fn(lanes)("0.8, 0.1", 16, 4)
    assert out == dp_tab.dp_api_fn(lanes)("0.8, 0.1", 16, 4) and out["budget"] == 16   # the second from the cache


@pytest.mark.slow
def test_the_dp_process_ends_with_the_server(tmp_path):
    """A forked child keeps the server's pipes (and a socket opened before the fork) open; it must exit when
    the server dies however it dies, or it holds the port (seen with the load test's tiny server)."""
    import os
    import subprocess

    if DP_LANE != "process":
        pytest.skip("no fork on this platform")
    root = Path(__file__).resolve().parents[2]
    code = ("import os, sys\nsys.path.insert(0, %r)\nfrom components.app_state.lanes import WorkLanes\n"
            "print(WorkLanes().dp.run(os.getpid), flush=True)\nos._exit(0)\n" % str(root))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    child = int(out.stdout.split()[-1])
    for _ in range(50):
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    raise AssertionError(f"the DP process {child} outlived the server")


def test_zerogpu_serves_on_hf_without_graphs_and_refuses_llamacpp_with_the_reason():
    import app

    env = app.zerogpu_env({"SEQUOIA_DEVICE": "cuda"})
    assert env["SEQUOIA_BACKEND"] == "hf" and env["SEQUOIA_GRAPHS"] == "0" and app.graphs_from_env(env) is False
    assert app.offload_from_env(env) is False and app.zerogpu_env({"SEQUOIA_OFFLOAD": "1"})["SEQUOIA_OFFLOAD"] == "1"
    assert app.zerogpu_env({"SEQUOIA_BACKEND": "HF"})["SEQUOIA_BACKEND"] == "hf"
    for named in ("llamacpp", "mixed"):
        with pytest.raises(ValueError, match=f"SEQUOIA_BACKEND='{named}' cannot serve on ZeroGPU.*forked"):
            app.zerogpu_env({"SEQUOIA_BACKEND": named})


def test_the_standin_is_installed_only_when_asked(monkeypatch):
    monkeypatch.setattr(serving, "spaces", None)
    assert serving.install_standin({}) is None and serving.spaces is None
    standin = serving.install_standin({serving.STANDIN_ENV: "1"})
    assert isinstance(standin, serving.ZeroGPUStandIn) and serving.spaces is standin and serving.zerogpu()


def test_a_standin_call_past_its_duration_is_aborted_and_its_errors_come_back():
    import time as clock

    standin = serving.ZeroGPUStandIn()

    @standin.GPU(duration=1)
    def slow():
        clock.sleep(30)

    with pytest.raises(serving.GPUTaskAborted, match="ran past its 1 s"):
        slow()
    # killed at its 1 s, not after the 30 s it asked for: 10 s is 10x the 1.0 s it measures, still under 30 s
    assert standin.calls[-1].outcome == "aborted" and standin.calls[-1].seconds < 10

    @standin.GPU(duration=lambda n: 10)
    def fails(n):
        raise ValueError(f"bad n: {n}")

    with pytest.raises(ValueError, match="bad n: 3"):
        fails(3)

    @standin.GPU(duration=10)
    def counts(n):
        yield from range(n)

    assert list(counts(3)) == [0, 1, 2] and standin.calls[-1].outcome == "returned"
    assert not serving.in_gpu_call()


def test_a_standin_call_runs_parallel_torch_after_its_thread_did(full_threads):
    """A thread that ran a parallel torch op before it forks (a server thread that served another page in the
    same process) must not hang the call's own parallel op: GNU OpenMP's pool does not survive a fork.  With
    the machine's threads: on one thread no op runs in parallel, and nothing can hang."""
    import threading

    standin, x = serving.ZeroGPUStandIn(), torch.randn(1024, 1024)

    @standin.GPU(duration=60)   # ~0.1 s here: 60 s only tells a hang (killed, "aborted") from a slow machine
    def product():
        return float((x @ x).sum())

    outcome = []

    def serve() -> None:
        x @ x                   # this thread now has an OpenMP pool of its own
        try:
            outcome.append(product())
        except serving.GPUTaskAborted as exc:
            outcome.append(exc)

    thread = threading.Thread(target=serve)
    thread.start()
    thread.join()
    assert outcome == [pytest.approx(float((x @ x).sum()), rel=1e-4)], standin.calls[-1]



def test_a_running_standin_call_prints_its_stacks_when_asked(capfd, tmp_path):
    import signal
    import threading

    standin, under_way = serving.ZeroGPUStandIn(), tmp_path / "under-way"

    @standin.GPU(duration=60)
    def stalls_here():
        under_way.touch()
        while True:
            time.sleep(0.05)

    ended = []

    def call() -> None:
        try:
            stalls_here()
        except RuntimeError as exc:      # its process killed below: "ended with exit code -9"
            ended.append(exc)

    caller = threading.Thread(target=call, daemon=True)
    caller.start()
    deadline = time.monotonic() + 30
    while not under_way.exists():
        assert time.monotonic() < deadline, "the call never started"
        time.sleep(0.05)
    pid = standin.calls[-1].pid
    assert standin.dump_running() == [pid]
    said, deadline = "", time.monotonic() + 30
    while "stalls_here" not in said:     # the process writes its stacks to the stderr it shares with this one
        assert time.monotonic() < deadline, f"no stack printed: {said!r}"
        time.sleep(0.05)
        said += capfd.readouterr().err
    os.kill(pid, signal.SIGKILL)
    caller.join(30)
    assert ended and standin.calls[-1].outcome != "running"
