"""The GPU check's part (a): is decoding lossless on this device, on the graph runner and the eager one?

Tiny fp32 models (exact enough that greedy equality is a fair test):
greedy output of every method against the target's own greedy ``generate``;
a tree's logits against each node's path forwarded as a chain; a graph replay
against the same forward run eagerly; the chi-square of a sampled two-token
joint (three rules) and of a broken verifier, which must fail.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from ...core.config import GenerationConfig, SamplingConfig
from ...runtime.checks.joint_check import broken_residual, empirical_joint, exact_joint, joint_pvalue
from ...runtime.engine import SpeculativeEngine
from ...runtime.methods import make_method
from .models import pair_of, perturbed, runner, tiny_model

METHODS = [
    ("ar", {}), ("chain", {"budget": 4}), ("specinfer", {"width": 3, "depth": 3}),
    ("kary", {"width": 2, "depth": 3}), ("sequoia", {"budget": 16, "depth": 5}),
    ("sequoia", {"budget": 40, "depth": 8}), ("sequoia-dynamic", {}), ("ngram", {}), ("sequoia-ngram", {}),
]
PROMPTS = ([1, 5, 9, 3, 7], [2, 4, 6, 8, 10, 12, 14, 16, 18], [11, 3])
#: A 24-node tree (breadth-first parents) for the tree-vs-chain check.
TREE = (-1, 0, 0, 0, 1, 1, 1, 2, 2, 3, 4, 4, 5, 6, 7, 9, 10, 10, 11, 12, 14, 15, 18, 20)
SAMPLED = [  # (method, kwargs, sampling)
    ("sequoia", {"budget": 6, "depth": 3}, SamplingConfig(temperature=1.0)),
    ("specinfer", {"width": 2, "depth": 2}, SamplingConfig(temperature=0.7, top_p=0.9)),
    ("sequoia-dynamic", {}, SamplingConfig(temperature=1.0)),
]
ALPHA = 1e-3   # a lossless rule fails 1 time in 1,000; the broken one's p-values are far below


def check_correctness(device: torch.device, kinds: tuple[str, ...], trials: int, new_tokens: int = 40,
                      log: Callable[[str], None] = print, quick: bool = False) -> dict:
    """Every check of part (a) on ``device`` for each runner kind; a dict of results, each with ``passed``.

    ``quick``: one prompt and one sampled rule (the foil still runs): the same code in a fraction of the time.
    """
    out: dict = {"kinds": list(kinds)}
    target = tiny_model(0, device)
    drafts = {"same": target, "noisy": perturbed(target, 0.5, 1), "random": tiny_model(7, device)}
    prompts = PROMPTS[:1] if quick else PROMPTS
    refs = [_hf_greedy(target, p, new_tokens) for p in prompts]
    for kind in kinds:
        t0 = time.perf_counter()
        out[f"greedy_{kind}"] = _greedy(target, drafts, prompts, refs, kind, new_tokens)
        log(f"  greedy equality ({kind}): {out[f'greedy_{kind}']['equal']}/{out[f'greedy_{kind}']['runs']} "
            f"({time.perf_counter() - t0:.1f} s)")
        out[f"tree_vs_chain_{kind}"] = _tree_vs_chain(runner(target, kind, "tiny"))
        log(f"  tree vs chain ({kind}): max |diff| {out[f'tree_vs_chain_{kind}']['max_abs_diff']:.2e}")
    out["graph_vs_eager"] = _graph_vs_eager(target)
    log(f"  graph replay vs eager: max |diff| {out['graph_vs_eager']['max_abs_diff']:.2e} "
        f"({out['graph_vs_eager']['graphs']} graphs)")
    out["distribution"] = _distribution(device, kinds[0], trials, log, SAMPLED[:1] if quick else SAMPLED)
    out["passed"] = all(v.get("passed", True) for v in out.values() if isinstance(v, dict))
    return out


def _hf_greedy(model, prompt: list[int], n: int) -> list[int]:
    ids = torch.tensor([prompt], device=next(model.parameters()).device)
    out = model.generate(ids, max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def _greedy(target, drafts: dict, prompts, refs: list[list[int]], kind: str, new_tokens: int) -> dict:
    equal, runs, failures = 0, 0, []
    t_runner = runner(target, kind, "tiny-target")
    for dname, dmodel in drafts.items():
        pair = pair_of(runner(dmodel, kind, "tiny-draft"), t_runner, f"tiny {dname}")
        engine = SpeculativeEngine(pair)
        for prompt, ref in zip(prompts, refs):
            for name, kwargs in METHODS:
                cfg = GenerationConfig(max_new_tokens=new_tokens, stop_at_eos=False)
                records = engine.generate(prompt, make_method(name, **kwargs), cfg)
                tokens = [t for r in records for t in r.new_tokens]
                runs += 1
                if tokens == ref:
                    equal += 1
                elif len(failures) < 5:
                    first = next(i for i, (a, b) in enumerate(zip(tokens + [-1] * new_tokens, ref)) if a != b)
                    failures.append(f"{name} {kwargs} draft={dname} prompt={prompt}: first difference at {first}")
    return {"equal": equal, "runs": runs, "failures": failures, "passed": equal == runs}


def _tree_logits(rn, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    session = rn.session()
    session.forward(prompt, keep=1)
    start = len(session)
    parents = [start - 1] + [start + p for p in TREE[1:]]
    return session.forward(tokens, parents).float()       # [24, V]


def _tree_vs_chain(rn) -> dict:
    gen = torch.Generator().manual_seed(3)
    prompt = torch.randint(rn.vocab_size, (12,), generator=gen).tolist()
    tokens = torch.randint(rn.vocab_size, (len(TREE),), generator=gen).tolist()
    tree = _tree_logits(rn, prompt, tokens)
    worst = 0.0
    for node in range(len(TREE)):
        path, v = [], node
        while v >= 0:
            path.append(tokens[v])
            v = TREE[v]
        chain = rn.session().forward(prompt + path[::-1], keep=1).float()[-1]
        worst = max(worst, (tree[node] - chain).abs().max().item())
    return {"max_abs_diff": worst, "nodes": len(TREE), "passed": worst <= 1e-4}


def _graph_vs_eager(model) -> dict:
    """The same tree forward replayed as a graph and run eagerly (off CUDA: the graph runner vs the plain one)."""
    graphs = runner(model, "graph", "graph")
    other = runner(model, "eager", "eager") if not getattr(graphs, "graphs", False) else \
        type(graphs)(model, "eager", graphs.info, graphs=False)
    gen = torch.Generator().manual_seed(4)
    prompt = torch.randint(graphs.vocab_size, (20,), generator=gen).tolist()
    tokens = torch.randint(graphs.vocab_size, (len(TREE),), generator=gen).tolist()
    a, b = _tree_logits(graphs, prompt, tokens), _tree_logits(other, prompt, tokens)
    diff = (a - b).abs().max().item()
    return {"max_abs_diff": diff, "graphs": getattr(graphs, "graph_count", 0),
            "capture_errors": dict((str(k), v) for k, v in getattr(graphs, "capture_errors", {}).items()),
            "passed": diff <= 1e-4 and not getattr(graphs, "capture_errors", {})}


def _distribution(device: torch.device, kind: str, trials: int, log, rules) -> dict:
    target = tiny_model(0, device, vocab=8, init=0.2)
    pair = pair_of(runner(tiny_model(3, device, vocab=8, init=0.2), kind, "d8"), runner(target, kind, "t8"), "v8")
    prompt, out = [1, 5, 3], {}
    for name, kwargs, sampling in rules:
        t0 = time.perf_counter()
        counts, firsts = empirical_joint(pair, make_method(name, **kwargs), sampling, prompt, trials)
        p = joint_pvalue(counts, exact_joint(pair.target, prompt, sampling, firsts))
        out[f"{name} T={sampling.temperature:g} top-p {sampling.top_p:g}"] = p
        log(f"  chi-square {name} T={sampling.temperature:g}: p = {p:.3g} ({time.perf_counter() - t0:.1f} s)")
    sampling = SamplingConfig(temperature=1.0)
    with broken_residual():
        counts, firsts = empirical_joint(pair, make_method("chain", budget=2), sampling, prompt, trials)
    foil = joint_pvalue(counts, exact_joint(pair.target, prompt, sampling, firsts))
    log(f"  chi-square of the broken residual (must fail): p = {foil:.3g}")
    return {"trials": trials, "p_values": out, "broken_residual_p": foil, "alpha": ALPHA,
            "passed": all(p > ALPHA for p in out.values()) and foil < ALPHA}
