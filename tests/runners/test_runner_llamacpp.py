"""The llama.cpp runner on a tiny random-weight GGUF (written once per test session) and on the embedded target."""

from __future__ import annotations

import gc
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

pytest.importorskip("llama_cpp")

from llamacpp_fixtures import TINY_VOCAB, tiny_qwen2, write_tiny_gguf  # noqa: E402
from runner_checks import TREE, check_runner_conformance, tree_path  # noqa: E402

from sequoia.runners.base import Runner, Session  # noqa: E402
from sequoia.runners.embedded import TARGET, EmbeddedModelError, ensure_gguf, locate_parts  # noqa: E402
from sequoia.runners.llamacpp import LlamaCppOptions, load_llamacpp_runner  # noqa: E402
from sequoia.runners.llamacpp.backend import backend_ready, ensure_backend  # noqa: E402
from sequoia.runners.llamacpp.quantize import requantize, requantized_path  # noqa: E402

SMALL = LlamaCppOptions(n_threads=1, n_ctx=1024)  # tiny models gain nothing from threads on a shared machine


@pytest.fixture(scope="session")
def tiny_hf():
    return tiny_qwen2(seed=0)


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory, tiny_hf):
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny-qwen2.f32.gguf", tiny_hf)


@pytest.fixture
def runner(tiny_gguf):
    with load_llamacpp_runner(tiny_gguf, SMALL) as r:
        yield r


def test_runner_describes_itself(runner):
    assert isinstance(runner, Runner) and isinstance(runner.session(), Session)
    assert runner.vocab_size == TINY_VOCAB and runner.device == torch.device("cpu")
    assert runner.max_context >= 1024
    assert (runner.info.runtime, runner.info.weights, runner.info.device, runner.info.threads) == \
        ("llamacpp", "F32", "cpu", 1)
    assert runner.name == "tiny-qwen2 (F32)" and runner.end_tokens == ()  # the fixture has no tokenizer


def test_the_backend_is_set_up_once_by_the_first_runner(runner):
    """Loading a runner set llama.cpp up; asking again, from several threads at once, is a no-op."""
    assert backend_ready()
    with ThreadPoolExecutor(4) as pool:
        assert list(pool.map(lambda _: ensure_backend(), range(8))) == [None] * 8
    assert backend_ready()


def test_conformance_on_the_tiny_gguf(runner, record_property):
    # f32 rounding only: few-row and one-row products sum in different orders (4.8e-5 with AVX2 kernels, 2.7e-4
    # with AVX-512 ones, repacked or not); a wrong mask or position moves logits by whole units.
    report = check_runner_conformance(runner, atol=1e-3)
    for check, diff in report.max_diff.items():
        record_property(f"max_diff_{check}", diff)
    print("llama.cpp tiny f32 max |logit diff| vs chain:", {k: f"{v:.2g}" for k, v in report.max_diff.items()})


def test_logits_match_the_hugging_face_model(runner, tiny_hf):
    """The fixture is a faithful GGUF of the HF model, so the two runtimes agree (llama.cpp keeps K/V in f16)."""
    ids = torch.randint(0, TINY_VOCAB, (40,), generator=torch.Generator().manual_seed(3))
    got = runner.session().forward(ids.tolist())
    with torch.no_grad():
        want = tiny_hf(ids[None]).logits[0]
    assert (got - want).abs().max() < 2e-2 * want.abs().max()


def test_tree_on_a_session_holding_an_earlier_tree(runner):
    """Forwarding a tree while an unkept tree is still cached (the drafter re-growing) stays exact."""
    s = runner.session()
    prompt = list(range(10, 30))
    s.forward(prompt, keep=1)
    s.forward([1, 2, 3], [19, 19, 20])  # an earlier tree, left in the cache
    toks = list(range(50, 50 + len(TREE)))
    got = s.forward(toks, [19 if p < 0 else 23 + p for p in TREE])
    for leaf in (5, 13):
        path = tree_path(TREE, leaf)
        want = runner.session().forward(prompt + [toks[i] for i in path], keep=len(path))
        torch.testing.assert_close(got[path], want, atol=1e-4, rtol=0)


