"""Running the race (:mod:`components.live.race`): the second runtime's pair loaded on demand, a warm-up, then
interleaved timed rounds of the three lanes, each run's text growing at its own pace; the pair freed at the end.

:func:`race_offer` asks this machine's profiles (the same ones the runtime was chosen by:
:func:`components.app_state.runtimes_here.runtimes_here`) whether a tree pays on an installed runtime other than
the serving one.  :func:`iter_race` runs it and yields a :class:`RaceState` at every change: while the pair
loads (its progress), after every step of every run (the lanes' texts), after every run (the bands).

The three lanes: Sequoia (auto) on the tree's runtime, priced by *that runtime's* profile (a view of the app
state around the second pair with its own profile: :func:`race_view`); the target alone there; the target alone
on the serving pair.  Every run goes through :func:`sequoia.runtime.measuring.timing.iter_run`, the bench's and
Compare's rule (the whole call on the engine's clock, prefill included; the page's pauses left out).  The
handler runs in the one model slot (``MODEL_WORK``), and each step holds its pair's lease, so a second visitor's
run waits for this one, never beside it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from dataclasses import dataclass, field, replace
from pathlib import Path

from sequoia.core.config import MAX_DEPTH
from sequoia.core.profiles.profile import HardwareProfile
from sequoia.core.profiles.runtimes import BF16_FLAGS, FoundProfile, display_name
from sequoia.core.statistics.trace import StepRecord
from sequoia.runners.hf.cpu import cpu_facts
from sequoia.runners.hf.kernels import default_draft_scheme
from sequoia.runtime.measuring.finder import ProfileChoice, find_acceptance
from sequoia.runtime.measuring.timing import RunResult, iter_run, warmup
from sequoia.runtime.memory import human, resident_bytes
from sequoia.runtime.models import ModelPair
from sequoia.runtime.texts import with_texts

from components.app_state import validation
from components.app_state.context import AppContext
from components.app_state.decode_inputs import DecodeInputs
from components.app_state.pair_room import LoadedPair
from components.app_state.profile_room import ProfileRoom
from components.app_state.run_flags import RunFlags
from components.app_state.runtimes_here import runtimes_here
from components.live import race
from components.live.live_tab import GUIDED

#: The largest tree Sequoia (auto) may pick in the race (race.offer prices trees up to the same size).
RACE_BUDGET = 64
#: Tokens of each lane's untimed warm-up run (first-call costs land on no round).
WARMUP_TOKENS = 2
#: How often the page hears of the second pair's loading progress.
LOAD_POLL_S = 0.5


def guided_inputs(max_new_tokens: int | None = None) -> DecodeInputs:
    """The guided example's prompt and settings (live_tab.GUIDED) with its code vector at its temperature;
    the method is set per lane."""
    vector = find_acceptance("code", float(GUIDED["temperature"])).values
    return DecodeInputs(GUIDED["prompt"], "ar", RACE_BUDGET, MAX_DEPTH, GUIDED["temperature"], 1.0,
                        int(max_new_tokens or GUIDED["max_new_tokens"]), GUIDED["seed"], True,
                        ", ".join(f"{a:.6g}" for a in vector))


def race_profiles(ctx: AppContext, acceptance: Sequence[float]) -> dict[str, HardwareProfile]:
    """backend -> its profile on this machine (the serving pair's own for its runtime); torch's stand-in
    (:func:`torch_stand_in`) where this CPU kind has none."""
    found = {b: f.profile for b, f in runtimes_here(ctx, acceptance)[0].items()}
    if "hf" not in found and not race.same_target("hf", ctx.pair().backend) and \
            (kin := torch_stand_in(ctx.assets_dir)) is not None:
        found["hf"] = kin.profile
    return found


def torch_stand_in(assets_dir, features: Sequence[str] | None = None) -> FoundProfile | None:
    """Where no torch profile of this CPU kind is cached or shipped and the CPU has bf16 matrix kernels
    (AVX-512-BF16, AMX; ``features``: None for this CPU's): the shipped torch profile of another CPU with them and
    this CPU's default draft, to predict the race with (the race then measures; ``python -m sequoia profile
    --backend hf`` measures this CPU's).  On the 2-vCPU Xeon with AMX the Zen 4's predicts Sequoia (auto) at 1.8x
    torch's target alone where its own profile predicts 2.55x, and 2.56x was measured (docs/serving.md)."""
    features = tuple(cpu_facts()[1] if features is None else features)
    if not any(flag in features for flag in BF16_FLAGS):
        return None
    draft = default_draft_scheme("cpu", features)
    for path in sorted((Path(assets_dir) / "profiles").glob("*.json")):
        try:
            prof = HardwareProfile.load(path)
        except (ValueError, OSError):
            continue
        fp = prof.fingerprint
        if fp is not None and fp.device_kind == "cpu" and fp.runtime == "hf" and fp.onednn_bf16 \
                and fp.draft_quant == draft and fp.target_quant == "none":
            model = fp.cpu_model or "another CPU"
            return FoundProfile(prof, f"shipped {path.name} ({model}: no torch profile of this CPU kind here)")
    return None


def stand_in_words(ctx: AppContext, backend: str, acceptance: Sequence[float]) -> str:
    """" (priced by ...)" where the race's ``backend`` is priced by :func:`torch_stand_in`, else ""."""
    if backend != "hf" or "hf" in runtimes_here(ctx, acceptance)[0]:
        return ""
    kin = torch_stand_in(ctx.assets_dir)
    return f" (predicted from {kin.source}; `python -m sequoia profile --backend hf` measures this one)" \
        if kin is not None else ""


def race_offer(ctx: AppContext, acceptance: Sequence[float]) -> race.Offer | None:
    """The race this server offers: None while the pair loads, where no second runtime can be loaded (ZeroGPU,
    a GPU, tests) or where no other runtime's profile predicts a tree paying (race.offer)."""
    if not on_cpu(ctx):
        return None
    return race.offer(ctx.pair().backend, race_profiles(ctx, acceptance), acceptance)


def on_cpu(ctx: AppContext) -> bool:
    """A race can run here: a loader for a second runtime, the pair loaded, on a CPU (on a GPU one runtime
    serves, the graph runner's: no CPU runtime races it)."""
    return ctx.extras.race_loader is not None and ctx.loaded and ctx.pair().device.type == "cpu"


def race_view(ctx: AppContext, pair: ModelPair, profile: HardwareProfile) -> AppContext:
    """The app state around the race's second pair, priced by that runtime's own profile (Sequoia (auto) picks
    its tree from it); measured rates and the lanes are shared, the extras are the view's own (none)."""
    models = LoadedPair.ready(pair)
    hardware = ProfileRoom(ctx.assets_dir, ctx.cache_dir, choice=ProfileChoice(
        profile, "given", None, f"this machine's {display_name(pair.backend)} profile, for the race"))
    return AppContext(models, hardware, ctx.extras.for_view(models), ctx.limits, ctx.lanes, ctx.owner,
                      target_rates=ctx.target_rates)


@dataclass
class RaceState(RunFlags):
    """Where one race stands (the page's session: Stop flags it, :class:`RunFlags`)."""

    offer: race.Offer | None = None
    rounds: int = race.ROUNDS
    phase: str = "idle"          # "loading", "warming", "running", "done", "failed"
    line: str = ""               # what runs now, in words
    round: int = 0               # the timed round now running, 1-based (0: before the rounds)
    lane: str = ""               # the key of the lane now running
    texts: dict[str, str] = field(default_factory=dict)     # lane key -> its current run's text
    results: list[tuple[race.Lane, float]] = field(default_factory=list)   # (lane, tokens/s) of every timed run
    tree: StepRecord | None = None   # the tree lane's newest step (its tree drawn on the page)
    resident: int = 0            # the most this process held (bytes, VmRSS) with both runtimes loaded
    error: str = ""

    @property
    def bands(self) -> dict[str, race.Band]:
        return race.bands(self.results)

    def memory_words(self) -> str:
        return f"resident memory with both runtimes loaded: {human(self.resident)}" if self.resident else ""


def iter_race(ctx: AppContext, state: RaceState, inputs: DecodeInputs | None = None) -> Iterator[RaceState]:
    """Run ``state.offer``'s race on ``inputs`` (None: the guided example) for ``state.rounds`` rounds; yields
    ``state`` at every change and ends early when ``state.stopped``.  The second pair is freed when it ends
    however it ends (Stop, an error, a closed page)."""
    offer, inputs = state.offer, inputs or guided_inputs()
    profile = race_profiles(ctx, race_acceptance(inputs))[offer.tree_backend]
    try:
        view = yield from _load(ctx, state, offer.tree_backend, lambda pair: race_view(ctx, pair, profile))
        if view is None or state.stopped:
            return
        plan = _plan(ctx, view, offer, inputs)
        state.phase, state.line = "warming", "warming up each lane (a few untimed tokens)"
        yield state
        for lane_ctx, lane, req in plan.values():
            warmup(lane_ctx.engine(), lane_ctx.pair(), req.prompt_ids, [(lane.method, req.proposer)],
                   min(WARMUP_TOKENS, req.config.max_new_tokens))
        state.resident = max(state.resident, resident_bytes())
        for r, lane in race.schedule(offer.lanes(), state.rounds):
            if state.stopped:
                return
            state.phase, state.round, state.lane = "running", r + 1, lane.key
            state.line = f"round {r + 1} of {state.rounds}: {lane.label}"
            run = yield from _timed(state, *plan[lane.key])
            if run is None:
                return
            state.results.append((lane, run.tokens_per_s))
            state.resident = max(state.resident, resident_bytes())
            yield state
        state.phase, state.line = "done", race.sentence(offer, state.bands)
        yield state
    finally:
        ctx.extras.free("race")


def race_acceptance(inputs: DecodeInputs) -> tuple[float, ...]:
    return tuple(float(a) for a in str(inputs.acceptance).split(","))


def _load(ctx: AppContext, state: RaceState, backend: str, make_view) -> Iterator[RaceState]:
    """The second pair's view, loaded in a worker thread while the page hears its progress; None (the error
    said in ``state``) when it cannot load."""
    state.phase, state.line = "loading", f"loading {display_name(backend)}'s pair for the race"
    yield state
    # Stop (this generator closed) or an error here cancels the load: it ends at its next stage, instead of
    # loading on unseen while the pool's exit waits for it (and holding the model's queue slot meanwhile).
    cancelled = threading.Event()
    with ThreadPoolExecutor(1, thread_name_prefix="sequoia-race-load") as pool:
        job = pool.submit(ctx.extras.race, backend, make_view, cancelled)
        try:
            while True:
                try:
                    view = job.result(timeout=LOAD_POLL_S)
                    break
                except TimeoutError:
                    if state.stopped:       # Stop while it loads: the load is cancelled below
                        return None
                    status = ctx.extras.race_status
                    if status is not None:
                        state.line = f"loading {display_name(backend)}'s pair for the race: {status.summary()}"
                    yield state
                except (OSError, RuntimeError, ValueError) as exc:   # refused by the memory budget, a missing file
                    state.phase, state.error = "failed", f"{type(exc).__name__}: {exc}"
                    state.line = f"The race could not load {display_name(backend)}'s pair: {exc}"
                    yield state
                    return None
        finally:
            if not job.done():
                cancelled.set()
    state.resident = max(state.resident, resident_bytes())
    return view


def _plan(ctx: AppContext, view: AppContext, offer: race.Offer, inputs: DecodeInputs) -> dict:
    """lane key -> (its context, the lane, its engine inputs): the request parsed once per pair."""
    plan = {}
    for lane in offer.lanes():
        lane_ctx = view if lane.backend == offer.tree_backend else ctx
        req = validation.parse_inputs(lane_ctx, replace(inputs, method=lane.method))
        plan[lane.key] = (lane_ctx, lane, validation.engine_inputs(lane_ctx, req))
    return plan


def _timed(state: RaceState, lane_ctx: AppContext, lane: race.Lane, req) -> Iterator[RaceState]:
    """One timed run of ``lane``, its text growing step by step; its result, or None when Stop ended it."""
    pair, tokens = lane_ctx.pair(), []
    state.texts[lane.key] = ""
    with closing(iter_run(lane_ctx.engine(), pair, lane.method, req.prompt_ids, req.config, req.proposer)) as steps:
        while True:
            try:
                rec = next(steps)
            except StopIteration as done:
                result: RunResult = done.value
                return result
            if state.stopped:
                return None
            tokens.extend(rec.new_tokens)
            state.texts[lane.key] = pair.tokenizer.decode(tokens, skip_special_tokens=True)
            if lane.key == "tree":   # its texts decoded outside the run's timed calls (iter_run times the engine)
                state.tree = with_texts(rec, pair.tokenizer.batch_decode)
            yield state
