"""The first minutes of a new Space, under load: the app as ``python app.py`` serves it (the default runtime, the
embedded pair) on a fresh cache (shipped profiles hidden, an empty profile cache), so the background profiler
measures this machine while visitors arrive.  127.0.0.1 only; keeps every core busy.

    .venv/bin/python scripts/page/fresh_cache_load.py [--duration 300] [--json out.json]

The moment the models are ready (the profiler starts then), for ``--duration`` seconds: ``--decode-clients``
``/decode`` clients at T=0 (each its own prompt), one ``/compare`` client (a few tokens, every method) and
``--dp-clients`` ``/dp`` clients.  Then the same load again with the profile measured,
and, with nothing else running, each decode prompt alone.  Prints (and writes) per phase and endpoint the calls,
failures and latencies, whether every T=0 output under load equals its solo run, the decode p50 while profiling
over the same load's once the profile is measured (model work runs one request at a time, so a decode's latency
under this load is mostly its wait behind the others), and when the profile finished and what its note says.
Issue 49's goal: 0 failed requests, every T=0 output equal to its solo run, decode p50 <= 1.5x its value without
the profiler.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # run as a plain script from anywhere
sys.path.insert(0, str(Path(__file__).resolve().parent))

from load_test import Calls, machine, random_dp_args  # noqa: E402

PROMPTS = ("def fibonacci(n):", "def is_prime(n):", "class Stack:", "def quicksort(values):")


def fresh_server(port: int | None):
    """The app from this environment with no profile to find, on ``port`` (None: a free one), once its pair is
    loaded: (demo, ctx, url)."""
    import app
    from components.loopback import serve_loaded

    assets = Path(tempfile.mkdtemp(prefix="assets-"))
    shutil.copytree(app.ASSETS, assets, dirs_exist_ok=True, ignore=shutil.ignore_patterns("profiles"))
    (assets / "profiles").mkdir()
    demo = app.build_from_env(dict(os.environ))
    ctx = demo.sequoia_context
    ctx.hardware.assets_dir = assets
    ctx.hardware.cache_dir = Path(tempfile.mkdtemp(prefix="profile-cache-"))
    return demo, ctx, serve_loaded(demo, port)


def decode_args(prompt: str, new_tokens: int) -> tuple:
    return (prompt, "sequoia", 16, 4, 0.0, 1.0, new_tokens, 0, False, "")


def loop(url: str, endpoint: str, calls: Calls, deadline: float, timeout_s: float, make_args, outputs=None):
    from gradio_client import Client  # only this check needs the client

    client = Client(url, verbose=False)
    while time.monotonic() < deadline:
        args = make_args()
        t0 = time.monotonic()
        job = client.submit(*args, api_name=endpoint)
        try:
            result = job.result(timeout=timeout_s)
            calls.add(time.monotonic() - t0, None)
            if outputs is not None:
                outputs.append((args[0], result[0]))
        except Exception as exc:  # every failure is a data point
            job.cancel()
            calls.add(time.monotonic() - t0, f"{type(exc).__name__}: {str(exc)[:160]}")


def run_phase(url: str, args, deadline: float, outputs: list, ctx) -> dict:
    """The clients until ``deadline`` (each finishing its call in flight): per endpoint's calls and latencies, and
    when the profile finished (seconds from the start; None: not seen, or ``ctx`` None)."""
    results = {"/decode": Calls(), "/compare": Calls(), "/dp": Calls()}
    rng = np.random.default_rng(0)
    plan = [("/decode", (lambda p=PROMPTS[i % len(PROMPTS)]: decode_args(p, args.new_tokens)), outputs)
            for i in range(args.decode_clients)]
    plan.append(("/compare", lambda: ("def add(a, b):", 8, 3, 0.0, 1.0, args.compare_tokens, 0, False), None))
    plan += [("/dp", lambda: random_dp_args(rng), None)] * args.dp_clients
    threads = [threading.Thread(target=loop, args=(url, ep, results[ep], deadline, args.timeout, make, out),
                                daemon=True) for ep, make, out in plan]
    t0, done = time.monotonic(), None
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        if done is None and ctx is not None and ctx.hardware.profiling is not None and not ctx.hardware.measuring:
            done = time.monotonic() - t0
        time.sleep(0.5)
    return {**{ep: c.summary() for ep, c in results.items()}, "profile_done_s": done}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--duration", type=float, default=300.0, help="seconds of load from the models' readiness")
    ap.add_argument("--decode-clients", type=int, default=3)
    ap.add_argument("--dp-clients", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--compare-tokens", type=int, default=4)
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--port", type=int, default=None, help="the server's port (default: a free one)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    demo, ctx, url = fresh_server(args.port)
    try:
        ready = time.monotonic()
        outputs: list[tuple[str, str]] = []
        during = run_phase(url, args, ready + args.duration, outputs, ctx)   # the profiler measuring meanwhile
        profiled_s = during.pop("profile_done_s")
        while ctx.hardware.measuring:
            time.sleep(0.5)
        profiled_s = profiled_s if profiled_s is not None else time.monotonic() - ready
        # the same load again with the profile measured (its decode p50 is "alone": no profiler beside it)
        after = run_phase(url, args, time.monotonic() + args.duration, outputs, None)
        after.pop("profile_done_s")
        # each prompt once with nothing else running: its T=0 output, and a solo decode's latency
        from gradio_client import Client

        client, solo, alone = Client(url, verbose=False), {}, Calls()
        for prompt in sorted({p for p, _ in outputs} | set(PROMPTS[:args.decode_clients])):
            for _ in range(3):
                t0 = time.monotonic()
                solo[prompt] = client.predict(*decode_args(prompt, args.new_tokens), api_name="/decode")[0]
                alone.add(time.monotonic() - t0, None)
        mismatched = sorted({p for p, text in outputs if text != solo.get(p)})
        under, without = during["/decode"]["p50_s"], after["/decode"]["p50_s"]
        report = {
            "machine": machine(), "backend": ctx.pair().backend, "duration_s": args.duration,
            "while_profiling": during, "profile_measured": after, "decode_solo": alone.summary(),
            "decode_p50_profiling_over_measured": round(under / without, 2) if under and without else None,
            "t0_outputs": len(outputs), "t0_outputs_differing_from_solo": mismatched,
            "profile_s_after_ready": round(profiled_s, 1),
            "profile_error": ctx.hardware.profiling.error if ctx.hardware.profiling else "not started",
            "profile_note": ctx.profile.note if ctx.profile is not None else None,
        }
    finally:
        demo.close()
    print(json.dumps(report, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    failed = sum(c["errors"] for phase in ("while_profiling", "profile_measured") for c in report[phase].values())
    return 0 if not failed and not mismatched else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
