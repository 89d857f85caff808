"""From draft confidence to acceptance: the per-node estimate a dynamic tree grows by.

The static DP (:mod:`sequoia.core.dp`) knows one number per sibling rank: p_k, the
probability that the k-th child of an accepted node is the one the target
accepts.  A dynamic tree sees more: the draft's own probability q of every
token it proposes.  A :class:`Calibration` maps (q, rank) to

    a(q, r) = P(the rank-r child is the accepted one | its parent was accepted, its q)

the same event as p_{r+1}, split by confidence.  The estimated acceptance of a
node is then the product of a(q, r) along its path (root excluded), as f(v) is
for the DP.  Each rank's curve is piecewise linear through ``knots`` and
non-decreasing in q.

``identity()`` (a = q) is the default: at temperature 0 a well-calibrated
draft's top token is the target's argmax with probability q.  Fits
(:func:`fit_outcomes`) bin (q, rank, hit) observations, shrink each bin
towards the identity where data are thin and make each rank's curve
monotone.  The observations come either from step records
(:func:`fit_records`: the children of accepted nodes) or, cheaper, from
:func:`calibrate`: teacher-forced forwards over continuations the target
writes for a prompt set.  Files are JSON (format ``sequoia-calibration/1``),
kept with the acceptance vectors in ``assets/acceptance/``; ``acceptance``
in a file is the mean hit rate per rank, an acceptance vector for the DP.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from .._meta import library_version, now_iso, pair_name, read_json, write_json
from ..core.config import GenerationConfig, SamplingConfig
from ..core.trace import StepRecord

FORMAT = "sequoia-calibration/1"
#: Confidence bins of a fit; finer where drafts put most of their mass.
EDGES = (0.0, 0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.98, 1.0)
#: Pseudo-observations of the identity prior in each bin.
PRIOR_WEIGHT = 4.0


@dataclass(frozen=True)
class Calibration:
    knots: tuple[float, ...]                  # [K] increasing q in [0, 1]
    values: tuple[tuple[float, ...], ...]     # [R, K] a(knot, rank); ranks >= R use the last row
    counts: tuple[tuple[int, ...], ...] = ()  # [R, K-2] observations per bin (fits only)
    acceptance: tuple[float, ...] = ()        # [R] mean hit rate per rank over the fit data (fits only)
    pair: str = ""
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    prompt_set: str = ""
    steps: int = 0
    date: str = ""
    version: str = ""

    def __post_init__(self) -> None:
        k = np.asarray(self.knots, dtype=np.float64)
        v = np.asarray(self.values, dtype=np.float64)
        if k.ndim != 1 or k.size < 2 or np.any(np.diff(k) <= 0) or k[0] < 0 or k[-1] > 1:
            raise ValueError("calibration knots must be >= 2 strictly increasing numbers in [0, 1]")
        if v.ndim != 2 or v.shape[1] != k.size or v.shape[0] < 1:
            raise ValueError(f"calibration values must be [ranks, {k.size}], got shape {v.shape}")
        if not np.all(np.isfinite(v)) or np.any(v < 0) or np.any(v > 1):
            raise ValueError("calibration values must lie in [0, 1]")
        object.__setattr__(self, "knots", tuple(float(x) for x in k))
        object.__setattr__(self, "values", tuple(tuple(float(x) for x in row) for row in v))

    @classmethod
    def identity(cls, ranks: int = 1) -> "Calibration":
        return cls(knots=(0.0, 1.0), values=((0.0, 1.0),) * ranks)

    @property
    def ranks(self) -> int:
        return len(self.values)

    def accept(self, q: torch.Tensor, rank: torch.Tensor) -> torch.Tensor:
        """a(q, rank) elementwise.  q: [...] float, rank: [...] int (broadcastable) -> [...] float32"""
        knots = torch.tensor(self.knots, dtype=torch.float32)
        table = torch.tensor(self.values, dtype=torch.float32)              # [R, K]
        q = q.detach().float().cpu().clamp(0.0, 1.0)
        r = torch.as_tensor(rank).cpu().clamp(0, self.ranks - 1)
        q, r = torch.broadcast_tensors(q, r)
        hi = torch.searchsorted(knots, q.contiguous(), right=False).clamp(1, len(self.knots) - 1)
        lo = hi - 1
        w = (q - knots[lo]) / (knots[hi] - knots[lo])
        return table[r, lo] * (1 - w) + table[r, hi] * w

    # ------------------------------------------------------------- (de)serialise
    def to_dict(self) -> dict:
        d = asdict(self)
        d["values"] = [list(r) for r in self.values]
        d["counts"] = [list(r) for r in self.counts]
        d["knots"] = list(self.knots)
        d["acceptance"] = list(self.acceptance)
        return {"format": FORMAT, **d}

    def save(self, path: str | Path) -> None:
        write_json(path, self.to_dict())

    @classmethod
    def load(cls, path: str | Path) -> "Calibration":
        data = read_json(path, FORMAT, "Sequoia calibration")
        try:
            return cls(knots=tuple(data["knots"]), values=tuple(tuple(r) for r in data["values"]),
                       counts=tuple(tuple(int(c) for c in r) for r in data.get("counts", ())),
                       acceptance=tuple(float(x) for x in data.get("acceptance", ())),
                       **{k: data[k] for k in ("pair", "temperature", "top_p", "top_k", "prompt_set",
                                               "steps", "date", "version") if k in data})
        except (KeyError, TypeError) as exc:
            raise ValueError(f"{path}: not a calibration file ({exc})") from exc


# ---------------------------------------------------------------------------- fitting
def child_outcomes(records: Iterable[StepRecord]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(q, rank, accepted) of every child of an accepted node.  -> three [N] arrays"""
    qs, ranks, hits = [], [], []
    for rec in records:
        on_path = set(rec.accepted)
        for v in range(1, rec.tree.n_nodes):
            if rec.tree.parents[v] in on_path:
                qs.append(rec.q[v])
                ranks.append(rec.tree.ranks[v])
                hits.append(v in on_path)
    return np.asarray(qs, dtype=np.float64), np.asarray(ranks, dtype=np.int64), np.asarray(hits, dtype=np.float64)


