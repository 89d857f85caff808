"""The decoding loop shared by every method.

One step: the proposer grows a draft tree (:mod:`sequoia.runtime.drafter`); the target
scores the whole tree in ONE forward with a tree attention mask and explicit
position ids; the walk in :func:`walk` accepts a path plus one bonus token
(:mod:`sequoia.core.sampling`); both KV caches are compacted to the accepted path;
the step is yielded as a :class:`~sequoia.core.trace.StepRecord`.

Step 0 is the prompt's forward: the target prefills the whole prompt and the
first token is drawn from its last row, exactly as the target alone draws it
(a plain step, no draft).  Drafting starts at step 1, from a root the target
chose: one target call fewer than prefilling all but the last prompt token and
verifying a tree from there, and no tree spent on the first token of an answer,
which a draft guesses worst (an opening fence or greeting it has no context for).

The engine sees token ids only: records leave their text fields empty, and a
generation ends at a stop string through the caller's ``stop`` test over the new
ids (:mod:`sequoia.runtime.texts` decodes both at the edge).

Cache invariant between steps: the target cache holds every committed token
but the last (the next root); the draft cache holds a prefix of them.

The engine drives a :class:`~sequoia.runtime.drafter.Proposer`: ``start()`` at the
beginning of a generation, ``wants_draft()`` before each step (False: a plain
target step, no draft forward), ``propose()``, and ``observe(record)`` after it.

Step timings (draft / verify / other) read the engine's ``clock`` (wall time by
default); a caller timing a whole run with another clock passes the same one.
On CUDA the phase boundaries are CUDA events, read once at the end of a step
(after the step's last readback), so timing adds no host wait of its own.
"""

from __future__ import annotations

import bisect
import dataclasses
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache

import torch

from ..core.config import MAX_PROMPT_TOKENS, GenerationConfig, SamplingConfig
from ..core.sampling import sample_token, verify_children, verify_greedy, warp
from ..core.checks import bonus_check, greedy_checks, sampled_checks
from ..core.trace import ACCEPTED, REJECTED, UNREACHED, NodeCheck, StepRecord
from ..core.tree import Tree
from ..runners.base import Session
from .device_walk import can_walk_on_device, walk_on_device
from .drafter import Draft, Drafter, Proposer
from ..runners.base import shared_vocab, upload

_DISPLAY = SamplingConfig(temperature=1.0)  # at T=0, show the models' raw confidence


@dataclass
class Walk:
    path: list[int]                   # accepted node indices, root first
    bonus: int
    verified: set[int]                # nodes the target looked at
    checks: list[NodeCheck] | None = None  # what each test saw (walk_tree(..., inspect=True) only)


