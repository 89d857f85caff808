"""The app's on-demand loads under a memory budget: fake sizes, a fake machine, tiny models.

Exact mode's float32 target and Compare's llama.cpp reference are planned before they load: a load
that fits after freeing the other one frees it first; a load that cannot fit is refused with a message
naming what to free, and the server keeps what it held.
"""

from __future__ import annotations

import copy

import pytest
import torch

import app
from components.app_state.context import AppContext, NotEnoughMemory
from components.compare import compare_tab
from sequoia.runners.hf.loading import wrap_model
from sequoia.runtime.checks.exactness import is_exact, widened_target
from sequoia.runtime.memory import GB, MemoryBudget

from conftest import app_pair, perturbed, tiny_model

EXACT, REFERENCE = int(6.5 * GB), int(1.5 * GB)


class FakeMachine:
    """A process whose resident size follows what the context loads and frees (by the sizes planned)."""

    def __init__(self, resident_gb: float, available_gb: float = 100.0):
        self.resident, self.available = int(resident_gb * GB), int(available_gb * GB)

    def probe(self) -> tuple[int, int]:
        return self.resident, self.available


class FakeRunner:
    """A reference runner that records its close (llama.cpp frees its buffers there)."""

    def __init__(self, machine: FakeMachine):
        self.machine, self.closed, self.name = machine, False, "tiny-target (llama.cpp)"
        machine.resident += REFERENCE

    def close(self) -> None:
        self.closed = True
        self.machine.resident -= REFERENCE


@pytest.fixture(scope="module")
def low_precision_pair():
    """A bf16 target (not exact: exact mode loads a float32 copy) and a noisy draft."""
    target = tiny_model(0)
    return app_pair(perturbed(target, 0.5, 1), wrap_model(copy.deepcopy(target).to(torch.bfloat16), "tiny-target",
                                                          "target", plain=False, blocked_weights=True))


def make_ctx(pair, tmp_path, machine: FakeMachine, cap_gb: float = 14.0, hints=()) -> AppContext:
    def exact_loader(p, progress):
        machine.resident += EXACT
        return widened_target(p.target)

    ctx = AppContext.from_pair_or_loader(
        pair, assets_dir=tmp_path, exact_loader=exact_loader,
        reference_loader=lambda p, progress: FakeRunner(machine),
        memory=MemoryBudget(cap=int(cap_gb * GB), margin=0, probe=machine.probe),
        exact_bytes=lambda p: EXACT, reference_bytes=lambda p: REFERENCE, memory_hints=tuple(hints))
    ctx.machine = machine
    return ctx


def track_frees(ctx: AppContext, machine: FakeMachine, sizes: dict[str, int]) -> None:
    """Make freeing lower the fake resident size by ``sizes`` (key -> bytes), as a real unload does."""
    free = ctx.extras.free

    def tracked(key: str, restore: bool = True) -> bool:
        done = free(key, restore=False)
        machine.resident -= sizes.get(key, 0) if done else 0
        if restore:                    # after the resident size fell, as free_extra's own restore sees it
            ctx.extras.restore_blocked()
        return done

    ctx.extras.free = tracked


def test_loads_that_fit_load(low_precision_pair, tmp_path):
    ctx = make_ctx(low_precision_pair, tmp_path, FakeMachine(4))
    ref = ctx.reference_context()
    exact = ctx.exact_context()
    assert ctx.reference_context() is ref and ctx.exact_context() is exact and is_exact(exact.pair())
    assert "exact mode's float32 target (6.5 GB)" in ctx.extras.memory_note() and "reference" in ctx.extras.memory_note()


def test_the_reference_is_freed_before_exact_mode_is_refused(low_precision_pair, tmp_path):
    machine = FakeMachine(6)                                 # 6 + 1.5 (reference) + 6.5 = 14: fits after freeing
    ctx = make_ctx(low_precision_pair, tmp_path, machine, cap_gb=13.0)
    runner = ctx.reference_context().pair().target
    exact = ctx.exact_context()
    assert runner.closed and not ctx.extras.reference_loaded and exact.pair().target.info.weights == "fp32"
    assert machine.resident == int(12.5 * GB)
    # The reference comes back on its next use, freeing the idle exact target if it must.
    track_frees(ctx, machine, {"exact": EXACT})
    again = ctx.reference_context()
    assert again.pair().target is not runner and not ctx.exact_loaded and machine.resident == int(7.5 * GB)