def fit_outcomes(q: np.ndarray, rank: np.ndarray, hit: np.ndarray, ranks: int = 4,
                 edges: Sequence[float] = EDGES, prior_weight: float = PRIOR_WEIGHT, **meta) -> Calibration:
    """Per rank and q bin: hit rate shrunk towards the bin's mean q, then made non-decreasing in q."""
    if not (q.shape == rank.shape == hit.shape) or q.ndim != 1:
        raise ValueError("q, rank and hit must be 1-D arrays of one length")
    edges = np.asarray(edges, dtype=np.float64)
    centers = (edges[:-1] + edges[1:]) / 2
    bins = np.clip(np.searchsorted(edges, q, side="right") - 1, 0, len(centers) - 1)
    rows, counts, mean_hit = [], [], []
    for r in range(ranks):
        sel = np.minimum(rank, ranks - 1) == r
        mean_hit.append(float(hit[sel].mean()) if sel.any() else 0.0)
        n = np.bincount(bins[sel], minlength=len(centers)).astype(np.float64)
        h = np.bincount(bins[sel], weights=hit[sel], minlength=len(centers))
        qsum = np.bincount(bins[sel], weights=q[sel], minlength=len(centers))
        mean_q = np.where(n > 0, qsum / np.maximum(n, 1), centers)
        rate = (h + prior_weight * mean_q) / (n + prior_weight)
        fitted = _isotonic(rate, n + prior_weight)
        # End knots: a token of q = 0 is never accepted; q = 1 keeps the last bin's rate.
        rows.append([0.0, *fitted, fitted[-1]])
        counts.append(n.astype(int).tolist())
    values = np.asarray(rows)
    knots = (0.0, *centers.tolist(), 1.0)
    return Calibration(knots=knots, values=tuple(map(tuple, values)), counts=tuple(map(tuple, counts)),
                       acceptance=tuple(mean_hit), **meta)


def fit_records(records: Iterable[StepRecord], ranks: int = 4, **meta) -> Calibration:
    q, rank, hit = child_outcomes(records)
    return fit_outcomes(q, rank, hit, ranks=ranks, **meta)


