"""Hardware tab: the measured cost model and the tree it makes Sequoia pick.

The profile (target forward time by tokens, draft level time by width) is the
one :mod:`sequoia.runtime.measuring.finder` picks for this machine (cached or shipped,
matched by fingerprint), else measured in the background at start-up; it is
server-wide, since it describes the machine, and "Sequoia (auto)" in the other
tabs uses it.  *Profile now* re-measures it, for the server's owner only
(``SEQUOIA_OWNER=1``).
"Measure" decodes a short prompt with the chosen tree and with the target
alone, in interleaved rounds after a warm-up as Compare does, to put each one's
median ms/token (its range over the rounds as an error bar) beside the
predictions.  "Eager and graph
runners" sets the two runners' measured costs side by side where this machine
has profiles of both (on a CPU only the eager one applies).
"""

import tempfile
import time
from dataclasses import dataclass, field, replace
from functools import partial

import gradio as gr
import torch

from sequoia.core.profiles.runtimes import display_name
from sequoia.core.requests.request import MethodSpec
from sequoia.core.statistics import rounds
from sequoia.core.trees.optimizer import choose_tree, predict
from sequoia.core.trees.tree import Tree
from sequoia.runners.hf.graphs.capture import capture_status
from sequoia.runners.hf.graphs.graph_runner import GraphRunner
from sequoia.runners.hf.loading import GRAPHS
from sequoia.runtime.measuring.finder import ProfileChoice, cache_profile, find_profile
from sequoia.runtime.measuring.fingerprint import machine_fingerprint
from sequoia.runtime.measuring.profiling import measure_profile
from sequoia.runtime.measuring.timing import run_method, warmup

from components.app_state import serving, target_rate, validation
from components.app_state.acceptance_choice import acceptance_catalogue, default_acceptance_label
from components.app_state.context import LIGHT_WORK, MODEL_WORK, AppContext, ModelsNotReady
from components.app_state.runtimes_here import runtimes_here
from components.hardware import runners_view
from components.widgets import dp_view, hardware_view, projection_view, runtime_view

QUICK_TARGET_GRID = (1, 2, 4, 8, 16, 32, 64, 128)
QUICK_DRAFT_GRID = (1, 2, 4, 8, 16, 32)
MEASURE_PROMPT = "Write a Python function that returns the n-th Fibonacci number."
MEASURE_TOKENS = 48
#: Timed rounds of Measure (each decodes the target alone, then the chosen tree), after an untimed warm-up.
MEASURE_ROUNDS = 3
#: Why Profile now is refused on ZeroGPU.
PROFILE_NOW_ZEROGPU = ("Profile now does not run on ZeroGPU: a profile's grid takes longer than one GPU call may "
                       "last, and what a call measures is gone with its process; profile on a dedicated GPU and "
                       "ship the JSON in assets/profiles")
PROFILE_NOW_DISABLED = ("Profile now changes the profile for every visitor, so it is disabled here; the server's "
                        "owner enables it by starting the app with SEQUOIA_OWNER=1")


@dataclass
class HardwareSession:
    measured: dict[str, tuple[float, ...]] = field(default_factory=dict)  # label -> decode ms/token, each round
    cores: hardware_view.CoresWait | None = None   # how long Measure's threads waited for a core held elsewhere


def _measured(label: str, label_ms: dict[str, tuple[float, ...]]) -> dict:
    """A prediction row's measured fields: the median of its rounds and their range (none when not measured)."""
    values = label_ms.get(label)
    if not values:
        return {}
    band = rounds.spread(values)
    return {"measured_ms": band.median, "measured_lo": band.lo, "measured_hi": band.hi, "rounds": band.n}


def predictions(ctx: AppContext, acceptance, budget: int, depth: int, measured: dict[str, tuple[float, ...]]):
    """(choice, rows): the optimizer's pick and predicted ms/token of it and the fixed shapes; ``measured``:
    Measure's ms/token of each round, by label."""
    prof = ctx.profile
    choice = choose_tree(acceptance, prof, max_budget=budget, max_depth=depth)
    chain = MethodSpec("chain", budget, depth).engine_args(dynamic_depth=depth)       # the registry's meaning
    chains = MethodSpec("specinfer", budget, depth).engine_args(dynamic_depth=depth)  # of budget and depth
    shapes = {
        "chain": Tree.chain(chain["budget"]),
        "specinfer": Tree.specinfer(chains["width"], chains["depth"]),
    }
    # The chosen row is what Sequoia (auto) runs: a tree, or the target alone where none pays (never drawn as one).
    chosen = f"sequoia n={choice.budget} d={choice.depth}" if choice.budget else "target alone (no tree pays)"
    rows = [hardware_view.PredictionRow("target only", choice.baseline_ms, **_measured("target only", measured)),
            hardware_view.PredictionRow(chosen, choice.ms_per_token, chosen=True,
                                        **_measured("sequoia (chosen)", measured))]
    for name, tree in shapes.items():
        rows.append(hardware_view.PredictionRow(f"{name} n={tree.size}", predict(tree, acceptance, prof).ms_per_token))
    return choice, rows