def test_a_load_that_cannot_fit_is_refused_and_the_server_keeps_what_it_held(low_precision_pair, tmp_path):
    machine = FakeMachine(9)
    ctx = make_ctx(low_precision_pair, tmp_path, machine, cap_gb=14.0,
                   hints=["restart with SEQUOIA_BLOCKED_WEIGHTS=0"])
    runner = ctx.reference_context().pair().target            # 10.5 GB held
    engine = ctx.engine()
    with pytest.raises(NotEnoughMemory) as err:
        ctx.exact_context()                                  # 6.5 > 3.5 free, 5.0 after freeing the reference
    msg = str(err.value)
    assert "exact mode's float32 target" in msg and "6.5 GB" in msg and "14.0 GB cap" in msg
    assert "the llama.cpp reference target" in msg and "SEQUOIA_BLOCKED_WEIGHTS=0" in msg
    assert not runner.closed and ctx.reference_context().pair().target is runner      # nothing freed
    assert not ctx.exact_loaded and ctx.extras.exact_status is None and ctx.engine() is engine
    assert machine.resident == int(10.5 * GB)
    # the page's usual path for a refusal: Compare shows it as the reason, the server decodes on
    rows, notes = compare_tab.run_comparison(ctx, "x = 1", 8, 3, 0.0, 1.0, 4, 0, methods=["Chain"])
    assert rows and rows[0].tokens == 4


def test_a_refused_reference_costs_its_row_only(low_precision_pair, tmp_path):
    ctx = make_ctx(low_precision_pair, tmp_path, FakeMachine(13.5), cap_gb=14.0)
    picked = ["Chain", "llama.cpp target alone"]
    rows, notes = compare_tab.run_comparison(ctx, "x = 1", 8, 3, 0.0, 1.0, 4, 0, methods=picked)
    assert [r.method for r in rows] == ["Target alone", "Chain"]
    assert "llama.cpp target alone was not run: not enough memory for the llama.cpp reference target" in notes[0]


def test_freeing_really_drops_the_exact_target(low_precision_pair, tmp_path):
    ctx = AppContext.from_pair_or_loader(low_precision_pair, assets_dir=tmp_path)
    import weakref

    model = weakref.ref(ctx.exact_context().pair().target.model)
    assert ctx.extras.free("exact") and not ctx.exact_loaded and model() is None
    assert not ctx.extras.free("exact") and not ctx.extras.free("reference")
    assert ctx.exact_context().pair().target.info.weights == "fp32"       # loads again on its next use


def test_the_app_reads_its_cap_once_with_a_clear_error():
    assert app.memory_from_env({}).budget.cap is None
    opts = app.memory_from_env({"SEQUOIA_MEMORY_GB": "14", "SEQUOIA_BACKEND": "hf"})
    assert opts.budget.cap == 14 * GB and any("SEQUOIA_MEMORY_GB" in h for h in opts.hints)
    assert any("SEQUOIA_BLOCKED_WEIGHTS=0" in h for h in opts.hints)
    assert not any("BLOCKED" in h for h in app.memory_from_env({"SEQUOIA_BACKEND": "llamacpp"}).hints)
    with pytest.raises(ValueError, match="SEQUOIA_MEMORY_GB must be a number of gigabytes"):
        app.memory_from_env({"SEQUOIA_MEMORY_GB": "lots"})


def test_exact_mode_drops_the_blocked_copies_last_and_they_come_back(low_precision_pair, tmp_path):
    from sequoia.runners.hf.onednn import blocked_bytes

    model = low_precision_pair.target.model
    blocked = blocked_bytes(model)
    if not blocked:
        pytest.skip("no oneDNN bf16 kernels here: the target has no blocked copies")
    machine = FakeMachine(4)
    ctx = make_ctx(low_precision_pair, tmp_path, machine, cap_gb=4 + 6.5 - 1e-9 * blocked / 2)
    track_frees(ctx, machine, {"blocked": blocked, "exact": EXACT})
    before = compare_tab.run_comparison(ctx, "x = 1", 8, 3, 0.0, 1.0, 6, 0, methods=["Chain"])[0]
    ctx.exact_context()
    assert blocked_bytes(model) == 0 and "oneDNN-blocked weight copies" in ctx.extras.memory_note()
    during = compare_tab.run_comparison(ctx, "x = 1", 8, 3, 0.0, 1.0, 6, 0, methods=["Chain"])[0]
    assert [r.token_ids for r in during] == [r.token_ids for r in before]    # the same sums, only slower
    assert ctx.extras.free("exact") and blocked_bytes(model) == blocked and "blocked" not in ctx.extras.memory_note()