def _isotonic(y: np.ndarray, w: np.ndarray) -> list[float]:
    """Weighted least-squares non-decreasing fit (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [value, weight, length]
    for yi, wi in zip(y.tolist(), w.tolist()):
        blocks.append([yi, wi, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            v2, w2, n2 = blocks.pop()
            v1, w1, n1 = blocks.pop()
            blocks.append([(v1 * w1 + v2 * w2) / (w1 + w2), w1 + w2, n1 + n2])
    return [min(max(v, 0.0), 1.0) for v, _, n in blocks for _ in range(n)]


def calibrate(pair, sequences: Sequence[tuple[list[int], list[int]]], samplings: Sequence[SamplingConfig],
              width: int = 4, seed: int = 0, prompt_set: str = "", progress=None) -> list[Calibration]:
    """One calibration per sampling config, from teacher-forced forwards.

    ``sequences`` are (context, scored) token lists: both models run once over
    context + scored, and every position predicting a scored token yields
    ``width`` (q, rank, hit) observations per config.  Greedy: the rank-r
    child hits when the draft's r-th token is the target's argmax.  Sampling:
    ``width`` children are drawn without replacement from q and verified with
    the library's rule (:func:`sequoia.core.sampling.verify_children`).  Scored
    tokens may be any text; :func:`target_continuation_of` gives the target's
    own (the faithful but slow choice).
    """
    gen = torch.Generator().manual_seed(seed)
    obs: list[list[tuple[np.ndarray, ...]]] = [[] for _ in samplings]
    for i, (context, scored) in enumerate(sequences):
        p_logits, q_logits = teacher_logits(pair, context, scored)
        for j, sampling in enumerate(samplings):
            obs[j].append(outcomes(p_logits, q_logits, sampling, width, gen))
        if progress is not None:
            progress((i + 1) / len(sequences), f"calibration: {i + 1}/{len(sequences)} sequences")
    out = []
    for sampling, parts in zip(samplings, obs):
        q, r, h = (np.concatenate(x) for x in zip(*parts))
        out.append(fit_outcomes(q, r, h, ranks=width, pair=pair_name(pair), temperature=sampling.temperature,
                                top_p=sampling.top_p, top_k=sampling.top_k, prompt_set=prompt_set,
                                steps=int(len(q) // width), date=now_iso(), version=library_version()))
    return out


def target_continuation_of(pair, ids: list[int], sampling: SamplingConfig, max_new_tokens: int,
                           seed: int = 0) -> list[int]:
    """What the target writes after ``ids`` (lossless speculative chain decoding)."""
    from .engine import SpeculativeEngine
    from .methods import make_method

    cfg = GenerationConfig(max_new_tokens=max_new_tokens, sampling=sampling, seed=seed)
    records = SpeculativeEngine(pair).generate(ids, make_method("chain", budget=3), cfg, with_texts=False)
    return [t for rec in records for t in rec.new_tokens]


@torch.inference_mode()
def teacher_logits(pair, context: list[int], scored: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Target and draft logits at the positions predicting each scored token.  -> two [L, V] float32"""
    if not context or not scored:
        raise ValueError("teacher_logits needs a non-empty context and scored tokens")
    vocab = min(int(m.config.vocab_size) for m in (pair.draft, pair.target))
    ids = torch.tensor([context + scored[:-1]], device=pair.device)    # the last token is never a context
    keep = len(scored)
    p = pair.target(input_ids=ids, logits_to_keep=keep).logits[0, :, :vocab].float().cpu()
    q = pair.draft(input_ids=ids, logits_to_keep=keep).logits[0, :, :vocab].float().cpu()
    return p, q


