"""A bounded, self-stopping load test of a Sequoia Studio server on this machine (127.0.0.1 only).

    # against an app you started yourself (give its pid to report its memory):
    .venv/bin/python scripts/page/load_test.py --url http://127.0.0.1:7860 --pid 12345
    # the mixed run of issue 24: decode clients alone, then beside the DP clients; prints the slowdown
    .venv/bin/python scripts/page/load_test.py --url http://127.0.0.1:7860 --pid 12345 --mixed --duration 60
    # or start a small random-weight app in a child process, load it, stop it:
    .venv/bin/python scripts/page/load_test.py --tiny-server

N light clients call ``/dp`` with random acceptance vectors, M model clients call ``/decode`` for a few
tokens, for a fixed duration; then every client finishes its call in flight (each call has a timeout,
after which it is cancelled) and the script prints, per endpoint, the calls, errors and p50 / p95 / max
latencies, and the server's resident memory (RSS) before and after.  It refuses any host but this one:
it is for checking that light work does not starve the model (issues 12 and 24), not for loading other servers.
Do not point it at a server running the real models on a shared machine: it keeps every core busy.

``--mixed`` runs two phases of ``--duration`` each: the decode clients alone, then the same clients beside
the DP clients, and reports each phase's latencies, the decode slowdown (mixed p50 / alone p50), the load
average of the machine before each phase (other jobs on a shared machine skew every figure) and
:data:`REFERENCE`, the figures issue 24 reported before the fix.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1"}

#: Issue 24's mixed run before the fix (embedded pair, ``python app.py``, AMD EPYC AVX2-only, 2 cores; 3
#: /decode clients of 16 tokens, 8 /dp clients with random vectors, 60 s per phase).
REFERENCE = {"decode_alone_p50_s": 4.8, "decode_mixed_p50_s": 13.9, "slowdown": 2.9, "dp_calls": 556,
             "dp_p50_s": 1.05, "errors": 0, "rss_gb_before": 9.07, "rss_gb_after": 9.21}


@dataclass
class Calls:
    """Latencies (s) of the calls that succeeded and the messages of those that failed, for one endpoint."""

    seconds: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, seconds: float, error: str | None) -> None:
        with self.lock:
            (self.errors.append(error) if error else self.seconds.append(seconds))

    def summary(self) -> dict:
        s = np.asarray(self.seconds)
        pct = (lambda q: round(float(np.percentile(s, q)), 3)) if s.size else (lambda q: None)
        return {"calls": int(s.size) + len(self.errors), "errors": len(self.errors), "p50_s": pct(50),
                "p95_s": pct(95), "max_s": round(float(s.max()), 3) if s.size else None,
                "first_errors": sorted(set(self.errors))[:3]}


def random_dp_args(rng: np.random.Generator) -> tuple[str, int, int]:
    """A random acceptance vector (1 to 16 entries, sum < 1) with a random budget and depth."""
    k = int(rng.integers(1, 17))
    vec = rng.dirichlet(np.ones(k + 1))[:k] * 0.95
    return ", ".join(f"{x:.4f}" for x in vec), int(rng.integers(8, 257)), int(rng.integers(2, 17))


def client_loop(url: str, endpoint: str, calls: Calls, deadline: float, timeout_s: float, seed: int,
                new_tokens: int) -> None:
    from gradio_client import Client  # only the load test needs the client

    client = Client(url, verbose=False)
    rng = np.random.default_rng(seed)
    while time.monotonic() < deadline:
        if endpoint == "/dp":
            args = random_dp_args(rng)
        else:
            args = ("def fib(n):", "sequoia", 16, 4, 0.0, 1.0, new_tokens, int(rng.integers(0, 1000)), True, "")
        t0 = time.monotonic()
        job = client.submit(*args, api_name=endpoint)
        try:
            job.result(timeout=timeout_s)
            calls.add(time.monotonic() - t0, None)
        except Exception as exc:  # every failure is a data point: timeouts, queue full, server errors
            job.cancel()
            calls.add(time.monotonic() - t0, f"{type(exc).__name__}: {str(exc)[:120]}")


def rss_mb(pid: int | None) -> float | None:
    if pid is None:
        return None
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None


def loadavg() -> str | None:
    """This machine's /proc/loadavg (1, 5, 15 minutes), or None off Linux."""
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return None


def machine() -> str:
    """The CPU model and core count, e.g. "AMD EPYC 7B13, 2 cores (avx2)"."""
    import os

    model, flags = "unknown CPU", ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and model == "unknown CPU":
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and not flags:
                have = line.split(":", 1)[1].split()
                flags = "avx512" if any(f.startswith("avx512") for f in have) else "avx2" if "avx2" in have else ""
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} cores" + (f" ({flags})" if flags else "")


