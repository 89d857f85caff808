"""DP explorer tab: the Sequoia dynamic program for one acceptance vector.

Pick a measured vector (or edit one), set the largest budget and depth, and
see the table of expected tokens per step, the optimal tree of any cell
(chosen with the size / depth sliders, since Plotly clicks do not reach
Gradio) and the scaling curves against chains, k chains and binary trees.
An optional copied chain (acceptances c_1, c_2, … of tokens copied from the
context) shows the best tree of the cell holding one at the root
(:func:`sequoia.core.trees.dp.optimal_tree_with_copies`).  Below, the best SGLang
launch of the cell (steps, top-k, draft tokens; :mod:`sequoia.core.trees.sglang_family`),
its tree and expected tokens beside the Sequoia tree's, and the command line
that serves it.  No model is needed.
"""

# No ``from __future__ import annotations``: gr.api reads the return annotation.

import functools
import json
from dataclasses import dataclass
from pathlib import Path

import gradio as gr

from sequoia.core.config import MAX_DEPTH
from sequoia.core.requests.request import parse_dp
from sequoia.core.statistics.words import counted
from sequoia.core.trees.dp import DPResult, baseline_curves, check_copies, optimal_tree, optimal_tree_with_copies
from sequoia.core.trees.sglang_family import ALGORITHMS, EMBEDDED_DRAFT, EMBEDDED_TARGET, best_launch
from sequoia.core.trees.tree import MAX_TREE_SIZE

from components.app_state import validation
from components.app_state.acceptance_choice import acceptance_catalogue, format_acceptance, parse_acceptance
from components.app_state.context import LIGHT_WORK
from components.app_state.lanes import WorkLanes
from components.widgets import dp_view


@dataclass
class DPSession:
    """Per-session state: the last solved table (``sequoia.core.trees.dp.DPResult``)."""

    result: DPResult | None = None


def solve(acceptance_text: str, budget, depth):
    """Validated DP solve in this thread (scripts, tests); raises ValueError with a readable message naming
    the field."""
    req = parse_dp(acceptance_text, budget, depth)
    return solved(req.acceptance, req.budget, req.depth)


@functools.lru_cache(maxsize=16)
def solved(acceptance: tuple[float, ...], budget: int, depth: int):
    """The DP table of one vector, budget and depth, solved once (the explorer's Solve, its cells and ``/dp``
    ask for the same table again and again).  Each table is at most a few MB under the DP work cap."""
    return optimal_tree(acceptance, budget, depth)


def clamped_cell(n, d, budget: int, depth: int) -> tuple[int, int]:
    """The cell (n, d), as its sliders sent it, within 0..budget x 0..depth (a value that is no number: the
    largest cell).

    Every event that reads the cell sliders takes their raw values (``preprocess=False``) and clamps them here:
    a solve narrows the sliders' range in its answer, and an event the page sent before it drew that answer
    carries the old value, which Gradio's own check refused with a red "Value 32 is greater than maximum value
    16" toast, leaving the figures one edit behind.
    """
    def whole(raw, top: int) -> int:
        try:
            return min(max(int(float(raw)), 0), top)
        except (TypeError, ValueError, OverflowError):
            return top
    return whole(n, int(budget)), whole(d, int(depth))


def _session_cell(n, d, session) -> tuple[int, int]:
    """(n, d) within the last solved table's limits (before the first solve, within the widest ones)."""
    if session is not None and session.result is not None:
        return clamped_cell(n, d, session.result.budget, session.result.depth)
    return clamped_cell(n, d, MAX_TREE_SIZE, MAX_DEPTH)