def views(ctx: AppContext, acceptance_name, budget, depth, session: HardwareSession):
    """(cost figure, choice markdown, predicted-grid heatmap, prediction bars, runtimes figure, runtimes table,
    runners figure, runners markdown)."""
    if ctx.profile is None and not ctx.loaded:
        return None, "*The models are still loading; the hardware view fills in once they are ready.*", None, None, \
            None, "", None, ""
    acc = acceptance_catalogue(ctx.assets_dir).get(acceptance_name)
    if acc is None:
        raise gr.Error(f"unknown acceptance vector {acceptance_name!r}")
    budget, depth = int(budget), int(depth)
    if ctx.profile is None:   # the other runtimes' profiles still say which is fastest here
        return (None, f"*{ctx.profile_note()}*", None, None, *runtime_views(ctx, acc, budget, depth),
                *runner_views(ctx))
    choice, rows = predictions(ctx, acc, budget, depth, (session or HardwareSession()).measured)
    md = hardware_view.choice_markdown(choice, acceptance_name) + f"\n\n{ctx.profile_note()}"
    measured = hardware_view.measured_markdown(rows, MEASURE_TOKENS, cores=(session or HardwareSession()).cores,
                                               profile_note=ctx.profile_note())
    md += f"\n\n{measured}" if measured else ""
    grid = dp_view.heatmap(choice.grid, selected=(choice.budget, choice.depth) if choice.budget else None,
                           zlabel="ms/token (predicted)", colorscale="Viridis_r",
                           title="predicted ms per token of the DP tree of every cell")
    return (hardware_view.cost_figure(hardware_view.cost_series(ctx.profile), chosen_n=choice.budget or None),
            md, grid, hardware_view.prediction_figure(rows), *runtime_views(ctx, acc, budget, depth),
            *runner_views(ctx))


def runner_curves(ctx: AppContext) -> runners_view.RunnerCurves:
    """The loaded pair's costs on the graph runner and the eager one, from the profiles found for this machine
    with each (the fingerprints differ only in their kernels: "cuda-graphs" or torch's own)."""
    pair = ctx.pair()
    device = torch.device(pair.device).type
    if device != "cuda":
        own = hardware_view.cost_series(ctx.profile) if ctx.profile is not None else None
        return runners_view.RunnerCurves(device, eager=own, backend=getattr(pair, "backend", "hf"))
    base = ctx.profile.fingerprint if ctx.profile is not None and ctx.profile.fingerprint else \
        machine_fingerprint(pair)

    def measured(kernel: str):
        prof = find_profile(replace(base, single_row_kernel=kernel, multi_row_kernel=kernel),
                            cache_dir=ctx.cache_dir, assets_dir=ctx.assets_dir).profile
        return hardware_view.cost_series(prof) if prof is not None else None

    return runners_view.RunnerCurves(device, graph=measured(GRAPHS), eager=measured(""), cache_note=cache_note(pair))


def cache_note(pair) -> str:
    """The graph runners' slot caches and captured graphs ("" when the pair runs eagerly)."""
    parts = [f"{role} {r.capacity} slots ({r.cache.nbytes / 2**20:.0f} MiB); {capture_status(r).line()}"
             for role, r in (("target", pair.target), ("draft", pair.draft)) if isinstance(r, GraphRunner)]
    return ("Graph runner slot caches: " + "; ".join(parts) + ".") if parts else ""


def runner_views(ctx: AppContext):
    """(figure, markdown) of :func:`runner_curves`; (None, "") until the models are loaded."""
    if not ctx.loaded:
        return None, ""
    curves = runner_curves(ctx)
    return runners_view.runners_figure(curves), runners_view.runners_markdown(curves)


def runtime_views(ctx: AppContext, acceptance, budget: int, depth: int):
    """(figure, markdown): every measured runtime's costs side by side, and a table of every installed one (its
    predicted rate or "not measured here") whose "fastest" line is the runtime choice's
    (:mod:`sequoia.runtime.measuring.runtime_choice`)."""
    found, decision = runtimes_here(ctx, acceptance, budget, depth)
    series = [hardware_view.CostSeries(f.profile.target_n, f.profile.target_ms, f.profile.draft_width,
                                       f.profile.draft_ms, label=display_name(backend))
              for backend, f in found.items()]
    running = ctx.pair().backend if ctx.loaded else None
    return (hardware_view.runtimes_figure(series),
            runtime_view.runtimes_markdown(decision, running, ctx.hardware.runtime, _room_gb(ctx)) + "\n\n" +
            target_rate.reconcile_markdown(target_rate.predicted(ctx.choice), ctx.target_rates.latest()))


