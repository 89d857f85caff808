"""Sequoia Studio: the Gradio app.  This file only wires the tabs together.

    python app.py                      # embedded Qwen2.5-Coder 0.5B -> 1.5B pair, offline, on the runtime
                                       # this machine runs fastest (SEQUOIA_BACKEND=hf|llamacpp|mixed names one)
    SEQUOIA_DRAFT=Qwen/Qwen2.5-0.5B-Instruct SEQUOIA_TARGET=Qwen/Qwen2.5-7B-Instruct \\
    SEQUOIA_DEVICE=cuda SEQUOIA_DTYPE=bfloat16 python app.py

Nothing is loaded at import.  ``main()`` reads the environment, builds the
page and serves it at once while the pair loads in a background thread: a
banner at the top shows the loading progress (the console prints it too),
the DP explorer works meanwhile, and model handlers answer "still loading"
until the pair is ready.  Tests call :func:`build_demo` with a tiny model
pair instead.  Named API endpoints for ``gradio_client``: ``/decode`` (text +
one JSON object per step), ``/decode_stream`` (the streaming UI handler),
``/dp`` and ``/compare``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import gradio as gr

from components.app_state import serving, validation
from components.app_state.context import ASSETS, AppContext, LoadStatus
from components.app_state.extra_runners import ExtraLoader
from components.app_state.lanes import WorkLanes
from components.app_state.pair_room import GPU_SPACE_TARGET, LEARNS, choose_pair, cuda_here, pair_env
from components.app_state.profile_room import zerogpu_stand_in
from components.app_state.serving import zerogpu_env  # noqa: F401 (app.zerogpu_env: the tests' and the docs' name)
from components.compare import compare_tab
from components.distribution import distribution_tab
from components.dp_explorer import dp_tab
from components.hardware import hardware_tab
from components.live import live_layout
from components.served_trees import served_trees
from components.widgets import runtime_view, status_view
from sequoia.runners.embedded import default_cache_dir
from sequoia.runners.hf.loading import hub_reachable
from sequoia.runtime.measuring.learned import LearnedAcceptance
from sequoia.runtime.measuring.runtime_choice import RuntimeDecision, decision_from
from sequoia.runtime.memory import MemoryBudget, gguf_size_bytes, parse_memory_gb
from sequoia.runtime.models import ModelPair

CSS_PATH = ASSETS / "studio.css"
#: Parameters of the embedded target as converted (Qwen2.5-Coder-1.5B; the shipped GGUF has its own head), for
#: estimates before it is converted.
EMBEDDED_TARGET_PARAMS = 1_777_088_000
#: What converting the embedded GGUFs to bf16 may add while it runs (a process converting both peaked at 5.4 GB).
CONVERSION_BYTES = int(5e9)
QUEUE_MAX_SIZE = 16     # waiting requests beyond this are refused rather than queued for minutes
STATUS_POLL_S = 1.0     # how often an open page re-reads the loading progress until the models are ready

_HEADER = """<div class="sq-header">
<h1>Sequoia Studio</h1>
<p>Speculative decoding with DP-optimal token trees (Chen et al., 2024): a small draft proposes a tree,
the target verifies it in one forward, and the output is distributed exactly as the target's.</p>
</div>"""


def build_demo(pair_or_loader: ModelPair | Callable[[], ModelPair], assets_dir: Path = ASSETS,
               max_budget: int | None = None, device: str | None = None, status: LoadStatus | None = None,
               cache_dir: Path | None = None, auto_profile: bool = False, owner: bool = False,
               exact_loader: ExtraLoader | None = None, reference_loader: ExtraLoader | None = None,
               memory: MemoryOptions | None = None, lanes: WorkLanes | None = None,
               runtime: RuntimeDecision | None = None, pair_why: str = "",
               learned: LearnedAcceptance | None = None) -> gr.Blocks:
    """The whole app for a model pair, or a zero-argument callable that loads one.

    A loader runs on first use, or in the background once ``demo.sequoia_context.models.start_loading()``
    is called; ``status`` is the progress object the loader reports to (shown in the page banner).
    ``max_budget`` and ``device`` (where a loader will put the pair; None: the CPU) set what one request may ask
    (components.app_state.context.server_limits: the tree budget, by device when ``max_budget`` is None, and token caps).
    ``auto_profile``: when no cached or shipped profile matches this machine, measure one in the background
    once the pair is loaded (cached under ``cache_dir``).  ``owner``: allow server-wide changes (Profile now).
    ``exact_loader``: (pair, progress) -> the float32 target of exact mode, loaded on its first use (None: a
    float32 copy of the loaded target, which suits small unquantized models).  ``reference_loader``: (pair,
    progress) -> the same target on llama.cpp, for Compare's reference row (None: no such row).  ``memory``:
    the budget those two loads are planned against, and their sizes (None: the machine's memory, no cap).
    ``lanes``: where model-free work runs (None: new ones, whose DP process is forked as the page is built);
    apps built in one process (tests, scripts) may share one set, and so one DP process.  ``runtime``: which
    runtime the loader serves on and why (:func:`runtime_from_env`), shown in the banner and the Hardware tab;
    ``pair_why``: why this pair (:func:`components.app_state.pair_room.choose_pair`), shown in the banner.
    ``learned``: where this server learns the pair's acceptance from its decodes (None: it uses the vectors
    picked as they are; :mod:`sequoia.runtime.measuring.learned`).
    """
    ctx = AppContext.from_pair_or_loader(pair_or_loader, assets_dir=Path(assets_dir), max_budget=max_budget,
                                         device=device, lanes=lanes,
                                         cache_dir=cache_dir, auto_profile=auto_profile, owner=owner,
                                         exact_loader=exact_loader, reference_loader=reference_loader,
                                         **({"status": status} if status is not None else {}),
                                         **(memory.context_fields() if memory is not None else {}))
    ctx.hardware.runtime, ctx.models.why, ctx.learned = runtime, pair_why, learned
    if ctx.loaded:
        ctx.find_profile()
    with gr.Blocks(title="Sequoia Studio") as demo:
        gr.HTML(_HEADER)
        banner = gr.HTML(_banner(ctx))
        ready = gr.State(ctx.status.ready)  # flips once, when the models are ready; its change refreshes views
        with gr.Tabs():
            with gr.Tab("Live decoding", elem_id="sq-live"):
                live_layout.build(ctx, refresh_on=(ready.change,))
            with gr.Tab("DP explorer"):
                dp_tab.build(ctx.lanes, ctx.assets_dir, demo)
            with gr.Tab("Compare"):
                compare_tab.build(ctx)
            with gr.Tab("Distribution check"):
                distribution_tab.build(ctx.models, ctx.limits)
            with gr.Tab("Hardware") as hardware:
                hardware_tab.build(ctx, demo, refresh_on=(hardware.select, ready.change))
        _wire_status(ctx, demo, banner, ready)
    # Model work runs one request at a time (components.app_state.context.MODEL_WORK); the rest waits in one queue.
    # Bad requests to the API endpoints and the Live tab are refused before they queue behind a decode.
    validation.attach_validators(demo, ctx)
    demo.queue(default_concurrency_limit=1, max_size=QUEUE_MAX_SIZE)
    demo.sequoia_context = ctx  # for tests and scripts; not used by the UI
    return demo


def _banner(ctx: AppContext) -> str:
    converts = ctx.hardware.runtime is None or ctx.hardware.runtime.backend != "llamacpp"
    return (status_view.banner_html(ctx.status, ctx.models.label(), converts=converts)
            + runtime_view.banner_html(ctx.hardware.runtime, measured_since=_measured_since(ctx))
            + ctx.hardware.banner())


def _measured_since(ctx: AppContext) -> bool:
    """This server measured its machine's profile after it chose the runtime (the background profiler)."""
    p = ctx.hardware.profiling
    return p is not None and p.ready and p.error is None


