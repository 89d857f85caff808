"""The memory budget: reading /proc and cgroup files, the cap, estimates, and planning a load (fake sizes)."""

from __future__ import annotations

import gc
import json
import struct
import weakref

import pytest

from sequoia.runtime import memory
from sequoia.runtime.memory import (GB, Holding, MemoryBudget, MemorySnapshot, NotEnoughMemory, cgroup_available_bytes,
                                    parse_kib_field, parse_memory_gb, plan_load, safetensors_params)

STATUS = "Name:\tpython\nVmPeak:\t 9000000 kB\nVmRSS:\t 9100000 kB\nThreads:\t4\n"
MEMINFO = "MemTotal:       24000000 kB\nMemFree:         1000000 kB\nMemAvailable:   12000000 kB\n"
REF = Holding("reference", "the llama.cpp reference target", int(1.5 * GB))
EXACT = Holding("exact", "exact mode's float32 target", int(6.5 * GB))


def snap(resident_gb: float, available_gb: float, cap_gb: float | None = None) -> MemorySnapshot:
    return MemorySnapshot(int(resident_gb * GB), int(available_gb * GB), None if cap_gb is None else int(cap_gb * GB))


def test_proc_fields_are_read_in_bytes(tmp_path):
    assert parse_kib_field(STATUS, "VmRSS") == 9100000 * 1024
    assert parse_kib_field(MEMINFO, "MemAvailable") == 12000000 * 1024
    assert parse_kib_field(MEMINFO, "Nope") is None
    (tmp_path / "status").write_text(STATUS)
    (tmp_path / "meminfo").write_text(MEMINFO)
    assert memory.resident_bytes(tmp_path / "status") == 9100000 * 1024
    assert memory.machine_available_bytes(tmp_path / "meminfo") == 12000000 * 1024
    assert memory.resident_bytes(tmp_path / "missing") == 0 and memory.machine_available_bytes(tmp_path / "x") is None


def test_this_process_reads_a_plausible_resident_size():
    assert 10**7 < memory.resident_bytes() < 10**12


@pytest.mark.parametrize("version", ["v2", "v1"])
def test_a_container_limit_counts_usage_less_inactive_file_cache(tmp_path, version):
    d = tmp_path if version == "v2" else tmp_path / "memory"
    d.mkdir(exist_ok=True)
    names = (("memory.max", "memory.current", "memory.stat", "inactive_file") if version == "v2" else
             ("memory.limit_in_bytes", "memory.usage_in_bytes", "memory.stat", "total_inactive_file"))
    (d / names[0]).write_text(str(16 * GB))
    (d / names[1]).write_text(str(10 * GB))
    (d / names[2]).write_text(f"anon 1\n{names[3]} {GB}\n")
    assert cgroup_available_bytes(tmp_path) == 7 * GB
    (d / names[0]).write_text("max\n" if version == "v2" else str(2**63 - 4096))
    assert cgroup_available_bytes(tmp_path) is None
    assert cgroup_available_bytes(tmp_path / "none") is None


@pytest.mark.parametrize("text, expected", [(None, None), ("", None), ("  ", None), ("14", 14 * GB),
                                            ("14.5", int(14.5 * GB))])
def test_the_cap_parses(text, expected):
    assert parse_memory_gb(text) == expected


@pytest.mark.parametrize("text", ["abc", "14GB", "0", "-3", "0.5", "nan", "inf"])
def test_a_bad_cap_names_the_variable(text):
    with pytest.raises(ValueError, match="SEQUOIA_MEMORY_GB"):
        parse_memory_gb(text)


def test_estimates_from_files(tmp_path):
    header = {"a": {"dtype": "BF16", "shape": [3, 4], "data_offsets": [0, 24]},
              "b": {"dtype": "BF16", "shape": [5], "data_offsets": [24, 34]}, "__metadata__": {"format": "pt"}}
    raw = json.dumps(header).encode()
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(34))
    assert safetensors_params(tmp_path) == 17
    assert memory.fp32_model_bytes(17) == 68 + memory.FP32_RUNTIME_BYTES
    (tmp_path / "m.gguf").write_bytes(bytes(1000))
    assert memory.gguf_runner_bytes(tmp_path / "m.gguf") == 2000 + memory.GGUF_RUNTIME_BYTES


def test_room_is_the_less_of_the_machine_and_the_cap():
    assert snap(9, 12).room == 12 * GB
    assert snap(9, 12, cap_gb=14).room == 5 * GB
    assert snap(15, 12, cap_gb=14).room == 0