def run_load(url: str, dp_clients: int, decode_clients: int, duration_s: float, timeout_s: float,
             new_tokens: int, pid: int | None) -> dict:
    host = urlparse(url).hostname
    if host not in LOCAL_HOSTS:
        raise SystemExit(f"refusing to load {host!r}: this load test only runs against 127.0.0.1")
    results = {"/dp": Calls(), "/decode": Calls()}
    load_before = loadavg()
    rss_before = rss_mb(pid)
    deadline = time.monotonic() + duration_s
    plan = [("/dp", i) for i in range(dp_clients)] + [("/decode", 100 + i) for i in range(decode_clients)]
    threads = [threading.Thread(target=client_loop, args=(url, ep, results[ep], deadline, timeout_s, seed,
                                                          new_tokens), daemon=True) for ep, seed in plan]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(duration_s + 2 * timeout_s + 30)  # a client past this is abandoned (daemon thread)
    return {"url": url, "dp_clients": dp_clients, "decode_clients": decode_clients, "duration_s": duration_s,
            "wall_s": round(time.monotonic() - t0, 1), "new_tokens": new_tokens,
            "endpoints": {ep: c.summary() for ep, c in results.items()},
            "rss_mb_before": rss_before, "rss_mb_after": rss_mb(pid), "loadavg_before": load_before,
            "loadavg_after": loadavg()}


def run_mixed(url: str, dp_clients: int, decode_clients: int, duration_s: float, timeout_s: float,
              new_tokens: int, pid: int | None) -> dict:
    """The decode clients alone, then beside the DP clients (``duration_s`` each); the slowdown between."""
    alone = run_load(url, 0, decode_clients, duration_s, timeout_s, new_tokens, pid)
    mixed = run_load(url, dp_clients, decode_clients, duration_s, timeout_s, new_tokens, pid)
    p50 = [r["endpoints"]["/decode"]["p50_s"] for r in (alone, mixed)]
    slowdown = round(p50[1] / p50[0], 2) if None not in p50 and p50[0] > 0 else None
    return {"machine": machine(), "alone": alone, "mixed": mixed, "decode_p50_s": {"alone": p50[0], "mixed": p50[1]},
            "slowdown": slowdown, "reference_issue_24": REFERENCE}


# ------------------------------------------------------------------ a small random-weight app
def serve_tiny(port: int, light_limit: int | None = None, dp_lane: str | None = None) -> None:
    """Serve the app on small random-weight models (the tests' character tokenizer); blocks.

    ``light_limit`` overrides the light group's concurrency (A/B against the old per-event limit of 4);
    ``dp_lane`` where ``/dp`` solves run ("thread" or "process": components.app_state.lanes.DP_LANE, A/B for issue 24).
    """
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "tests"))
    import tempfile

    import app
    from components.app_state import context
    from conftest import app_pair, tiny_model  # the tests' tiny pair: nothing downloaded

    if dp_lane is not None:
        from components.app_state import lanes  # only the A/B run needs it

        lanes.DP_LANE = dp_lane
    if light_limit is not None:  # the tabs unpack LIGHT_WORK when the page is built, so edit it in place
        context.LIGHT_WORK.clear()
        context.LIGHT_WORK["concurrency_limit"] = light_limit

    target = tiny_model(0, hidden=256, layers=4)
    demo = app.build_demo(app_pair(tiny_model(1, hidden=128, layers=2), target),
                          assets_dir=Path(tempfile.mkdtemp()), max_budget=64)
    demo.launch(server_name="127.0.0.1", server_port=port, quiet=True)


def with_tiny_server(port: int, run, light_limit: int | None = None, dp_lane: str | None = None) -> dict:
    extra = ["--light-limit", str(light_limit)] if light_limit is not None else []
    extra += ["--dp-lane", dp_lane] if dp_lane is not None else []
    proc = subprocess.Popen([sys.executable, __file__, "--serve-tiny", "--port", str(port), *extra], cwd=ROOT)
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(240):
            try:
                from gradio_client import Client

                Client(url, verbose=False)
                break
            except Exception:
                if proc.poll() is not None:
                    raise SystemExit("the tiny server exited before it came up")
                time.sleep(0.5)
        return run(url, proc.pid)
    finally:
        proc.terminate()
        proc.wait(30)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:7860")
    ap.add_argument("--pid", type=int, default=None, help="the server's process id, to report its RSS")
    ap.add_argument("--dp-clients", type=int, default=8)
    ap.add_argument("--decode-clients", type=int, default=3)
    ap.add_argument("--duration", type=float, default=60.0, help="seconds of load (at most 600)")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds before one call is cancelled")
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--tiny-server", action="store_true", help="start a random-weight app in a child process")
    ap.add_argument("--serve-tiny", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=7871)
    ap.add_argument("--light-limit", type=int, default=None,
                    help="with --tiny-server: light work's concurrency per event instead of the app's group")
    ap.add_argument("--dp-lane", choices=("thread", "process"), default=None,
                    help="with --tiny-server: where /dp solves run (components.app_state.lanes.DP_LANE)")
    ap.add_argument("--mixed", action="store_true",
                    help="two phases of --duration: decode clients alone, then beside the DP clients")
    ap.add_argument("--json", default=None, help="also write the report here")
    args = ap.parse_args(argv)
    if args.serve_tiny:
        serve_tiny(args.port, args.light_limit, args.dp_lane)
        return 0
    duration = min(max(args.duration, 1.0), 300.0 if args.mixed else 600.0)
    clients = (min(args.dp_clients, 32), min(args.decode_clients, 8))

    def run(url, pid):
        return (run_mixed if args.mixed else run_load)(url, *clients, duration, args.timeout, args.new_tokens, pid)

    report = (with_tiny_server(args.port, run, args.light_limit, args.dp_lane) if args.tiny_server
              else run(args.url, args.pid))
    text = json.dumps(report, indent=1)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
