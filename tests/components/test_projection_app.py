"""The projection in the app, on the tiny random-weight pair: the Live summary after a run, the Hardware figure."""

import shutil
from pathlib import Path

import gradio as gr
import pytest

import app
from components.app_state.acceptance_choice import DEFAULT_ACCEPTANCE_LABEL
from components.app_state.decode_inputs import DecodeInputs
from components.live import after_run, live_tab
from components.widgets import projection_view
from sequoia.core.profiles.profile import HardwareProfile

SHIPPED = Path(__file__).resolve().parents[2] / "assets" / "projections"


@pytest.fixture(scope="module")
def ctx(tiny_app_pair, tmp_path_factory, lanes):
    assets = tmp_path_factory.mktemp("assets")
    shutil.copytree(SHIPPED, assets / "projections")
    projection_view.elsewhere.cache_clear()
    demo = app.build_demo(tiny_app_pair, assets_dir=assets, max_budget=24, lanes=lanes)
    yield demo.sequoia_context
    projection_view.elsewhere.cache_clear()


def _summaries(ctx, method: str) -> list[str]:
    """The run's summaries, then the one the words after it give (their own event: components.live.after_run)."""
    inputs = DecodeInputs.from_page("def f(x):", method, 8, 3, 0.0, 1.0, 12, 0, DEFAULT_ACCEPTANCE_LABEL, True)
    outs = list(live_tab.decode_stream(ctx, inputs))
    return [out[3] for out in outs if out[3] is not gr.skip()] + [after_run.words(ctx, outs[-1][-1])[0]]


def test_the_live_summary_projects_the_run_onto_the_shipped_machines(ctx):
    ctx.profile = HardwareProfile.hand_made(lambda n: 30.0 * n, lambda w: 10.0)   # this machine: compute-bound
    try:
        summaries = _summaries(ctx, "Sequoia (budget & depth)")
    finally:
        ctx.profile = None
    final = summaries[-1]
    assert "**Where this run would pay**" in final
    assert "On an H100 at the 7B shapes this run's trees would run at" in final
    assert "× the target alone" in final and "projected from measured costs" in final
    assert "On this machine (by its profile) this run's trees would run at" in final
    assert not any("Where this run would pay" in s for s in summaries[:-1])   # only once the run has ended


def test_the_hardware_tabs_roofline_figure_has_every_machine(ctx):
    fig = projection_view.roofline_figure(ctx)                 # no profile here: the shipped curves only
    names = [t.name for t in fig.data]
    assert any(n.startswith("an H100 at the 7B shapes") for n in names) and not any("this machine" in n for n in names)
