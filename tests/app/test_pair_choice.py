"""Which pair the server loads (components.app_state.pair_room), and the loading path of a pair whose
vocabularies are padded apart as Qwen2.5 0.5B's and 7B's are (151,936 and 152,064 rows over one tokenizer)."""

import pytest
import torch

from components.app_state.pair_room import (EMBEDDED_WHY, GPU_SPACE_DRAFT, GPU_SPACE_TARGET, choose_pair,
                                              pair_env)
from sequoia.core.config import GenerationConfig
from sequoia.runtime.engine import SpeculativeEngine
from sequoia.runtime.methods import make_method
from sequoia.runtime.models import load_pair
from sequoia.tools.gpucheck.models import CPU_DRAFT, CPU_TARGET
from sequoia.tools.random_pair import PairShapes, make_pair


def _never():
    raise AssertionError("asked where it does not decide")


def test_the_embedded_pair_serves_off_spaces_without_asking_the_hub():
    choice = choose_pair({}, zerogpu=False, cuda=_never, hub=_never)
    assert choice.embedded and choice.why == EMBEDDED_WHY and choice.banner_words == ""
    assert pair_env({"X": "1"}, choice) == {"X": "1"}


def test_a_zerogpu_space_serves_the_7b_target_and_says_why():
    choice = choose_pair({}, zerogpu=True, hub=lambda: True)
    assert (choice.draft, choice.target) == (GPU_SPACE_DRAFT, GPU_SPACE_TARGET)
    assert "ZeroGPU" in choice.why and "1.84x" in choice.why and "prior" in choice.why
    env = pair_env({}, choice)
    assert (env["SEQUOIA_DRAFT"], env["SEQUOIA_TARGET"]) == (GPU_SPACE_DRAFT, GPU_SPACE_TARGET)


def test_a_dedicated_gpu_space_too_and_a_cpu_space_keeps_the_embedded_pair():
    gpu = choose_pair({"SPACE_ID": "me/studio"}, cuda=lambda: True, hub=lambda: True)
    assert gpu.target == GPU_SPACE_TARGET and "GPU Space" in gpu.why
    assert choose_pair({"SPACE_ID": "me/studio"}, cuda=lambda: False, hub=_never).embedded


def test_without_the_hub_a_gpu_space_serves_the_embedded_pair_and_says_so():
    choice = choose_pair({}, zerogpu=True, hub=lambda: False)
    assert choice.embedded and "cannot reach the model hub" in choice.banner_words


def test_named_models_win_everywhere():
    choice = choose_pair({"SEQUOIA_TARGET": "me/big"}, zerogpu=True, hub=_never)
    assert (choice.draft, choice.target) == ("embedded", "me/big") and "SEQUOIA_TARGET" in choice.why


@pytest.fixture(scope="module")
def padded_pair(tmp_path_factory):
    """Random tiny models over one byte-level tokenizer (259 tokens), their output rows padded apart as the
    Qwen2.5 0.5B and 7B are (here 512 and 640)."""
    out = tmp_path_factory.mktemp("padded")
    shapes = PairShapes("padded", CPU_DRAFT, CPU_TARGET.__class__(**{**CPU_TARGET.__dict__, "vocab": 640}))
    import sequoia.tools.random_pair as rp
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(rp.PAIRS, "padded", shapes)
        make_pair(out, "padded", dtype=torch.float32, tokenizer=None)
    return out


def test_a_pair_padded_apart_loads_and_decodes_the_targets_greedy_text(padded_pair):
    pair = load_pair(str(padded_pair / "draft"), str(padded_pair / "target"), device="cpu", dtype="fp32",
                     plain=True)
    assert (pair.draft.vocab_size, pair.target.vocab_size, pair.vocab_size) == (512, 640, 259)
    prompt = pair.encode_prompt("def f(x):")
    config = GenerationConfig(max_new_tokens=24, stop_at_eos=False)
    ar = [t for r in SpeculativeEngine(pair).generate(prompt, make_method("ar"), config) for t in r.new_tokens]
    tree = [t for r in SpeculativeEngine(pair).generate(prompt, make_method("sequoia", budget=8, depth=4), config)
            for t in r.new_tokens]
    assert tree == ar and len(ar) == 24


def test_on_zerogpu_the_h100s_graph_costs_stand_in_for_the_cards_profile(tmp_path, tiny_app_pair):
    import app
    from components.app_state import serving
    from components.app_state.profile_room import ProfileRoom
    from sequoia.runtime.measuring import gpu_call

    seven = app.zerogpu_stand_in(choose_pair({}, zerogpu=True, hub=lambda: True).target == GPU_SPACE_TARGET)
    small = app.zerogpu_stand_in(choose_pair({}, zerogpu=True, hub=lambda: False).target == GPU_SPACE_TARGET)
    assert "h100-7b" in seven.reason and seven.profile.target(1) > small.profile.target(1)
    assert gpu_call.replays(seven.profile)
    room = ProfileRoom(tmp_path / "assets", tmp_path / "cache", stand_in=seven)
    room.on_pair_loaded(tiny_app_pair)          # nothing shipped or cached matches: the stand-in serves
    assert room.profile is seven.profile and "no profile yet" in room.note()
    # a call's duration prices those replays eager (x EAGER_OVER_GRAPH), the plan capturing where it pays
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(serving, "zerogpu", lambda: True)
        planned = serving.gpu_seconds(128, profile=seven.profile).plan
    assert planned.capture and "eager = graphs x" in planned.reason