def cell_views(result, n, d):
    """Heatmap with (n, d) outlined, that cell's tree and a one-line description."""
    n, d = clamped_cell(n, d, result.budget, result.depth)
    tree = result.tree(n, d)
    value = result.value(n, d)
    heat = dp_view.heatmap(result.table, selected=(n, d))
    fig = dp_view.tree_figure(tree, result.acceptance, value)
    md = (f"**n = {n}, d = {d}**: {value:.3f} expected tokens/step with a tree of "
          f"{counted(tree.size, 'node')} and depth {tree.depth} · parents `{list(tree.parents)}`")
    return heat, fig, md


def on_solve(lanes: WorkLanes, acceptance_text, budget, depth, n, d, session: DPSession):
    """Solve handler: parsed here, solved and drawn in the DP lane (:class:`components.app_state.lanes.DPLane`).

    A bad vector, budget or depth leaves the last good figures and sliders as they are, with the message
    beside them (an error raised here would put an error badge on every output instead).
    """
    try:
        req = validation.dp_request(lanes.dp_requests, acceptance_text, budget, depth)
    except ValueError as exc:
        kept = " The figures still show the last good vector." if session is not None and session.result else ""
        return (gr.skip(), gr.skip(), f"**Cannot solve the DP:** {exc}.{kept}", gr.skip(), gr.skip(), gr.skip(),
                gr.skip())
    heat, fig, md, curves, n, d, result = lanes.dp.run(solve_views, req, n, d)
    return (heat, fig, md, curves,
            gr.Slider(maximum=result.budget, value=n), gr.Slider(maximum=result.depth, value=d),
            DPSession(result))


def solve_views(req, n, d):
    """(heatmap, cell tree, cell line, curves, n, d, result) of a parsed DP request and the cell sliders."""
    result = solved(req.acceptance, req.budget, req.depth)
    sizes, values = _curves(req.acceptance, req.budget)
    curves = dp_view.curves(sizes, values)
    n, d = clamped_cell(n, d, result.budget, result.depth)
    heat, fig, md = cell_views(result, n, d)
    return heat, fig, md, curves, n, d, result


def parse_copies(text: str) -> tuple[float, ...]:
    """``"0.9, 0.8"`` (or empty: no copied chain) as a validated c_1..c_L, at most MAX_DEPTH long."""
    text = (text or "").strip()
    if not text:
        return ()
    try:
        value = json.loads(text if text.startswith("[") else f"[{text}]")
    except json.JSONDecodeError as exc:
        raise ValueError(f"copied chain: expected numbers separated by commas ({exc.msg})") from None
    if not isinstance(value, list) or not all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                              for x in value):
        raise ValueError("copied chain: expected a list of numbers")
    if len(value) > MAX_DEPTH:
        raise ValueError(f"copied chain: at most {MAX_DEPTH} acceptances, got {len(value)}")
    return tuple(float(x) for x in check_copies(value))


def copies_views(lanes: WorkLanes, acceptance_text, copies_text, n, d, session: DPSession | None = None):
    """The copied-chain variant of cell (n, d) (within the last solved limits): its tree and E by m; (None, hint)
    without a chain."""
    n, d = _session_cell(n, d, session)
    try:
        copies = parse_copies(copies_text)
        if not copies:
            return None, "*Enter c_1, c_2, … (chance each copied token is accepted given the previous one was) " \
                         "to see the best tree holding a copied chain.*"
        req = validation.dp_request(lanes.dp_requests, acceptance_text, max(int(n), 1), max(int(d), 1))
    except ValueError as exc:   # the message beside the last good tree, not an error badge on it
        return gr.skip(), f"**Cannot solve with the copied chain:** {exc}."
    return lanes.dp.run(_copies_views, req, copies)


def _copies_views(req, copies):
    acc, n, d = req.acceptance, req.budget, req.depth
    result = optimal_tree_with_copies(acc, copies, n, d)
    md = (f"**n = {n}, d = {d}**, copied chain c = `{list(copies)}`: best m = **{result.n_copied}** copied "
          f"nodes, {result.value:.3f} tokens/step (the draft's nodes count only when the first copy is "
          f"rejected; p assumed unchanged then)\n\n" + dp_view.copies_markdown(result))
    return dp_view.copies_tree_figure(result, acc, copies), md