def _room_gb(ctx: AppContext) -> float | None:
    """The memory a restarted server would have: what it holds now plus what is free, under the owner's cap."""
    try:
        snap = ctx.extras.memory.snapshot()
    except OSError:
        return None
    room = snap.resident + snap.available
    return (room if snap.cap is None else min(room, snap.cap)) / 1e9


def profile_now(ctx: AppContext, quick: bool, progress=None) -> str:
    """Measure this machine, cache it where the finder looks and make it the server's profile (owner only);
    returns a downloadable copy of the JSON."""
    if not ctx.owner:
        raise ValueError(PROFILE_NOW_DISABLED)
    kwargs = dict(target_grid=QUICK_TARGET_GRID, draft_grid=QUICK_DRAFT_GRID, repeats=2) if quick else {}
    prof = measure_profile(ctx.pair(), progress=progress, **kwargs)
    path = cache_profile(prof, ctx.cache_dir)
    ctx.choice = ProfileChoice(prof, "measured", path, f"measured now with Profile now and cached as {path.name}")
    # The download is a temporary copy: Gradio serves files from its temp folder, not the cache.
    copy = tempfile.NamedTemporaryFile(prefix="sequoia-profile-", suffix=".json", delete=False).name
    prof.save(copy)
    return copy


def measure(ctx: AppContext, budget: int, depth: int, acceptance, rounds_: int = MEASURE_ROUNDS,
            progress=None) -> dict[str, tuple[float, ...]]:
    """Measured decode ms/token (after the prompt's forward: what the profile's step costs predict) of the
    target alone and of the auto-chosen tree on a fixed prompt, one value a round.

    The bench's rule (:mod:`sequoia.runtime.measuring.timing`), as Compare runs it (components.compare.compare_run): one short
    untimed warm-up run of both, then ``rounds_`` rounds in which each runs once in turn (a busy machine slows
    both alike).  ``progress(fraction, words)``: after each run.
    """
    base = validation.decode_request(ctx, MEASURE_PROMPT, "Target only", budget, depth, 0.0, 1.0, MEASURE_TOKENS, 0,
                                     True, acceptance)
    reqs = {label: validation.engine_inputs(ctx, base.for_method(method))
            for label, method in (("target only", "Target only"), ("sequoia (chosen)", "Sequoia (auto)"))}
    engine, pair = ctx.engine(), ctx.pair()
    ids = reqs["target only"].prompt_ids
    warmup(engine, pair, ids, [(r.proposer.name, r.proposer) for r in reqs.values()], tokens=2)
    out: dict[str, list[float]] = {label: [] for label in reqs}
    for k in range(rounds_):
        for i, (label, r) in enumerate(reqs.items()):
            if progress:
                progress((k * len(reqs) + i) / (rounds_ * len(reqs)), f"round {k + 1} of {rounds_}: {label}")
            out[label].append(run_method(engine, pair, r.proposer.name, r.prompt_ids, r.config, r.proposer)
                              .decode_ms_per_token)
    return {label: tuple(values) for label, values in out.items()}


HOW_TO_READ = """\
**Profile**: what one target forward of n tokens and one draft level of width w cost on this server, measured on a machine with the fingerprint shown (a profile from another machine is never used).
**Choice**: the (budget, depth) whose DP tree minimises predicted ms per token under that profile; the heatmap shows every cell, and no tree at all when none beats the target alone.
**Measure**: decodes the chosen tree and the target alone here, to check the prediction against real time: an untimed warm-up, then {rounds} interleaved rounds of {tokens} tokens (the target alone, then the tree); each bar is the median ms per token after the prompt's forward (the decode rate, what the profile predicts), its whisker the range over the rounds.
"""


