"""The race wired: the second runtime's pair loaded on demand within the budget and freed after, interleaved timed
rounds of three lanes, the tree priced by its own runtime's profile, Stop, and the panel's handlers.

The serving pair is the tiny pair labelled llama.cpp; the "torch" pair the race loads is another tiny pair; the
profiles are hand-made (test_race's: trees pay on torch, not on llama.cpp).  Few tokens, 1-2 rounds.
"""

from __future__ import annotations

import dataclasses
import threading

import pytest

from components.app_state.context import AppContext
from components.live import race, race_panel, race_run
from conftest import app_pair, tiny_model
from test_race import CODE, LLAMA, TORCH


@pytest.fixture()
def race_ctx(tiny_app_pair, tmp_path, monkeypatch):
    """An app state serving the tiny pair "on llama.cpp", whose race loads a tiny "torch" pair (loads counted)."""
    serving = dataclasses.replace(tiny_app_pair, backend="llamacpp")
    ctx = AppContext.from_pair_or_loader(serving, assets_dir=tmp_path)
    loads = []

    def loader(backend, progress):
        progress(0.5, f"loading the {backend} pair")
        pair = dataclasses.replace(app_pair(tiny_model(3), tiny_model(0)), backend=backend)
        loads.append(pair)
        return pair
    ctx.extras.race_loader, ctx.extras.race_bytes = loader, lambda backend: 1
    monkeypatch.setattr(race_run, "race_profiles", lambda c, acceptance: {"llamacpp": LLAMA, "hf": TORCH})
    ctx.loads = loads
    return ctx


def _race(ctx, rounds=2, tokens=4, stop_at=None):
    state = race_run.RaceState(offer=race_run.race_offer(ctx, CODE), rounds=rounds)
    seen = []
    for s in race_run.iter_race(ctx, state, race_run.guided_inputs(tokens)):
        seen.append((s.phase, s.lane, len(s.results)))
        if stop_at is not None and len(s.results) >= stop_at:
            s.stop() if s.on else setattr(s, "stopped", True)
    return state, seen


def test_the_race_runs_interleaved_rounds_and_frees_the_second_runtime(race_ctx):
    offer = race_run.race_offer(race_ctx, CODE)
    assert offer is not None and (offer.tree_backend, offer.serving_backend) == ("hf", "llamacpp")
    state, seen = _race(race_ctx)
    phases = [p for p, _, _ in seen]
    assert phases[0] == "loading" and "warming" in phases and phases[-1] == "done"
    assert [lane.key for lane, _ in state.results] == ["tree", "alone", "serving"] * 2
    assert all(rate > 0 for _, rate in state.results)
    assert state.line == race.sentence(offer, state.bands) and "over 2 rounds" in state.line
    assert all(state.texts[key] for key in ("tree", "alone", "serving"))     # each lane's text drawn
    assert state.tree is not None and state.tree.tree.size > 1            # priced by torch's profile: a tree
    assert state.resident > 0 and "resident memory" in state.memory_words()
    assert len(race_ctx.loads) == 1 and race_ctx.extras.race_loaded is None    # loaded once, freed at the end
    assert race_ctx.pair().backend == "llamacpp"                              # the serving pair untouched


def test_stop_ends_the_race_and_frees_it(race_ctx):
    state, seen = _race(race_ctx, rounds=2, stop_at=1)
    assert state.stopped and 1 <= len(state.results) < 6 and seen[-1][0] != "done"
    assert race_ctx.extras.race_loaded is None


def test_a_race_that_does_not_fit_loads_nothing_and_says_why(race_ctx):
    race_ctx.extras.race_bytes = lambda backend: 10**15
    state, _ = _race(race_ctx)
    assert state.phase == "failed" and "not enough memory" in state.line and not state.results
    assert race_ctx.loads == [] and race_ctx.extras.race_loaded is None


def test_a_second_visitor_is_not_broken(race_ctx):
    """One visitor's Stop leaves another's race alone (each session has its own flags); both get their own load."""
    first, _ = _race(race_ctx, rounds=1, stop_at=1)
    second, _ = _race(race_ctx, rounds=1)
    assert first.stopped and not second.stopped and second.phase == "done" and len(second.results) == 3
    assert len(race_ctx.loads) == 2 and race_ctx.extras.race_loaded is None


def test_the_panel_offers_the_race_or_says_why_not(race_ctx, monkeypatch):
    offer = race_run.race_offer(race_ctx, CODE)
    words = race_panel.offer_markdown(race_ctx, offer)
    assert "verifying 16 tokens costs 1.4x one token on Hugging Face (torch) against 6.5x on llama.cpp" in words
    assert race_panel.RACE_LABEL in words
    monkeypatch.setattr(race_run, "race_profiles", lambda c, acceptance: {"llamacpp": LLAMA})
    assert race_run.race_offer(race_ctx, CODE) is None
    line = race_panel.offer_markdown(race_ctx, None)
    assert line.startswith("No race between runtimes here") and "verifying 16 tokens costs 6.5x one" in line
    assert "Hugging Face (torch) is not profiled here" in line and "projection" in line
    race_ctx.extras.race_loader = None
    assert race_run.race_offer(race_ctx, CODE) is None and race_panel.offer_markdown(race_ctx, None) == ""