def _wire_status(ctx: AppContext, demo: gr.Blocks, banner: gr.HTML, ready: gr.State) -> None:
    """Re-render the banner every STATUS_POLL_S until loading (and the background profile measurement) ends,
    then stop polling and set ``ready``."""
    timer = gr.Timer(STATUS_POLL_S, active=not ctx.status.ready or ctx.hardware.measuring)

    def poll():
        measuring = ctx.hardware.measuring
        done = (ctx.status.ready or ctx.status.error is not None) and not measuring
        return _banner(ctx), gr.Timer(active=not done), ctx.status.ready and not measuring

    # No concurrency limit: a status read must never wait behind a decode.  (queue=False would skip the
    # queue entirely, but then neither the timer update nor the state change reach the page.)
    for trigger in (demo.load, timer.tick):
        trigger(poll, None, [banner, timer, ready], show_progress="hidden", api_visibility="private",
                concurrency_limit=None)


class _ConsoleProgress:
    """progress(fraction, description) for load_pair: one console line per new description."""

    def __init__(self) -> None:
        self.last = None

    def __call__(self, fraction: float, description: str) -> None:
        if description != self.last:
            print(f"  [{fraction:4.0%}] {description}", flush=True)
            self.last = description


def load_from_env(env: Mapping[str, str] = os.environ, progress: Callable[[float, str], None] | None = None):
    """Load the pair named by SEQUOIA_DRAFT / SEQUOIA_TARGET / SEQUOIA_DEVICE / SEQUOIA_DTYPE and the weight
    quantization SEQUOIA_DRAFT_QUANT / SEQUOIA_TARGET_QUANT (none / int8 / int4; default: this machine's best);
    SEQUOIA_BLOCKED_WEIGHTS=0 keeps one copy of the weights (less memory, slower verification on CPU);
    SEQUOIA_BACKEND=llamacpp runs GGUF files through llama.cpp (the embedded pair as shipped, or .gguf paths);
    SEQUOIA_BACKEND=mixed the Hugging Face target with the draft on llama.cpp (the embedded draft as Q4_0);
    SEQUOIA_BACKEND=hf both on Hugging Face (torch); unset, the runtime :func:`runtime_from_env` chooses;
    on CUDA both models run on the graph runner (CUDA graphs over a slot cache) unless SEQUOIA_GRAPHS=0 or
    the Space is a ZeroGPU one (SPACES_ZERO_GPU: the GPU is attached per call, captured graphs would not last);
    SEQUOIA_OFFLOAD=1 streams the target's layers from host memory (0: never; unset: on CUDA when the target
    does not fit the GPU's free memory);
    on the graph runner SEQUOIA_COMPILE=0 keeps the draft's forward uncompiled (1: compiled, an error where
    compilation is unavailable; unset: compiled wherever it is available, see :func:`compile_from_env`)."""
    from sequoia.runtime.models import load_pair

    return load_pair(
        draft=env.get("SEQUOIA_DRAFT") or "embedded",
        target=env.get("SEQUOIA_TARGET") or "embedded",
        device=env.get("SEQUOIA_DEVICE") or None,
        dtype=env.get("SEQUOIA_DTYPE") or "auto",
        draft_quant=env.get("SEQUOIA_DRAFT_QUANT") or None,
        target_quant=env.get("SEQUOIA_TARGET_QUANT") or "none",
        blocked_weights=env.get("SEQUOIA_BLOCKED_WEIGHTS", "1").strip().lower() not in ("0", "false", "no", "off"),
        backend=backend_from_env(env),
        progress=progress,
        graphs=graphs_from_env(env),
        warm_trees=served_trees(ASSETS),   # on graphs: the default trees' drafts captured before serving
        offload=offload_from_env(env),
        compile=compile_from_env(env),
    )


