"""Compare's reference row: the same target alone on llama.cpp, beside the methods on the Hugging Face runtime.

The tiny app pair's target is written as an f32 GGUF and served back by a reference loader, as
``app.reference_loader_from_env`` serves the embedded target's shipped Q4_K_M file.
"""

from __future__ import annotations

import pytest

pytest.importorskip("llama_cpp")

import app  # noqa: E402
from components.app_state.context import AppContext  # noqa: E402
from components.compare import compare_tab, compare_view  # noqa: E402
from llamacpp_fixtures import write_tiny_gguf  # noqa: E402
from sequoia.runners.llamacpp import LlamaCppOptions, load_llamacpp_runner  # noqa: E402

PICKED = ["Chain", "Sequoia (budget & depth)", "llama.cpp target alone"]


@pytest.fixture(scope="module")
def gguf(tiny_target, tmp_path_factory):
    return write_tiny_gguf(tmp_path_factory.mktemp("ref") / "tiny-target.gguf", tiny_target)


@pytest.fixture()
def ctx(tiny_app_pair, gguf, tmp_path):
    loads = []

    def loader(pair, progress):
        loads.append(pair.target_name)
        return load_llamacpp_runner(gguf, LlamaCppOptions(n_threads=1, n_ctx=512), name="tiny-target (f32)")

    ctx = AppContext.from_pair_or_loader(tiny_app_pair, assets_dir=tmp_path, reference_loader=loader)
    ctx.loads = loads
    return ctx


def test_reference_row_runs_the_target_alone_on_llamacpp(ctx):
    assert "llama.cpp target alone" in compare_tab.offered(ctx)
    assert "llama.cpp target alone" in compare_tab.DEFAULT_METHODS
    assert compare_tab.ticked(ctx)[:2] == ["Target alone", "llama.cpp target alone"]
    lines = []
    rows, notes = compare_tab.run_comparison(ctx, "x = 1", 8, 3, 0.0, 1.0, 10, 0, methods=PICKED,
                                             progress=lambda f, desc: lines.append(desc))
    assert [r.method for r in rows] == ["Target alone", compare_view.LLAMACPP_REFERENCE, "Chain",
                                        "Sequoia (budget & depth)"]
    # loading is said apart from running, and comes in the warm-up round, when the reference's turn does
    loading = [i for i, line in enumerate(lines) if line.startswith("*Loading the llama.cpp reference")]
    before, after = lines[loading[0] - 1], lines[loading[0] + 1]
    assert len(loading) == 1 and "Target alone**, 1 of 4" in before and "target alone**, 2 of 4" in after
    ref = rows[1]
    assert ref.tokens == 10 and ref.seconds > 0 and ref.identical is None   # other kernels: never flagged
    assert all(r.identical for r in rows if r is not ref)
    assert ctx.reference_context().pair().target.info.runtime == "llamacpp"
    rows2, _ = compare_tab.run_comparison(ctx, "y = 2", 8, 3, 0.0, 1.0, 4, 0, methods=PICKED)
    assert ctx.loads == ["tiny-target"]   # loaded on first use, then kept
    md = compare_tab._notes_markdown(rows, notes, 0.0)
    assert "reproduce the target-only output" in md and "tokens/s" in md and "shipped Q4_K_M GGUF" in md
    table = compare_view.table(rows)
    assert table[1][-1] == "– other kernels"


def test_no_reference_row_without_a_loader_or_in_exact_mode(ctx, tiny_app_pair, tmp_path):
    plain = AppContext.from_pair_or_loader(tiny_app_pair, assets_dir=tmp_path)
    assert "llama.cpp target alone" not in compare_tab.offered(plain)
    rows, notes = compare_tab.run_comparison(plain, "x = 1", 8, 3, 0.0, 1.0, 4, 0, methods=PICKED)
    assert compare_view.LLAMACPP_REFERENCE not in [r.method for r in rows]
    assert notes and "was not run" in notes[0]
    exact = ctx.exact_context()
    assert not exact.offers_reference
    rows, notes = compare_tab.run_comparison(exact, "x = 1", 8, 3, 0.0, 1.0, 4, 0, methods=PICKED)
    assert compare_view.LLAMACPP_REFERENCE not in [r.method for r in rows] and "exact mode" in notes[0]
    with pytest.raises(ValueError, match="no llama.cpp reference"):
        plain.reference_context()


def test_the_app_offers_the_reference_for_the_embedded_target_on_the_hf_runtime():
    assert callable(app.reference_loader_from_env({"SEQUOIA_BACKEND": "hf"}))
    assert app.reference_loader_from_env({"SEQUOIA_BACKEND": "llamacpp"}) is None  # target only is that row
    assert app.reference_loader_from_env({"SEQUOIA_TARGET": "Qwen/Qwen2.5-7B-Instruct",
                                          "SEQUOIA_BACKEND": "hf"}) is None  # no GGUF known
    assert callable(app.reference_loader_from_env({"SEQUOIA_TARGET": "Qwen/Qwen2.5-7B-Instruct",
                                                   "SEQUOIA_REFERENCE_GGUF": "/models/qwen7b.Q4_K_M.gguf"}))


def test_a_reference_that_cannot_load_costs_its_row_only(tiny_app_pair, tmp_path):
    def broken(pair, progress):
        raise FileNotFoundError("no GGUF file at /nowhere/target.gguf")

    ctx = AppContext.from_pair_or_loader(tiny_app_pair, assets_dir=tmp_path, reference_loader=broken)
    rows, notes = compare_tab.run_comparison(ctx, "x = 1", 8, 3, 0.0, 1.0, 4, 0, methods=PICKED)
    assert [r.method for r in rows] == ["Target alone", "Chain", "Sequoia (budget & depth)"]
    assert notes == ["llama.cpp target alone was not run: no GGUF file at /nowhere/target.gguf"]
