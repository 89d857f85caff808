"""Robustness (the Sequoia paper's rejection-rate figure), teacher-forced on a real pair.

Average rejection rate (the probability that *every* one of k speculated
children of a node is rejected) against k, at several temperatures, for the
three ways of drawing children (:mod:`sequoia.core.sampling`): without replacement
(Sequoia), with replacement (SpecInfer) and top-k.

The target first writes a continuation of each prompt (sampled at
``--context-temperature``); one forward of each model over prompt +
continuation then gives p (target) and q (draft) at every position.  At each
position and temperature a seeded Monte Carlo draws K children and runs the
verification rule of :func:`sequoia.core.sampling.verify_children`, vectorised over
positions and samples; the first k of K children drawn are a valid draw of k
children for all three modes, so one run gives the whole curve.

    .venv/bin/python scripts/robustness.py --out out/robustness

Writes robustness.json and robustness.html/.png.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a plain script from anywhere

from sequoia.core.config import SAMPLING_MODES, SamplingConfig  # noqa: E402
from sequoia.core.sampling import sample_children, warp  # noqa: E402
from sequoia.tools.bench import encode, load_prompt_sets  # noqa: E402
from sequoia._meta import ASSETS  # noqa: E402
from sequoia.tools.common import add_model_args as _add_model_args  # noqa: E402
from sequoia.tools.common import load_from_args as _load  # noqa: E402

_TINY = 1e-12
CHUNK = 8                  # positions truncated together
MAX_ELEMENTS = 1 << 22     # rows x kept tokens per Monte Carlo pass: bounds memory at high temperature


def first_accepted(p: torch.Tensor, q: torch.Tensor, k: int, mode: str, gen: torch.Generator) -> torch.Tensor:
    """Index of the first accepted of k children (-1: all rejected), per row.  p, q: [R, V] -> [R]

    Vectorised :func:`sequoia.core.sampling.verify_children`: child x is accepted
    when u * q(x) < r(x) (q(x) = 1 for top-k), r being p and then the residual
    norm(max(r - q, 0)) after each rejection (r without x for top-k); without
    replacement the rejected token also leaves q.
    """
    if p.ndim != 2 or p.shape != q.shape:
        raise ValueError(f"p and q must both be [R, V], got {tuple(p.shape)} and {tuple(q.shape)}")
    drawn = sample_children(q, k, mode, gen)                            # [R, k]
    u = torch.rand(drawn.shape, generator=gen)                          # [R, k]
    first = torch.full((p.shape[0],), -1, dtype=torch.long)
    live = torch.ones(p.shape[0], dtype=torch.bool)
    r, q = p.clone(), q.clone()
    for i in range(drawn.shape[1]):
        x = drawn[:, i:i + 1]                                           # [R, 1]
        qx = torch.ones(p.shape[0]) if mode == "topk" else q.gather(-1, x)[:, 0]
        live &= qx > _TINY                                              # q's support used up: fillers follow
        accept = live & (u[:, i] * qx < r.gather(-1, x)[:, 0])
        first[accept] = i
        live &= ~accept
        residual = r.scatter(-1, x, 0.0) if mode == "topk" else (r - q).clamp(min=0.0)
        total = residual.sum(-1, keepdim=True)
        residual = torch.where(total > _TINY, residual / total.clamp(min=_TINY), r)
        r = torch.where(live[:, None], residual, r)
        if mode == "without_replacement":
            q = q.scatter(-1, x, 0.0)
            q = q / q.sum(-1, keepdim=True).clamp(min=_TINY)
    return first


def truncate(p: torch.Tensor, q: torch.Tensor, tail: float, keep_at_least: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Keep the fewest top tokens (by p + q) holding all but ``tail`` of both; lump the rest into one.  -> [L, m+1]"""
    both = p + q
    order = both.argsort(-1, descending=True)
    mass = both.gather(-1, order).cumsum(-1)
    m = max(int((mass < 2.0 * (1.0 - tail)).sum(-1).max()) + 1, keep_at_least)
    idx = order[:, : min(m, p.shape[-1])]
    ps, qs = p.gather(-1, idx), q.gather(-1, idx)
    ps = torch.cat([ps, (1.0 - ps.sum(-1, keepdim=True)).clamp(min=0.0)], -1)
    qs = torch.cat([qs, (1.0 - qs.sum(-1, keepdim=True)).clamp(min=0.0)], -1)
    return ps / ps.sum(-1, keepdim=True), qs / qs.sum(-1, keepdim=True)