def offload_from_env(env: Mapping[str, str] = os.environ) -> bool | None:
    """SEQUOIA_OFFLOAD: 1 streams the target from host memory, 0 never; unset (None) lets the loader decide."""
    value = env.get("SEQUOIA_OFFLOAD", "").strip().lower()
    return None if not value else value not in ("0", "false", "no", "off")


def runtime_from_env(env: Mapping[str, str] = os.environ) -> RuntimeDecision:
    """The runtime the pair named by the environment serves on, and why: SEQUOIA_BACKEND when set (a clear
    ValueError naming it for an unknown one), else the one this machine runs fastest by its measured or
    shipped costs (:mod:`sequoia.runtime.measuring.runtime_choice`); where no profile ranks torch and llama.cpp
    on this CPU kind, by each one's target alone timed here first (a few seconds, kept in the cache;
    SEQUOIA_PROBE=0 skips it: llama.cpp then, the faster target alone on every CPU kind measured)."""
    named = (env.get("SEQUOIA_BACKEND") or "").strip()
    probe = not named and env.get("SEQUOIA_PROBE", "1").strip().lower() not in ("0", "false", "no", "off")
    pair = dict(draft=env.get("SEQUOIA_DRAFT") or "embedded", target=env.get("SEQUOIA_TARGET") or "embedded")
    return replace(decision_from(named, "SEQUOIA_BACKEND", device=env.get("SEQUOIA_DEVICE") or None, **pair,
                                 cache_dir=default_cache_dir(env), probe=probe, log=_probe_log), timed_later=probe)


