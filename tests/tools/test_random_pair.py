"""scripts/make_random_pair.py: random-weight HF folders from a seed, loadable as SEQUOIA_DRAFT / SEQUOIA_TARGET."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import app
from sequoia.core.config import GenerationConfig
from sequoia.core.trees.tree import Tree
from sequoia.runtime.drafter import StaticTreeProposer
from sequoia.runtime.engine import SpeculativeEngine
from sequoia.tools.random_pair import PAIRS, make_pair

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny_pair_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("random-pair")
    make_pair(out, "tiny", seed=5)
    return out


def test_the_same_seed_writes_the_same_bytes_and_another_seed_others(tiny_pair_dir, tmp_path):
    make_pair(tmp_path / "again", "tiny", seed=5)
    make_pair(tmp_path / "other", "tiny", seed=6)
    for role in ("draft", "target"):
        first = (tiny_pair_dir / role / "model.safetensors").read_bytes()
        assert first == (tmp_path / "again" / role / "model.safetensors").read_bytes()
        assert first != (tmp_path / "other" / role / "model.safetensors").read_bytes()
    written = json.loads((tiny_pair_dir / "random_pair.json").read_text())
    assert written["pair"] == "tiny" and written["tokenizer"].startswith("byte-level")


def test_the_real_shapes_are_qwens():
    emb, big = PAIRS["embedded"], PAIRS["7b"]
    assert (emb.draft.hidden, emb.draft.layers, emb.draft.vocab, emb.draft.tied) == (896, 24, 151936, True)
    assert (emb.target.hidden, emb.target.layers, emb.target.kv_heads) == (1536, 28, 2)
    t = big.target
    assert (t.hidden, t.layers, t.heads, t.kv_heads, t.intermediate, t.vocab) == (3584, 28, 28, 4, 18944, 152064)


def test_the_folders_load_from_the_environment_and_decode(tiny_pair_dir):
    env = {"SEQUOIA_DRAFT": str(tiny_pair_dir / "draft"), "SEQUOIA_TARGET": str(tiny_pair_dir / "target"),
           "SEQUOIA_DEVICE": "cpu", "SEQUOIA_DTYPE": "fp32", "SEQUOIA_DRAFT_QUANT": "none"}
    pair = app.load_from_env(env)
    assert pair.vocab_size == 259 and pair.target.vocab_size == 512 and pair.eos_token_ids
    ids = pair.encode_prompt("def f(x):")
    assert ids[0] == pair.tokenizer.convert_tokens_to_ids("<|im_start|>")
    config = GenerationConfig(max_new_tokens=12, stop_at_eos=False)
    records = list(SpeculativeEngine(pair).generate(ids, StaticTreeProposer(Tree.k_ary(2, 2), name="k"), config))
    assert sum(len(r.new_tokens) for r in records) == 12
    assert isinstance(pair.tokenizer.decode(records[0].new_tokens), str)


@pytest.mark.slow
def test_the_script_runs_with_tiny(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "make_random_pair.py"), "--out", str(tmp_path),
                           "--tiny", "--seed", "1"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "target" / "model.safetensors").is_file() and "byte-level" in proc.stdout
    bad = subprocess.run([sys.executable, str(ROOT / "scripts" / "make_random_pair.py"), "--out", str(tmp_path),
                          "--tokenizer", str(tmp_path / "nowhere")], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "--tokenizer: no such folder" in bad.stderr