def rejection_curves(p_logits: torch.Tensor, q_logits: torch.Tensor, temperature: float, children: list[int],
                     samples: int, gen: torch.Generator, tail: float = 1e-4) -> dict[str, list[float]]:
    """mode -> average P(all k children rejected) for each k in ``children``.  logits: [L, V]"""
    cfg = SamplingConfig(temperature=temperature)
    K = max(children)
    rejected = {mode: torch.zeros(len(children)) for mode in SAMPLING_MODES}
    for lo in range(0, p_logits.shape[0], CHUNK):
        p, q = truncate(warp(p_logits[lo:lo + CHUNK], cfg), warp(q_logits[lo:lo + CHUNK], cfg), tail, K + 1)
        rows = torch.arange(p.shape[0]).repeat_interleave(samples)     # [positions * samples] -> position
        step = max(1, MAX_ELEMENTS // p.shape[1])
        for mode in SAMPLING_MODES:
            for r0 in range(0, rows.numel(), step):
                sel = rows[r0:r0 + step]
                first = first_accepted(p[sel], q[sel], K, mode, gen)   # [len(sel)]
                for j, k in enumerate(children):
                    rejected[mode][j] += ((first < 0) | (first >= k)).float().sum()
    total = p_logits.shape[0] * samples
    return {mode: (v / total).tolist() for mode, v in rejected.items()}


@torch.inference_mode()
def logits_over(model, prompt: list[int], cont: list[int], vocab: int) -> torch.Tensor:
    """Logits predicting each continuation token, from one forward.  # [len(cont), V] float32"""
    ids = torch.tensor([prompt + cont[:-1]], device=next(model.parameters()).device)
    return model(input_ids=ids, logits_to_keep=len(cont)).logits[0, :, :vocab].float().cpu()


def teacher_logits(args, key: dict, cache: Path, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Target and draft logits over target-written continuations.  # [positions, V] each

    Kept in ``cache`` (with the ``key`` settings that made them) so a rerun skips the models entirely.
    """
    from sequoia.runtime.acceptance import target_continuation

    if cache.exists():
        saved = torch.load(cache)
        if saved["settings"] == key:
            return saved["p"], saved["q"]
    pair = _load(args)
    vocab = min(int(m.config.vocab_size) for m in (pair.draft, pair.target))
    p_rows, q_rows = [], []
    for s in load_prompt_sets(args.prompts, ASSETS / "prompts", args.limit):
        for text in s.prompts:
            ids = encode(pair, text)
            cont = target_continuation(pair.target, ids, SamplingConfig(args.context_temperature), args.max_new_tokens,
                                       gen, set(pair.eos_token_ids), vocab)
            p_rows.append(logits_over(pair.target, ids, cont, vocab))
            q_rows.append(logits_over(pair.draft, ids, cont, vocab))
            print(f"{s.name}: {len(cont)} positions", file=sys.stderr, flush=True)
    p_logits, q_logits = torch.cat(p_rows), torch.cat(q_rows)
    torch.save({"settings": key, "p": p_logits, "q": q_logits}, cache)
    return p_logits, q_logits


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--temperatures", default="0.2,0.6,1.0")
    ap.add_argument("--children", default="1,2,4,8,16,32")
    ap.add_argument("--prompts", default="code,chat")
    ap.add_argument("--limit", type=int, default=4, help="prompts per set")
    ap.add_argument("--max-new-tokens", type=int, default=64, help="continuation length per prompt")
    ap.add_argument("--context-temperature", type=float, default=0.6, help="temperature the target writes at")
    ap.add_argument("--samples", type=int, default=64, help="Monte Carlo draws per position")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (1: stabler on a busy machine)")
    ap.add_argument("--out", default="out/robustness")
    _add_model_args(ap)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    from sequoia.tools.bench_figures import robustness_figure, write_figures

    temps = [float(t) for t in args.temperatures.split(",")]
    children = sorted(int(k) for k in args.children.split(","))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    settings = {k: getattr(args, k) for k in ("prompts", "limit", "max_new_tokens", "context_temperature",
                                               "samples", "seed", "draft", "target", "dtype")}
    gen = torch.Generator().manual_seed(args.seed)
    key = {k: v for k, v in settings.items() if k != "samples"}  # what the logits depend on
    p_logits, q_logits = teacher_logits(args, key, out / "logits.pt", gen)
    rows = []
    for t in temps:
        curves = rejection_curves(p_logits, q_logits, t, children, args.samples, gen)
        for mode, values in curves.items():
            rows += [{"temperature": t, "mode": mode, "children": k, "rejection": v} for k, v in zip(children, values)]
            print(f"T={t:g} {mode:>20}: " + "  ".join(f"k={k}: {v:.3f}" for k, v in zip(children, values)), flush=True)
    (out / "robustness.json").write_text(json.dumps({"format": "sequoia-robustness/1", "settings": settings,
                                                     "positions": int(p_logits.shape[0]), "rows": rows}, indent=1))
    _, note = write_figures({"robustness": robustness_figure(rows)}, out)
    print(f"wrote {out / 'robustness.json'} and the chart" + (f" ({note})" if note else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