def _probe_log(line: str) -> None:
    print(f"Sequoia Studio: timing the runtimes before choosing one: {line}", flush=True)


def backend_from_env(env: Mapping[str, str] = os.environ) -> str:
    """SEQUOIA_BACKEND when set, else the measured choice (:func:`runtime_from_env`)."""
    named = (env.get("SEQUOIA_BACKEND") or "").strip().lower()
    return named or runtime_from_env(env).backend


def graphs_from_env(env: Mapping[str, str] = os.environ) -> bool | None:
    """False where CUDA graphs cannot pay or last (SEQUOIA_GRAPHS=0, ZeroGPU); None: the runtime's default."""
    if env.get("SEQUOIA_GRAPHS", "1").strip().lower() in ("0", "false", "no", "off") or env.get("SPACES_ZERO_GPU"):
        return False
    return None


def compile_from_env(env: Mapping[str, str] = os.environ) -> bool | None:
    """SEQUOIA_COMPILE: "0" (or false/no/off) False, "1" (true/yes/on) True, unset None (the draft compiled
    wherever compilation is available: CUDA with triton, not ZeroGPU).  A clear ValueError for anything else."""
    value = env.get("SEQUOIA_COMPILE", "").strip().lower()
    if value in ("", "auto"):
        return None
    if value in ("0", "false", "no", "off"):
        return False
    if value in ("1", "true", "yes", "on"):
        return True
    raise ValueError(f"SEQUOIA_COMPILE={value!r}: use 0 or 1 (or leave it unset)")


def exact_loader_from_env(env: Mapping[str, str] = os.environ):
    """Exact mode's loader for the pair :func:`load_from_env` loads: the same target (SEQUOIA_TARGET) in float32
    with the plain forward, on the same device: widened from the bf16 target in memory where the pair holds one
    (the same numbers, without the file read's transient peak), else read again from its converted files."""
    def load(pair, progress):
        from sequoia.runtime.checks.exactness import load_exact_target, widened_target

        progress(0.0, "widening the target to float32")
        widened = widened_target(pair.target, pair.target_name)
        if widened is not None:
            return widened
        return load_exact_target(env.get("SEQUOIA_TARGET") or "embedded", pair.device, progress=progress,
                                 name=pair.target_name)
    return load


