"""The race's pure parts: which runtime it offers, its interleaved order, the bands, the sentence and the figure."""

from __future__ import annotations

from pathlib import Path

import pytest

from components.live import race
from sequoia.core.profiles.acceptance import AcceptanceVector
from sequoia.core.profiles.profile import HardwareProfile

ROOT = Path(__file__).resolve().parents[2]
CODE = AcceptanceVector.load(ROOT / "assets" / "acceptance" / "embedded-code-greedy.json").values
# torch on bf16 matrix kernels: 16 tokens cost ~1.4x one (trees pay); llama.cpp: 16 tokens cost ~6.5x one.
TORCH = HardwareProfile.hand_made(lambda n: 120.0 * (1 + 0.027 * (n - 1)), lambda w: 30.0 + w)
LLAMA = HardwareProfile.hand_made(lambda n: 40.0 * min(n, 1 + 0.37 * (n - 1)), lambda w: 20.0 * w)


def test_the_race_is_offered_where_another_runtime_makes_a_tree_pay():
    got = race.offer("llamacpp", {"llamacpp": LLAMA, "hf": TORCH}, CODE)
    assert got is not None and got.tree_backend == "hf" and got.serving_backend == "llamacpp"
    assert got.predicted_ratio > 1.5 and got.verify_ratio["hf"] == pytest.approx(1.405)
    assert got.verify_ratio["llamacpp"] == pytest.approx(6.55)
    assert [lane.key for lane in got.lanes()] == ["tree", "alone", "serving"]
    assert got.lanes()[0].label == "Sequoia (auto) on Hugging Face (torch)"
    assert race.offer("llamacpp", {"llamacpp": LLAMA}, CODE) is None                    # nothing else profiled
    assert race.offer("llamacpp", {"llamacpp": LLAMA, "hf": LLAMA}, CODE) is None       # no tree pays there
    assert race.offer("hf", {"llamacpp": LLAMA}, CODE) is None                          # serving not profiled
    # the mixed runtime runs torch's target too: serving either, the other is no race (one target against itself)
    assert race.offer("hf", {"hf": TORCH, "mixed": TORCH, "llamacpp": LLAMA}, CODE) is None
    assert race.offer("mixed", {"mixed": TORCH, "hf": TORCH}, CODE) is None
    assert race.offer("llamacpp", {"llamacpp": LLAMA, "mixed": TORCH}, CODE).tree_backend == "mixed"
    # serving the runtime where the tree pays: no race, one line saying so with its arithmetic
    line = race.serving_pays_line("hf", TORCH, CODE)
    assert "A tree pays on the runtime serving" in line and "1.4x one token" in line and "Sequoia (auto)" in line
    assert race.serving_pays_line("llamacpp", LLAMA, CODE) == ""


def test_runs_interleave_and_bands_pair_extremes():
    lanes = race.Offer("hf", "llamacpp", 2.0, {"hf": 1.4, "llamacpp": 6.5}).lanes()
    order = race.schedule(lanes, 2)
    assert [(r, lane.key) for r, lane in order] == [(0, "tree"), (0, "alone"), (0, "serving"),
                                                    (1, "tree"), (1, "alone"), (1, "serving")]
    with pytest.raises(ValueError):
        race.schedule(lanes, 0)
    got = race.bands([(lanes[0], 8.0), (lanes[1], 4.0), (lanes[2], 14.0), (lanes[0], 9.0), (lanes[1], 4.5),
                      (lanes[2], 13.0), (lanes[0], 8.4), (lanes[1], 4.2), (lanes[2], 14.2)])
    assert got["tree"] == race.Band(8.4, 8.0, 9.0, 3)
    mid, lo, hi = race.ratio_band(got["tree"], got["alone"])
    assert (round(mid, 2), round(lo, 2), round(hi, 2)) == (2.0, 1.78, 2.25)


def test_the_sentence_names_three_rates_why_and_the_fastest():
    offer = race.Offer("hf", "llamacpp", 2.0, {"hf": 1.4, "llamacpp": 6.5})
    got = {"tree": race.Band(8.4, 8.0, 9.0, 3), "alone": race.Band(4.2, 4.0, 4.5, 3),
           "serving": race.Band(14.0, 13.0, 14.2, 3)}
    text = race.sentence(offer, got)
    assert text.startswith("Sequoia (auto) on Hugging Face (torch) decoded 8.4 tokens/s (8.0-9.0 over 3 rounds), "
                           "2.00x (1.78-2.25) its target alone's 4.2, because verifying 16 tokens costs 1.4x one")
    assert "the target alone on llama.cpp decoded 14.0 tokens/s (13.0-14.2 over 3 rounds)" in text
    assert "16 tokens cost 6.5x one; fastest here: the target alone on llama.cpp." in text
    tie = race.sentence(offer, {**got, "alone": race.Band(8.3, 7.9, 8.8, 3)})
    assert "(the same within noise)" in tie
    fig = race.figure(offer.lanes(), got)
    assert list(fig.data[0].y) == [8.4, 4.2, 14.0] and list(fig.data[0].error_y.arrayminus) == pytest.approx(
        [0.4, 0.2, 1.0])
    with pytest.raises(ValueError):
        race.band([])
