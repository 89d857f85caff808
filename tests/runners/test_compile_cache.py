"""The compiled draft's artifacts (runners/hf/graphs/compile_cache.py): keying, files, the fallback, the status line.

A real inductor compile takes minutes and needs CUDA for the path that matters, so ``torch.compile`` and
``torch.compiler.save/load_cache_artifacts`` are replaced by fakes here; what is tested is everything
around them: which file a compile is saved to and loaded from, what happens when none is there or it is
damaged, when compilation is unavailable (off CUDA, ZeroGPU, no triton) and when the compiled forward fails.
"""

from __future__ import annotations

import logging

import pytest
import torch
from conftest import tiny_model

from sequoia.runners.base import RunnerInfo
from sequoia.runners.hf.graphs import compile_cache as cc
from sequoia.runners.hf.graphs.capture import _first_call
from sequoia.runners.hf.graphs.graph_runner import GraphRunner
from sequoia.runners.hf.loading import compile_plan, wrap_model

INFO = RunnerInfo(runtime="hf", weights="fp32", device="cpu")
H100 = cc.CompileKey("2.11.0+cu130", "3.5.0", "NVIDIA H100 80GB HBM3", "sm_90")


class FakeMegaCache:
    """Stands in for torch.compiler's save/load_cache_artifacts: remembers what was loaded, saves a blob."""

    def __init__(self, blob: bytes = b"compiled kernels") -> None:
        self.blob, self.loaded = blob, []

    def save(self):
        return (self.blob, object()) if self.blob else None

    def load(self, data: bytes):
        if data.startswith(b"bad"):
            raise RuntimeError("not a cache artifact")
        self.loaded.append(data)


@pytest.fixture
def mega(monkeypatch):
    fake = FakeMegaCache()
    monkeypatch.setattr(torch.compiler, "save_cache_artifacts", fake.save)
    monkeypatch.setattr(torch.compiler, "load_cache_artifacts", fake.load)
    monkeypatch.setattr(torch, "compile", lambda model, **kw: ("compiled", model))
    return fake


def test_the_key_names_torch_triton_and_the_gpu(tmp_path):
    assert H100.slug() == "torch-2.11.0+cu130_triton-3.5.0_NVIDIA-H100-80GB-HBM3_sm_90"
    others = [cc.CompileKey("2.11.1", "3.5.0", H100.gpu, "sm_90"), cc.CompileKey(H100.torch, "3.6.0", H100.gpu,
              "sm_90"), cc.CompileKey(H100.torch, H100.triton, "NVIDIA RTX PRO 6000 Blackwell", "sm_120")]
    paths = {cc.artifacts_path(tmp_path, k) for k in [H100, *others]}
    assert len(paths) == 4 and all(p.parent == tmp_path / cc.SUBDIR and p.suffix == ".bin" for p in paths)
    assert "/" not in cc.CompileKey("2.11", "3", "a/b c", "sm_90").slug()


def test_where_compilation_is_unavailable_it_says_why():
    cuda = torch.device("cuda")
    assert cc.unavailable_reason(torch.device("cpu"), {}) == "not on CUDA"
    assert "ZeroGPU" in cc.unavailable_reason(cuda, {cc.ZERO_GPU_ENV: "true"}, triton="3.5.0")
    assert cc.unavailable_reason(cuda, {}, triton=None) == "triton is not installed"
    assert cc.unavailable_reason(cuda, {}, triton="3.5.0") is None
    plan = cc.CompilePlan.for_draft(torch.device("cpu"), "/tmp/x")
    assert not plan.enabled and plan.reason == "not on CUDA"
    assert "uncompiled forward runs under the graphs" in cc.CompileStatus.off(plan.reason).line()


def test_the_default_compiles_the_draft_only_and_an_impossible_compile_is_an_error():
    cpu = torch.device("cpu")
    assert compile_plan(cpu, "target", None, None).reason == "only the draft is compiled by default"
    assert compile_plan(cpu, "draft", None, None) == cc.CompilePlan(False, "not on CUDA")
    assert compile_plan(cpu, "draft", False, None).reason == "not asked"
    with pytest.raises(ValueError, match="compile=True: not on CUDA"):
        compile_plan(cpu, "draft", True, None)
    assert not isinstance(wrap_model(tiny_model(0), "d", "draft"), GraphRunner)   # CPU: the eager runner


def test_save_then_load_round_trips_through_the_file(tmp_path, mega):
    path = cc.artifacts_path(tmp_path, H100)
    assert cc.load_artifacts(path) == 0 and mega.loaded == []          # nothing saved yet: a cold compile
    assert cc.save_artifacts(path) == len(mega.blob) and path.read_bytes() == mega.blob
    assert not list(path.parent.glob("*.tmp*"))                         # written whole, then renamed
    assert cc.load_artifacts(path) == len(mega.blob) and mega.loaded == [mega.blob]
    mega.blob = b""                                                     # a process that compiled nothing
    assert cc.save_artifacts(tmp_path / "other.bin") == 0 and not (tmp_path / "other.bin").exists()


