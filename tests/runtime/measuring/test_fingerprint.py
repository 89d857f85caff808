"""Fingerprints: which fields decide a match, readable differences, stable keys, JSON, reading this machine."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from conftest import make_pair, tiny_model

from sequoia.core.profiles.fingerprint import Fingerprint
from sequoia.core.profiles.profile import HardwareProfile
from sequoia.runtime.measuring.fingerprint import cpu_facts, machine_fingerprint

AVX2 = Fingerprint(device_kind="cpu", cpu_model="AMD EPYC 7B12", cpu_features=("avx2",), onednn_bf16=False, threads=2,
                   torch_version="2.13.0+cpu", target_dtype="bf16", draft_dtype="bf16", draft_quant="int8",
                   pair="d+t")
AVX512 = dataclasses.replace(AVX2, cpu_features=("avx512_bf16", "avx2", "avx512f"), onednn_bf16=True)
H100 = Fingerprint(device_kind="cuda", cpu_model="Intel Xeon", cpu_features=("avx2", "avx512f"), onednn_bf16=True,
                   threads=16, gpu_name="NVIDIA H100 80GB HBM3", gpu_memory_gb=79.1, gpu_capability="9.0",
                   target_dtype="bf16", draft_dtype="bf16", pair="d+t")


def test_features_are_kept_in_one_order():
    assert AVX512.cpu_features == ("avx2", "avx512f", "avx512_bf16")
    with pytest.raises(ValueError, match="unknown cpu_features"):
        dataclasses.replace(AVX2, cpu_features=("sse9",))
    with pytest.raises(ValueError, match="device_kind"):
        dataclasses.replace(AVX2, device_kind="tpu")
    with pytest.raises(ValueError, match="threads"):
        dataclasses.replace(AVX2, threads=0)


def test_what_matters_for_cost_decides_a_match():
    assert AVX2.matches(AVX2)
    # Marketing names and torch patch versions do not change what a matmul costs here.
    assert AVX2.matches(dataclasses.replace(AVX2, cpu_model="AMD EPYC 9B14", torch_version="2.13.1+cpu"))
    diffs = AVX2.mismatches(AVX512)
    assert diffs == ["CPU features: avx2, avx512f, avx512_bf16 here, avx2 in the profile",
                     "oneDNN bf16: yes here, no in the profile"]
    for field, value, label in [("threads", 4, "threads: 4 here, 2"), ("draft_quant", "int4", "draft quantization"),
                                ("target_dtype", "fp32", "target dtype"), ("pair", "x+y", "model pair")]:
        other = dataclasses.replace(AVX2, **{field: value})
        assert not AVX2.matches(other) and label in AVX2.mismatches(other)[0]
    # The pair counts only when both name one (a machine fingerprint taken before models load).
    assert AVX2.matches(dataclasses.replace(AVX2, pair=""))
    assert AVX2.mismatches(H100) == ["device: cuda here, cpu in the profile"]


def test_gpus_match_on_name_and_capability_not_host_cpu():
    other_host = dataclasses.replace(H100, cpu_model="AMD EPYC", cpu_features=("avx2",), onednn_bf16=False, threads=8)
    assert H100.matches(other_host)
    assert "GPU" in H100.mismatches(dataclasses.replace(H100, gpu_name="NVIDIA H200"))[0]
    assert "compute capability" in H100.mismatches(dataclasses.replace(H100, gpu_capability="8.0"))[0]


def test_key_is_stable_and_follows_the_match():
    assert AVX2.key() == dataclasses.replace(AVX2, cpu_model="other name", torch_version="9").key()
    assert len({AVX2.key(), AVX512.key(), H100.key(), dataclasses.replace(AVX2, threads=4).key()}) == 4
    assert AVX2.key().isalnum() and len(AVX2.key()) == 12


def test_describe_is_one_readable_line():
    assert AVX512.describe() == "cpu AMD EPYC 7B12, avx512_bf16, oneDNN bf16, 2 threads; target bf16, draft int8"
    assert AVX2.describe().startswith("cpu AMD EPYC 7B12, avx2, no oneDNN bf16, 2 threads")
    assert H100.describe() == "cuda NVIDIA H100 80GB HBM3, 79 GB, sm 9.0; target bf16, draft bf16"
    bare = Fingerprint(device_kind="cpu", cpu_model="", cpu_features=(), onednn_bf16=False, threads=1)
    assert bare.describe() == "cpu unknown model, no avx2, no oneDNN bf16, 1 threads"


def test_json_round_trip_and_errors(tmp_path):
    for fp in (AVX2, AVX512, H100):
        assert Fingerprint.from_dict(fp.to_dict()) == fp
    with pytest.raises(ValueError, match="missing field 'threads'"):
        Fingerprint.from_dict({k: v for k, v in AVX2.to_dict().items() if k != "threads"})
    with pytest.raises(ValueError, match="unknown fingerprint fields"):
        Fingerprint.from_dict({**AVX2.to_dict(), "colour": "red"})
    with pytest.raises(ValueError, match="'onednn_bf16' must be bool"):
        Fingerprint.from_dict({**AVX2.to_dict(), "onednn_bf16": "yes"})
    prof = dataclasses.replace(HardwareProfile.hand_made(lambda n: 10.0 * n, lambda w: 2.0), fingerprint=AVX2)
    prof.save(tmp_path / "p.json")
    assert HardwareProfile.load(tmp_path / "p.json").fingerprint == AVX2


def test_a_profile_without_fingerprint_matches_no_machine():
    prof = HardwareProfile.hand_made(lambda n: 10.0 * n, lambda w: 2.0)
    assert not prof.matches(AVX2) and "no fingerprint" in prof.mismatches(AVX2)[0]
    assert dataclasses.replace(prof, fingerprint=AVX2).matches(AVX2)


def test_cpu_facts_read_model_and_flags():
    text = "processor\t: 0\nmodel name\t: AMD EPYC 9B14\nflags\t\t: fpu sse avx2 fma avx512f avx512_bf16 amx_tile\n" \
           "processor\t: 1\nmodel name\t: AMD EPYC 9B14\nflags\t\t: fpu\n"
    assert cpu_facts(text, "AVX512") == ("AMD EPYC 9B14", ("avx2", "avx512f", "avx512_bf16", "amx_tile"))
    assert cpu_facts("", "AVX512") == ("", ())


def test_cpu_facts_leave_out_flags_the_kernels_are_told_not_to_use():
    # ATEN_CPU_CAPABILITY=avx2 on an AVX-512 machine: its matmuls cost what an AVX2-only machine's do.
    text = "model name\t: AMD EPYC 9B14\nflags\t\t: fpu avx2 avx512f avx512_bf16\n"
    assert cpu_facts(text, "AVX2") == ("AMD EPYC 9B14", ("avx2",))
    assert cpu_facts(text, "avx2") == ("AMD EPYC 9B14", ("avx2",))
    assert cpu_facts(text, "DEFAULT") == ("AMD EPYC 9B14", ())
    # The process's own capability by default (never more than the CPU has).
    assert set(cpu_facts(text)[1]) <= {"avx2", "avx512f", "avx512_bf16"}


def test_machine_fingerprint_with_and_without_a_pair():
    machine = machine_fingerprint()
    assert machine.device_kind == "cpu" and machine.threads == torch.get_num_threads()
    assert machine.target_dtype == "" and machine.pair == "" and machine.torch_version == torch.__version__
    pair = make_pair(tiny_model(1, vocab=64, hidden=16), tiny_model(0, vocab=64), 64)
    fp = machine_fingerprint(pair)
    assert (fp.target_dtype, fp.target_quant, fp.draft_dtype, fp.draft_quant) == ("fp32", "none", "fp32", "none")
    assert fp.pair == "tiny-draft+tiny-target" and fp.cpu_features == machine.cpu_features
    assert fp.runtime == "hf"
    # Not loaded yet (a stand-in): the loader's int8 flag, and the newer per-model quantization names.
    from types import SimpleNamespace

    stand_in = SimpleNamespace(device=torch.device("cpu"), dtype=torch.bfloat16, draft_dtype=torch.bfloat16,
                               draft_int8=True, draft_name="d", target_name="t")
    assert machine_fingerprint(stand_in).describe().endswith("target bf16, draft int8")
    stand_in.draft_quant, stand_in.target_quant = "int4", "int8"
    fp = machine_fingerprint(stand_in)
    assert (fp.draft_quant, fp.target_quant) == ("int4", "int8")


# A profile measured before one-token forwards skipped oneDNN priced the target alone ~1.6x too dear; one
# measured with plain weights priced verification 1.1-1.6x too dear for oneDNN-blocked ones.
KERNELS = [("single_row_kernel", "aten", "one-token forwards' kernel", "(one-token forwards: aten), 2 threads"),
           ("multi_row_kernel", "onednn-blocked", "many-token forwards' kernel",
            "(one-token forwards: aten, wider ones: onednn-blocked), 2 threads")]


@pytest.mark.parametrize("field, value, label, described", KERNELS, ids=[k[0] for k in KERNELS])
def test_the_kernels_of_the_targets_forwards_decide_a_match(monkeypatch, field, value, label, described):
    base = AVX512 if field == "single_row_kernel" else dataclasses.replace(AVX512, single_row_kernel="aten")
    measured = dataclasses.replace(base, **{field: value})
    assert measured.mismatches(base) == [f"{label}: unknown here, {value} in the profile"]
    assert measured.key() != base.key()
    assert described in measured.describe()
    assert Fingerprint.from_dict(measured.to_dict()) == measured
    # Not loaded yet (profile --show): predicted from the machine and the target's dtype.
    from types import SimpleNamespace

    monkeypatch.setattr("sequoia.runners.hf.cpu.onednn_bf16", lambda: True)
    monkeypatch.setattr("sequoia.runners.hf.cpu.cpu_facts", lambda: ("EPYC", ("avx2", "avx512f", "avx512_bf16")))
    stand_in = SimpleNamespace(device=torch.device("cpu"), dtype=torch.bfloat16, draft_dtype=torch.bfloat16,
                               draft_quant="int4", target_quant="none", name="not loaded")
    assert getattr(machine_fingerprint(stand_in), field) == value
    stand_in.dtype = torch.float32
    assert getattr(machine_fingerprint(stand_in), field) == ""
    if field == "single_row_kernel":   # with AMX one row goes through the blocked copies, where there are some
        monkeypatch.setattr("sequoia.runners.hf.cpu.cpu_facts", lambda: ("Xeon", ("avx512_bf16", "amx_bf16")))
        stand_in.dtype = torch.bfloat16
        assert machine_fingerprint(stand_in).single_row_kernel == "onednn-blocked"
        stand_in.blocked_weights = False
        assert machine_fingerprint(stand_in).single_row_kernel == ""
    # A loaded target says what it got (a tiny fp32 one: nothing).
    pair = make_pair(tiny_model(1, vocab=64, hidden=16), tiny_model(0, vocab=64), 64)
    assert getattr(machine_fingerprint(pair), field) == ""