def build(ctx: AppContext, demo: gr.Blocks, refresh_on=()) -> None:
    """Lay out the tab; it refreshes on page load and on each of ``refresh_on`` (event triggers such as the
    tab's ``select``: the profile is server-wide and may change under an open page)."""
    with gr.Accordion("How to read this", open=False):
        gr.Markdown(HOW_TO_READ.format(rounds=MEASURE_ROUNDS, tokens=MEASURE_TOKENS))
    with gr.Row():
        with gr.Column(scale=1, min_width=300):
            acceptance, budget, depth, choice_md, quick, prof_btn, prof_file, measure_btn = _controls(ctx)
        with gr.Column(scale=2):
            cost = gr.Plot(label="cost model")
            pred = gr.Plot(label="predicted vs measured")
    grid = gr.Plot(label="optimizer grid")
    with gr.Accordion("Runtimes on this machine", open=True):
        with gr.Row():
            runtimes = gr.Plot(label="cost by runtime")
            runtimes_md = gr.Markdown()
    with gr.Accordion("Eager and graph runners", open=True):
        with gr.Row():
            runners = gr.Plot(label="cost by runner")
            runners_md = gr.Markdown()
    with gr.Accordion("Why no tree pays here, and where it would", open=False):
        roofline = gr.Plot(label="cost of verifying n tokens, relative to one")
    session = gr.State(HardwareSession())
    inputs = [acceptance, budget, depth, session]
    outputs = [cost, choice_md, grid, pred, runtimes, runtimes_md, runners, runners_md]
    for trigger in (acceptance.change, budget.release, depth.release, demo.load, *refresh_on):
        trigger(_bound(views, ctx, "refresh"), inputs, outputs, api_visibility="private", **LIGHT_WORK)
    for trigger in (demo.load, *refresh_on):
        trigger(_bound(projection_view.roofline_figure, ctx, "roofline"), None, roofline, api_visibility="private",
                **LIGHT_WORK)
    prof_btn.click(_bound(_on_profile, ctx), [quick, *inputs], [prof_file, *outputs], api_visibility="private",
                   **MODEL_WORK)
    # ZeroGPU only: the warm-up and the interleaved rounds of both runs, in one GPU call
    def seconds(*_, **__) -> int:
        return serving.gpu_seconds(MEASURE_TOKENS, 2 * (MEASURE_ROUNDS + 1), ctx.profile)
    measure_btn.click(serving.on_gpu(_bound(_on_measure, ctx), seconds), inputs,
                      [*outputs, session], api_visibility="private", **MODEL_WORK)


def _bound(fn, ctx: AppContext, name: str = ""):
    """``fn`` with the context bound, under a name of its own (Gradio names an event's endpoint after it)."""
    bound = partial(fn, ctx)
    bound.__name__ = name or fn.__name__.lstrip("_")
    return bound


def _controls(ctx: AppContext):
    """The left column: acceptance, budget and depth, the choice, Profile now and Measure."""
    acceptance = gr.Dropdown(list(acceptance_catalogue(ctx.assets_dir)),
                             value=default_acceptance_label("code", 0.0, ctx.assets_dir), label="acceptance vector")
    budget = gr.Slider(1, ctx.budget_cap(), value=min(128, ctx.budget_cap()), step=1,
                       label="largest budget considered")
    depth = gr.Slider(1, 32, value=12, step=1, label="largest depth considered")
    choice_md = gr.Markdown()
    with gr.Row():
        quick = gr.Checkbox(value=True, label="quick profile (fewer points)")
        prof_btn = gr.Button("Profile now", interactive=ctx.owner)
    if not ctx.owner:
        gr.Markdown(f"<small>{PROFILE_NOW_DISABLED}.</small>")
    prof_file = gr.File(label="measured profile (JSON)", interactive=False, visible=False)
    measure_btn = gr.Button("Measure predicted vs real", variant="primary")
    return acceptance, budget, depth, choice_md, quick, prof_btn, prof_file, measure_btn


def _on_profile(ctx: AppContext, q, name, b, d, s, progress=gr.Progress()):
    if not ctx.owner:
        raise gr.Error(PROFILE_NOW_DISABLED)
    if serving.zerogpu():
        raise gr.Error(PROFILE_NOW_ZEROGPU)
    try:
        path = profile_now(ctx, q, progress=lambda fraction, label: progress(fraction, desc=label))
    except ModelsNotReady as exc:
        raise gr.Error(str(exc)) from None
    except (ValueError, RuntimeError) as exc:
        raise gr.Error(f"profiling failed: {exc}") from None
    return (gr.File(path, visible=True), *views(ctx, name, b, d, s))


def _on_measure(ctx: AppContext, name, b, d, s, progress=gr.Progress()):
    try:
        ctx.pair()  # ModelsNotReady while loading: say so rather than "no profile"
        if ctx.profile is None:
            raise ValueError(ctx.profile_note())
        threads, start = target_rate.thread_times(), time.perf_counter()
        measured = measure(ctx, int(b), int(d), acceptance_catalogue(ctx.assets_dir).get(name),
                           progress=lambda fraction, words: progress(fraction, desc=words))
        cores = target_rate.core_wait(threads, target_rate.thread_times(), time.perf_counter() - start)
    except ValueError as exc:
        raise gr.Error(str(exc)) from None
    s = HardwareSession(measured, cores=cores and hardware_view.CoresWait(cores.waited, cores.wait_s,
                                                                          target_rate.SHARED_ABOVE))
    return (*views(ctx, name, b, d, s), s)