class SpeculativeEngine:
    """Runs any :class:`~sequoia.runtime.drafter.Proposer` against a draft/target pair."""

    def __init__(self, pair, clock: Callable[[], float] = time.perf_counter, device_walk: bool | None = None) -> None:
        self.pair = pair
        self.clock = clock                # seconds; read after draining the GPU queue (see _now)
        self.device = torch.device(pair.device)
        # The sampled walk verifies every node at once on the device and reads back once (device_walk.py):
        # on a GPU that saves a host wait per tested child; on a CPU the host walk does less work.
        self.device_walk = self.device.type == "cuda" if device_walk is None else device_walk
        self.vocab_size = shared_vocab(pair)

    def generate(
        self,
        prompt_ids: list[int],
        proposer: Proposer,
        config: GenerationConfig,
        should_stop: Callable[[], bool] | None = None,
        stop: Callable[[Sequence[int]], bool] | None = None,
        inspect: bool = False,
    ) -> Iterator[StepRecord]:
        """Yield one record per step; ``inspect`` also records what verification saw (``record.checks``).

        ``should_stop()`` is polled after each yield (a cancelled request); ``stop(new_ids)`` sees every
        token generated so far after each step and ends the generation there (finish reason "stop").
        """
        self._check_request(prompt_ids, proposer, config, stop)
        gen = torch.Generator(device=self.device).manual_seed(config.seed)
        state = _State(list(prompt_ids), self.pair.target.session(),
                       Drafter(self.pair.draft, config.sampling, self.vocab_size), stop)
        proposer.start()
        record = self._first_step(state, proposer, config, gen, inspect)
        step = 0
        while True:
            proposer.observe(record)
            yield record
            if record.finished or (should_stop is not None and should_stop()):
                return
            step += 1
            record = self._step(state, proposer, config, gen, step, inspect)

    def _now(self):
        """A phase boundary: a recorded CUDA event on a GPU (resolved in _conclude), else the clock's reading."""
        if self.device.type == "cuda":
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return self.clock()

    # ------------------------------------------------------------------ a step
    def _first_step(self, state, proposer, config, gen, inspect) -> StepRecord:
        """Step 0: the prompt's forward, whose last row gives the first token (a plain target step)."""
        n_prompt = len(state.committed)
        t0 = self._now()
        logits = self._prefill(state)
        t1 = self._now()
        draft, walk, p = self._walk(_plain(state), logits, config, proposer, gen, inspect)
        record = self._conclude(0, state, draft, p, walk, config, proposer, t0, t0, t1)
        return dataclasses.replace(record, prompt_tokens=n_prompt)

    def _step(self, state, proposer, config, gen, step, inspect=False) -> StepRecord:
        t0 = self._now()
        draft = self._draft(state, proposer, gen)
        t1 = self._now()
        if draft.unread and not getattr(self.pair.target, "device_tokens", False):
            draft, _, _ = _read_back(draft)   # a target that takes host tokens: read the draft now
        logits = self._verify_forward(state, draft)
        t2 = self._now()
        draft, walk, p = self._walk(draft, logits, config, proposer, gen, inspect)
        prefix = len(state.target) - draft.tree.n_nodes
        state.target.keep(prefix, [prefix + v for v in walk.path])
        if draft.tree.size:
            state.drafter.commit(walk.path)
        return self._conclude(step, state, draft, p, walk, config, proposer, t0, t1, t2)

    def _walk(self, draft: Draft, logits: torch.Tensor, config, proposer, gen, inspect):
        """(draft, walk, p): the accepted path and each node's target probability, read back from the device
        once, with the draft's tokens where they are still there (a host walk at T > 0 reads as it tests)."""
        sampling = config.sampling
        probs = node_target_probs(draft, logits, sampling)                        # [n_nodes - 1] on the device
        if self.device_walk and can_walk_on_device(draft, sampling, inspect):
            pending = walk_on_device(draft, logits, sampling, proposer.mode, gen)
            draft, values, p = _read_back(draft, pending.values, probs)
            return draft, Walk(*pending.finish(values)), p
        top = logits.argmax(-1) if sampling.greedy else None
        draft, values, p = _read_back(draft, top, probs)
        return draft, walk_tree(draft, logits, sampling, proposer.mode, gen, inspect, top=values if sampling.greedy else None), p

    def _conclude(self, step, state, draft, p, walk, config, proposer, t0, t1, t2) -> StepRecord:
        """Commit the walk's tokens and make the step's record; t0..t2: start, drafted, verified."""
        new, reason = self._commit(state, draft, walk, config)
        record = self._record(step, draft, p, walk, new, reason, proposer)
        t3 = self._now()
        if self.device.type == "cuda":   # events: one wait for the last, then the GPU timeline's gaps
            t3.synchronize()
            return _with_times(record, *(a.elapsed_time(b) / 1e3 for a, b in ((t0, t1), (t1, t2), (t2, t3))))
        return _with_times(record, t1 - t0, t2 - t1, t3 - t2)

    def _draft(self, state, proposer, gen) -> Draft:
        if not proposer.wants_draft():
            # No draft forward at all; the draft cache catches up at the next begin().
            return _plain(state)
        if proposer.wants_draft_model():
            state.drafter.begin(state.committed)
        else:  # proposals from the context alone (copied n-grams): no draft forward this step
            state.drafter.skip(state.committed)
        return proposer.propose(state.drafter, gen)

    def _verify_forward(self, state, draft: Draft) -> torch.Tensor:
        """Target logits at every node, from one forward of the whole tree.  # [n_nodes, V]

        The root (the last committed token, not cached yet) hangs off the last cached slot; every other
        node off its parent's slot in this same call.
        """
        start = len(state.target)
        parents = [start - 1] + [start + p for p in draft.tree.parents[1:]]
        tokens = draft.token_ids if draft.unread else draft.tokens
        return state.target.forward(tokens, parents)[:, : self.vocab_size]

    def _prefill(self, state) -> torch.Tensor:
        """Forward the whole prompt as a chain; the target's logits at its last token.  # [1, V]"""
        # keep=1: no output head over all rows but the last (a row costs as much as a whole layer stack's
        # worth of a token on a compute-bound CPU).
        return state.target.forward(state.committed, keep=1)[:, : self.vocab_size]

    # ------------------------------------------------------------- bookkeeping
    def _commit(self, state, draft: Draft, walk: Walk, config: GenerationConfig):
        new = [draft.tokens[v] for v in walk.path[1:]] + [walk.bonus]
        reason = None
        eos = set(self.pair.eos_token_ids) if config.stop_at_eos else set()
        for i, tok in enumerate(new):
            if tok in eos:
                new, reason = new[: i + 1], "eos"
                break
        room = config.max_new_tokens - state.n_new
        if len(new) >= room:
            new, reason = new[:room], reason or "length"
        state.committed.extend(new)
        state.n_new += len(new)
        if reason is None and state.stop is not None and state.stop(state.committed[-state.n_new:]):
            reason = "stop"
        return tuple(new), reason

    def _record(self, step, draft, p, walk, new, reason, proposer) -> StepRecord:
        tree = draft.tree
        on_path = set(walk.path)
        status = tuple(ACCEPTED if v in on_path else REJECTED if v in walk.verified else UNREACHED
                       for v in range(tree.n_nodes))
        return StepRecord(
            step=step, tree=tree, tokens=tuple(draft.tokens), texts=(),
            q=tuple(draft.q_token), p=p,
            accepted=tuple(walk.path), status=status, bonus=walk.bonus,
            bonus_text="", checks=tuple(walk.checks) if walk.checks is not None else (),
            new_tokens=new, draft_s=0.0, verify_s=0.0, other_s=0.0,
            method=proposer.name, finished=reason is not None,
            finish_reason=reason, dynamic=draft.dynamic, sources=draft.sources or (),
            match_len=draft.match_len or (),
        )

    def _check_request(self, prompt_ids, proposer, config, stop) -> None:
        if config.stop_strings and stop is None:
            # Stop strings are text: only the caller can test them (sequoia.runtime.texts.stop_test).
            raise ValueError("config.stop_strings needs a stop test over the new ids (generate(..., stop=...))")
        if not prompt_ids:
            raise ValueError("the prompt is empty")
        if len(prompt_ids) > MAX_PROMPT_TOKENS:
            raise ValueError(f"the prompt has {len(prompt_ids)} tokens; the maximum is {MAX_PROMPT_TOKENS}")
        limit = self.pair.target.max_context
        need = len(prompt_ids) + config.max_new_tokens + proposer.max_nodes
        if limit and need > limit:
            raise ValueError(f"prompt + max_new_tokens + tree ({need} positions) exceeds the target's "
                             f"context of {limit}")