def test_a_load_that_fits_frees_nothing():
    plan = plan_load("exact", int(6.5 * GB), snap(9, 12), [REF], margin=0)
    assert plan.fits and plan.free == ()


def test_the_reference_is_freed_before_a_refusal():
    # 5 GB of room under a 14 GB cap; the exact target needs 6.5: freeing the 1.5 GB reference makes it fit.
    plan = plan_load("exact mode's float32 target", int(6.5 * GB), snap(9, 20, cap_gb=14), [REF], margin=0)
    assert plan.fits and plan.free == (REF,)
    # Freeing stops as soon as the load fits: the exact target is not freed for a reference that fits after one.
    plan = plan_load("the reference", int(1.5 * GB), snap(13, 20, cap_gb=14), [REF, EXACT], margin=0)
    assert plan.fits and plan.free == (REF,)


def test_a_load_that_does_not_fit_is_refused_naming_what_to_free():
    plan = plan_load("exact mode's float32 target", int(6.5 * GB), snap(12, 20, cap_gb=14), [REF],
                     hints=["restart with SEQUOIA_BLOCKED_WEIGHTS=0 (frees 3.1 GB)"], margin=0)
    assert not plan.fits and plan.free == ()          # refused: nothing is freed for nothing
    msg = plan.message()
    assert "exact mode's float32 target" in msg and "6.5 GB" in msg and "2.0 GB free" in msg and "14.0 GB cap" in msg
    assert "the llama.cpp reference target" in msg and "SEQUOIA_BLOCKED_WEIGHTS=0" in msg
    bare = plan_load("x", 10 * GB, snap(1, 2), margin=0)
    assert not bare.fits and bare.message().endswith("free (this server holds 1.0 GB).")


def test_the_margin_is_kept_free():
    refused = plan_load("x", 4 * GB, snap(9, 4.2), margin=int(0.5 * GB))
    assert not refused.fits and "needs about 4.0 GB (plus 0.5 GB kept free)" in refused.message()
    assert plan_load("x", 4 * GB, snap(9, 4.6), margin=int(0.5 * GB)).fits


class FakeMachine:
    """Resident and available memory that the test's frees change, as a real unload would."""

    def __init__(self, resident_gb: float, available_gb: float, returned: float = 1.0):
        self.resident, self.available, self.returned = int(resident_gb * GB), int(available_gb * GB), returned
        self.freed: list[str] = []

    def probe(self) -> tuple[int, int]:
        return self.resident, self.available

    def free(self, holding: Holding) -> None:
        self.freed.append(holding.key)
        self.resident -= int(holding.size * self.returned)


def test_make_room_frees_then_checks_the_resident_size_again():
    machine = FakeMachine(9, 20)
    budget = MemoryBudget(cap=14 * GB, margin=0, probe=machine.probe)
    budget.make_room("exact", int(6.5 * GB), [REF], machine.free)
    assert machine.freed == ["reference"]
    # freed pages that stayed with the process (returned 0%): refused after freeing, not killed later
    stuck = FakeMachine(9, 20, returned=0.0)
    budget = MemoryBudget(cap=14 * GB, margin=0, probe=stuck.probe)
    with pytest.raises(NotEnoughMemory, match="not enough memory for exact"):
        budget.make_room("exact", int(6.5 * GB), [REF], stuck.free)


def test_make_room_refuses_before_freeing_anything():
    machine = FakeMachine(12, 20)
    budget = MemoryBudget(cap=14 * GB, margin=0, probe=machine.probe)
    with pytest.raises(NotEnoughMemory) as err:
        budget.make_room("exact mode's float32 target", int(6.5 * GB), [REF], machine.free)
    assert machine.freed == [] and isinstance(err.value, ValueError)
    assert "the llama.cpp reference target" in str(err.value)


def test_release_freed_collects_and_trims_where_glibc_is(monkeypatch):
    """It collects unreachable cycles, then asks glibc to trim (where there is a glibc; elsewhere gc only)."""
    trims = []
    monkeypatch.setattr(memory, "_libc", lambda: type("Libc", (), {"malloc_trim": staticmethod(trims.append)})())
    class Cycle:
        pass

    a, b = Cycle(), Cycle()
    a.other, b.other = b, a
    ref = weakref.ref(a)
    del a, b
    gc.disable()   # only release_freed's own collection may free the cycle
    try:
        memory.release_freed()
    finally:
        gc.enable()
    assert ref() is None and trims == [0]
    monkeypatch.setattr(memory, "_libc", lambda: None)
    memory.release_freed()   # no glibc (musl, macOS): gc only, no error
    assert trims == [0]
