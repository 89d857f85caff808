"""The runtimes the start only bounded, timed in the background: which are pending, the result kept in the
cache for the next start, the banner's switch offer with both rates (fake probes, no models), and the child
process's failure said plainly."""

from __future__ import annotations

import json
import threading

import pytest

from sequoia.runtime.measuring import background_probe as bp
from sequoia.runtime.measuring.runtime_choice import Machine, TargetProbe, decide
from sequoia.runtime.measuring.target_probe import CACHE_NAME, probe_runtimes

from components.app_state.profile_room import ProfileRoom

AMX = Machine("cpu", ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16"), llamacpp_installed=True)
CODE = (0.92, 0.05, 0.01)


def timed(backend: str, rate: float) -> TargetProbe:
    return TargetProbe(backend, rate, rate * 0.9, rate * 1.1, 5, 2.0, "fake")


def bound(rate: float) -> TargetProbe:
    return TargetProbe("hf", rate, rate, rate, 0, 0.5, "at most: 3.1 GB of bf16 weights a token")


def started(hf: TargetProbe, llamacpp: float = 6.2):
    return decide(AMX, {}, CODE, probes={"hf": hf, "llamacpp": timed("llamacpp", llamacpp)})


def test_pending_are_both_runtimes_until_both_are_timed_here():
    fresh = decide(AMX, {}, CODE)   # the app's start on a fresh cache: the rule, nothing timed
    assert fresh.backend == "llamacpp" and bp.pending(fresh) == ("llamacpp", "hf")   # the served one first
    assert bp.pending(started(bound(9.0))) == ("llamacpp", "hf")   # an older cache's bound: timed now
    assert bp.pending(started(timed("hf", 2.6))) == ()      # both timed at an earlier start
    assert bp.pending(None) == ()
    assert bp.pending(fresh.overridden("hf", "SEQUOIA_BACKEND")) == ()
    assert bp.pending(decide(Machine("cpu", AMX.cpu_features, llamacpp_installed=False), {}, CODE)) == ()
    assert bp.pending(decide(Machine("cuda", (), llamacpp_installed=True), {}, CODE)) == ()


def test_the_offer_names_both_rates_and_how_to_switch():
    start = started(bound(9.0))
    backend, words = bp.switch_offer(start, {"hf": timed("hf", 8.0)})
    assert backend == "hf"
    assert words.startswith("Hugging Face (torch) proved faster here: its target alone decoded 8.0 tokens/s "
                            "(7.2-8.8 over 5 steps) on one thread against llama.cpp's 6.2 tokens/s")
    assert "1.3x" in words and "SEQUOIA_BACKEND=hf" in words
    assert bp.switch_offer(start, {"hf": timed("hf", 2.6)}) is None
    stays = bp.outcome(start, {"hf": timed("hf", 2.6)})
    assert "Hugging Face (torch)'s 2.6 tokens/s" in stays and "llama.cpp stays the faster" in stays
    # the served one re-timed in the background is the one compared; bands that overlap offer nothing
    assert bp.switch_offer(start, {"hf": timed("hf", 8.0), "llamacpp": timed("llamacpp", 8.5)}) is None
    noisy = bp.outcome(start, {"hf": timed("hf", 8.0), "llamacpp": timed("llamacpp", 8.5)})
    assert "llama.cpp's 8.5 tokens/s" in noisy and "the same within noise" in noisy


def test_a_probe_spread_by_a_busy_hour_offers_no_switch():
    # measured on the busy Xeon: llama.cpp's start probe 1.6 (0.1-5.6) under memory pressure, torch's 1.9-2.1
    spread = TargetProbe("llamacpp", 1.6, 0.1, 5.6, 5, 26.0, "fake")
    start = decide(AMX, {}, CODE, probes={"hf": bound(5.8), "llamacpp": spread})
    assert start.backend == "llamacpp"
    torch = TargetProbe("hf", 1.9, 1.9, 2.1, 5, 400.0, "fake")
    assert bp.switch_offer(start, {"hf": torch}) is None
    assert bp.switch_offer(start, {"hf": torch, "llamacpp": timed("llamacpp", 6.0)}) is None
    assert "stays the faster" in bp.outcome(start, {"hf": torch, "llamacpp": timed("llamacpp", 6.0)})


def test_a_recorded_probe_decides_the_next_start(tmp_path):
    fakes = {"llamacpp": lambda d: timed("llamacpp", 6.2), "hf": lambda d: pytest.fail("timed at start")}
    first = probe_runtimes(("hf", "llamacpp"), tmp_path, "k", fakes, ceilings={"hf": lambda d: bound(9.0)})
    assert first["hf"].bound
    bp.record(tmp_path, "k", timed("hf", 8.0))
    kept = json.loads((tmp_path / CACHE_NAME).read_text())
    assert kept["key"] == "k" and kept["probes"]["hf"]["steps"] == 5 and kept["probes"]["llamacpp"]["steps"] == 5
    again = probe_runtimes(("hf", "llamacpp"), tmp_path, "k", fakes, ceilings={"hf": lambda d: bound(9.0)})
    chosen = decide(AMX, {}, CODE, probes=again)
    assert chosen.backend == "hf" and "timed at an earlier start" in chosen.reason


def test_the_room_times_after_the_profile_and_the_banner_offers_the_switch(tmp_path):
    room = ProfileRoom(cache_dir=tmp_path, auto_profile=True)
    room.runtime = started(bound(9.0))
    thread = room.start_timing(("hf",), time_one=lambda backend, cache: timed(backend, 8.0))
    thread.join(timeout=60)   # a fake probe: microseconds; 60 s only bounds a hang
    assert not thread.is_alive() and not room.measuring and room.later_probes["hf"].tokens_per_s == 8.0
    html = room.banner()
    assert "sq-status-switch" in html and "<b>Switch?</b>" in html and "8.0 tokens/s" in html and "6.2" in html
    assert json.loads((tmp_path / CACHE_NAME).read_text())["probes"]["hf"]["tokens_per_s"] == 8.0

    slower = ProfileRoom(cache_dir=tmp_path / "b", auto_profile=True)
    slower.runtime = started(bound(9.0))
    slower.start_timing(("hf",), time_one=lambda backend, cache: timed(backend, 2.6)).join(timeout=60)
    assert "stays the faster" in slower.banner() and "Switch?" not in slower.banner()

    def broken(backend, cache):
        raise RuntimeError("the hf probe exited with 1: MemoryError")
    failed = ProfileRoom(cache_dir=tmp_path / "c", auto_profile=True)
    failed.runtime = started(bound(9.0))
    failed.start_timing(("hf",), time_one=broken).join(timeout=60)
    assert "MemoryError" in failed.banner() and not failed.measuring


def test_a_failing_child_probe_says_why(tmp_path):
    with pytest.raises(RuntimeError, match="exited with 1: KeyError"):
        bp.time_in_child("no-such-runtime", tmp_path, timeout_s=300)   # bounds a hang, far over its ~5 s


def test_the_start_assembles_meanwhile_only_when_it_times(tmp_path):
    import threading

    beside = threading.Event()

    def llamacpp(cache_dir):   # returns only once the work meanwhile ran beside it (60 s bounds a hang)
        assert beside.wait(60)
        return timed("llamacpp", 6.2)
    got = probe_runtimes(("llamacpp",), tmp_path, "k", {"llamacpp": llamacpp}, meanwhile=lambda d: beside.set())
    assert got["llamacpp"].tokens_per_s == 6.2
    again = probe_runtimes(("llamacpp",), tmp_path, "k", {"llamacpp": llamacpp},
                           meanwhile=lambda d: pytest.fail("a cached probe needs nothing meanwhile"))
    assert again["llamacpp"].cached


def test_the_background_result_joins_the_starts_own_key(tmp_path):
    fakes = {"llamacpp": lambda d: timed("llamacpp", 6.2)}
    start = probe_runtimes(("hf", "llamacpp"), tmp_path, "key at start", fakes, ceilings={"hf": lambda d: bound(9.0)})
    decision = decide(AMX, {}, CODE, probes=start)
    assert bp.start_key(tmp_path, decision, "key built later") == "key at start"
    assert bp.start_key(tmp_path / "none", decision, "key built later") == "key built later"


def test_the_next_start_keeps_llamacpp_where_the_bands_overlap():
    tied = decide(AMX, {}, CODE, probes={"hf": timed("hf", 6.5), "llamacpp": timed("llamacpp", 6.2)})
    assert tied.backend == "llamacpp" and "the same within noise" in tied.reason and "6.5 tokens/s" in tied.reason
    assert "llama.cpp loads without a conversion" in tied.reason
    proven = decide(AMX, {}, CODE, probes={"hf": timed("hf", 8.0), "llamacpp": timed("llamacpp", 6.2)})
    assert proven.backend == "hf"


def test_a_child_probe_needs_its_memory_free(tmp_path):
    with pytest.raises(RuntimeError, match="needs about 4.5 GB free and 2.0 GB are"):
        bp.time_in_child("hf", tmp_path, free=lambda: 2_000_000_000)


def test_the_note_reads_while_only_the_timing_runs(tmp_path):
    """The Hardware tab's note while the background timing runs and no profile measurement does (it once read
    the profile measurement's progress, None there, and the tab's views failed)."""
    room = ProfileRoom(cache_dir=tmp_path, auto_profile=True)
    room.runtime = started(bound(9.0))
    release = threading.Event()

    def held(backend, cache):
        release.wait(60)   # bounds a hang only: released just below
        return timed(backend, 8.0)
    thread = room.start_timing(("hf",), time_one=held)
    try:
        assert room.profiling is None and room.measuring
        assert "No hardware profile" in room.note() or "Hardware profile" in room.note()
    finally:
        release.set()
        thread.join(timeout=60)
    assert not thread.is_alive()


def test_probe_0_switches_the_background_timing_off():
    """SEQUOIA_PROBE=0 skips the timing, as docs/configuration.md says: the start serves llama.cpp by the rule and
    nothing is timed in the background either."""
    import app
    from dataclasses import replace

    decision = started(bound(9.0))
    assert bp.pending(decision) and not bp.pending(replace(decision, timed_later=False))
    assert app.runtime_from_env({"SEQUOIA_BACKEND": "", "SEQUOIA_PROBE": "0"}).timed_later is False
