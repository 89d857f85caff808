"""Press the Live tab's "Race the runtimes" once, in-process, through the page's own handlers, and write what it
measured as JSON: each run's rate, the three bands, the tree's ratio to its runtime's target alone with its band,
the page's sentence, and the resident memory with both runtimes loaded (VmRSS sampled every 0.1 s) and after.

    SEQUOIA_CACHE=/tmp/race-cache .venv/bin/python scripts/page/race.py --json race.json

The app is built as ``python app.py`` builds it (the same environment: SEQUOIA_BACKEND, SEQUOIA_CACHE, ...), its
pair loaded, the offer read from this machine's profiles (none: the script says the page's line and stops); then
:func:`components.live.race_panel.first_frame` and :func:`~components.live.race_panel.race_stream` run as the
button's two events do (the guided example, race.ROUNDS interleaved rounds unless ``--rounds``).
``--profile BACKEND=PATH`` prices that runtime with a profile file instead of the one found here (a profile of
this CPU kind measured on a quieter hour: a busy shared machine's wall-clock profile is noise), as the page
would with that file in its cache; the JSON names the files used.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import app  # noqa: E402
from components.live import race, race_panel, race_run  # noqa: E402
from sequoia.core.profiles.profile import HardwareProfile  # noqa: E402
from sequoia.runners.hf.cpu import cpu_facts  # noqa: E402
from sequoia.runtime.memory import GB, resident_bytes  # noqa: E402


def _sample_peak(stop: threading.Event, peak: list[int]) -> None:
    while not stop.wait(0.1):
        peak[0] = max(peak[0], resident_bytes())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, help="where to write the result")
    ap.add_argument("--rounds", type=int, default=race.ROUNDS)
    ap.add_argument("--profile", action="append", default=[], metavar="BACKEND=PATH",
                    help="price BACKEND with this profile file (repeatable)")
    args = ap.parse_args()
    given = {b: HardwareProfile.load(Path(path)) for b, path in (item.split("=", 1) for item in args.profile)}
    if given:
        found = race_run.race_profiles
        race_run.race_profiles = lambda ctx, acceptance: {**found(ctx, acceptance), **given}
    demo = app.build_from_env()
    ctx = demo.sequoia_context
    t0 = time.perf_counter()
    ctx.models.get()                     # the serving pair, as the page's banner waits for it
    load_s = time.perf_counter() - t0
    acceptance = race_run.race_acceptance(race_run.guided_inputs())
    offer = race_run.race_offer(ctx, acceptance)
    model, features = cpu_facts()
    out = {"cpu": f"{model} ({', '.join(features)}), {os.cpu_count()} vCPUs", "serving": ctx.pair().backend,
           "serving_load_s": load_s, "resident_serving_gb": resident_bytes() / GB,
           "offer_line": race_panel.offer_markdown(ctx, offer)}
    out["profiles_given"] = dict(item.split("=", 1) for item in args.profile)
    print(out["offer_line"], flush=True)
    if offer is not None:
        out.update(_race(ctx, offer, args.rounds))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")


def _race(ctx, offer: race.Offer, rounds: int) -> dict:
    *_, state, _ = race_panel.first_frame(ctx, None)
    peak, stop = [resident_bytes()], threading.Event()
    sampler = threading.Thread(target=_sample_peak, args=(stop, peak), daemon=True)
    sampler.start()
    t0, shown = time.perf_counter(), ""
    for *_, state in race_panel.race_stream(ctx, state, rounds=rounds):
        if state.line != shown:
            shown = state.line
            print(f"[{time.perf_counter() - t0:6.1f} s] {shown}", flush=True)
    stop.set()
    sampler.join()
    got = state.bands
    mid, lo, hi = race.ratio_band(got["tree"], got["alone"])
    return {"tree_backend": offer.tree_backend, "predicted_ratio": offer.predicted_ratio,
            "verify_ratio": dict(offer.verify_ratio), "shown_tokens": offer.shown_tokens, "rounds": rounds,
            "runs": [{"lane": lane.key, "label": lane.label, "tokens_per_s": rate} for lane, rate in state.results],
            "bands": {k: vars(b) for k, b in got.items()},
            "tree_over_alone": {"median": mid, "low": lo, "high": hi},
            "sentence": state.line, "race_s": time.perf_counter() - t0,
            "resident_both_gb": state.resident / GB, "resident_peak_sampled_gb": peak[0] / GB,
            "resident_after_gb": resident_bytes() / GB, "freed": ctx.extras.race_loaded is None}


if __name__ == "__main__":
    main()