def reference_loader_from_env(env: Mapping[str, str] = os.environ):
    """Compare's llama.cpp reference for the pair :func:`load_from_env` loads: the same target as a GGUF on
    llama.cpp (the embedded target's shipped Q4_K_M, or the file SEQUOIA_REFERENCE_GGUF names), loaded on first
    use; None when the pair already runs on llama.cpp, no GGUF of its target is known, or llama-cpp-python is
    not installed."""
    import importlib.util

    if not importlib.util.find_spec("llama_cpp") or backend_from_env(env) == "llamacpp":
        return None
    given = (env.get("SEQUOIA_REFERENCE_GGUF") or "").strip()
    if not given and (env.get("SEQUOIA_TARGET") or "embedded") != "embedded":
        return None

    def load(pair, progress):
        from sequoia.runners.embedded import default_cache_dir
        from sequoia.runners.llamacpp import load_embedded_runner, load_llamacpp_runner

        if given:
            return load_llamacpp_runner(given)
        return load_embedded_runner("target", default_cache_dir(env), progress=progress)
    return load


@dataclass(frozen=True)
class MemoryOptions:
    """What the app plans its on-demand loads with (components.app_state.extra_runners.ExtraRunners: memory, exact_bytes, ...)."""

    budget: MemoryBudget
    exact_bytes: Callable[[ModelPair], int] | None = None       # pair -> bytes exact mode's target adds
    reference_bytes: Callable[[ModelPair], int] | None = None   # pair -> bytes Compare's llama.cpp reference adds
    hints: tuple[str, ...] = ()                           # what the owner could change to make room

    def context_fields(self) -> dict[str, object]:
        fields = {"memory": self.budget, "memory_hints": self.hints, "exact_bytes": self.exact_bytes,
                  "reference_bytes": self.reference_bytes}
        return {k: v for k, v in fields.items() if v is not None}


def memory_from_env(env: Mapping[str, str] = os.environ) -> MemoryOptions:
    """The memory budget for the pair :func:`load_from_env` loads: capped by SEQUOIA_MEMORY_GB (a clear
    ValueError naming it for a bad value), sizes from the files the loaders will read."""
    from sequoia.runners.embedded import EMBEDDED, converted_dir, default_cache_dir
    from sequoia.runtime.memory import fp32_copy_bytes, fp32_model_bytes, safetensors_params

    budget = MemoryBudget(cap=parse_memory_gb(env.get("SEQUOIA_MEMORY_GB")))
    target = env.get("SEQUOIA_TARGET") or "embedded"
    files = converted_dir(EMBEDDED["target"], default_cache_dir(env)) if target == "embedded" else Path(target)
    reference = (env.get("SEQUOIA_REFERENCE_GGUF") or "").strip()

    def exact_bytes(pair) -> int:
        if getattr(pair.target, "model", None) is not None:     # a Hugging Face target: the same parameters
            return fp32_copy_bytes(pair.target)
        # Read from the bf16 files: from_pretrained's float32 load peaks about the files' size above its result
        # (embedded target: 3.5 GB), so the peak is planned, not only what stays.
        if files.is_dir() and any(files.glob("*.safetensors")):
            n = safetensors_params(files)
            return fp32_model_bytes(n) + 2 * n
        # not converted yet (the llama.cpp runtime): the conversion's own peak comes first
        return fp32_model_bytes(EMBEDDED_TARGET_PARAMS) + 2 * EMBEDDED_TARGET_PARAMS + CONVERSION_BYTES

    def reference_bytes(pair) -> int:
        size = Path(reference).stat().st_size if reference and Path(reference).is_file() else EMBEDDED["target"].size
        return gguf_size_bytes(size)

    blocked = env.get("SEQUOIA_BLOCKED_WEIGHTS", "1").strip().lower() not in ("0", "false", "no", "off")
    hints = ("restart with SEQUOIA_BLOCKED_WEIGHTS=0 (the target's second, oneDNN-blocked copy of its weights: "
             "3.1 GB on the embedded pair)",) if blocked and backend_from_env(env) != "llamacpp" else ()
    hints += ("run on a machine with more memory" + (" or raise SEQUOIA_MEMORY_GB" if budget.cap else ""),)
    return MemoryOptions(budget, exact_bytes, reference_bytes, hints)