def sglang_views(lanes: WorkLanes, acceptance_text, n, d, target, draft, algorithm, session: DPSession | None = None):
    """The best SGLang launch of cell (n, d) (within the last solved limits): its tree, the two expectations and
    the command line."""
    n, d = _session_cell(n, d, session)
    target, draft = (target or "").strip(), (draft or "").strip()
    if not target or not draft:
        return gr.skip(), "**Cannot write the SGLang command:** enter the target and the draft model paths.", ""
    if int(n) < 1 or int(d) < 1:
        return None, "*Pick a cell with n ≥ 1 and d ≥ 1: SGLang drafts at least one token.*", ""
    try:
        req = validation.dp_request(lanes.dp_requests, acceptance_text, int(n), int(d))
    except ValueError as exc:   # a message, not an error badge; no command left that this vector did not choose
        return gr.skip(), f"**Cannot choose the SGLang launch:** {exc}.", ""
    return lanes.dp.run(_sglang_views, req, target, draft, algorithm)


def _sglang_views(req, target, draft, algorithm):
    choice = best_launch(req.acceptance, req.budget, req.depth, algorithm=algorithm)
    return (dp_view.sglang_tree_figure(choice, req.acceptance), dp_view.sglang_markdown(choice),
            choice.args.command_line(target, draft))


def on_cell(lanes: WorkLanes, n, d, session: DPSession):
    if session is None or session.result is None:
        return gr.skip(), gr.skip(), "*Press **Solve** first.*"
    return lanes.light.run(lambda: cell_views(session.result, n, d))


#: The dropdown's entry once the vector has been edited by hand.
CUSTOM = "custom"
HOW_TO_READ = """\
**Vector**: p_k is the chance that the k-th child the draft samples is the one the target accepts; the DP assumes it depends only on k.
**Heatmap**: expected tokens per target call of the best tree with n draft tokens and depth ≤ d; pick a cell with the sliders to see its tree.
**Curves**: how that best tree scales against a chain, the best set of k chains and a binary tree of the same size.
**SGLang**: the serving engine that speculates with trees today; its trees grow S steps, each expanding the top-k best nodes by their top-k, and keep the N−1 best; the launch shown is the best such tree of the cell, beside the Sequoia tree of as many tokens (vLLM serves chains only).
**Copied chain** (optional): c_j is the chance the j-th token copied from the context is accepted given the previous one was; the best tree of the cell then spends m nodes on the copies (◇ marked) and the rest on the draft.
"""


def on_pick(name, catalogue):
    return format_acceptance(catalogue[name]) if name in catalogue else gr.skip()


def on_edit(text, name, catalogue):
    """A hand edit makes the vector "custom" unless it still equals the picked entry."""
    try:
        same = name in catalogue and parse_acceptance(text) == parse_acceptance(format_acceptance(catalogue[name]))
    except ValueError:
        same = False
    return gr.skip() if same else gr.update(value=CUSTOM)


def dp_api_fn(lanes: WorkLanes):
    """The typed function behind the ``/dp`` API endpoint."""
    def dp_api(acceptance: str, budget: int = 32, depth: int = 8) -> dict:
        """Solve the DP; returns a summary: the value and optimal tree at (budget, depth), the best value for
        every size at that depth, the best SGLang launch within them (for the embedded pair's checkpoints),
        and the baseline curves.

        Not the whole table: at budget 1024 and depth 64 it alone is over 1 MB of JSON.  The request is parsed
        once (by the validator before the queue); the solve runs in the DP lane (components.app_state.lanes.DPLane).
        """
        try:
            req = validation.dp_request(lanes.dp_requests, acceptance, budget, depth)
        except ValueError as exc:
            raise gr.Error(str(exc)) from None
        return lanes.dp.run(summary, req)
    return dp_api