def _plain(state) -> Draft:
    """A step without draft tokens: the target alone at the last committed token."""
    return Draft(tree=Tree.root_only(), tokens=[state.committed[-1]], q={}, q_token=[1.0])


@dataclass
class _State:
    committed: list[int]
    target: Session                   # the target's cache: every committed token but the last
    drafter: Drafter
    stop: Callable[[Sequence[int]], bool] | None = None   # the caller's stop test over the new ids
    n_new: int = 0


def walk_tree(draft: Draft, logits: torch.Tensor, sampling: SamplingConfig, mode: str, gen,
              inspect: bool = False, top: list[int] | None = None) -> Walk:
    """Accept a path from the root and draw the bonus token.  logits: [n_nodes, V] target.

    ``inspect`` fills ``Walk.checks`` (same random draws, same result); ``top``: each node's target argmax
    (greedy), where the caller read it back already.
    """
    tree, node, path, verified = draft.tree, 0, [0], set()
    checks: list[NodeCheck] | None = [] if inspect else None
    # One readback of every node's argmax, not one per node on the path (each is a host wait on a GPU).
    if sampling.greedy and top is None:
        top = logits.argmax(-1).tolist()
    while True:
        kids = list(tree.children[node])
        kid_tokens = [draft.tokens[c] for c in kids]
        if sampling.greedy:
            target = top[node]
            idx, bonus_dist = verify_greedy(target, kid_tokens), None
            verified.update(kids if idx is None else kids[: idx + 1])
            if checks is not None:  # the raw softmax, to show how sure each model was
                bonus_dist = warp(logits[node], _DISPLAY)
                checks += greedy_checks(node, kids, kid_tokens, idx, bonus_dist, draft.q.get(node))
        else:
            p = warp(logits[node], sampling)
            events = [] if checks is not None else None
            idx, bonus_dist = (verify_children(p, draft.q.get(node), kid_tokens, mode, gen, events,
                                               n_fixed=draft.n_fixed(node))
                               if kids else (None, p))
            verified.update(kids if idx is None else kids[: idx + 1])
            if checks is not None:
                checks += sampled_checks(node, kids, events or [])
        if idx is None:
            bonus = target if sampling.greedy else sample_token(bonus_dist, gen)
            if checks is not None:
                checks.append(bonus_check(node, tree.n_nodes, bonus, bonus_dist))
            return Walk(path=path, bonus=bonus, verified=verified, checks=checks)
        node = kids[idx]
        path.append(node)


