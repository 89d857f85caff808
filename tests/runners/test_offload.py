"""The streamed target on CPU: the resident runner's outputs, the bound on layers in flight, one copy in memory.

Host and device are the same memory here, so the stream's copies are plain
copies into its slots and its events do nothing; the schedule, the hooks and
the numbers are the ones a GPU runs (the GPU's overlap is measured by
``scripts/gpu/offload_check.py``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import make_pair, tiny_model

from sequoia.core.config import GenerationConfig
from sequoia.runners.hf.loading import load_model, wrap_model
from sequoia.runners.offload.checkpoint import Checkpoint
from sequoia.runners.offload.runner import STREAMED, load_streamed_runner
from sequoia.runtime.engine import SpeculativeEngine
from sequoia.runtime.methods import make_method
from sequoia.tools.gpucheck.models import perturbed

PROMPT = [1, 5, 9, 3, 7]
CPU = torch.device("cpu")


def _saved(tmp_path: Path, layers: int = 4, tied: bool = False, dtype=torch.float32):
    model = tiny_model(11, vocab=64, layers=layers)
    if tied:
        model.config.tie_word_embeddings = True
        model.lm_head.weight = model.model.embed_tokens.weight
    folder = tmp_path / f"target-{layers}-{tied}-{str(dtype)[6:]}"
    model.to(dtype).save_pretrained(folder, safe_serialization=True)
    return model.float(), folder


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    return _saved(tmp_path_factory.mktemp("offload"))


def _tokens(pair, method, n=30):
    records = SpeculativeEngine(pair).generate(PROMPT, method, GenerationConfig(max_new_tokens=n))
    return [t for r in records for t in r.new_tokens]


@pytest.mark.parametrize("name,kwargs", [("ar", {}), ("sequoia", {"budget": 16, "depth": 5}),
                                         ("sequoia", {"budget": 40, "depth": 8})])
def test_greedy_output_equals_the_resident_runner(saved, name, kwargs):
    model, folder = saved
    draft = perturbed(model, 0.5, 1)
    streamed = load_streamed_runner(folder, "streamed", CPU, torch.float32)
    want = _tokens(make_pair(draft, wrap_model(model, "resident"), 64), make_method(name, **kwargs))
    got = _tokens(make_pair(draft, streamed, 64), make_method(name, **kwargs))
    assert got == want
    assert STREAMED in streamed.info.kernels


def test_tree_logits_equal_the_resident_runner_bit_for_bit(saved):
    model, folder = saved
    streamed = load_streamed_runner(folder, "streamed", CPU, torch.float32)
    parents = [-1, 0, 0, 1, 1, 2]
    rows = []
    for runner in (wrap_model(model, "resident"), streamed):
        s = runner.session()
        s.forward(PROMPT)
        rows.append(s.forward([3, 4, 5, 6, 7, 8], [len(PROMPT) - 1] + [len(PROMPT) + p for p in parents[1:]]))
    assert torch.equal(rows[0], rows[1])


@pytest.mark.parametrize("in_flight", [1, 2, 3])
def test_at_most_in_flight_layers_are_on_the_device(tmp_path, in_flight):
    _, folder = _saved(tmp_path, layers=4)
    log: list = []
    runner = load_streamed_runner(folder, "streamed", CPU, torch.float32, in_flight=in_flight, log=log)
    s = runner.session()
    for chunk in ([1, 2, 3], [4], [5, 6]):
        s.forward(chunk)
    held: dict[int, int] = {}                       # slot -> layer copied into it and not yet freed
    computed = []
    for kind, layer, slot in log:
        if kind == "copy":
            assert slot not in held, f"layer {layer} copied into slot {slot} while layer {held.get(slot)} holds it"
            held[slot] = layer
            assert len(held) <= in_flight
        elif kind == "compute":
            assert held.get(slot) == layer, f"layer {layer} computes from slot {slot} holding {held.get(slot)}"
            computed.append(layer)
        else:
            assert held.pop(slot) == layer
    assert computed == [0, 1, 2, 3] * 3
    assert len(runner.stream.slots) == in_flight


def test_a_forward_stopped_part_way_restarts_the_ring(saved):
    model, folder = saved
    streamed = load_streamed_runner(folder, "streamed", CPU, torch.float32)
    s = streamed.session()
    layer = streamed.model.model.layers[1]
    handle = layer.register_forward_pre_hook(lambda m, a: (_ for _ in ()).throw(RuntimeError("stop")))
    with pytest.raises(RuntimeError, match="stop"):
        s.forward(PROMPT)
    handle.remove()
    assert torch.equal(streamed.session().forward(PROMPT), wrap_model(model, "resident").session().forward(PROMPT))


def test_a_tied_head_and_a_bf16_checkpoint_load(tmp_path):
    _, folder = _saved(tmp_path, layers=2, tied=True, dtype=torch.bfloat16)
    streamed = load_streamed_runner(folder, "streamed", CPU, torch.float32)
    assert streamed.model.lm_head.weight is streamed.model.model.embed_tokens.weight
    assert "lm_head.weight" not in Checkpoint(folder)
    want = wrap_model(load_model(folder, CPU, torch.float32), "resident").session().forward(PROMPT)
    assert torch.equal(streamed.session().forward(PROMPT), want)


def test_the_shared_conformance_checks_pass(saved):
    from runner_checks import check_runner_conformance

    check_runner_conformance(load_streamed_runner(saved[1], "streamed", CPU, torch.float32, in_flight=3), atol=1e-5)


_PEAK = """
import json, sys, torch
from sequoia.runners.offload.runner import load_streamed_runner
from transformers import AutoConfig, AutoModelForCausalLM

