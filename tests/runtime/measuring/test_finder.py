"""The one finder: which profile, acceptance vector and calibration the app, bench and CLI use, and why."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sequoia.core.ngrams.ngram_acceptance import NgramAcceptance, pool_ngram_acceptance
from sequoia.core.profiles.acceptance import AcceptanceVector
from sequoia.core.profiles.calibration import Calibration
from sequoia.core.profiles.fingerprint import Fingerprint
from sequoia.core.profiles.profile import HardwareProfile
from sequoia.runtime.measuring.finder import (DEFAULT_ENTRY, ProfileChoice, cache_profile, find_acceptance,
                                              find_calibration, find_ngram_acceptance, find_profile, list_acceptance,
                                              profile_cache_path)
from sequoia.runtime.methods import DEFAULT_ACCEPTANCE

AVX2 = Fingerprint(device_kind="cpu", cpu_model="Intel Xeon", cpu_features=("avx2",), onednn_bf16=False, threads=2,
                   target_dtype="bf16", draft_dtype="bf16", draft_quant="int8", pair="d+t")
AVX512 = replace(AVX2, cpu_model="AMD EPYC", cpu_features=("avx2", "avx512f", "avx512_bf16"), onednn_bf16=True)


def _profile(fp: Fingerprint | None, ms: float = 100.0) -> HardwareProfile:
    prof = HardwareProfile.hand_made(lambda n: ms + n, lambda w: 10.0 + w)
    return replace(prof, fingerprint=fp, date="2026-11-01T00:00:00+00:00")


def _ship(assets, name: str, prof: HardwareProfile):
    path = assets / "profiles" / name
    prof.save(path)
    return path


def test_shipped_profile_is_used_only_on_a_matching_machine(tmp_path):
    assets, cache = tmp_path / "assets", tmp_path / "cache"
    _ship(assets, "cpu-avx2.json", _profile(AVX2))
    choice = find_profile(AVX2, cache_dir=cache, assets_dir=assets)
    assert choice.source == "shipped" and choice.path.name == "cpu-avx2.json" and choice.profile is not None
    assert "cpu-avx2.json" in choice.reason and str(tmp_path) not in choice.reason  # file name, not the path

    other = find_profile(AVX512, cache_dir=cache, assets_dir=assets)
    assert other.source == "none" and other.profile is None and other.path is None
    assert "cpu-avx2.json" in other.reason and "another machine" in other.reason
    assert "avx512" in other.reason and "none matches" in other.reason


def test_a_profile_without_fingerprint_is_never_used(tmp_path):
    _ship(tmp_path, "old.json", _profile(None))
    choice = find_profile(AVX2, cache_dir=tmp_path / "cache", assets_dir=tmp_path)
    assert choice.source == "none" and "old.json" in choice.reason and "fingerprint" in choice.reason


def test_the_matching_one_among_several_and_broken_files_are_skipped(tmp_path):
    _ship(tmp_path, "a-avx512.json", _profile(AVX512, 50.0))
    _ship(tmp_path, "b-avx2.json", _profile(AVX2, 200.0))
    (tmp_path / "profiles" / "c-broken.json").write_text("{")
    assert find_profile(AVX2, cache_dir=tmp_path, assets_dir=tmp_path).path.name == "b-avx2.json"
    assert find_profile(AVX512, cache_dir=tmp_path, assets_dir=tmp_path).path.name == "a-avx512.json"
    assert find_profile(replace(AVX2, threads=8), cache_dir=tmp_path, assets_dir=tmp_path).source == "none"


def test_cache_round_trip_beats_shipped(tmp_path):
    assets, cache = tmp_path / "assets", tmp_path / "cache"
    _ship(assets, "cpu-avx2.json", _profile(AVX2, 300.0))
    path = cache_profile(_profile(AVX2, 120.0), cache)
    assert path == profile_cache_path(AVX2, cache) and path.name == f"{AVX2.key()}.json"
    choice = find_profile(AVX2, cache_dir=cache, assets_dir=assets)
    assert choice.source == "cached" and choice.path == path and choice.profile.target(1) == 121.0
    # the cache of one machine is not read on another
    assert find_profile(AVX512, cache_dir=cache, assets_dir=assets).source == "none"
    with pytest.raises(ValueError, match="fingerprint"):
        cache_profile(_profile(None), cache)


def test_a_runtimes_expected_fingerprint_finds_the_embedded_pairs_profile_cached_under_its_pairs_key(tmp_path):
    # `python -m sequoia profile --backend hf` caches under the loaded pair's key (its name is in it); the page
    # looks the runtimes it has not loaded up by a fingerprint naming no pair: it must still find that profile
    cache = tmp_path / "cache"
    embedded = replace(AVX512, pair="Qwen2.5-Coder-0.5B-Instruct (int4)+Qwen2.5-Coder-1.5B-Instruct")
    older = replace(_profile(embedded, 300.0), date="2026-10-01T00:00:00+00:00")
    (cache / "profiles").mkdir(parents=True)
    older.save(cache / "profiles" / "older.json")
    path = cache_profile(_profile(embedded, 120.0), cache)
    cache_profile(_profile(replace(AVX512, pair="some-draft+some-target"), 50.0), cache)   # another pair
    unnamed = replace(AVX512, pair="")
    assert path != profile_cache_path(unnamed, cache)
    choice = find_profile(unnamed, cache_dir=cache, assets_dir=tmp_path / "assets")
    assert choice.source == "cached" and choice.path == path and choice.profile.target(1) == 121.0   # the newest
    # another pair's profile never stands in for the embedded pair's, nor another machine's
    path.unlink(), (cache / "profiles" / "older.json").unlink()
    assert find_profile(unnamed, cache_dir=cache, assets_dir=tmp_path / "assets").source == "none"
    cache_profile(_profile(embedded, 120.0), cache)
    assert find_profile(replace(AVX2, pair=""), cache_dir=cache, assets_dir=tmp_path / "assets").source == "none"


def test_explicit_profile_wins_and_warns_when_foreign(tmp_path):
    _ship(tmp_path, "cpu-avx2.json", _profile(AVX2))
    mine = tmp_path / "mine.json"
    _profile(AVX512, 42.0).save(mine)
    choice = find_profile(AVX2, explicit=mine, cache_dir=tmp_path, assets_dir=tmp_path)
    assert choice.source == "given" and choice.profile.target(1) == 43.0
    assert "WARNING" in choice.reason and "another machine" in choice.reason
    same = find_profile(AVX512, explicit=mine, cache_dir=tmp_path, assets_dir=tmp_path)
    assert same.source == "given" and "WARNING" not in same.reason
    with pytest.raises(ValueError):
        find_profile(AVX2, explicit=tmp_path / "missing.json", cache_dir=tmp_path, assets_dir=tmp_path)


def test_a_choice_has_a_profile_exactly_when_it_is_not_none():
    with pytest.raises(ValueError):
        ProfileChoice(None, "shipped", None, "x")
    with pytest.raises(ValueError):
        ProfileChoice(_profile(AVX2), "none", None, "x")
    with pytest.raises(ValueError):
        ProfileChoice(None, "somewhere", None, "x")


def _acceptance_assets(tmp_path):
    folder = tmp_path / "acceptance"
    AcceptanceVector((0.9, 0.05), temperature=0.0, prompt_set="code").save(folder / "v-code-greedy.json")
    AcceptanceVector((0.7, 0.1), temperature=0.6, prompt_set="code").save(folder / "v-code-t0.6.json")
    AcceptanceVector((0.6, 0.2), temperature=0.6, prompt_set="chat").save(folder / "v-chat-t0.6.json")
    AcceptanceVector((0.5, 0.2), temperature=1.0, prompt_set="chat").save(folder / "v-chat-t1.0.json")
    AcceptanceVector((0.5, 0.1), temperature=0.6, top_p=0.9, prompt_set="code").save(folder / "v-topp.json")
    for t in (0.0, 0.6):
        Calibration(knots=(0.0, 1.0), values=((0.0, 1.0),), temperature=t).save(
            folder / f"calibration-x-t{t:g}.json")
    (folder / "broken.json").write_text("{")
    return tmp_path


def test_acceptance_listing_excludes_calibrations_and_labels_kind_and_temperature(tmp_path):
    assets = _acceptance_assets(tmp_path)
    entries = list_acceptance(assets)
    assert len(entries) == 5 and not any("calibration" in e.label for e in entries)
    labels = {e.label for e in entries}
    assert "code, T=0 (v-code-greedy)" in labels and "chat, T=0.6 (v-chat-t0.6)" in labels
    assert list_acceptance(tmp_path / "nowhere") == []


def test_acceptance_default_follows_kind_and_temperature(tmp_path):
    assets = _acceptance_assets(tmp_path)
    assert find_acceptance("code", 0.0, assets).values == (0.9, 0.05)
    assert find_acceptance("code", 0.6, assets).values == (0.7, 0.1)      # same kind and T; top-p one skipped
    assert find_acceptance("chat", 0.6, assets).values == (0.6, 0.2)
    assert find_acceptance("chat", 0.0, assets).values == (0.9, 0.05)     # same T beats same kind
    assert find_acceptance("chat", 0.9, assets).values == (0.5, 0.2)      # nearest T of the same kind
    assert find_acceptance("code", 0.9, assets).values == (0.7, 0.1)
    fallback = find_acceptance("code", 0.0, tmp_path / "nowhere")
    assert fallback == DEFAULT_ENTRY and fallback.values == DEFAULT_ACCEPTANCE and "built-in" in fallback.label


def test_calibration_nearest_in_temperature(tmp_path):
    assets = _acceptance_assets(tmp_path)
    assert find_calibration(0.7, assets).temperature == 0.6
    assert find_calibration(0.1, assets).temperature == 0.0
    assert find_calibration(0.0, tmp_path / "nowhere") is None


def test_copy_acceptance_of_no_known_kind_pools_every_kind_at_the_nearest_temperature(tmp_path):
    folder = tmp_path / "acceptance"
    folder.mkdir()
    a = NgramAcceptance(table=((0.2, 1.0),), counts=((10, 0),), prompt_set="code", temperature=0.0)
    b = NgramAcceptance(table=((0.6, 0.5),), counts=((30, 4),), prompt_set="rag", temperature=0.0)
    c = NgramAcceptance(table=((0.9, 0.9),), counts=((50, 50),), prompt_set="rag", temperature=0.6)
    for name, acc in (("ngram-code-greedy", a), ("ngram-rag-greedy", b), ("ngram-rag-t0.6", c)):
        acc.save(folder / f"{name}.json")
    pooled = find_ngram_acceptance("", 0.0, tmp_path)
    assert pooled.counts == ((40, 4),)
    assert pooled.table[0] == pytest.approx((0.5, 0.5))     # (10 * 0.2 + 30 * 0.6) / 40; the empty cell drops out
    assert find_ngram_acceptance("code", 0.0, tmp_path).prompt_set == "code"
    assert find_ngram_acceptance("", 0.7, tmp_path).table == c.table
    with pytest.raises(ValueError):
        pool_ngram_acceptance([])


def test_measurements_of_the_same_models_serve_every_quantization_and_runtime():
    """The shipped vectors and calibrations (torch int8/int4 draft) serve the same models as GGUF files on llama.cpp
    and on the mixed runtime; other models never."""
    from sequoia.runtime.measuring.finder import find_calibration, list_acceptance, same_models

    torch_pair = "Qwen2.5-Coder-0.5B-Instruct (int4)+Qwen2.5-Coder-1.5B-Instruct"
    for other in ("Qwen2.5-Coder-0.5B-Instruct (Q4_0, llama.cpp)+Qwen2.5-Coder-1.5B-Instruct",
                  "Qwen2.5-Coder-0.5B-Instruct (Q4_K_M)+Qwen2.5-Coder-1.5B-Instruct (Q4_K_M)"):
        assert same_models(torch_pair, other)
        assert {e.kind for e in list_acceptance(pair=other)} >= {"code", "chat"}
        assert find_calibration(0.0, pair=other) is not None
    assert not same_models(torch_pair, "Qwen2.5-0.5B-Instruct (Q4_0, llama.cpp)+Qwen2.5-7B-Instruct (Q4_K_M)")
