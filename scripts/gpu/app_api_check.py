"""The app on a device, measured through its own API: is the page's step the engine's step?

    python scripts/gpu/app_api_check.py --out DIR --device cuda (--make embedded|7b|tiny | --draft D --target T)
                                    [--models-dir M]
                                    [--app inprocess|subprocess] [--method sequoia --budget 32 --depth 8]
                                    [--temperatures 0,1] [--new-tokens 64] [--repeats 3] [--tolerance 0.10]

Starts the app with ``SEQUOIA_DEVICE`` and the given model folders (``--make``: random weights written by
``scripts/make_random_pair.py`` first, into ``--models-dir`` or a temporary folder removed at the end, never
under ``--out``: on a GPU machine everything under ``$OUT`` travels back, and a 7B pair is ~16 GB): in this
process (``--app inprocess``, one copy of the models, the same one the direct runs use) or as ``python app.py`` in a subprocess (the real start-up; the direct runs then
load a second copy here).  For each temperature it calls ``/decode`` with ``gradio_client`` (one untimed
warm-up call: the graphs are captured there) and runs the same request straight through the engine, the two
interleaved ``--repeats`` times.  Compared, API against direct: the step time the step records carry (median
over the steps after the first two) and the wall time per step (the client's round trip over the steps, the
prompt's forward and the transport included; directly, the engine call's); and the decode rate the Live
tab's own stream (``/decode_stream``, frames and all) shows, against the same page request run directly: the
engine must not slow down while the page renders (``--no-live`` leaves it out).  Writes DIR/app_api_check.json and
.md; exits 1 when either ratio is off by more than ``--tolerance``.  Needs gradio and gradio_client: on a
machine with no package index, see scripts/gpu/wheelhouse.py.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # run as a plain script from anywhere

from gradio_client import Client  # noqa: E402

import app  # noqa: E402
from components.app_state import validation
from components.app_state.acceptance_choice import default_acceptance_label  # noqa: E402
from components.app_state.decode_inputs import PAGE_FIELDS, DecodeInputs  # noqa: E402
from components.live import live_tab  # noqa: E402
from components.loopback import free_port, serve_here  # noqa: E402
from sequoia._meta import write_json  # noqa: E402
from sequoia.core.requests.request import METHOD_OF_LABEL  # noqa: E402
from sequoia.core.statistics.stats import summarize  # noqa: E402
from sequoia.runners.hf.loading import resolve_dtype  # noqa: E402
from sequoia.runtime.engine import sync  # noqa: E402
from sequoia.tools.random_pair import PAIRS, make_pair  # noqa: E402

PROMPT = "Write a Python function that returns the n-th Fibonacci number."
SKIP_STEPS = 2   # the first steps of a decode carry the prompt's forward and warm caches
RATE = re.compile(r"\*\*([0-9.]+)\*\* tokens/s(?!tep)")   # the Live tab's summary line: its decode rate


def log(msg: str) -> None:
    print(msg, flush=True)


def step_ms(records: list[dict]) -> float:
    """Median step time (ms) the records carry, after the first SKIP_STEPS.  records: ``StepRecord.to_dict()``s"""
    timed = records[SKIP_STEPS:] or records
    return statistics.median(1e3 * (r["draft_s"] + r["verify_s"] + r["other_s"]) for r in timed)


def compare(api: dict, direct: dict, tolerance: float, stream: dict | None = None,
            direct_page: dict | None = None) -> dict:
    """API over direct for the records' step and the wall per step, and (``stream``) the decode rate the Live
    tab's stream shows (the engine's, from its step records) over the same page request's run directly;
    passed when every ratio is within ``tolerance``."""
    ratios = {k: api[k] / direct[k] for k in ("step_ms", "wall_ms_per_step") if direct[k] > 0}
    wanted = 2
    if stream is not None and direct_page is not None:
        wanted += 1
        if direct_page["ms_per_token"] > 0 and stream["ms_per_token"] > 0:
            ratios["live_ms_per_token"] = stream["ms_per_token"] / direct_page["ms_per_token"]
    return {"ratios": ratios, "tolerance": tolerance,
            "passed": len(ratios) == wanted and all(abs(r - 1) <= tolerance for r in ratios.values())}


# ------------------------------------------------------------------ the app
class InProcessApp:
    """The app built and served in this process; direct runs use its own context (the same models)."""

    def __init__(self, env: dict[str, str]) -> None:
        pair = app.load_from_env(env)
        self.demo = app.build_demo(pair, device=str(pair.device))
        self.url = serve_here(self.demo)
        self.ctx = self.demo.sequoia_context

    def close(self) -> None:
        self.demo.close()


class SubprocessApp:
    """``python app.py`` with the environment given; direct runs load the same pair here (not launched)."""

    def __init__(self, env: dict[str, str], log_path: Path, ready_s: float = 1800) -> None:
        port = free_port()
        self.url = f"http://127.0.0.1:{port}/"
        self._log = log_path.open("w")
        self.proc = subprocess.Popen([sys.executable, str(ROOT / "app.py")], cwd=ROOT, stdout=self._log,
                                     stderr=subprocess.STDOUT,
                                     env={**os.environ, **env, "GRADIO_SERVER_NAME": "127.0.0.1",
                                          "GRADIO_SERVER_PORT": str(port), "PYTHONUNBUFFERED": "1"})
        pair = app.load_from_env(env)
        self.ctx = app.build_demo(pair, device=str(pair.device)).sequoia_context
        self._wait(ready_s)

    def _wait(self, ready_s: float) -> None:
        deadline = time.monotonic() + ready_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"app.py exited with {self.proc.returncode}; see {self._log.name}")
            try:
                Client(self.url, verbose=False).predict("hi", "ar", 1, 1, 0.0, 1.0, 1, 0, True, "",
                                                         api_name="/decode")
                return
            except Exception:  # noqa: BLE001 - not up, or the models still loading: ask again
                time.sleep(2.0)
        raise RuntimeError(f"app.py did not answer /decode within {ready_s:.0f} s; see {self._log.name}")

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self._log.close()


# ------------------------------------------------------------------ one request, both ways
def through_api(client: Client, inputs: DecodeInputs) -> dict:
    t0 = time.perf_counter()
    _, records = client.predict(*inputs.values(), api_name="/decode")
    wall = time.perf_counter() - t0
    return {"steps": len(records), "step_ms": step_ms(records), "wall_ms_per_step": 1e3 * wall / len(records),
            "tokens": sum(len(r["new_tokens"]) for r in records)}


def through_stream(client: Client, page: DecodeInputs, steps: int) -> dict:
    """The Live tab's stream (``/decode_stream``, the page's own handler) until its last frame: the decode rate
    its summary line shows (from the step records, so the engine's own while the page renders) and the wall
    per step of the same request run directly (``steps``).  The target alone's rate on the prompt is measured
    by the first stream (the warm-up) and cached, so the timed streams end with their last decoding frame."""
    t0 = time.perf_counter()
    job = client.submit(*(getattr(page, f) for f in PAGE_FIELDS), api_name="/decode_stream")
    summaries = [out[3] for out in job if isinstance(out[3], str)]
    wall = time.perf_counter() - t0
    rate = RATE.search(summaries[-1]) if summaries else None
    return {"frames": len(summaries), "wall_ms_per_step": 1e3 * wall / max(steps, 1),
            "ms_per_token": 1e3 / float(rate.group(1)) if rate and float(rate.group(1)) > 0 else 0.0}


def page_inputs(inputs: DecodeInputs, assets_dir: Path) -> DecodeInputs:
    """``inputs`` as the Live tab sends them: the method's page label, the catalogue's vector for the
    temperature (the page's default for code)."""
    label = next(lb for lb, name in METHOD_OF_LABEL.items() if name == inputs.method)
    return DecodeInputs(inputs.prompt, label, inputs.budget, inputs.depth, inputs.temperature, inputs.top_p,
                        inputs.max_new_tokens, inputs.seed, inputs.chat,
                        default_acceptance_label("code", inputs.temperature, assets_dir))


def direct(ctx, inputs: DecodeInputs, page: bool = False) -> dict:
    """The same request straight through the engine, parsed and built as the ``/decode`` handler does
    (``page``: as the Live tab's handler does)."""
    req = validation.page_request(ctx, inputs) if page else validation.parse_inputs(ctx, inputs)
    job = validation.engine_inputs(ctx, req)
    device = ctx.pair().device
    sync(device)
    t0 = time.perf_counter()
    steps = list(live_tab.run_decode(ctx, job))
    sync(device)
    wall = time.perf_counter() - t0
    records = [r.to_dict() for r in steps]
    rate = summarize(steps).tokens_per_s    # as the Live tab's summary computes it
    return {"steps": len(records), "step_ms": step_ms(records), "wall_ms_per_step": 1e3 * wall / len(records),
            "tokens": sum(len(r["new_tokens"]) for r in records), "ms_per_token": 1e3 / rate if rate > 0 else 0.0}


def check_temperature(client, ctx, inputs: DecodeInputs, repeats: int, tolerance: float,
                      live: bool = True) -> dict:
    """``repeats`` interleaved rounds after a warm-up (which captures the graphs the request replays): the API
    and the direct run; ``live``: also the Live tab's stream and its request run directly."""
    page = page_inputs(inputs, ctx.assets_dir) if live else None
    through_api(client, inputs)
    direct(ctx, inputs)
    if live:
        through_stream(client, page, 1)
        direct(ctx, page, page=True)
    runs: dict[str, list[dict]] = {"api": [], "direct": [], "stream": [], "direct_page": []}
    for _ in range(repeats):             # interleaved: drift of the machine hits all alike
        runs["api"].append(through_api(client, inputs))
        runs["direct"].append(direct(ctx, inputs))
        if live:
            runs["direct_page"].append(direct(ctx, page, page=True))
            runs["stream"].append(through_stream(client, page, runs["direct_page"][-1]["steps"]))
    med = {name: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for name, rs in runs.items() if rs}
    return {**med, **compare(med["api"], med["direct"], tolerance, med.get("stream"), med.get("direct_page"))}


# ------------------------------------------------------------------ report
def markdown(result: dict) -> str:
    v, r = result["versions"], result["request"]
    lines = [f"# The app through its API on {v.get('gpu') or v['device']}", "",
             f"torch {v['torch']}, transformers {v['transformers']}, gradio {v['gradio']}, python {v['python']}; "
             f"models: {result['models']}; app {result['app']}; method {r['method']}, budget {r['budget']}, "
             f"depth {r['depth']}, {r['max_new_tokens']} new tokens, {result['repeats']} interleaved repeats "
             f"(medians); tolerance {result['tolerance']:.0%}.", "",
             "| T | steps | step ms: API / direct | ratio | wall ms per step: API / direct | ratio | "
             "Live tab ms per token: stream / direct | ratio | Live wall ms per step: stream / direct | verdict |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    nan = float("nan")
    for t, row in result.get("temperatures", {}).items():
        a, d, q = row["api"], row["direct"], row["ratios"]
        live = (f"{row['stream']['ms_per_token']:.2f} / {row['direct_page']['ms_per_token']:.2f} | "
                f"{q.get('live_ms_per_token', nan):.3f} | {row['stream']['wall_ms_per_step']:.2f} / "
                f"{row['direct_page']['wall_ms_per_step']:.2f}") if "stream" in row else "- | - | -"
        lines.append(f"| {t} | {a['steps']:.0f} | {a['step_ms']:.2f} / {d['step_ms']:.2f} | "
                     f"{q.get('step_ms', nan):.3f} | {a['wall_ms_per_step']:.2f} / "
                     f"{d['wall_ms_per_step']:.2f} | {q.get('wall_ms_per_step', nan):.3f} | {live} | "
                     f"{'within' if row['passed'] else 'BEYOND'} {row['tolerance']:.0%} |")
    if "error" in result:
        lines += ["", f"**Failed:** {result['error']}"]
    lines += ["", "Step ms: the median of the step records' draft + verify + other after the first "
              f"{SKIP_STEPS} steps. Wall per step: the whole call (client round trip through the queue and HTTP, "
              "or the engine call in-process) over its steps. Live tab: `/decode_stream`, the page's own handler "
              "(the engine ahead in a worker thread, paced frames): the decode rate its summary shows (step "
              "records after the first) against the same page request run directly; its wall per step (until the "
              "last frame, figures and transport included) is shown, not judged."]
    return "\n".join(lines) + "\n"


def versions(device: torch.device) -> dict:
    import gradio
    import transformers

    out = {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
           "gradio": gradio.__version__, "device": str(device)}
    if device.type == "cuda":
        out["gpu"] = torch.cuda.get_device_name(device)
    else:
        out["cpu"] = platform.processor() or platform.machine()
    return out


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--make", choices=list(PAIRS), help="write a random-weight pair of these shapes first")
    ap.add_argument("--models-dir", help="where --make writes it (default: a temporary folder, removed at the end; "
                                         "never under --out)")
    ap.add_argument("--draft", help="a model folder (with --target; instead of --make)")
    ap.add_argument("--target")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--app", choices=("inprocess", "subprocess"), default="inprocess")
    ap.add_argument("--method", default="sequoia")
    ap.add_argument("--budget", type=int, default=32)
    ap.add_argument("--depth", type=int, default=8)
    ap.add_argument("--temperatures", default="0,1")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tolerance", type=float, default=0.10)
    ap.add_argument("--no-live", action="store_true", help="leave out the Live tab's stream")
    ap.add_argument("--compile", choices=("auto", "0", "1"), default="auto",
                    help="SEQUOIA_COMPILE for the app (0: no compile of the draft's forward: no minutes of it)")
    args = ap.parse_args(argv)
    if (args.make is None) == (args.draft is None or args.target is None):
        ap.error("give --make, or both --draft and --target")
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: CUDA is not available here (use --device cpu)")
    resolve_dtype(args.dtype, device)
    out = Path(args.out)
    if args.models_dir and out.resolve() in (Path(args.models_dir).resolve(), *Path(args.models_dir).resolve().parents):
        ap.error("--models-dir must be outside --out (everything under --out travels back from a GPU machine)")
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="sequoia-random-pair-") as tmp:
        if args.make:
            models = Path(args.models_dir or tmp)
            log(f"writing random {args.make} models into {models}")
            make_pair(models, args.make, device=device, log=log)
            args.draft, args.target = str(models / "draft"), str(models / "target")
        return run_check(args, out, device)


def run_check(args, out: Path, device: torch.device) -> int:
    """The check itself, once the model folders exist."""
    env = {"SEQUOIA_DEVICE": args.device, "SEQUOIA_DRAFT": args.draft, "SEQUOIA_TARGET": args.target,
           "SEQUOIA_DTYPE": args.dtype, "SEQUOIA_DRAFT_QUANT": "none", "SEQUOIA_COMPILE": args.compile}
    temps = [float(t) for t in args.temperatures.split(",") if t.strip()]
    result = {"versions": versions(device), "app": args.app, "models": f"{args.draft} -> {args.target}",
              "repeats": args.repeats, "tolerance": args.tolerance, "temperatures": {},
              "request": {"method": args.method, "budget": args.budget, "depth": args.depth,
                          "max_new_tokens": args.new_tokens}}

    def save() -> None:
        write_json(out / "app_api_check.json", result)
        (out / "app_api_check.md").write_text(markdown(result))

    t0 = time.perf_counter()
    served = InProcessApp(env) if args.app == "inprocess" else SubprocessApp(env, out / "app.log")
    log(f"app up at {served.url} after {time.perf_counter() - t0:.1f} s")
    try:
        client = Client(served.url, verbose=False)
        for t in temps:
            inputs = DecodeInputs(PROMPT, args.method, args.budget, args.depth, t, 1.0, args.new_tokens, 0)
            row = check_temperature(client, served.ctx, inputs, args.repeats, args.tolerance, not args.no_live)
            result["temperatures"][str(t)] = row
            log(f"T={t}: step {row['api']['step_ms']:.2f} / {row['direct']['step_ms']:.2f} ms, wall per step "
                f"{row['api']['wall_ms_per_step']:.2f} / {row['direct']['wall_ms_per_step']:.2f} ms (API / direct); "
                f"ratios {', '.join(f'{k} {v:.3f}' for k, v in row['ratios'].items())}")
            save()
    except Exception as exc:  # noqa: BLE001 - the report says what failed
        result["error"] = f"{type(exc).__name__}: {str(exc)[:500]}"
    finally:
        served.close()
    result["passed"] = "error" not in result and all(r["passed"] for r in result["temperatures"].values())
    save()
    log(f"{'passed' if result['passed'] else 'FAILED'}; wrote {out / 'app_api_check.md'}")
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
