"""Measured positional acceptance vectors p_1..p_W of a draft/target pair.

p_k is the probability that the k-th child the draft proposes at a node is
the one the target accepts (see :mod:`sequoia.core.dp`).  Two ways to measure it:

``teacher``  The target writes a continuation of each prompt (greedy or
    sampled with the same warping); then ONE forward of each model over
    prompt + continuation gives p (target) and q (draft) at every position.
    Greedy: p_k is the fraction of positions where the target's argmax is the
    draft's k-th ranked token.  Sampling: p_1 = sum_x min(p, q) exactly; for
    k >= 2 a seeded Monte Carlo draws W children without replacement from q
    and runs the residual verification rule of :mod:`sequoia.core.sampling`.
    Continuations are what the target itself writes, so the contexts are
    distributed as in real decoding.
``decode``   Real speculative decoding with a tree whose root has W children;
    p_k comes from the step records (:func:`sequoia.core.stats.empirical_acceptance`).

For speed the Monte Carlo keeps, per position, the fewest tokens that hold
all but ``tail`` of both p's and q's mass and lumps the rest into one token;
the error this adds to any p_k is at most about ``tail``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from .._meta import (
    Progress,
    ProgressFn,
    library_version,
    now_iso,
    number_list,
    pair_name,
    read_json,
    require,
    write_json,
)
from ..core.config import GenerationConfig, SamplingConfig
from ..core.dp import check_acceptance
from ..core.sampling import sample_children, sample_token, warp
from ..core.tree import Tree
from .kv_cache import KVCache

FORMAT = "sequoia-acceptance/1"
METHODS = ("teacher", "decode")
_TINY = 1e-12


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
    def from_dict(cls, data: dict, source: str = "acceptance vector") -> "AcceptanceVector":
        try:
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
        except (ValueError, TypeError) as exc:
            if str(exc).startswith(source):
                raise
            raise ValueError(f"{source}: {exc}") from exc

    @classmethod
    def load(cls, path: str | Path, pair: str | None = None,
             sampling: SamplingConfig | None = None) -> "AcceptanceVector":
        """Read a vector; with ``pair`` / ``sampling``, refuse one measured under other conditions."""
        vec = cls.from_dict(read_json(path, FORMAT, "Sequoia acceptance vector"), source=str(path))
        if pair is not None and vec.pair and vec.pair != pair:
            raise ValueError(f"{path}: measured for pair {vec.pair!r}, not {pair!r}")
        if sampling is not None and vec.sampling != sampling:
            raise ValueError(f"{path}: measured at temperature={vec.temperature}, top_p={vec.top_p}, "
                             f"top_k={vec.top_k}; requested {sampling}")
        return vec


def load_prompts(path: str | Path) -> list[str]:
    """A JSONL prompt set: one ``{"prompt": "..."}`` object per non-empty line."""
    out = []
    for i, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{i}: not valid JSON ({exc})") from exc
        if not isinstance(obj, dict) or not isinstance(obj.get("prompt"), str) or not obj["prompt"].strip():
            raise ValueError(f'{path}:{i}: expected {{"prompt": "<non-empty text>"}}')
        out.append(obj["prompt"])
    if not out:
        raise ValueError(f"{path}: no prompts")
    return out


# ---------------------------------------------------------------------------- measuring
def measure_acceptance(
    pair,
    prompts: Sequence[str | Sequence[int]],
    sampling: SamplingConfig,
    width: int = 16,
    max_new_tokens: int = 64,
    method: str = "teacher",
    generator: torch.Generator | None = None,
    mc_samples: int = 128,
    prompt_set: str = "",
    chat: bool = True,
    tail: float = 1e-4,
    progress: ProgressFn | None = None,
) -> AcceptanceVector:
    """Measure p_1..p_width on ``prompts`` (texts, encoded with ``pair.encode_prompt``, or token ids).

    ``generator`` seeds the continuations, the Monte Carlo and the decoding
    runs (a fixed seed is used without one).
    """
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; expected one of {METHODS}")
    if not isinstance(width, int) or width < 1 or not prompts or max_new_tokens < 1 or mc_samples < 1:
        raise ValueError("need width >= 1, at least one prompt, max_new_tokens >= 1 and mc_samples >= 1")
    gen = generator if generator is not None else torch.Generator().manual_seed(0)
    ids = [_encode(pair, p, chat) for p in prompts]
    tick = Progress(len(ids), progress, f"acceptance ({method})")
    try:
        measure = _teacher if method == "teacher" else _decode
        values, stderr, count = measure(pair, ids, sampling, width, max_new_tokens, gen, mc_samples, tail, tick)
    finally:
        tick.close()
    return AcceptanceVector(
        values=values, stderr=stderr, pair=pair_name(pair), temperature=float(sampling.temperature),
        top_p=float(sampling.top_p), top_k=sampling.top_k, prompt_set=prompt_set, positions=count,
        method=method, mc_samples=mc_samples if method == "teacher" and not sampling.greedy else 0,
        date=now_iso(), version=library_version(),
    )


def _encode(pair, prompt, chat: bool) -> list[int]:
    if isinstance(prompt, str):
        prompt = pair.encode_prompt(prompt, chat=chat)
    out = [int(t) for t in (prompt.flatten().tolist() if isinstance(prompt, torch.Tensor) else prompt)]
    if not out:
        raise ValueError("a prompt encoded to no tokens")
    return out


def _teacher(pair, prompts, sampling, width, max_new, gen, mc_samples, tail, tick):
    """Per-position success probabilities of every rank, averaged over all positions."""
    vocab = min(int(m.config.vocab_size) for m in (pair.draft, pair.target))
    rows = []  # each [L, W]: P(rank-k child is the accepted one) at each position
    for prompt in prompts:
        # The target's logits come from its own decoding steps: no second forward over the continuation.
        cont, p_logits = target_continuation(pair.target, prompt, sampling, max_new, gen, _eos(pair), vocab,
                                             return_logits=True)  # [L], [L, V]
        q_logits = _logits_over(pair.draft, prompt, cont, vocab)   # [L, V]
        if sampling.greedy:
            rows.append(greedy_rank_hits(p_logits, q_logits, width))
        else:
            rows.append(sampled_rank_probs(warp(p_logits, sampling), warp(q_logits, sampling),
                                           width, mc_samples, gen, tail))
        tick(f"{len(cont)} positions")
    per_pos = torch.cat(rows)  # [positions, W]
    n = per_pos.shape[0]
    values = per_pos.mean(0)
    stderr = per_pos.std(0, unbiased=True) / math.sqrt(n) if n > 1 else torch.zeros_like(values)
    return tuple(values.tolist()), tuple(stderr.tolist()), n


def _eos(pair) -> set[int]:
    return set(getattr(pair, "eos_token_ids", ()) or ())


@torch.inference_mode()
def target_continuation(model, prompt: list[int], sampling: SamplingConfig, max_new: int,
                        gen: torch.Generator, eos: set[int], vocab: int, return_logits: bool = False):
    """Plain autoregressive continuation by ``model`` (stops after an EOS token).

    Returns the tokens, and with ``return_logits`` also the float32 logits that
    predicted each of them ([len(tokens), vocab], on the CPU).
    """
    device = next(model.parameters()).device
    cache = KVCache(model.config)
    ids = torch.tensor([prompt], device=device)  # [1, T]
    out: list[int] = []
    kept: list[torch.Tensor] = []
    for _ in range(max_new):
        logits = model(input_ids=ids, past_key_values=cache.cache, use_cache=True,
                       logits_to_keep=1).logits[0, -1, :vocab]  # [V]
        if return_logits:
            kept.append(logits.float().cpu())
        tok = int(logits.argmax()) if sampling.greedy else sample_token(warp(logits, sampling), gen)
        out.append(tok)
        if tok in eos:
            break
        ids = torch.tensor([[tok]], device=device)
    return (out, torch.stack(kept)) if return_logits else out


@torch.inference_mode()
def _logits_over(model, prompt: list[int], cont: list[int], vocab: int) -> torch.Tensor:
    """Logits predicting each continuation token, from one forward.  # [len(cont), V] float32"""
    device = next(model.parameters()).device
    ids = torch.tensor([prompt + cont[:-1]], device=device)  # the last token is never a context
    logits = model(input_ids=ids, logits_to_keep=len(cont)).logits[0, :, :vocab]
    return logits.float().cpu()


