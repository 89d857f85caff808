"""The embedded target alone, timed on each installed runtime in seconds, before the pair converts or loads.

Why: a CPU kind with no profile (every machine the project has not measured) used to be served by a rule of
thumb (torch where the CPU has bf16 matrix kernels), and on a 2-vCPU Zen 4 that rule served torch's target at
8.1-8.8 tokens/s against llama.cpp's 22-24, after a 99 s conversion against a 21 s load.  Timing each
runtime's one-token decode of the target here costs a few seconds and settles it by measurement.

- llama.cpp: the target GGUF as shipped (it loads without conversion; the kept file serves the pair after).
- Hugging Face (torch): a bf16 model of the target's shape (read from the GGUF's metadata) with placeholder
  weights, through the model's own forward and cache.  The conversion that would give it the real weights
  takes a minute or more, and a one-token decode's time does not depend on the weights' values (a bf16
  product reads the same bytes and runs the same kernels whatever they hold).

Each probe decodes a short prompt, then ``steps`` single tokens after ``warmup`` ones, on one thread timed by
that thread's CPU time, and reports the median rate with the slowest and fastest step.  One thread and CPU time
because the machine may be busy (a shared 2-vCPU VM, other visitors): there wall time swung 2-7x from step to
step while CPU time held within 10% (2-vCPU Intel Xeon with AMX, 3 other processes busy), and llama.cpp's
worker threads spin while they wait for a core.  The rates are per thread, about half of what 2 threads serve;
their ratio is what ranks the runtimes.  :func:`probe_runtimes` keeps the result in the cache directory
(``runtime-probe.json``), keyed by what the rates depend on (CPU flags, threads, torch and llama.cpp
versions), so a later start reads it instead of timing again.
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

import torch

from ...core.profiles.runtimes import TargetProbe
from ...runners.embedded import EMBEDDED, TARGET, ensure_gguf

#: Tokens of the timed prompt, one-token steps not timed, timed steps.
PROMPT_TOKENS, WARMUP, STEPS = 32, 1, 5
CACHE_NAME = "runtime-probe.json"
#: The runtimes a probe exists for (``mixed`` runs torch's target, so ``hf``'s probe stands for it).
PROBED = ("hf", "llamacpp")

Probe = Callable[[Path], TargetProbe]


def time_steps(step: Callable[[int], int], first: int, warmup: int = WARMUP, steps: int = STEPS,
               clock: Callable[[], float] = time.thread_time) -> list[float]:
    """Seconds of each timed call of ``step`` (token in, next token out) by ``clock``, after ``warmup`` untimed
    ones."""
    token, times = first, []
    for i in range(warmup + steps):
        t0 = clock()
        token = step(token)
        if i >= warmup:
            times.append(clock() - t0)
    return times


def summarize(backend: str, times: list[float], seconds: float, how: str) -> TargetProbe:
    rates = sorted(1.0 / t for t in times)
    return TargetProbe(backend, statistics.median(rates), rates[0], rates[-1], len(times), seconds, how)


def _prompt(vocab: int) -> list[int]:
    return [(1000 + 7919 * i) % vocab for i in range(PROMPT_TOKENS)]


# ------------------------------------------------------------------------------------------- llama.cpp
def probe_llamacpp(cache_dir: Path) -> TargetProbe:
    """The shipped Q4_K_M target on llama.cpp, one token at a time."""
    # deferred: llama-cpp-python is optional (a probe without it fails and says so)
    from ...runners.llamacpp.load import load_embedded_runner
    from ...runners.llamacpp.runner import LlamaCppOptions  # deferred: as above

    ensure_gguf(TARGET, cache_dir)   # assembled and hashed once; not timed as part of the probe
    t0 = time.perf_counter()
    # one thread: it computes in this one (llama.cpp runs a single-thread graph in the caller), so its CPU time
    runner = load_embedded_runner("target", cache_dir, LlamaCppOptions(n_threads=1, n_ctx=256))
    try:
        session = runner.session()
        first = int(session.forward(_prompt(runner.vocab_size), keep=1)[0].argmax())
        times = time_steps(lambda tok: int(session.forward([tok], keep=1)[0].argmax()), first)
    finally:
        runner.close()
        gc.collect()
    return summarize("llamacpp", times, time.perf_counter() - t0, "the Q4_K_M target as shipped, one thread")


# ------------------------------------------------------------------------------------------- torch
def target_config(gguf: Path):
    """A transformers config of the GGUF target's shape (its architecture's own config class)."""
    from transformers import AutoConfig  # deferred: transformers only where the torch probe runs
    from transformers.integrations.gguf import read_gguf_metadata  # deferred: as above

    meta = read_gguf_metadata(str(gguf))[0]
    arch = meta["general.architecture"]
    def field(name: str):
        return meta[f"{arch}.{name}"]
    tokens = meta["tokenizer.ggml.tokens"]   # the fast reader gives the count of a long array
    vocab = meta.get(f"{arch}.vocab_size") or (tokens if isinstance(tokens, int) else len(tokens))
    return AutoConfig.for_model(
        arch, hidden_size=int(field("embedding_length")), num_hidden_layers=int(field("block_count")),
        intermediate_size=int(field("feed_forward_length")), num_attention_heads=int(field("attention.head_count")),
        num_key_value_heads=int(field("attention.head_count_kv")), vocab_size=int(vocab),
        max_position_embeddings=int(field("context_length")), tie_word_embeddings=True)


def placeholder_model(config, dtype: torch.dtype = torch.bfloat16) -> torch.nn.Module:
    """``config``'s causal LM in ``dtype`` with small pseudo-random weights, built without the slow init."""
    from transformers import AutoModelForCausalLM  # deferred: transformers only where the torch probe runs

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.to_empty(device="cpu")
    with torch.no_grad():
        # Every byte written: an untouched page reads as the kernel's one zero page, which would time a cache
        # hit instead of a read of the weights.  A constant is enough (products do not look at the values).
        for p in model.parameters():
            p.fill_(0.02)
    model.model.rotary_emb.__init__(config)   # its frequencies are computed, not loaded
    return model.eval()