def outcomes(p_logits: torch.Tensor, q_logits: torch.Tensor, sampling: SamplingConfig, width: int,
             gen: torch.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(q, rank, hit) of ``width`` children at each position.  logits: [L, V] -> three [L * width]"""
    from ..core.sampling import sample_children, verify_children, warp

    if p_logits.ndim != 2 or p_logits.shape != q_logits.shape:
        raise ValueError(f"logits must both be [L, V], got {tuple(p_logits.shape)} and {tuple(q_logits.shape)}")
    if sampling.greedy:
        top = torch.topk(torch.softmax(q_logits, -1), width, dim=-1)    # [L, W] as the Drafter sees q
        hit = (top.indices == p_logits.argmax(-1, keepdim=True)).float()
        q_kids = top.values
    else:
        q_all, p_all = warp(q_logits, sampling), warp(p_logits, sampling)
        kids = sample_children(q_all, width, "without_replacement", gen)  # [L, W]
        hit = torch.zeros(kids.shape)
        for t in range(kids.shape[0]):
            idx, _ = verify_children(p_all[t], q_all[t], kids[t].tolist(), "without_replacement", gen)
            if idx is not None:
                hit[t, idx] = 1.0
        q_kids = q_all.gather(-1, kids)
    rank = torch.arange(width).expand_as(hit)
    return q_kids.numpy().ravel(), rank.numpy().ravel(), hit.numpy().ravel()


def _text_sequences(pair, paths: Sequence[str], chunk: int, limit: int | None) -> list[tuple[list[int], list[int]]]:
    """Chunks of text files: the first 16 tokens of a chunk are context, the rest are scored."""
    out = []
    for path in paths:
        ids = pair.tokenizer(Path(path).read_text(errors="ignore"))["input_ids"]
        starts = list(range(0, len(ids) - chunk + 1, chunk))[:limit]
        out.extend((ids[lo: lo + 16], ids[lo + 16: lo + chunk]) for lo in starts)
    return out


def find_calibration(directory: str | Path | None, temperature: float = 0.0,
                     pair: str | None = None) -> Calibration | None:
    """The ``calibration-*.json`` in ``directory`` nearest in temperature (measured for ``pair`` when both
    name one), or None.  Unreadable files are skipped."""
    if directory is None or not Path(directory).is_dir():
        return None
    found = []
    for path in sorted(Path(directory).glob("calibration-*.json")):
        try:
            cal = Calibration.load(path)
        except (ValueError, OSError):
            continue
        if not (pair and cal.pair and cal.pair != pair):
            found.append(cal)
    return min(found, key=lambda c: abs(c.temperature - float(temperature)), default=None)


def main(argv: list[str] | None = None) -> int:
    """python -m sequoia.runtime.calibration --texts sequoia/*.py README.md --out-dir assets/acceptance"""
    import argparse

    from .acceptance import load_prompts
    from .models import load_pair

    ap = argparse.ArgumentParser(prog="python -m sequoia calibrate",
                                 description="Fit the confidence-to-acceptance calibration of the dynamic tree.")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompts", nargs="+", help="JSONL prompt files: score what the target writes (slow)")
    src.add_argument("--texts", nargs="+", help="text files: score chunks of them (fast)")
    ap.add_argument("--out-dir", default="assets/acceptance")
    ap.add_argument("--name", default="embedded", help="file names: calibration-NAME-tT.json")
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 0.6])
    ap.add_argument("--width", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=64, help="continuation length (--prompts)")
    ap.add_argument("--chunk", type=int, default=160, help="tokens per text chunk (--texts)")
    ap.add_argument("--limit", type=int, default=None, help="most prompts or chunks per file")
    args = ap.parse_args(argv)
    samplings = [SamplingConfig(temperature=t) for t in args.temperatures]
    missing = [f for f in (args.texts or args.prompts) if not Path(f).is_file()]
    if missing:  # before the minute it takes to load the models
        raise FileNotFoundError(f"no such file: {', '.join(missing)}")
    pair = load_pair()
    if args.texts:
        sequences = _text_sequences(pair, args.texts, args.chunk, args.limit)
        source = "texts:" + ",".join(Path(f).name for f in args.texts)
    else:
        prompts = [pair.encode_prompt(p) for f in args.prompts for p in load_prompts(f)[: args.limit]]
        sequences = [(ids, target_continuation_of(pair, ids, SamplingConfig(), args.max_new_tokens)) for ids in prompts]
        source = ",".join(Path(f).name for f in args.prompts)
    cals = calibrate(pair, sequences, samplings, args.width, prompt_set=source,
                     progress=lambda f, d: print(d, flush=True))
    for cal in cals:
        path = Path(args.out_dir) / f"calibration-{args.name}-t{cal.temperature:g}.json"
        cal.save(path)
        print(json.dumps({"out": str(path), "observations": cal.steps, "acceptance": cal.acceptance}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