def greedy_rank_hits(p_logits: torch.Tensor, q_logits: torch.Tensor, width: int) -> torch.Tensor:
    """One-hot [L, W]: the target's argmax is the draft's k-th ranked token.  logits: [L, V]"""
    if p_logits.ndim != 2 or p_logits.shape != q_logits.shape:
        raise ValueError(f"logits must both be [L, V], got {tuple(p_logits.shape)} and {tuple(q_logits.shape)}")
    target = p_logits.argmax(-1, keepdim=True)                          # [L, 1]
    rank = (q_logits > q_logits.gather(-1, target)).sum(-1)             # [L] tokens the draft ranks higher
    hits = torch.zeros(p_logits.shape[0], width)
    inside = rank < width
    hits[inside.nonzero()[:, 0], rank[inside]] = 1.0
    return hits


def sampled_rank_probs(p: torch.Tensor, q: torch.Tensor, width: int, samples: int,
                       gen: torch.Generator, tail: float = 1e-4) -> torch.Tensor:
    """P(rank-k child is the first accepted) at each position.  p, q: [L, V] -> [L, W].

    Rank 1 is exact (sum_x min(p, q)); ranks >= 2 are (1 - p_1) times the Monte Carlo
    frequency of rank k among the draws whose first child was rejected.
    """
    if p.ndim != 2 or p.shape != q.shape:
        raise ValueError(f"p and q must both be [L, V], got {tuple(p.shape)} and {tuple(q.shape)}")
    out = torch.zeros(p.shape[0], width)
    out[:, 0] = torch.minimum(p, q).sum(-1)
    if width > 1:
        for lo in range(0, p.shape[0], 16):  # chunks bound the [rows * samples, kept] working set
            ps, qs = _truncate(p[lo:lo + 16], q[lo:lo + 16], tail)
            first = _first_accepted(ps.repeat_interleave(samples, 0), qs.repeat_interleave(samples, 0), width, gen)
            hits = torch.nn.functional.one_hot(first + 1, width + 1)[:, 2:].float()  # [rows*S, W-1] ranks >= 2
            hits = hits.view(ps.shape[0], samples, width - 1).sum(1)                 # [rows, W-1]
            rejected = (first != 0).view(ps.shape[0], samples).sum(1, keepdim=True)  # [rows, 1]
            # P(rank k) = P(rank 1 rejected) * P(rank k | rank 1 rejected): the exact first factor
            # times a Monte Carlo ratio keeps every row's total <= 1.
            out[lo:lo + 16, 1:] = (1.0 - out[lo:lo + 16, :1]) * hits / rejected.clamp(min=1)
    return out