def summary(req) -> dict:
    """The ``/dp`` answer of a parsed request (sequoia.core.requests.request.DPRequest); tables and curves cached per
    vector, so a repeated request (the explorer re-solving the same vector) costs a dictionary lookup."""
    result = solved(req.acceptance, req.budget, req.depth)
    sizes, curves = _curves(req.acceptance, req.budget)
    tree = result.tree()
    return {"format": "sequoia-dp-summary/1", "acceptance": list(result.acceptance), "budget": result.budget,
            "depth": result.depth, "value": result.value(), "tree": tree.to_dict(),
            "sglang": best_launch(req.acceptance, req.budget, req.depth, dp=result).to_dict(EMBEDDED_TARGET,
                                                                                           EMBEDDED_DRAFT),
            "value_by_size": [round(float(x), 6) for x in result.table[:, result.depth]],
            "curve_sizes": sizes, "curves": curves}


@functools.lru_cache(maxsize=64)
def _curves(acceptance: tuple[float, ...], budget: int) -> tuple[list[int], dict]:
    """The scaling curves of a vector up to ``budget``: a DP at every depth up to 64 plus Python loops over
    chains and binary trees, several times the work of the requested solve, so kept per vector."""
    sizes = dp_view.curve_sizes(budget)
    return sizes, baseline_curves(acceptance, sizes)


def build(lanes: WorkLanes, assets_dir: Path, demo: gr.Blocks) -> None:
    """Lay out the tab inside the current ``gr.Blocks`` and wire its events (no model: the work runs in
    ``lanes``; the vectors offered are read from ``assets_dir``)."""
    lanes.dp.prepare()   # now: before the server listens and before the pair loads (components.app_state.lanes)
    catalogue = acceptance_catalogue(assets_dir)
    names = list(catalogue)
    with gr.Accordion("How to read this", open=False):
        gr.Markdown(HOW_TO_READ)
    with gr.Row():
        with gr.Column(scale=1, min_width=300):
            pick = gr.Dropdown(names + [CUSTOM], value=names[0], label="acceptance vector")
            vector = gr.Textbox(format_acceptance(catalogue[names[0]]), label="p_1, p_2, … (editable)",
                                info="p_k: chance the k-th sampled child is the accepted one; sum ≤ 1")
            budget = gr.Slider(1, MAX_TREE_SIZE, value=128, step=1, label="largest budget n",
                               elem_id="sq-dp-budget")
            depth = gr.Slider(1, MAX_DEPTH, value=16, step=1, label="largest depth d", elem_id="sq-dp-depth")
            solve_btn = gr.Button("Solve", variant="primary")
            gr.Markdown("**Cell** (Plotly clicks do not reach the server; pick the cell here)")
            n = gr.Slider(0, 128, value=32, step=1, label="tree size n", elem_id="sq-dp-n")
            d = gr.Slider(0, 16, value=8, step=1, label="depth d", elem_id="sq-dp-d")
            cell_md = gr.Markdown(elem_id="sq-dp-cell")
        with gr.Column(scale=2):
            heat = gr.Plot(label="expected tokens per step (DP table)", elem_id="sq-dp-heat")
            tree = gr.Plot(label="optimal tree of the selected cell", elem_id="sq-dp-tree")
    curves = gr.Plot(label="scaling: expected tokens per step vs tree size")
    with gr.Accordion("Copied chain (tokens copied from the context)", open=False):
        with gr.Row():
            with gr.Column(scale=1, min_width=300):
                copies = gr.Textbox("", label="c_1, c_2, … (optional)",
                                    info="chance each copied token is accepted given the previous one was")
                copies_md = gr.Markdown(elem_id="sq-dp-copies")
            copies_tree = gr.Plot(label="best tree of the selected cell with the copied chain")
    with gr.Accordion("Serve it with SGLang (the selected cell)", open=True):
        with gr.Row():
            with gr.Column(scale=1, min_width=300):
                target = gr.Textbox(EMBEDDED_TARGET, label="target model path (--model-path)")
                draft = gr.Textbox(EMBEDDED_DRAFT, label="draft model or EAGLE head (--speculative-draft-model-path)")
                algorithm = gr.Dropdown(list(ALGORITHMS), value=ALGORITHMS[0], label="--speculative-algorithm",
                                        info="STANDALONE: a separate draft model; EAGLE / EAGLE3: an EAGLE head "
                                             "(its own acceptance vector)")
                sglang_md = gr.Markdown(elem_id="sq-dp-sglang")
            sglang_tree = gr.Plot(label="the tree SGLang verifies with these arguments")
        command = gr.Code(label="launch command", language="shell", interactive=False, lines=2, wrap_lines=True,
                          show_line_numbers=False, buttons=["copy"], elem_id="sq-dp-sglang-command")
    session = gr.State(DPSession())
    pick.change(lambda name: on_pick(name, catalogue), pick, vector, api_visibility="private", **LIGHT_WORK)
    vector.input(lambda text, name: on_edit(text, name, catalogue), [vector, pick], pick,
                 api_visibility="private", trigger_mode="always_last", **LIGHT_WORK)
    afters = [(functools.partial(copies_views, lanes), [vector, copies, n, d, session], [copies_tree, copies_md]),
              (functools.partial(sglang_views, lanes), [vector, n, d, target, draft, algorithm, session],
               [sglang_tree, sglang_md, command])]
    _wire_solves(lanes, demo, solve_btn, [vector, budget, depth, n, d, session],
                 [heat, tree, cell_md, curves, n, d, session], afters)
    copies.submit(*afters[0], api_visibility="private", preprocess=False, **LIGHT_WORK)
    for box in (target, draft):
        box.submit(*afters[1], api_visibility="private", preprocess=False, **LIGHT_WORK)
    algorithm.change(*afters[1], api_visibility="private", preprocess=False, **LIGHT_WORK)


