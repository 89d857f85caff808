"""Cost of one llama.cpp batch by new tokens and cached context, and the runner's decode speed against a bare loop.

    .venv/bin/python scripts/measure/llamacpp_costs.py [--threads N] [--target PATH --draft PATH]
    .venv/bin/python scripts/measure/llamacpp_costs.py --pair-load     # load time and memory of the embedded pair

For each model (the embedded Q4_K_M pair by default) and each cached context C,
times one ``forward`` of n new tokens laid out as a binary tree hanging off the
last cached slot (all n logits rows returned, as verification needs), median of
``--reps`` runs, the tree cropped away between runs.  Then greedy-decodes 64
tokens one at a time through the runner and through llama-cpp-python's own
high-level ``Llama.eval`` loop, to show what the runner's bookkeeping costs.
Other processes on the machine skew the figures: the load average is printed
before and after.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
from llama_cpp import Llama, llama_get_logits_ith

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a plain script from anywhere

from sequoia.runners.embedded import EMBEDDED, default_cache_dir, ensure_gguf  # noqa: E402
from sequoia.runners.llamacpp import LlamaCppOptions, load_embedded_llamacpp, load_llamacpp_runner  # noqa: E402


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "n/a"


def rss_gb() -> float:
    """Resident memory of this process (GB), from /proc (Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1e6
    return float("nan")


def pair_ready(cache: Path, options: LlamaCppOptions, gen: torch.Generator) -> None:
    """Time to load both embedded runners from a warm cache (+ a first 128-token prefill each) and their RSS."""
    base, t0 = rss_gb(), time.perf_counter()
    runners = load_embedded_llamacpp(cache, options)
    loaded = time.perf_counter() - t0
    for r in runners.values():  # the first forward touches every mmap'd weight page
        r.session().forward(torch.randint(0, 1000, (128,), generator=gen).tolist(), keep=1)
    ready = time.perf_counter() - t0
    print(f"embedded pair: loaded in {loaded:.1f} s, ready after a 128-token prefill each in {ready:.1f} s; "
          f"RSS {rss_gb():.2f} GB ({rss_gb() - base:.2f} GB above the {base:.2f} GB before loading)")
    for r in runners.values():
        r.close()


def batch_costs(runner, contexts: list[int], rows: list[int], reps: int, gen: torch.Generator) -> dict:
    """{(C, n): median ms} of one tree forward of n tokens after C cached ones."""
    out = {}
    for c in contexts:
        s = runner.session()
        s.forward(torch.randint(0, 1000, (c,), generator=gen).tolist(), keep=1)
        for n in rows:
            toks = torch.randint(0, 1000, (n,), generator=gen).tolist()
            parents = [c - 1] + [c + (i - 1) // 2 for i in range(1, n)]  # a binary tree off the last slot
            times = []
            for _ in range(reps + 1):  # the first run warms up
                t0 = time.perf_counter()
                s.forward(toks, parents)
                times.append((time.perf_counter() - t0) * 1000)
                s.crop(c)
            out[c, n] = statistics.median(times[1:])
    return out


def runner_decode(runner, prompt: list[int], n: int) -> tuple[float, list[int]]:
    """tokens/s of greedy decoding one token per forward, and the tokens."""
    s = runner.session()
    tok = int(s.forward(prompt, keep=1)[0].argmax())
    out, t0 = [tok], time.perf_counter()
    for _ in range(n - 1):
        tok = int(s.forward([tok], keep=1)[0].argmax())
        out.append(tok)
    return (n - 1) / (time.perf_counter() - t0), out


def bare_decode(path: Path, threads: int, n_ctx: int, prompt: list[int], n: int) -> tuple[float, list[int]]:
    """The same greedy loop on llama-cpp-python's high-level Llama (its own batch and logits copy)."""
    llm = Llama(model_path=str(path), n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads,
                n_batch=512, verbose=False)
    # Llama.eval keeps no logits unless logits_all (a copy of every row): read the last row from the context.
    def last_argmax() -> int:
        return int(np.argmax(np.ctypeslib.as_array(llama_get_logits_ith(llm.ctx, -1), shape=(llm.n_vocab(),))))

    try:
        llm.eval(prompt)
        tok = last_argmax()
        out, t0 = [tok], time.perf_counter()
        for _ in range(n - 1):
            llm.eval([tok])
            tok = last_argmax()
            out.append(tok)
        return (n - 1) / (time.perf_counter() - t0), out
    finally:
        llm.close()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", type=Path, help="target GGUF (default: the embedded Qwen2.5-Coder-1.5B Q4_K_M)")
    ap.add_argument("--draft", type=Path, help="draft GGUF (default: the embedded Qwen2.5-Coder-0.5B Q4_K_M)")
    ap.add_argument("--cache", type=Path, help="cache of the embedded GGUFs (default: $SEQUOIA_CACHE or ~/.cache)")
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="llama.cpp threads (default: all cores)")
    ap.add_argument("--rows", default="1,2,4,8,16,32,64", help="new tokens per batch")
    ap.add_argument("--contexts", default="128,512,1024", help="cached tokens before the batch")
    ap.add_argument("--reps", type=int, default=7, help="timed runs per cell (median)")
    ap.add_argument("--decode", type=int, default=64, help="tokens of the greedy decode comparison (0: skip)")
    ap.add_argument("--models", default="target,draft", help="which of target,draft to measure")
    ap.add_argument("--repack", action=argparse.BooleanOptionalAction, default=None,
                    help="re-lay quantized weights for SIMD gemm (more RAM; default: the runner's, on with AVX-512)")
    ap.add_argument("--flash-attn", action="store_true", help="llama.cpp's flash attention (off in the runner)")
    ap.add_argument("--pair-load", action="store_true",
                    help="only time loading the embedded pair (warm cache) and report its resident memory")
    args = ap.parse_args(argv)
    rows = [int(x) for x in args.rows.split(",")]
    contexts = [int(x) for x in args.contexts.split(",")]
    paths = {"target": args.target, "draft": args.draft}
    options = LlamaCppOptions(n_threads=args.threads, n_ctx=max(contexts) + max(rows) + 256, repack=args.repack,
                              flash_attn=args.flash_attn)
    gen = torch.Generator().manual_seed(0)
    print(f"threads {options.threads}, repack {options.repacks}, flash_attn {options.flash_attn}, "
          f"load average before: {loadavg()}")
    if args.pair_load:
        pair_ready(args.cache or default_cache_dir(),
                   LlamaCppOptions(n_threads=args.threads, repack=args.repack, flash_attn=args.flash_attn), gen)
        return 0
    for role in args.models.split(","):
        path = paths[role] or ensure_gguf(EMBEDDED[role], args.cache or default_cache_dir())
        t0 = time.perf_counter()
        runner = load_llamacpp_runner(path, options)
        print(f"\n{role}: {runner.name}, loaded in {time.perf_counter() - t0:.1f} s")
        costs = batch_costs(runner, contexts, rows, args.reps, gen)
        print("| cached C | " + " | ".join(f"n={n}" for n in rows) + " |  (ms, median of "
              f"{args.reps})\n|---|" + "---|" * len(rows))
        for c in contexts:
            print(f"| {c} | " + " | ".join(f"{costs[c, n]:.1f}" for n in rows) + " |", flush=True)
        if args.decode:
            prompt = torch.randint(0, 1000, (128,), generator=gen).tolist()
            ours, a = runner_decode(runner, prompt, args.decode)
            runner.close()
            bare, b = bare_decode(path, options.threads, options.n_ctx, prompt, args.decode)
            same = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
            print(f"greedy decode of {args.decode} tokens after 128: runner {ours:.1f} tok/s, "
                  f"bare Llama.eval loop {bare:.1f} tok/s, "
                  + ("same tokens" if same is None else f"tokens differ from #{same} on (Llama repacks weights: "
                     "another rounding; run with --repack to compare like with like)"))
        runner.close()
    print(f"\nload average after: {loadavg()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