def test_a_stale_session_and_a_closed_runner_refuse(tiny_gguf):
    r = load_llamacpp_runner(tiny_gguf, SMALL)
    old = r.session()
    old.forward([1, 2, 3])
    new = r.session()
    assert len(new) == 0
    with pytest.raises(RuntimeError, match="stale"):
        old.forward([4])
    with pytest.raises(RuntimeError, match="stale"):
        old.keep(1, [])
    r.close()
    r.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        new.forward([1])
    with pytest.raises(RuntimeError, match="closed"):
        r.session()


def test_bad_tokens_and_a_full_context_are_value_errors(runner):
    s = runner.session()
    with pytest.raises(ValueError, match=rf"token ids must be in 0..{TINY_VOCAB - 1}"):
        s.forward([1, TINY_VOCAB])
    with pytest.raises(ValueError, match="exceed the context"):
        s.forward([1] * (runner.max_context + 1))
    assert len(s) == 0
    s.forward([1, 2])  # still usable
    assert len(s) == 2


def test_loader_names_what_is_wrong(tmp_path):
    with pytest.raises(FileNotFoundError, match="no GGUF file at"):
        load_llamacpp_runner(tmp_path / "missing.gguf")
    bad = tmp_path / "model.safetensors"
    bad.write_bytes(b"\x00" * 64)
    with pytest.raises(ValueError, match="is not a GGUF file"):
        load_llamacpp_runner(bad)
    with pytest.raises(ValueError, match="n_ubatch <= n_batch"):
        LlamaCppOptions(n_batch=64, n_ubatch=128)
    with pytest.raises(ValueError, match="n_batch must be at least 256"):   # llama.cpp would abort the process
        LlamaCppOptions(n_batch=128, n_ubatch=128)


def test_requantize_writes_once_and_the_copy_runs(tiny_gguf, tmp_path):
    src = tmp_path / "tiny.Q4_K_M.gguf"   # named as the shipped files are, to check the new name
    src.write_bytes(tiny_gguf.read_bytes())
    assert requantized_path(src, "Q8_0") == tmp_path / "tiny.Q8_0.gguf"
    out = requantize(src, "q8_0")
    assert out == tmp_path / "tiny.Q8_0.gguf" and not list(tmp_path.glob("*.tmp-*"))
    made = out.stat().st_mtime_ns
    assert requantize(src, "Q8_0") == out and out.stat().st_mtime_ns == made   # kept, not written again
    with load_llamacpp_runner(out, SMALL) as q8, load_llamacpp_runner(tiny_gguf, SMALL) as f32:
        assert q8.info.weights == "Q8_0"
        a, b = (r.session().forward([5, 17, 3, 99], keep=1) for r in (q8, f32))
        assert (a - b).abs().max() < 0.1 * b.abs().max()   # 8-bit weights: close to the f32 model's logits
    with pytest.raises(ValueError, match="unknown GGUF weight type 'Q3_X'"):
        requantize(src, "Q3_X")
    with pytest.raises(FileNotFoundError, match="no GGUF file"):
        requantize(tmp_path / "missing.gguf", "Q4_0")


def test_many_runners_open_and_close(tiny_gguf):
    """Five runners in turn, each freed on leaving its block: each computes the same logits as the first
    (no state left over from a freed one), and a closed runner refuses work instead of reading freed memory."""
    first = None
    for _ in range(5):
        with load_llamacpp_runner(tiny_gguf, SMALL) as r:
            logits = r.session().forward([1, 2, 3], keep=1)
        assert logits.shape == (1, r.vocab_size) and bool(logits.isfinite().all())
        first = logits if first is None else first
        assert (logits - first).abs().max() < 1e-4 * (1 + first.abs().max())
        with pytest.raises(RuntimeError, match="the runner was closed"):
            r.session()


# ------------------------------------------------------------------ the embedded target (Q4_K_M)
@pytest.fixture(scope="module")
def embedded_target(tmp_path_factory):
    try:
        locate_parts(TARGET)
    except EmbeddedModelError as exc:
        pytest.skip(f"embedded parts not installed: {exc}")
    from sequoia.runners.embedded import default_cache_dir

    path = ensure_gguf(TARGET, default_cache_dir())
    # one thread: on a shared 2-core machine a second llama.cpp thread spin-waits for a descheduled peer
    with load_llamacpp_runner(path, LlamaCppOptions(n_ctx=1024, n_threads=1)) as r:
        yield r