def hwm():
    return next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmHWM"))

with torch.device("meta"):
    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(sys.argv[1]))   # imports the modeling code
open("/proc/self/clear_refs", "w").write("5")       # the peak restarts at the current resident size
before = hwm()
runner = load_streamed_runner(sys.argv[1], "streamed", torch.device("cpu"), torch.float32)
print(json.dumps({"grew": hwm() - before, "host": runner.host_bytes, "resident": runner.resident_bytes,
                  "slots": sum(s.numel() * s.element_size() for s in runner.stream.slots)}))
"""


@pytest.mark.slow
def test_loading_holds_the_weights_once(tmp_path):
    """The process peak grows by the weights and the two device slots (here in the same memory), not twice."""
    model = tiny_model(5, vocab=4096, layers=8, hidden=512)    # 92 MB in fp32
    folder = tmp_path / "mid"
    model.save_pretrained(folder, safe_serialization=True)
    del model
    out = subprocess.run([sys.executable, "-c", _PEAK, str(folder)], capture_output=True, text=True, timeout=600,
                         cwd=Path(__file__).parents[2])
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    weights, layer = got["host"] + got["resident"], got["slots"] / 2
    assert got["grew"] <= weights + got["slots"] + layer + 16e6, got   # slack: allocator and interpreter pages
    assert got["grew"] >= weights, got                                # the loader did hold the weights


def test_load_pair_streams_the_target_when_asked(tmp_path):
    from components.app_state.pair_room import LoadedPair
    from sequoia.runners.offload.runner import StreamedRunner
    from sequoia.runtime.models import load_pair
    from sequoia.tools.random_pair import make_pair as write_pair

    write_pair(tmp_path, "tiny", seed=3)
    folders = {role: str(tmp_path / role) for role in ("draft", "target")}
    streamed = load_pair(folders["draft"], folders["target"], device="cpu", dtype="fp32", backend="offload",
                         draft_quant="none")
    resident = load_pair(folders["draft"], folders["target"], device="cpu", dtype="fp32", draft_quant="none",
                         plain=True)
    assert isinstance(streamed.target, StreamedRunner) and streamed.target_streamed
    assert not isinstance(resident.target, StreamedRunner) and not resident.target_streamed
    method = make_method("sequoia", budget=12, depth=4)
    assert _tokens(streamed, method, 12) == _tokens(resident, method, 12)
    room = LoadedPair(loader=lambda: streamed, _pair=streamed)
    assert "target streamed from host memory" in room.label()


def test_the_environment_names_offload():
    from app import offload_from_env

    assert offload_from_env({}) is None
    assert offload_from_env({"SEQUOIA_OFFLOAD": "1"}) is True
    assert offload_from_env({"SEQUOIA_OFFLOAD": "0"}) is False


@pytest.mark.slow
def test_the_offload_check_runs_on_cpu(tmp_path):
    """scripts/gpu/offload_check.py's smoke mode: every part runs and the report is written (timings mean nothing)."""
    from conftest import load_script

    assert load_script("offload_check").main(["--device", "cpu", "--shapes", "tiny", "--out", str(tmp_path),
                                             "--repeats", "1", "--steps", "2"]) == 0
    result = json.loads((tmp_path / "offload_check.json").read_text())
    assert result["profile"]["target_n"][-1] == 1024
    assert len(result["projections"]) >= 1 and "steps" in result
    assert "ms_per_token" in result["accelerate"] or "error" in result["accelerate"]
    # what ran is named, and accelerate is reported over pinned buffers (measured) and ordinary memory (projected)
    assert {"python", "torch", "transformers", "accelerate"} <= set(result["versions"])
    assert result["copy_pageable"]["gb_per_s"] > 0 and "accelerate_ordinary" in result
    assert "speedup_vs_accelerate_ordinary" in result["projections"][0]
    assert "ordinary memory" in (tmp_path / "offload_check.md").read_text()
    assert (tmp_path / "offload_profile.json").is_file() and (tmp_path / "offload_check.md").is_file()