def env_device(env: Mapping[str, str] = os.environ) -> str | None:
    """The device the pair will load on (the request limits are derived from it before it loads)."""
    from sequoia.runtime.models import resolve_device

    try:
        return str(resolve_device(env.get("SEQUOIA_DEVICE") or None))
    except ValueError:
        return None  # the loader fails with the same message, and the banner shows it


def build_from_env(env: Mapping[str, str] = os.environ, lanes: WorkLanes | None = None) -> gr.Blocks:
    """The app as ``python app.py`` serves it, from the environment: the runtime decided once (and said on the
    console), every loader reading that runtime; the pair not loading yet (``models.start_loading()``)."""
    standin = serving.install_standin(env)   # SEQUOIA_ZEROGPU_STANDIN=1: served as ZeroGPU would serve it
    zero = serving.zerogpu()
    if zero:
        env = zerogpu_env(env)
    chosen = choose_pair(env, zerogpu=zero, cuda=cuda_here, hub=hub_reachable)
    env = pair_env(env, chosen)        # the loaders, the runtime's choice and the profiles all read this pair
    print(f"Sequoia Studio: the pair {chosen.draft} -> {chosen.target}: {chosen.why}", flush=True)
    # A pair nobody measured learns its acceptance from this server's decodes, kept with the cache across restarts.
    learned = None if chosen.embedded else \
        LearnedAcceptance(default_cache_dir(env) / "learned-acceptance", f"{chosen.draft} -> {chosen.target}")
    runtime = runtime_from_env(env)   # an unknown SEQUOIA_BACKEND stops here, before anything loads
    print(f"Sequoia Studio: {runtime.summary()}", flush=True)
    env = {**env, "SEQUOIA_BACKEND": runtime.backend}   # a copy: the loaders below all read this one decision
    converts = "" if runtime.backend == "llamacpp" else " (the first run converts the embedded GGUF files once)"
    print(f"Loading the model pair in the background{converts}; the page is up meanwhile and shows the progress.",
          flush=True)
    memory = memory_from_env(env)   # a bad SEQUOIA_MEMORY_GB stops here, before anything loads
    status = LoadStatus(listener=_ConsoleProgress())
    # SEQUOIA_OWNER=1: this server's owner may change server-wide state (Profile now); visitors may not.
    def load() -> ModelPair:
        pair = load_from_env(env, progress=status)
        if standin is not None:          # as on ZeroGPU: no model work outside a GPU call
            standin.guard(pair.draft)
            standin.guard(pair.target)
        return pair
    # On ZeroGPU no background profiler (its model work would run outside a GPU call) and no llama.cpp reference
    # (a CPU runtime whose threads do not survive the fork each call runs in); the H100's measured graph replays
    # at the target's shapes stand in for the card's profile (each call captures its graphs).
    demo = build_demo(load, device=env_device(env), status=status, auto_profile=not zero,
                      pair_why=chosen.banner_words + (LEARNS if learned else ""), learned=learned,
                      owner=env.get("SEQUOIA_OWNER") == "1", cache_dir=default_cache_dir(env),
                      exact_loader=exact_loader_from_env(env),
                      reference_loader=None if zero else reference_loader_from_env(env),
                      memory=memory, runtime=runtime, lanes=lanes)
    if zero:
        demo.sequoia_context.hardware.stand_in = zerogpu_stand_in(chosen.target == GPU_SPACE_TARGET)
    else:   # the Live tab's race: the pair on another runtime, loaded on its first use (components.live.race_run)
        demo.sequoia_context.extras.race_loader = lambda b, p: load_from_env({**env, "SEQUOIA_BACKEND": b}, p)
    return demo


def main() -> None:
    import torch

    # Denormal floats make CPU matmuls of small activations many times slower.
    torch.set_flush_denormal(True)
    demo = build_from_env()
    demo.sequoia_context.models.start_loading()
    # GRADIO_SERVER_NAME / GRADIO_SERVER_PORT are read by gradio itself.
    demo.launch(css_paths=[CSS_PATH] if CSS_PATH.exists() else None, show_error=True)


if __name__ == "__main__":
    main()