def test_damaged_artifacts_mean_a_cold_compile_not_an_error(tmp_path, mega, caplog):
    path = cc.artifacts_path(tmp_path, H100)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"bad bytes")
    with caplog.at_level(logging.WARNING, logger="sequoia"):
        assert cc.load_artifacts(path) == 0
    assert "compiling from cold" in caplog.text


def test_a_cold_start_saves_and_a_warm_start_loads(tmp_path, mega):
    plan = cc.CompilePlan(True, artifacts=cc.artifacts_path(tmp_path, H100))
    forward, status = cc.compile_forward("model", plan)
    assert forward == ("compiled", "model") and status.state == "pending" and status.loaded_bytes == 0
    assert "cold: no saved artifacts" in status.line()
    cold = cc.finish(status, 104.0)
    assert cold.state == "cold" and cold.saved_bytes == len(mega.blob) and "compiled cold in 104.0 s" in cold.line()
    _, status = cc.compile_forward("model", plan)                      # the next start
    warm = cc.finish(status, 3.5)
    assert status.loaded_bytes == len(mega.blob) and mega.loaded == [mega.blob]
    assert warm.state == "warm" and "from saved artifacts" in warm.line()
    assert cc.compile_forward("model", cc.CompilePlan(False, "ZeroGPU"))[1].state == "off"


def test_a_compiled_forward_that_fails_leaves_the_models_own(mega):
    model = tiny_model(0)
    runner = GraphRunner(model, "d", INFO, compile=cc.CompilePlan(True))
    assert runner.compile_status.state == "pending" and runner._forward == ("compiled", model)
    _first_call(runner)   # the fake "compiled" forward is not callable: the compile "fails"
    assert runner._forward is model and runner.compile_status.state == "failed"
    assert "uncompiled forward runs" in runner.compile_status.line()
    session = runner.session()   # and decoding goes on, uncompiled
    assert session.forward([1, 2, 3]).shape == (3, model.config.vocab_size)


def test_sequoia_compile_turns_the_apps_compile_off_or_on(monkeypatch):
    """SEQUOIA_COMPILE=0 keeps the draft's forward uncompiled on the graph runner (no minutes of compiling at a
    start), 1 requires it, unset leaves the default (compiled wherever compilation is available)."""
    import app
    import sequoia.runtime.models as models

    seen = {}
    monkeypatch.setattr(models, "load_pair", lambda **kw: seen.update(kw) or "pair")
    for value, want in (("", None), ("0", False), ("off", False), ("1", True), ("auto", None)):
        app.load_from_env({"SEQUOIA_BACKEND": "hf", "SEQUOIA_COMPILE": value})
        assert seen["compile"] is want, value
    with pytest.raises(ValueError, match="SEQUOIA_COMPILE"):
        app.compile_from_env({"SEQUOIA_COMPILE": "maybe"})
    assert compile_plan(torch.device("cpu"), "draft", False, None) == cc.CompilePlan(False, "not asked")


def test_artifacts_are_saved_again_after_the_captures(monkeypatch, tmp_path):
    """A shape that compiles again during the captures is persisted too: warm_up saves once more at its end."""
    from sequoia.runners.hf.graphs import compile_cache

    saved = []
    monkeypatch.setattr(compile_cache, "save_artifacts", lambda path: saved.append(path) or 4096)
    cold = compile_cache.CompileStatus("cold", path=str(tmp_path / "a.bin"), saved_bytes=1024)
    assert compile_cache.resave(cold).saved_bytes == 4096 and saved == [tmp_path / "a.bin"]
    for untouched in (compile_cache.CompileStatus("pending", path=str(tmp_path)),
                      compile_cache.CompileStatus.off("not asked"), compile_cache.CompileStatus("cold", path="")):
        assert compile_cache.resave(untouched) is untouched
    assert len(saved) == 1


def test_a_cold_start_cut_by_its_timeout_says_where_and_the_warm_start_still_runs(monkeypatch):
    """The compiled-draft check: a cold child cut short reports its last step and the artifacts it left, and the
    warm child runs anyway (what a server's next start would find)."""
    import subprocess

    from sequoia.tools.gpucheck import draft

    starts = []

    def run(cmd, **kwargs):
        starts.append(kwargs["env"]["TORCHINDUCTOR_CACHE_DIR"].rsplit("-", 1)[-1])
        raise subprocess.TimeoutExpired(cmd, kwargs["timeout"], stderr=b"draft: compiling the forward cold\n"
                                                                        b"draft: capturing 4 rows x 256 keys (3/40)\n")

    monkeypatch.setattr(draft, "unavailable_reason", lambda device: None)
    monkeypatch.setattr(draft, "compile_key", lambda device: type("K", (), {"slug": lambda self: "k"})())
    monkeypatch.setattr(draft.subprocess, "run", run)
    out = draft.check_compile(torch.device("cpu"), 16, 1, log=lambda *a: None, timeout=5)
    assert starts == ["cold", "warm"]
    assert out["cold"]["error"] == "timed out after 5 s" and "capturing 4 rows" in out["cold"]["last_step"]
    assert out["cold"]["artifacts_saved"] == 0 and "error" in out["warm"]