def test_a_cpu_target_streams_only_when_asked(saved):
    from sequoia.runtime.models import streams_target, target_bytes

    folder = saved[1]
    assert streams_target(None, folder, CPU, torch.float32) is False
    assert streams_target(True, folder, CPU, torch.float32) is True
    assert streams_target(False, folder, CPU, torch.float32) is False
    assert target_bytes(folder, torch.bfloat16) * 2 == target_bytes(folder, torch.float32) == Checkpoint(folder).nbytes


@pytest.mark.slow
def test_the_profile_command_measures_a_streamed_target_up_to_1024_tokens(tmp_path):
    from sequoia.core.profiles.profile import HardwareProfile
    from sequoia.tools.cli import main
    from sequoia.tools.random_pair import make_pair as write_pair

    write_pair(tmp_path, "tiny", seed=3)
    out = tmp_path / "profile.json"
    assert main(["profile", "--draft", str(tmp_path / "draft"), "--target", str(tmp_path / "target"), "--device",
                 "cpu", "--dtype", "fp32", "--draft-quant", "none", "--backend", "hf", "--offload", "--contexts",
                 "--repeats", "1", "--threads", "1", "--out", str(out)]) == 0
    profile = HardwareProfile.load(out)
    assert profile.max_tokens == 1024 and "streamed target" in profile.note


class _FakeCudart:
    """torch.cuda.cudart() as host_buffer uses it, recording the calls in order."""

    def __init__(self, register_result: int) -> None:
        self.register_result, self.calls = register_result, []

    def cudaHostRegister(self, ptr, size, flags):
        self.calls.append("register")
        return self.register_result

    def cudaHostUnregister(self, ptr):
        self.calls.append("unregister")
        return 0

    def cudaGetLastError(self):
        self.calls.append("read last error")
        return 0


def test_a_failed_registration_clears_its_error_and_a_freed_buffer_waits_for_its_copies(monkeypatch):
    """host_buffer on a GPU, with the runtime stood in: a failed cudaHostRegister is read back (else the next
    kernel's launch check raises it) before torch's pinned memory stands in; a registered buffer, once freed,
    drains the device's queued copies before it is unregistered."""
    import gc

    from sequoia.runners.offload import stream

    real_empty = torch.empty
    monkeypatch.setattr(stream.torch, "empty", lambda *a, pin_memory=False, **k: real_empty(*a, **k))
    failed = _FakeCudart(register_result=712)   # cudaErrorHostMemoryAlreadyRegistered
    monkeypatch.setattr(stream.torch.cuda, "cudart", lambda: failed)
    buf = stream.host_buffer(16, torch.bfloat16, pin=True)
    assert buf.shape == (16,) and failed.calls == ["register", "read last error"]

    ok = _FakeCudart(register_result=0)
    monkeypatch.setattr(stream.torch.cuda, "cudart", lambda: ok)
    monkeypatch.setattr(stream.torch.cuda, "synchronize", lambda *a: ok.calls.append("synchronize"))
    buf = stream.host_buffer(16, torch.bfloat16, pin=True)
    del buf
    gc.collect()
    assert ok.calls == ["register", "synchronize", "unregister"]
