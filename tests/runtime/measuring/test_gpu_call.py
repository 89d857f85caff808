"""sequoia.runtime.measuring.gpu_call: a ZeroGPU call's duration from the profile, and when capturing graphs in it pays."""

from __future__ import annotations

import importlib
import sys
from types import SimpleNamespace

import pytest

from sequoia.core.profiles.profile import HardwareProfile
from sequoia.runtime.measuring import gpu_call
from sequoia.runtime.measuring.finder import DEFAULT_ENTRY


def _profile(step_ms: float = 20.0) -> HardwareProfile:
    """A launch-bound card: every forward costs about ``step_ms / 2`` whatever its width (eager on a GPU)."""
    half = step_ms / 2
    return HardwareProfile(device="test GPU (eager)", dtype="torch.bfloat16", context_len=128,
                           target_n=(1, 2, 4, 8, 16, 32, 64, 128), target_ms=(half,) * 7 + (half * 1.2,),
                           draft_width=(1, 2, 4, 8, 16, 32, 64), draft_ms=(half * 0.8,) * 7)


def test_capture_pays_when_the_steps_save_more_than_the_captures_cost():
    assert gpu_call.capture_pays(steps=1000, eager_step_s=0.02, graph_step_s=0.005, graphs=4, capture_s=0.5)
    assert not gpu_call.capture_pays(steps=10, eager_step_s=0.02, graph_step_s=0.005, graphs=4, capture_s=0.5)
    assert not gpu_call.capture_pays(steps=0, eager_step_s=0.02, graph_step_s=0.005, graphs=1, capture_s=0.0)
    with pytest.raises(ValueError, match="non-negative"):
        gpu_call.capture_pays(steps=-1, eager_step_s=0.02, graph_step_s=0.005, graphs=1, capture_s=0.5)


def test_graphs_needed_counts_buckets_and_windows():
    # widths 1, 2, 3 -> buckets 1, 2, 4; the verify forward of 7 rows -> bucket 8; one window (256)
    assert gpu_call.graphs_needed((1, 2, 3), 7, context=100, new_tokens=50) == 4
    # a call's runners attend to at least 1,024 keys: one window up to there, then one more each doubling
    assert gpu_call.graphs_needed((1, 2, 3), 7, context=200, new_tokens=100) == 4
    assert gpu_call.graphs_needed((1, 2, 3), 7, context=1000, new_tokens=100) == 8
    # the graph runner's own windows start at 256: crossing 256 doubles them
    assert gpu_call.graphs_needed((1, 2, 3), 7, context=200, new_tokens=100, min_window=256) == 8
    assert gpu_call.graphs_needed((), 1, context=10, new_tokens=10) == 1       # the target alone


def test_plan_grows_with_the_request_and_captures_only_when_it_pays():
    prof = _profile()
    short = gpu_call.plan_call(8, prof, DEFAULT_ENTRY.values)
    long = gpu_call.plan_call(2048, prof, DEFAULT_ENTRY.values)
    assert not short.capture and long.capture                # a short call cannot pay for its captures
    assert gpu_call.MIN_S <= short.duration_s <= long.duration_s <= gpu_call.MAX_S
    assert "not measured" in long.reason and long.steps > short.steps > 0
    measured = gpu_call.CaptureCost(0.01, True, "measured")
    assert gpu_call.plan_call(64, prof, DEFAULT_ENTRY.values, capture=measured).capture
    slow = gpu_call.CaptureCost(1e3, True, "measured")
    assert not gpu_call.plan_call(2048, prof, DEFAULT_ENTRY.values, capture=slow).capture
    assert gpu_call.plan_call(10 ** 6, prof, DEFAULT_ENTRY.values).duration_s == gpu_call.MAX_S


def test_without_a_profile_the_flat_rate_applies():
    plan = gpu_call.plan_call(100, None, DEFAULT_ENTRY.values, n_runs=2)
    assert not plan.capture and plan.duration_s == int(gpu_call.FLAT_BASE_S + gpu_call.PER_TOKEN_S * 200)
    with pytest.raises(ValueError, match="new_tokens"):
        gpu_call.plan_call(-1, None, DEFAULT_ENTRY.values)


def test_the_apps_duration_is_priced_by_the_profile():
    from components.app_state import serving

    assert serving.gpu_seconds(2048, profile=_profile(40.0)) > serving.gpu_seconds(2048, profile=_profile(10.0))
    assert serving.gpu_seconds("not a number") == gpu_call.MIN_S


