"""A page that agrees with itself on one visit (issue 58), in headless Chromium on the tiny random-weight pair.

* The DP explorer: narrowing the largest budget or depth below the selected cell clamps the cell before the
  solve: no toast, no error badge, and after every edit the heat map's table has the typed limits and its
  selected cell lies within them (the figure never one edit behind).
* One context limit: a prompt whose tokens, new tokens and tree run past the target's context is refused beside
  the prompt field with the real cap, never in a toast, and the refusal is brought into view.

    python -m pytest -q tests/app/test_browser_page_agrees.py
"""

import pytest

import re

from test_browser import _decode, _wait_for, browser_context, server, sync_api
from test_browser_fresh import _errors

pytestmark = [pytest.mark.browser]
__all__ = ["browser_context", "server"]

#: Limits typed in pairs, the largest budget n then at once the largest depth d, as a visitor tabbing from one box
#: to the next does: the depth's event is sent before the budget's answer narrows the cell sliders.  First the
#: limits the issue started from (32, 8), then its four edits in its order (32 -> 16, 8 -> 4, 16 -> 8, 4 -> 3),
#: then limits above and below the selection: 12 edits.
EDITS = [(32, 8), (16, 4), (8, 3), (24, 6), (5, 2), (64, 12)]
#: The heat map as drawn: its table's limits (rows - 1, columns - 1) and the selected cell from its marker.
HEAT_STATE = """() => {
    const plot = document.querySelector('#sq-dp-heat .js-plotly-plot');
    if (!plot || !plot.data) return null;
    const heat = plot.data.find(t => t.type === 'heatmap');
    const mark = plot.data.find(t => t.name === 'selected');
    if (!heat || !mark) return null;
    // numpy arrays arrive as {dtype, bdata, shape}: the table's shape is "rows, columns"
    const shape = heat.z.shape ? heat.z.shape.split(',').map(Number) : [heat.z.length, heat.z[0].length];
    return {budget: shape[0] - 1, depth: shape[1] - 1, n: mark.y[0], d: mark.x[0], title: plot.layout.title.text};
}"""


@pytest.fixture()
def page(server, browser_context):
    page = browser_context.new_page()
    page.set_viewport_size({"width": 1280, "height": 720})
    page.goto(server, wait_until="domcontentloaded")
    page.locator("#sq-prompt textarea").wait_for()
    yield page
    page.close()


def _type_limit(page, field: str, value: int) -> None:
    box = page.locator(f"#sq-dp-{field} input[type='number']")
    box.fill(str(value))
    box.press("Enter")


def _heat(page) -> dict | None:
    return page.evaluate(HEAT_STATE)


def test_narrowing_the_dp_limits_never_raises_a_toast_nor_leaves_the_figure_behind(page):
    page.get_by_role("tab", name="DP explorer").click()
    sync_api.expect(page.locator("#sq-dp-cell")).to_contain_text("expected tokens/step")
    seen = []
    for budget, depth in EDITS:
        _type_limit(page, "budget", budget)
        _type_limit(page, "depth", depth)     # no wait: sent while the budget's solve runs or waits

        def drawn() -> bool:
            state = _heat(page)
            return state is not None and (state["budget"], state["depth"]) == (budget, depth)

        _wait_for(drawn, 30)    # the table of the limits just typed, not of the edit before
        state = _heat(page)
        seen.append((budget, depth, state["n"], state["d"]))
        assert 0 <= state["n"] <= budget and 0 <= state["d"] <= depth, (budget, depth, state)
        assert f"selected n={state['n']}, d={state['d']}" in state["title"]
        # the sliders show the cell drawn, within the new limits, and the line under them says the same
        n_box, d_box = page.locator("#sq-dp-n input[type='number']"), page.locator("#sq-dp-d input[type='number']")
        sync_api.expect(n_box).to_have_value(str(state["n"]))
        sync_api.expect(d_box).to_have_value(str(state["d"]))
        sync_api.expect(page.locator("#sq-dp-cell")).to_contain_text(f"n = {state['n']}, d = {state['d']}")
        assert _errors(page) == [], (budget, depth, _errors(page))
        assert page.locator("#sq-dp-heat, #sq-dp-tree").get_by_text("Error", exact=True).count() == 0
    # the events after each solve (copied chain, SGLang launch) answered too, and nothing raised meanwhile
    sync_api.expect(page.locator("#sq-dp-sglang")).not_to_contain_text("Cannot")
    assert _errors(page) == []
    print("edits (budget, depth, n, d):", seen)


def test_a_prompt_over_the_context_is_refused_beside_it_in_view_with_the_real_cap(page):
    """The tiny target has 512 positions: 400 characters, 200 new tokens and the tree do not fit.  Decode is
    pressed from below the fold (the prompt scrolled out of view), as a visitor scrolling down to it does."""
    _decode(page, "def ok():", 4)
    sync_api.expect(page.locator("#sq-summary")).to_contain_text("4 tokens")
    page.locator("#sq-prompt textarea").fill("x" * 400)
    box = page.get_by_label(re.compile(r"^max new tokens"))
    box.fill("200")
    box.press("Enter")
    decode = page.get_by_role("button", name="Decode", exact=True)
    decode.evaluate("b => b.scrollIntoView({block: 'end'})")     # the button at the window's bottom edge
    sync_api.expect(page.locator("#sq-prompt div.validation-error")).to_have_count(0)
    sync_api.expect(page.locator("#sq-prompt textarea")).not_to_be_in_viewport()
    decode.click()
    refusal = page.locator("#sq-prompt div.validation-error")
    sync_api.expect(refusal).to_contain_text("exceeds the target's context of 512")
    assert re.search(r"at most \d+ prompt tokens fit these settings", refusal.text_content())
    assert "8192" not in refusal.text_content()
    sync_api.expect(refusal).to_be_in_viewport()               # brought into view, not left above the window
    assert _errors(page) == []                                   # beside the field, never a toast
    sync_api.expect(page.locator("#sq-summary")).to_contain_text("4 tokens")   # nothing ran
