"""The acceptance vector record: p_1..p_W of a draft/target pair, and its JSON file.

p_k is the probability that the k-th child the draft proposes at a node is the
one the target accepts (see :mod:`sequoia.core.trees.dp`); how it is measured is
:mod:`sequoia.runtime.measuring.acceptance`.  Files are JSON, format ``sequoia-acceptance/1``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path

from ..._meta import named_errors, number_list, read_json, require, write_json
from ..config import SamplingConfig
from ..trees.dp import check_acceptance

FORMAT = "sequoia-acceptance/1"


@dataclass(frozen=True)
class AcceptanceVector:
    values: tuple[float, ...]          # [W] p_1..p_W
    stderr: tuple[float, ...] = ()     # [W] standard error of each entry (empty: unknown)
    pair: str = ""
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    prompt_set: str = ""
    positions: int = 0                 # positions (teacher) or verified parent nodes (decode) counted
    method: str = "teacher"            # "teacher" | "decode" | "hand-made"
    mc_samples: int = 0                # Monte Carlo draws per position (teacher, sampling only)
    date: str = ""
    version: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "values", tuple(float(x) for x in check_acceptance(self.values)))
        object.__setattr__(self, "stderr", tuple(float(x) for x in self.stderr))
        if self.stderr and len(self.stderr) != len(self.values):
            raise ValueError(f"stderr has {len(self.stderr)} entries but values has {len(self.values)}")
        if any(not math.isfinite(s) or s < 0 for s in self.stderr):
            raise ValueError("stderr entries must be finite and >= 0")
        SamplingConfig(self.temperature, self.top_p, self.top_k)  # same validation as everywhere else

    @property
    def width(self) -> int:
        return len(self.values)

    @property
    def sampling(self) -> SamplingConfig:
        return SamplingConfig(self.temperature, self.top_p, self.top_k)

    def to_dict(self) -> dict:
        return {"format": FORMAT, **{k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}}

    def save(self, path: str | Path) -> None:
        write_json(path, self.to_dict())

    @classmethod
    def from_dict(cls, data: dict, source: str = "acceptance vector") -> AcceptanceVector:
        with named_errors(source):
            return cls(
                values=number_list(data, "values", source),
                stderr=number_list(data, "stderr", source) if "stderr" in data else (),
                pair=str(data.get("pair", "")),
                temperature=require(data, "temperature", (int, float), source),
                top_p=data.get("top_p", 1.0), top_k=data.get("top_k", 0),
                prompt_set=str(data.get("prompt_set", "")), positions=int(data.get("positions", 0)),
                method=str(data.get("method", "")), mc_samples=int(data.get("mc_samples", 0)),
                date=str(data.get("date", "")), version=str(data.get("version", "")),
            )

    @classmethod
    def load(cls, path: str | Path, pair: str | None = None,
             sampling: SamplingConfig | None = None) -> AcceptanceVector:
        """Read a vector; with ``pair`` / ``sampling``, refuse one measured under other conditions."""
        vec = cls.from_dict(read_json(path, FORMAT, "Sequoia acceptance vector"), source=str(path))
        if pair is not None and vec.pair and vec.pair != pair:
            raise ValueError(f"{path}: measured for pair {vec.pair!r}, not {pair!r}")
        if sampling is not None and vec.sampling != sampling:
            raise ValueError(f"{path}: measured at temperature={vec.temperature}, top_p={vec.top_p}, "
                             f"top_k={vec.top_k}; requested {sampling}")
        return vec