def _truncate(p: torch.Tensor, q: torch.Tensor, tail: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Keep the top tokens by p + q holding all but ``tail`` of each row's mass; lump the rest.  -> [L, m+1]"""
    both = p + q                                                        # [L, V]
    order = both.argsort(-1, descending=True)
    mass = both.gather(-1, order).cumsum(-1)                            # [L, V]
    m = int((mass < 2.0 * (1.0 - tail)).sum(-1).max()) + 1
    idx = order[:, : min(m, p.shape[-1])]                               # [L, m]
    ps, qs = p.gather(-1, idx), q.gather(-1, idx)
    ps = torch.cat([ps, (1.0 - ps.sum(-1, keepdim=True)).clamp(min=0.0)], -1)
    qs = torch.cat([qs, (1.0 - qs.sum(-1, keepdim=True)).clamp(min=0.0)], -1)
    return ps / ps.sum(-1, keepdim=True), qs / qs.sum(-1, keepdim=True)


def _first_accepted(p: torch.Tensor, q: torch.Tensor, width: int, gen: torch.Generator) -> torch.Tensor:
    """Vectorised :func:`sequoia.core.sampling.verify_children` (without replacement).  p, q: [R, V] -> [R] rank or -1."""
    drawn = sample_children(q, width, "without_replacement", gen)       # [R, W] Gumbel-top-k order
    u = torch.rand(drawn.shape, generator=gen)                          # [R, W]
    first = torch.full((p.shape[0],), -1, dtype=torch.long)
    live = torch.ones(p.shape[0], dtype=torch.bool)                     # not yet decided
    r, q = p.clone(), q.clone()
    for k in range(drawn.shape[1]):
        x = drawn[:, k:k + 1]                                           # [R, 1]
        qx, px = q.gather(-1, x)[:, 0], r.gather(-1, x)[:, 0]
        live &= qx > _TINY                                              # q's support is used up: no more children
        accept = live & (u[:, k] * qx < px)
        first[accept] = k
        live &= ~accept
        residual = (r - q).clamp(min=0.0)
        total = residual.sum(-1, keepdim=True)
        residual = torch.where(total > _TINY, residual / total.clamp(min=_TINY), r)
        r = torch.where(live[:, None], residual, r)
        q = q.scatter(-1, x, 0.0)
        q = q / q.sum(-1, keepdim=True).clamp(min=_TINY)
    return first


def _decode(pair, prompts, sampling, width, max_new, gen, mc_samples, tail, tick):
    """Real speculative decoding with a root of ``width`` children (one verified parent per step)."""
    from ..core.stats import rank_counts
    from .drafter import StaticTreeProposer
    from .engine import SpeculativeEngine

    engine = SpeculativeEngine(pair)
    proposer = StaticTreeProposer(Tree.k_ary(width, 1), name="acceptance")
    records = []
    for prompt in prompts:
        seed = int(torch.randint(2**31 - 1, (1,), generator=gen))
        cfg = GenerationConfig(max_new_tokens=max_new, sampling=sampling, seed=seed)
        records.extend(engine.generate(prompt, proposer, cfg, with_texts=False))
        tick(f"{len(records)} steps")
    accepts, parents = rank_counts(records, width)
    values = tuple(a / n if n else 0.0 for a, n in zip(accepts, parents))
    stderr = tuple(math.sqrt(v * (1 - v) / n) if n else 0.0 for v, n in zip(values, parents))
    return values, stderr, parents[0]