def _wire_solves(lanes: WorkLanes, demo: gr.Blocks, solve_btn, solve_inputs, solve_outputs, afters) -> None:
    """The solve and cell events, each followed by the views of ``afters`` ((fn, inputs, outputs): the copied
    chain, the SGLang launch), all in the DP lane; ``solve_inputs``: vector, budget, depth, n, d, session;
    ``solve_outputs``: heatmap, tree, cell line, curves, n, d, session."""
    solve_fn, cell_fn = functools.partial(on_solve, lanes), functools.partial(on_cell, lanes)
    vector, budget, depth, n, d, session = solve_inputs
    heat, tree, cell_md = solve_outputs[:3]

    # preprocess=False on every event that reads the cell sliders: the handlers clamp the cell to the limits they
    # solve (clamped_cell), where Gradio's check refused a value the same edit was narrowing with an error toast.
    raw = dict(api_visibility="private", preprocess=False, **LIGHT_WORK)

    def then_afters(event):
        for after in afters:
            event = event.then(*after, **raw)

    then_afters(solve_btn.click(solve_fn, solve_inputs, solve_outputs, **raw))
    # Every change re-solves (always_last: a burst of keystrokes or a drag solves once, for its last value), so
    # the figures never show another vector's numbers than the one in the box.
    for box in (vector, budget, depth):
        then_afters(box.change(solve_fn, solve_inputs, solve_outputs, trigger_mode="always_last",
                               show_progress="minimal", **raw))
    for s in (n, d):
        then_afters(s.input(cell_fn, [n, d, session], [heat, tree, cell_md], trigger_mode="always_last", **raw))
    gr.api(dp_api_fn(lanes), api_name="dp", **LIGHT_WORK)
    # Show the default vector solved as soon as the page opens.
    then_afters(demo.load(solve_fn, solve_inputs, solve_outputs, **raw))
