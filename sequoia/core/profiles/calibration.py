"""From draft confidence to acceptance: the record a dynamic tree grows by, and its fit.

The static DP (:mod:`sequoia.core.trees.dp`) knows one number per sibling rank: p_k, the
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
teacher-forced forwards (:func:`sequoia.runtime.measuring.calibration.calibrate`).
Files are JSON (format ``sequoia-calibration/1``), kept with the acceptance
vectors in ``assets/acceptance/``; ``acceptance`` in a file is the mean hit
rate per rank, an acceptance vector for the DP.  Pure: numpy and torch only.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from ..._meta import read_json, write_json
from ..statistics.trace import StepRecord

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
    def identity(cls, ranks: int = 1) -> Calibration:
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
    def load(cls, path: str | Path) -> Calibration:
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