def test_the_panel_streams_the_race_and_stop_settles_it(race_ctx):
    lanes, _, words, state, column = race_panel.first_frame(race_ctx, None)
    assert state.waiting and 'data-lane="serving"' in lanes and "queued" in words
    frames = list(race_panel.race_stream(race_ctx, state, rounds=1, max_new_tokens=3))
    lanes, bars, tree, words, state = frames[-1]
    assert "decoded" in words and "Resident memory with both runtimes loaded" in words
    assert list(bars.data[0].x) == [lane.label for lane in state.offer.lanes()] and not state.running
    assert race_panel.stop(state) == (race_panel.gr.skip(), race_panel.gr.skip())   # nothing running: no change
    _, _, _, waiting, _ = race_panel.first_frame(race_ctx, None)
    lanes, words = race_panel.stop(waiting)                 # stopped in the queue: it never starts
    assert "Stopped" in words and list(race_panel.race_stream(race_ctx, waiting)) == [(race_panel.gr.skip(),) * 5]
    assert race_ctx.loads and race_ctx.extras.race_loaded is None


def test_a_cpu_kind_without_a_torch_profile_races_on_a_shipped_stand_in(race_ctx, tmp_path, monkeypatch):
    """A fresh CPU Space with bf16 matrix kernels has no torch profile of its kind: the race is predicted from
    another such CPU's shipped torch profile (and says so); never on a CPU without them, never llama.cpp's."""
    from sequoia.core.profiles.fingerprint import Fingerprint
    from sequoia.core.profiles.runtimes import FoundProfile

    zen4 = Fingerprint(device_kind="cpu", cpu_model="AMD EPYC", cpu_features=("avx2", "avx512f", "avx512_bf16"),
                       onednn_bf16=True, threads=2, target_dtype="bf16", draft_dtype="bf16", draft_quant="int4",
                       runtime="hf")
    assets = tmp_path / "shipped"
    dataclasses.replace(TORCH, fingerprint=dataclasses.replace(zen4, runtime="llamacpp")).save(
        assets / "profiles" / "a-llamacpp.json")
    assert race_run.torch_stand_in(assets, ("avx2", "avx512_bf16", "amx_bf16")) is None   # llama.cpp's is no stand-in
    dataclasses.replace(TORCH, fingerprint=zen4).save(assets / "profiles" / "b-torch.json")
    amx = ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16")
    kin = race_run.torch_stand_in(assets, amx)
    assert kin is not None and kin.profile.target(1) == TORCH.target(1) and "b-torch.json" in kin.source
    assert "AMD EPYC" in kin.source
    assert race_run.torch_stand_in(assets, ("avx2",)) is None                              # no bf16 kernels: none
    assert race_run.torch_stand_in(assets, ("avx2", "avx512_bf16")).source == kin.source   # int4 draft there too

    monkeypatch.undo()   # the fixture's hand-made race_profiles: the real one, with this machine's lookup faked
    monkeypatch.setattr(race_run, "runtimes_here", lambda c, acceptance: ({"llamacpp": FoundProfile(LLAMA, "in use")},
                                                                          None))
    monkeypatch.setattr(race_run, "torch_stand_in", lambda assets_dir, features=None: kin)
    assert race_run.race_profiles(race_ctx, CODE) == {"llamacpp": LLAMA, "hf": kin.profile}
    offer = race_run.race_offer(race_ctx, CODE)
    assert offer is not None and offer.tree_backend == "hf"
    words = race_panel.offer_markdown(race_ctx, offer)
    assert "predicted from shipped b-torch.json (AMD EPYC: no torch profile of this CPU kind here)" in words
    assert "python -m sequoia profile --backend hf" in words


def test_stop_while_the_second_runtime_loads_cancels_the_load_at_its_next_stage(race_ctx):
    """Closing the race while its second pair loads (Stop, or the page gone) ends the load at its next progress
    report, instead of loading on unseen while the close waits for it."""
    entered, done = threading.Event(), []

    def loader(backend, progress):
        progress(0.1, "loading the target")
        entered.set()
        progress.cancelled.wait(60)          # a long stage; without the cancel the close waits all of it
        progress(0.9, "loading the draft")   # the next stage's report: raises once cancelled
        done.append(backend)
        return dataclasses.replace(app_pair(tiny_model(3), tiny_model(0)), backend=backend)

    race_ctx.extras.race_loader = loader
    state = race_run.RaceState(offer=race_run.race_offer(race_ctx, CODE), rounds=1)
    loading = race_run._load(race_ctx, state, "hf", lambda pair: pair)
    while not entered.is_set():
        assert next(loading).phase == "loading"
    loading.close()                          # returns once the load's thread has ended
    assert done == [] and race_ctx.extras.race_loaded is None
    assert not [t for t in threading.enumerate() if t.name.startswith("sequoia-race-load")]