def test_spaces_decorator_passes_through_outside_spaces(monkeypatch):
    """With the real ``spaces`` package when installed, else a stub of its documented behaviour."""
    monkeypatch.delenv("SPACES_ZERO_GPU", raising=False)
    try:
        spaces = importlib.import_module("spaces")
    except ImportError:
        spaces = SimpleNamespace(GPU=lambda duration=None: (lambda fn: fn),
                                 config=SimpleNamespace(Config=SimpleNamespace(zero_gpu=False)))
        monkeypatch.setitem(sys.modules, "spaces", spaces)

    def work(n):
        return n + 1

    assert spaces.GPU(duration=lambda n: 30)(work)(1) == 2
    from components.app_state import serving

    monkeypatch.setattr(serving, "spaces", spaces)
    assert not serving.zerogpu() and serving.on_gpu(work, lambda n: 30) is work


def test_the_duration_covers_the_target_alone_too():
    prof = _profile(20.0)          # the target alone: 10 ms a token here
    plan = gpu_call.plan_call(1000, prof, DEFAULT_ENTRY.values, capture=gpu_call.CaptureCost(1e3, True, "slow"))
    alone_s = 1000 * 0.010
    assert not plan.capture and plan.eager_s < alone_s       # the tree is faster per token, yet the call is
    assert plan.duration_s >= gpu_call.BASE_S + gpu_call.MARGIN * alone_s   # long enough for the target alone
    assert "target alone" in plan.reason


def test_the_duration_covers_the_requests_own_tree_on_an_arithmetic_bound_machine():
    """A CPU's verify forward costs about its width in one-token forwards (the AVX2 Zen 3's 16 tokens: 11x one):
    a page's fixed tree of 12 tokens then costs far more a token than the tree the profile would choose, and
    the call must last for it (the stand-in's first decode on the embedded pair was cut at 20 s for 18 s)."""
    cpu = HardwareProfile(device="cpu (test)", dtype="torch.bfloat16", context_len=128,
                          target_n=(1, 2, 4, 8, 16, 32), target_ms=(233.0, 400.0, 700.0, 1300.0, 2605.0, 5200.0),
                          draft_width=(1, 2, 4, 8, 16), draft_ms=(72.0, 120.0, 220.0, 420.0, 800.0))
    own = gpu_call.plan_call(16, cpu, DEFAULT_ENTRY.values)
    asked = gpu_call.plan_call(16, cpu, DEFAULT_ENTRY.values, tree=(12, 5))
    assert asked.duration_s > own.duration_s
    assert "request's own tree" in asked.reason
    # on a launch-bound card the same fixed tree costs about a one-token step: no longer than the target alone's
    gpu = _profile()
    assert gpu_call.plan_call(16, gpu, DEFAULT_ENTRY.values, tree=(12, 5)).duration_s <= \
        gpu_call.plan_call(16, gpu, DEFAULT_ENTRY.values).duration_s + 1


def test_a_capture_is_priced_in_eager_forwards_and_says_it_is_not_measured():
    prof = _profile(20.0)
    cost = gpu_call.estimated_capture(prof)
    assert cost.per_graph_s == pytest.approx(gpu_call.CAPTURE_FORWARDS * 10.0 / 1e3) and not cost.measured
    assert "not measured" in cost.source


def test_a_card_without_a_profile_is_priced_with_the_h100s_measured_costs():
    proxy = gpu_call.proxy_profile()
    h100 = gpu_call.load_elsewhere(gpu_call.ASSETS / "projections" / f"{gpu_call.PROXY}.json").profile
    assert proxy.target(1) == pytest.approx(h100.target(1) * gpu_call.EAGER_OVER_GRAPH)
    assert proxy.draft(1) == pytest.approx(h100.draft(1) * gpu_call.EAGER_OVER_GRAPH)
    short, default = (gpu_call.plan_call(n, proxy, DEFAULT_ENTRY.values) for n in (16, 128))
    # the page's default decode earns its captures back at these costs; a 16-token call does not
    assert default.capture and not short.capture and default.graphs_s < default.eager_s


def test_the_call_order_follows_the_plan_and_sequoia_call_graphs(monkeypatch):
    from components.app_state import serving

    monkeypatch.setattr(serving, "zerogpu", lambda: True)
    monkeypatch.delenv("SEQUOIA_CALL_GRAPHS", raising=False)
    long, short = serving.gpu_seconds(128), serving.gpu_seconds(16)
    assert long.plan.capture and "H100" in long.plan.reason
    assert serving.call_order(long).capture and not serving.call_order(short).capture
    assert "would not pay" in serving.call_order(short).reason
    assert not serving.call_order(60).capture                        # a bare number: no plan
    monkeypatch.setenv("SEQUOIA_CALL_GRAPHS", "0")
    assert not serving.call_order(serving.gpu_seconds(512)).capture
    monkeypatch.setenv("SEQUOIA_CALL_GRAPHS", "1")
    order = serving.call_order(serving.gpu_seconds(16))
    assert order.capture and order.emulate
    monkeypatch.setenv("SEQUOIA_CALL_GRAPHS", "sometimes")
    with pytest.raises(ValueError, match="SEQUOIA_CALL_GRAPHS"):
        serving.call_order(60)