def probe_torch(cache_dir: Path) -> TargetProbe:
    """A bf16 model of the target's shape on torch, one token at a time through its own forward and cache."""
    from transformers import DynamicCache  # deferred: transformers only where the torch probe runs

    gguf = ensure_gguf(TARGET, cache_dir)
    t0 = time.perf_counter()
    config = target_config(gguf)
    model = placeholder_model(config)
    try:
        with _one_thread(), torch.inference_mode():
            cache = DynamicCache()
            ids = torch.tensor([_prompt(config.vocab_size)])
            out = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
            def step(tok: int) -> int:
                logits = model(input_ids=torch.tensor([[tok]]), past_key_values=cache, use_cache=True).logits
                return int(logits[0, -1].argmax())
            times = time_steps(step, int(out.logits[0, -1].argmax()))
    finally:
        del model
        gc.collect()
    return summarize("hf", times, time.perf_counter() - t0,
                     "a bf16 model of the target's shape, placeholder weights, the model's own forward, one thread")


#: A stream that only reads may go faster than a copy's reads and writes together: the bound allows this much
#: more (torch's target measured 2.6-3.0 tokens/s on one thread against 4.0-4.1 unmargined, Xeon with AMX).
READ_MARGIN = 1.5


def weight_bytes(config, bytes_per_weight: int = 2) -> int:
    """Bytes of weights one token's forward reads: every layer's projections and the (tied) output matrix."""
    h, i, layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    kv = h * config.num_key_value_heads // config.num_attention_heads
    return bytes_per_weight * (config.vocab_size * h + layers * (2 * h * h + 2 * h * kv + 3 * h * i))


def copy_rate(mb: int = 512, repeats: int = 3) -> float:
    """Bytes a second one thread moves here (read and written), the best of ``repeats`` copies of ``mb`` MB
    (beyond the last-level cache), by this thread's CPU time."""
    src = torch.ones(mb << 19, dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    dst.fill_(0)   # touch every page first: a first write pays its page faults, not the copy
    best = float("inf")
    for _ in range(repeats):
        t0 = time.thread_time()
        dst.copy_(src)
        best = min(best, time.thread_time() - t0)
    return 2 * src.numel() * src.element_size() / max(best, 1e-9)


def torch_ceiling(cache_dir: Path) -> TargetProbe:
    """The most tokens/s torch's bf16 target could decode here on one thread: its weights' bytes a token at the
    rate one thread copies memory (a bound, not a measurement of the model: milliseconds, not seconds)."""
    t0 = time.perf_counter()
    weights = weight_bytes(target_config(ensure_gguf(TARGET, cache_dir)))
    with _one_thread():
        rate = copy_rate()
    ceiling = READ_MARGIN * rate / weights
    how = (f"at most: {weights / 1e9:.1f} GB of bf16 weights a token at {READ_MARGIN}x the {rate / 1e9:.0f} GB/s "
           f"one thread copies here")
    return TargetProbe("hf", ceiling, ceiling, ceiling, 0, time.perf_counter() - t0, how)


@contextmanager
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)   # at start, before anything else runs torch; restored after
    try:
        yield
    finally:
        torch.set_num_threads(threads)


PROBES: dict[str, Probe] = {"llamacpp": probe_llamacpp, "hf": probe_torch}
#: backend -> a bound on its target alone's rate, found at start instead of its probe (torch's takes seconds to
#: build a 3 GB model and time it): the probe runs later, in the background, only where the bound could win.
CEILINGS: dict[str, Probe] = {"hf": torch_ceiling}