def node_target_probs(draft: Draft, logits: torch.Tensor, sampling: SamplingConfig) -> torch.Tensor | None:
    """p of each node's token under its parent's target distribution, root excluded (None: the root alone).
    # [n_nodes - 1] on the device

    Only rows of nodes that have children are warped, and without top-k/top-p
    a token's probability is exp(logit / T - logsumexp): no [rows, V] softmax.
    Queued without a host wait; the engine reads it back with the walk.
    """
    tree = draft.tree
    if tree.size == 0:
        return None
    cfg = _DISPLAY if sampling.greedy else sampling
    # Chunks bound the [rows, V] float32 copy on a CPU; on a GPU one chunk saves a dozen launches per 32 rows.
    ix = _probs_index(tree, str(logits.device), 256 if logits.device.type == "cuda" else 32)
    tokens = draft.token_ids if draft.token_ids is not None else upload(torch.tensor(draft.tokens), logits.device)
    tok = tokens[ix.nodes]                                                     # [n - 1] by parent row
    pieces = []
    for rows, r, a, b in ix.chunks:
        part, t = logits[rows].float(), tok[a:b]
        if cfg.top_k or cfg.top_p < 1.0:
            pieces.append(warp(part, cfg)[r, t])
        else:
            part = part / cfg.temperature
            pieces.append(torch.exp(part[r, t] - torch.logsumexp(part, -1)[r]))
    out = torch.empty(tree.size, dtype=torch.float32, device=logits.device)
    out[ix.order] = torch.cat(pieces).float()
    return out


@dataclass(frozen=True)
class _ProbsIndex:
    """Where each node's probability is read: parent rows in chunks, nodes grouped by them (device tensors)."""

    nodes: torch.Tensor                                            # [n - 1] nodes, by parent row
    order: torch.Tensor                                            # [n - 1] their places in the output (node - 1)
    chunks: tuple[tuple[torch.Tensor, torch.Tensor, int, int], ...]   # (parent rows, row of each node, a, b)


@lru_cache(maxsize=64)
def _probs_index(tree: Tree, device: str, size: int) -> _ProbsIndex:
    # Worked out on the host once per tree shape: boolean masks or a unique on the device would each wait.
    rows_list = sorted(set(tree.parents[1:]))
    row_of = {p: i for i, p in enumerate(rows_list)}
    order = sorted(range(tree.size), key=lambda j: row_of[tree.parents[j + 1]])   # nodes - 1, by parent row
    inv_sorted = [row_of[tree.parents[j + 1]] for j in order]
    dev = torch.device(device)
    chunks = []
    for lo in range(0, len(rows_list), size):
        a, b = bisect.bisect_left(inv_sorted, lo), bisect.bisect_left(inv_sorted, lo + size)
        host = torch.tensor([v - lo for v in inv_sorted[a:b]], dtype=torch.long)
        chunks.append((upload(torch.tensor(rows_list[lo: lo + size], dtype=torch.long), dev), upload(host, dev), a, b))
    both = upload(torch.tensor([[j + 1 for j in order], order], dtype=torch.long), dev)
    return _ProbsIndex(both[0], both[1], tuple(chunks))


def _read_back(draft: Draft, ints: torch.Tensor | None = None, probs: torch.Tensor | None = None):
    """The step's one readback: ``ints`` (e.g. the walk's values), ``probs`` ([n_nodes - 1], see
    :func:`node_target_probs`) and the draft's tokens and q where still on the device.  (draft, ints, p)."""
    parts = [x for x in (ints, probs) if x is not None and x.numel()]
    if draft.unread:
        parts += [draft.token_ids, draft.q_token_ids]
    if len({x.dtype for x in parts}) > 1:
        parts = [x.double() for x in parts]   # ids below 2**53 and float32 values are exact in float64
    back = (parts[0] if len(parts) == 1 else torch.cat(parts)).tolist() if parts else []
    a = 0 if ints is None else ints.numel()
    b = a + (0 if probs is None else probs.numel())
    if draft.unread:
        draft = draft.read(back[b:])
    return draft, [int(x) for x in back[:a]], (1.0,) + tuple(back[a:b])


def _with_times(record: StepRecord, draft_s: float, verify_s: float, other_s: float) -> StepRecord:
    return dataclasses.replace(record, draft_s=draft_s, verify_s=verify_s, other_s=other_s)


def sync(device) -> None:
    """Drain the GPU queue: honest times of a GPU run need it (a no-op on CPU)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