@pytest.mark.embedded
def test_embedded_target_tree_argmax_equals_chain(embedded_target, record_property):
    """Every node of a 16-node tree has its chain's argmax unless the chain's top two logits are nearer than
    the runtime's own rounding (few-row and one-row Q4_K_M products round differently: the same chain split
    at another place differs by 0.3-0.6 here, so a margin under 1.0 may flip); logits differ only that much."""
    r = embedded_target
    assert r.info.weights == "Q4_K_M" and r.vocab_size == 151936
    assert 151645 in r.end_tokens  # <|im_end|>
    t0 = time.perf_counter()
    prompt = [151644, 872, 198, 750, 75698, 1445, 982, 262, 421, 308, 366, 220, 17, 25, 262, 470]
    tree = (-1, 0, 0, 0, 1, 1, 2, 3, 4, 4, 6, 8, 8, 10, 11, 11)  # 16 nodes, depth 5, 7 leaves
    toks = torch.randint(0, 151000, (len(tree),), generator=torch.Generator().manual_seed(0)).tolist()
    s = r.session()
    s.forward(prompt, keep=1)
    got = s.forward(toks, [len(prompt) - 1 if p < 0 else len(prompt) + p for p in tree])
    worst, flips = 0.0, 0
    for leaf in [i for i in range(len(tree)) if i not in tree]:
        path = tree_path(tree, leaf)
        want = r.session().forward(prompt + [toks[i] for i in path], keep=len(path))
        top2 = want.topk(2, dim=-1).values
        agree = got[path].argmax(-1) == want.argmax(-1)
        assert bool((agree | (top2[:, 0] - top2[:, 1] < 1.0)).all()), f"argmax differs on the path to node {leaf}"
        flips += int((~agree).sum())
        worst = max(worst, (got[path] - want).abs().max().item())
    record_property("embedded_near_tie_flips", flips)
    s = r.session()  # the runtime's own noise: the last path as prompt, then path (two batches), vs one batch
    s.forward(prompt, keep=1)
    noise = (s.forward([toks[i] for i in path]) - want).abs().max().item()
    record_property("embedded_max_abs_logit_diff", worst)
    record_property("embedded_chain_split_diff", noise)
    print(f"embedded Q4_K_M target: tree vs chain max |logit diff| {worst:.3g}; the same chain split in two "
          f"batches differs by {noise:.3g} ({time.perf_counter() - t0:.1f} s)")
    assert worst < 2.0, "a wrong mask or position shifts logits by whole units, not tenths"


@pytest.mark.embedded
def test_the_mixed_backend_pairs_the_hugging_face_target_with_a_q4_0_draft_on_llamacpp():
    """``backend="mixed"``: the embedded draft requantized once by llama.cpp, the bf16 target on torch; the pair's
    fingerprint names both runtimes, and the engine drafts with one and verifies with the other."""
    try:
        locate_parts(TARGET)
    except EmbeddedModelError as exc:
        pytest.skip(f"embedded parts not installed: {exc}")
    from sequoia.core.config import GenerationConfig
    from sequoia.runtime.engine import SpeculativeEngine
    from sequoia.runtime.measuring.fingerprint import expected_fingerprint, machine_fingerprint
    from sequoia.runtime.methods import make_method
    from sequoia.runtime.models import load_pair

    pair = load_pair(backend="mixed", dtype="bf16", blocked_weights=False)   # one copy of the target: less memory
    try:
        assert pair.backend == "mixed" and pair.draft.info.runtime == "llamacpp" and pair.target.info.runtime == "hf"
        assert pair.draft.info.weights == "Q4_0" and pair.draft.path.name.endswith(".Q4_0.gguf")
        fp = machine_fingerprint(pair)
        assert fp.runtime == "llamacpp+hf" and fp.draft_dtype == "Q4_0"
        predicted = expected_fingerprint(pair.device, pair.dtype, "int4", blocked_weights=False, backend="mixed")
        assert not predicted.mismatches(fp)   # the profile a mixed server measures is found again before loading
        ids = pair.encode_prompt("Write a Python function that reverses a list.")
        steps = list(SpeculativeEngine(pair).generate(ids, make_method("chain", budget=4),
                                                      GenerationConfig(max_new_tokens=16)))
        assert sum(s.n_new for s in steps) == 16 and sum(s.n_accepted for s in steps) > 0
    finally:
        pair.draft.close()
        del pair
        gc.collect()   # the suite's process holds other embedded models: give this target's memory back now
