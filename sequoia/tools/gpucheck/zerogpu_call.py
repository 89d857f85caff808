"""The ZeroGPU call check: ZeroGPU's shape of work on a real card, timed.

On ZeroGPU the models are loaded on the host by the server, and each ``@spaces.GPU``
call runs in a process made for it, where the GPU first exists: the weights go onto
the card, the call's graphs are captured (:mod:`sequoia.runners.hf.graphs.call_graphs`),
then it decodes.  This check does the same with random weights at real shapes
(costs do not depend on the values): the pair built on the host in this process,
each call in a process forked for it (CUDA first initialised in the child), the
guided example (a 12-token depth-5 tree at T=0.6, 48 tokens) and the page's default
decode (the optimizer's tree for the shipped code vector, T=0, 128 tokens), each beside
the target alone, in one call on graphs and one call eager.  Tokens per step of
random weights mean nothing, so each tree row is also projected with the shipped
acceptance vector: its expected tokens a step over its measured step time.

``--device cpu`` runs the same form with tiny models (replays emulated off CUDA).
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import pickle
import statistics
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass

import torch
from transformers import Qwen2ForCausalLM

from ...core.config import GenerationConfig, SamplingConfig
from ...core.profiles.profile import HardwareProfile
from ...core.trees.dp import optimal_tree
from ...core.trees.optimizer import choose_tree, predict
from ...core.trees.tree import Tree
from ...runners.hf.graphs.call_graphs import CallGraphs
from ...runners.hf.loading import wrap_model
from ...runtime.drafter import StaticTreeProposer
from ...runtime.call_engine import CallEngine
from ...runtime.forking import start_from_a_fresh_thread
from ...runtime.methods import make_method
from .models import Shape, pair_of
from .offload import RandomFill

#: The page's two decodes (components/live/live_tab.py: GUIDED, DEFAULT_NEW_TOKENS).
GUIDED_TOKENS, GUIDED_BUDGET, GUIDED_DEPTH, GUIDED_T = 48, 12, 5, 0.6
DEFAULT_TOKENS = 128
PROMPT_TOKENS = 40


@dataclass(frozen=True)
class Row:
    """One decode of a call: which example, which tree (None: the target alone), at which temperature."""

    example: str
    method: str
    tree: Tree | None
    temperature: float
    new_tokens: int
    expected_tokens: float = 1.0      # a step, from the shipped vector (the target alone: 1)


def host_model(shape: Shape, dtype: torch.dtype, seed: int) -> Qwen2ForCausalLM:
    """Random weights at ``shape`` in host memory, as a server holds them before any call (built on the meta
    device, then filled from a random pool: seconds for a 7B model, no initialiser's minutes)."""
    with torch.device("meta"):
        model = Qwen2ForCausalLM(shape.config()).to(dtype)
    model = model.to_empty(device="cpu").eval().requires_grad_(False)
    fill = RandomFill(dtype, seed=seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            fill(name, p.data)
    rotary = model.model.rotary_emb   # its buffers are not parameters: to_empty left them unset
    model.model.rotary_emb = type(rotary)(config=model.config)   # float32 frequencies, as from_pretrained keeps them
    return model


def rows(profile: HardwareProfile, code_t0, code_t06) -> list[Row]:
    """The call's decodes: the guided example's tree and the default decode's chosen tree, each with the
    target alone at the same settings."""
    guided = optimal_tree(code_t06, GUIDED_BUDGET, GUIDED_DEPTH).tree(GUIDED_BUDGET, GUIDED_DEPTH)
    guided_e = predict(guided, code_t06, profile).expected_tokens
    choice = choose_tree(code_t0, profile)
    auto = choice.tree if choice.budget else None
    return [Row("guided", f"sequoia {GUIDED_BUDGET}/{GUIDED_DEPTH}", guided, GUIDED_T, GUIDED_TOKENS, guided_e),
            Row("guided", "target alone", None, GUIDED_T, GUIDED_TOKENS),
            Row("default", f"sequoia (auto): {choice.budget}/{choice.depth}" if auto else "sequoia (auto): none",
                auto, 0.0, DEFAULT_TOKENS, choice.expected_tokens if auto else 1.0),
            Row("default", "target alone", None, 0.0, DEFAULT_TOKENS)]


def one_call(draft: Qwen2ForCausalLM, target: Qwen2ForCausalLM, device: str, graphs: bool,
             decodes: list[Row], vocab: int) -> dict:
    """What one call does, in the call's process: weights onto the card, the pair (graph runners over the same
    models when ``graphs``), every decode of ``decodes``; times of each part."""
    t0 = time.perf_counter()
    dev = torch.device(device)
    draft, target = draft.to(dev), target.to(dev)
    _sync(dev)
    to_card = time.perf_counter() - t0
    eager = pair_of(wrap_model(draft, "draft", plain=True, graphs=False),
                    wrap_model(target, "target", plain=True, graphs=False), "call")
    call = CallGraphs(eager, capture=graphs, reason="eager: the row beside the graphs'")
    pair = call.pair
    prompt = torch.randint(vocab, (PROMPT_TOKENS,), generator=torch.Generator().manual_seed(3)).tolist()
    out = []
    engine = CallEngine(pair, call)   # as the app's calls: a tree's shapes captured before its generation
    for row in decodes:
        before = call.report()
        timed = _decode(engine, row, prompt)
        after = call.report()
        timed.update(row=row.example, method=row.method, temperature=row.temperature,
                     captures=after.captures - before.captures,
                     capture_s=after.capture_s - before.capture_s,
                     since_call_start_s=time.perf_counter() - t0)
        if row.tree is not None:
            timed["projected_tokens_per_step"] = row.expected_tokens
            timed["projected_tokens_per_s"] = 1e3 * row.expected_tokens / timed["step_ms"]
        out.append(timed)
    report = call.report()
    captures = [{"runner": r.name, "bucket": k[0], "window": k[1], "seconds": s, "ok": ok}
                for r in call.runners() for k, s, ok in r.captured]
    call.close()
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    return {"device_name": name, "mode": report.mode, "line": report.line(), "weights_to_card_s": to_card, "captures": captures,
            "capture_s": report.capture_s, "rows": out, "call_s": time.perf_counter() - t0}


def _decode(engine: CallEngine, row: Row, prompt: list[int]) -> dict:
    """One row's decode, timed from the first step (the captures its tree planned happen before: they are the
    row's ``capture_s``)."""
    pair = engine.pair
    proposer = make_method("ar") if row.tree is None else StaticTreeProposer(row.tree, name="sequoia")
    config = GenerationConfig(max_new_tokens=row.new_tokens, stop_at_eos=False,
                              sampling=SamplingConfig(temperature=row.temperature))
    steps = engine.generate(prompt, proposer, config)   # captures the row's planned shapes now
    _sync(pair.device)
    t0 = time.perf_counter()
    walls, first, ids, t = [], None, [], t0
    for record in steps:
        _sync(pair.device)
        now = time.perf_counter()
        walls.append((now - t) * 1e3)
        first = now - t0 if first is None else first
        ids += record.new_tokens
        t = now
    total = time.perf_counter() - t0
    steady = walls[2:] or walls
    digest = hashlib.sha256(str(ids).encode()).hexdigest()[:16]   # T=0: the same in a graphs and an eager call
    return {"tokens": len(ids), "tokens_sha": digest, "steps": len(walls), "first_token_s": first, "seconds": total,
            "tokens_per_s": len(ids) / total, "step_ms": statistics.median(steady),
            "first_steps_ms": walls[:2]}


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def forked(fn: Callable[..., dict], *args, timeout: float = 500.0) -> dict:
    """``fn(*args)`` in a process forked for it (as a ZeroGPU call runs); its result, or {"error": ...}; the
    fork's own seconds beside it."""
    ctx = multiprocessing.get_context("fork")
    receive, send = ctx.Pipe(duplex=False)
    t0 = time.perf_counter()
    child = ctx.Process(target=_child, args=(fn, args, send), daemon=True)
    start_from_a_fresh_thread(child)   # the models were built on this thread, with its OpenMP pool
    send.close()
    try:
        if not receive.poll(timeout):
            return {"error": f"the call ran past {timeout:.0f} s", "forked_call_s": time.perf_counter() - t0}
        out = pickle.loads(receive.recv_bytes())
    except EOFError:
        out = {"error": f"the call's process ended with exit code {child.exitcode}"}
    finally:
        if child.is_alive():
            child.kill()
        child.join(10)
    out["forked_call_s"] = time.perf_counter() - t0
    return out


def _child(fn, args, send) -> None:
    try:
        out = fn(*args)
    except BaseException as exc:   # noqa: BLE001 - every failure goes back as the call's row
        out = {"error": f"{type(exc).__name__}: {str(exc)[:300]}", "traceback": traceback.format_exc()[-2000:]}
    send.send_bytes(pickle.dumps(out))
    send.close()
    os._exit(0)


def summarise(calls: dict[str, dict]) -> dict:
    """Per example: each mode's rows side by side, and the tree's ratio to the target alone in the same call
    (measured, and projected with the shipped vector)."""
    out = {}
    for mode, call in calls.items():
        if "rows" not in call:
            continue
        for example in ("guided", "default"):
            tree, alone = (next((r for r in call["rows"] if r["row"] == example and (r["method"] == "target alone")
                                 == want), None) for want in (False, True))
            if tree is None or alone is None:
                continue
            entry = out.setdefault(example, {})
            entry[mode] = {"tree_tokens_per_s": tree["tokens_per_s"], "alone_tokens_per_s": alone["tokens_per_s"],
                           "measured_ratio": tree["tokens_per_s"] / alone["tokens_per_s"],
                           "tree_step_ms": tree["step_ms"], "alone_step_ms": alone["step_ms"]}
            if "projected_tokens_per_s" in tree:
                entry[mode]["projected_ratio"] = tree["projected_tokens_per_s"] * alone["step_ms"] / 1e3
    return out
