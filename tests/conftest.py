"""Shared fixtures: tiny random-weight models built from a config (nothing downloaded)."""

from __future__ import annotations

import importlib.util
import os
import sys

# Threads that wait for work sleep instead of spinning (GNU OpenMP, torch's CPU threads): a test's torch threads
# spinning while another process (the second test worker, a browser, the app's llama.cpp threads, another job on
# the machine) holds a core made its small forwards 3-5x slower (tests/tools/test_gpu_check.py beside one busy
# loop on 2 cores: 135 s spinning, 39 s sleeping; 26 s on a quiet machine).  Set before torch loads OpenMP; the
# scripts the tests start inherit it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
if "torch" in sys.modules:   # a plugin imported it first: OpenMP read the policy already
    import warnings

    warnings.warn("torch was imported before tests/conftest.py: its threads spin while waiting", stacklevel=1)
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from sequoia.tools.gpucheck.models import perturbed  # noqa: F401 (a noisy copy of a model: the drafts the tests use)

# Tiny models gain nothing from threads, and on a shared 2-core machine thread
# contention makes them ~6x slower.  Tests of real-size models raise this
# again with the `full_threads` fixture.
torch.set_num_threads(1)


@pytest.fixture
def full_threads():
    import os

    before = torch.get_num_threads()
    torch.set_num_threads(os.cpu_count() or 1)
    yield
    torch.set_num_threads(before)


def pytest_configure(config):
    config.addinivalue_line("markers", "embedded: needs the embedded Qwen2.5-Coder pair (slow, converts once)")
    config.addinivalue_line("markers", "slow: takes more than a few seconds")
    config.addinivalue_line("markers", "browser: drives headless Chromium")
    config.addinivalue_line("markers", "gpu: needs CUDA")


def pytest_xdist_auto_num_workers(config):
    """Workers for pyproject's ``-n auto``: one a core, at most 4 (each full-size group below runs in one of them
    whatever the count, so more buy little); none (one process, no xdist) under ``-s``, whose prints a worker
    would swallow, and ``-n 0`` or ``-p no:xdist`` turn it off too."""
    import os

    if config.getoption("capture", "fd") == "no":
        return 0
    return max(1, min(os.cpu_count() or 1, 4))


#: The xdist groups of the tests that hold full-size models, each run one after another in one worker, so that
#: one process holds each group's gigabytes (two workers each holding them all thrashed a 24 GB machine): the
#: embedded pair with a float32 target (conftest's session fixture, ~7 GB), and the pages and browsers (the
#: embedded pair served, up to ~11 GB with two runtimes loaded, or the tiny pair's).  The two may share a worker;
#: every other module runs whole in any.  xdist starts the groups with the most tests first: the pages' group at
#: once, the float32 pair's beside the modules.  (Started first, at once with the pages' group, the float32
#: group's two threads and the pages' slowed each other: a quarter of the suite in 11 minutes, against 13 min
#: 28 s for all of it this way.)
FLOAT32, SERVED = "float32-pair", "pages"


def pytest_itemcollected(item):
    """Under ``--dist loadgroup`` (pyproject's addopts), in a worker: the test's group (:data:`FLOAT32`,
    :data:`SERVED`, else its module, whose module-scoped fixtures are then built once) as the ``@group`` suffix of
    its node id that xdist's scheduler reads.  xdist's own ``xdist_group`` mark cannot do it under pytest 9.2: it
    sets ``item._nodeid``, which no longer is the node id (``item._id``), so every test ran in any worker and
    both workers held the full-size models."""
    if not getattr(item.config.option, "loadgroup", False):
        return
    if "embedded_pair_fp32" in getattr(item, "fixturenames", ()):
        group = FLOAT32
    elif item.get_closest_marker("embedded") or item.get_closest_marker("browser"):
        group = SERVED
    else:
        group = item.nodeid.split("::")[0]
    item._id = type(item._id).parse(f"{item.nodeid}@{group}")


class CharTokenizer:
    """Just enough of a tokenizer for the engine: token i decodes to a short string."""

    def __init__(self, vocab: int) -> None:
        self.vocab = vocab

    def __len__(self) -> int:
        return self.vocab

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return "".join(f"<{int(i)}>" for i in ids)

    def batch_decode(self, seqs, skip_special_tokens: bool = False) -> list[str]:
        return [self.decode(s) for s in seqs]


