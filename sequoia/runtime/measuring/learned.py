"""An acceptance vector learnt from a server's own decodes, on top of a prior, kept across restarts.

Why: a pair nobody measured (the 7B pair a GPU Space serves) still needs a vector for
its trees from the first request; the embedded pair's measured vectors are the
nearest evidence, so they serve as the **prior**, and every decode the server runs
adds what it saw.  The engine records, at each node of the accepted path, how many
children it had and which rank the target accepted
(:func:`sequoia.core.statistics.stats.rank_counts`); summed over decodes these are
``accepts[k]`` and ``parents[k]`` per 0-based rank k, and the learnt

    p_k = (M * prior_k + accepts[k]) / (M + parents[k])

with M = :data:`PRIOR_WEIGHT` nodes' worth of belief in the prior: the prior alone at
first, the server's own rates once its nodes outnumber M.  (Scaled down if the ranks
sum past 1: one child at most is accepted.)  Counts are kept per temperature (greedy
and sampled decodes accept differently) in one JSON file, written under a file lock
(ZeroGPU runs each call in a process of its own, and two may end at once).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
from collections.abc import Iterable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ...core.statistics.stats import rank_counts
from ...core.statistics.trace import StepRecord
from ...core.trees.dp import check_acceptance

#: Nodes' worth of belief in the prior vector.
PRIOR_WEIGHT = 200
#: Ranks counted (the page's vectors are at most this wide).
WIDTH = 16
FORMAT = "sequoia-learned-acceptance/1"


@dataclass(frozen=True)
class Learnt:
    """The vector a request gets, and how much of it is this server's own evidence."""

    values: tuple[float, ...]      # [W] p_1..p_W
    nodes: int                     # accepted-path nodes with children counted here (0: the prior alone)
    decodes: int

    def words(self) -> str:
        if not self.nodes:
            return "the prior alone (no decode here yet)"
        return (f"learnt from {self.decodes} decode(s) here ({self.nodes} nodes), {PRIOR_WEIGHT} nodes' weight on "
                "the prior")


def temperature_key(temperature: float) -> str:
    """Counts are kept per temperature to one decimal ("0" greedy)."""
    return f"{round(float(temperature), 1):g}"


class LearnedAcceptance:
    """The counts of one pair in ``folder`` (``<slug of pair>.json``)."""

    def __init__(self, folder: str | Path, pair: str) -> None:
        self.pair = pair
        self.path = Path(folder) / f"{re.sub(r'[^A-Za-z0-9._-]+', '_', pair)[:120]}.json"

    def read(self) -> dict:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {"format": FORMAT, "pair": self.pair, "by_temperature": {}}
        if data.get("format") != FORMAT or not isinstance(data.get("by_temperature"), dict):
            return {"format": FORMAT, "pair": self.pair, "by_temperature": {}}
        return data

    def observe(self, records: Iterable[StepRecord], temperature: float) -> None:
        """Add one decode's step records (nothing when no node had children: the target alone's steps)."""
        accepts, parents = rank_counts(records, WIDTH)
        if not any(parents):
            return
        key = temperature_key(temperature)
        with self._locked():
            data = self.read()
            entry = data["by_temperature"].setdefault(key, {"accepts": [0] * WIDTH, "parents": [0] * WIDTH,
                                                            "decodes": 0})
            entry["accepts"] = [a + b for a, b in zip(entry["accepts"], accepts)]
            entry["parents"] = [a + b for a, b in zip(entry["parents"], parents)]
            entry["decodes"] += 1
            tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(data, indent=1))
            os.replace(tmp, self.path)

    def vector(self, prior, temperature: float) -> Learnt:
        """``prior`` (a valid vector) updated with this server's counts at ``temperature``."""
        p = [float(x) for x in check_acceptance(prior)]
        entry = self.read()["by_temperature"].get(temperature_key(temperature))
        if not entry:
            return Learnt(tuple(p), 0, 0)
        width = max(len(p), min(WIDTH, max((k + 1 for k, n in enumerate(entry["parents"]) if n), default=0)))
        p += [0.0] * (width - len(p))
        out = [(PRIOR_WEIGHT * p[k] + (entry["accepts"][k] if k < WIDTH else 0))
               / (PRIOR_WEIGHT + (entry["parents"][k] if k < WIDTH else 0)) for k in range(width)]
        total = sum(out)
        if total > 1:
            out = [x / total for x in out]
        while len(out) > 1 and out[-1] == 0:
            out.pop()
        return Learnt(tuple(out), int(entry["parents"][0]), int(entry["decodes"]))

    @contextmanager
    def _locked(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_suffix(".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