# ------------------------------------------------------------------------------------------- both, cached
def probe_key(cpu_features: Iterable[str]) -> str:
    """What the rates depend on besides the model: CPU flags, threads, the runtimes' versions."""
    import importlib.metadata as md  # deferred: read only when the probe's cache key is built

    def version(dist: str) -> str:
        try:
            return md.version(dist)
        except md.PackageNotFoundError:
            return "none"
    return (f"cpu={','.join(sorted(cpu_features))};cores={os.cpu_count()};torch_threads={torch.get_num_threads()};"
            f"torch={torch.__version__};llama_cpp={version('llama_cpp_python')}")


def probe_runtimes(backends: Iterable[str], cache_dir: str | Path, key: str,
                   probes: Mapping[str, Probe] = PROBES, log: Callable[[str], None] | None = None,
                   ceilings: Mapping[str, Probe] = CEILINGS,
                   meanwhile: Callable[[Path], None] | None = None,
                   time_now: bool = True) -> dict[str, TargetProbe]:
    """backend -> its target alone timed here, for each of ``backends`` with a probe: read from
    ``cache_dir/runtime-probe.json`` when it holds ``key``, else timed now (and written there).  A probe that
    fails is left out (and logged): the choice then falls back to its rule.  ``meanwhile(cache_dir)`` runs
    in a thread of its own while they are timed (e.g. :func:`assemble_draft`).  ``time_now=False``: only what
    the cache holds (the app's start: it times them in the background instead, see below).

    A runtime with a bound (``ceilings``) is not timed where its bound is under a rate timed already (it
    cannot win); where it is not, the bound is kept and the runtime is timed later, in the background
    (:mod:`sequoia.runtime.measuring.background_probe`).  Why: torch's probe builds a 3 GB model, 6-11 s of CPU
    on the 2-vCPU Xeon with AMX, and torch would serve only after its minute-long conversion anyway."""
    cache_dir = Path(cache_dir)
    path = cache_dir / CACHE_NAME
    wanted = [b for b in backends if b in probes]
    cached = _read(path, key)
    if all(b in cached for b in wanted) or not time_now:
        return {b: cached[b] for b in wanted if b in cached}
    if meanwhile is not None:   # work the start needs whichever runtime wins, in a thread of its own
        threading.Thread(target=meanwhile, args=(cache_dir,), name="sequoia-meanwhile", daemon=True).start()
    out: dict[str, TargetProbe] = {}
    for backend in sorted(wanted, key=list(probes).index):   # the quick probes first, then the bounded ones
        try:
            if backend in ceilings and out:
                bound = out[backend] = ceilings[backend](cache_dir)
                if log:
                    rates = [p.tokens_per_s for p in out.values() if not p.bound]
                    cannot = bound.tokens_per_s < max(rates, default=0.0)
                    later = "" if cannot else "; timed in the background once the models are ready"
                    log(f"target alone on {backend}: {bound.text}, found in {bound.seconds:.1f} s{later}")
                continue
            out[backend] = probes[backend](cache_dir)
        except Exception as exc:   # noqa: BLE001 - a probe is advice; the rule still chooses without it
            if log:
                log(f"timing the target alone on {backend} failed: {type(exc).__name__}: {exc}")
            continue
        if log:
            log(f"target alone on {backend}: {out[backend].text}, timed in {out[backend].seconds:.1f} s")
    if out:
        _write(path, key, out)
    return out


def assemble_draft(cache_dir: Path) -> None:
    """The draft's GGUF assembled and kept (both runtimes load or convert it), for ``probe_runtimes``'
    ``meanwhile``: while the probes time one thread, a busy machine's cores serve two threads of this start
    rather than one (its time is not the probe's: each probe reads its own thread's CPU time).  A failure
    is left to the loader, which assembles it again and says what failed."""
    try:
        ensure_gguf(EMBEDDED["draft"], cache_dir)
    except Exception:   # noqa: BLE001 - see above
        pass


def _read(path: Path, key: str) -> dict[str, TargetProbe]:
    try:
        data = json.loads(path.read_text())
        if data.get("key") != key:
            return {}
        return {b: TargetProbe(**{**v, "cached": True}) for b, v in data["probes"].items()}
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return {}


def _write(path: Path, key: str, probes: Mapping[str, TargetProbe]) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps({"key": key, "probes": {b: asdict(p) for b, p in probes.items()}}, indent=1))
        os.replace(tmp, path)
    except OSError:
        pass   # a read-only cache: the next start times again


def main(argv: list[str]) -> None:
    """``python -m sequoia.runtime.measuring.target_probe BACKEND CACHE_DIR``: time one runtime's target alone
    and print it as one JSON line (the background probe runs it in a child process of its own: its 3 GB model
    and its one torch thread never touch the server's)."""
    backend, cache_dir = argv
    print(json.dumps(asdict(PROBES[backend](Path(cache_dir)))), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