class ChatCharTokenizer(CharTokenizer):
    """A CharTokenizer that also encodes text and has a chat template, as the app's prompt path needs.

    Each character maps to one of ids 1..40, so any text encodes within a 48-token vocabulary.
    """

    chat_template = "user: {content}\nassistant: "

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict:
        return {"input_ids": [1 + ord(c) % 40 for c in text]}

    def apply_chat_template(self, messages, add_generation_prompt: bool = True, tokenize: bool = False) -> str:
        assert not tokenize
        return "".join(self.chat_template.format(content=m["content"]) for m in messages)


def tiny_model(seed: int, vocab: int = 48, init: float = 0.3, layers: int = 2, hidden: int = 32):
    cfg = Qwen2Config(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        tie_word_embeddings=False, initializer_range=init, attn_implementation="sdpa",
    )
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(cfg).eval().float()


def runner(model, name: str = "tiny", role: str = "target"):
    """``model`` behind the Hugging Face runner's plain path (a runner is passed through)."""
    from sequoia.runners.hf.loading import wrap_model

    return model if hasattr(model, "session") else wrap_model(model, name, role, plain=True)


def make_pair(draft, target, vocab: int, eos=()) -> SimpleNamespace:
    draft, target = runner(draft, "tiny-draft", "draft"), runner(target, "tiny-target")
    return SimpleNamespace(draft=draft, target=target, tokenizer=CharTokenizer(vocab), device=torch.device("cpu"),
                           dtype=torch.float32, eos_token_ids=tuple(eos), draft_name="tiny-draft",
                           target_name="tiny-target", vocab_size=vocab)


@pytest.fixture(scope="session")
def tiny_target():
    return tiny_model(0)


@pytest.fixture(scope="session")
def tiny_pairs(tiny_target):
    """draft == target (all accepted), a noisy copy (some accepted), an unrelated model (mostly rejected)."""
    vocab = tiny_target.config.vocab_size
    return {
        "same": make_pair(tiny_target, tiny_target, vocab),
        "noisy": make_pair(perturbed(tiny_target, 0.5, 1), tiny_target, vocab),
        "random": make_pair(tiny_model(7), tiny_target, vocab),
    }


def app_pair(draft, target):
    """A real :class:`sequoia.runtime.models.ModelPair` of tiny models, so ``encode_prompt`` runs the library's code."""
    from sequoia.runtime.models import ModelPair

    return ModelPair(draft=runner(draft, "tiny-draft", "draft"), target=runner(target, "tiny-target"),
                     tokenizer=ChatCharTokenizer(target.config.vocab_size),
                     draft_name="tiny-draft", target_name="tiny-target", device=torch.device("cpu"),
                     dtype=torch.float32, draft_int8=False, eos_token_ids=())


@pytest.fixture(scope="session")
def lanes():
    """The app's model-free work lanes (components.app_state.lanes), one set for the session: one DP process, not one a test."""
    from components.app_state.lanes import WorkLanes

    return WorkLanes()


@pytest.fixture(scope="session")
def tiny_app_pair(tiny_target):
    """The app's pair: draft == target, so every draft token is accepted and runs are short and deterministic."""
    return app_pair(tiny_target, tiny_target)


@pytest.fixture(scope="module")
def demo(tiny_app_pair, tmp_path_factory, lanes):
    """The whole app on the tiny pair, one a test module (a module with its own ``demo`` builds its own page)."""
    import app

    return app.build_demo(tiny_app_pair, assets_dir=tmp_path_factory.mktemp("assets"), max_budget=24, lanes=lanes)


@pytest.fixture()
def ctx(demo):
    """The app context behind :func:`demo`."""
    return demo.sequoia_context


@pytest.fixture(scope="session")
def embedded_pair_fp32():
    """The real embedded pair with an fp32 target: exactness tests need fp32 logits (docs/models.md)."""
    import os

    from sequoia.runtime.models import load_pair

    torch.set_num_threads(os.cpu_count() or 1)
    try:
        yield load_pair(dtype="fp32", draft_int8=True)
    finally:
        torch.set_num_threads(1)


def load_script(name: str) -> ModuleType:
    """``scripts/<name>.py`` imported as the module ``name`` (scripts are run, not packaged); registered in
    ``sys.modules`` before it runs, as an import would (a dataclass in it looks its module up)."""
    path = next((Path(__file__).resolve().parents[1] / "scripts").rglob(f"{name}.py"))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
