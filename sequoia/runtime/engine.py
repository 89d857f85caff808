"""The decoding loop shared by every method.

One step: the proposer grows a draft tree (:mod:`sequoia.runtime.drafter`); the target
scores the whole tree in ONE forward with a tree attention mask and explicit
position ids; :func:`~sequoia.runtime.verify.verify_tree` walks the tree by
:mod:`sequoia.core.verification.sampling`'s rule to an accepted path plus one bonus token and
reads the step back from the device once; both KV caches are compacted to the
accepted path; the step is yielded as a :class:`~sequoia.core.statistics.trace.StepRecord`.

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

import dataclasses
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import torch

from ..core.config import MAX_PROMPT_TOKENS, GenerationConfig
from ..core.statistics.trace import ACCEPTED, REJECTED, UNREACHED, StepRecord
from ..core.trees.tree import Tree
from ..runners.base import Session, shared_vocab
from .drafter import Draft, Drafter, Proposer, Stopped, forward_chain
from .lease import ModelLease
from .verify import Walk, read_draft, verify_tree


class SpeculativeEngine:
    """Runs any :class:`~sequoia.runtime.drafter.Proposer` against a draft/target pair."""

    def __init__(self, pair, clock: Callable[[], float] = time.perf_counter, device_walk: bool | None = None) -> None:
        self.pair = pair
        self.clock = clock                # seconds; read after draining the GPU queue (see _now)
        self.device = torch.device(pair.device)
        # The sampled walk verifies every node at once on the device (verify.py's device walk):
        # on a GPU that saves a host wait per tested child; on a CPU the host walk does less work.
        self.device_walk = self.device.type == "cuda" if device_walk is None else device_walk
        self.vocab_size = shared_vocab(pair)
        self.lock = model_lock(pair)

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
        # The generation owns the pair's runners from its first step to its last (their sessions live across
        # steps: another session on a llama.cpp runner would clear this one's cache).  The lease is not tied to a
        # thread: a streamed generation is resumed on whichever worker thread the server picks, and each step
        # runs on behalf of this generation there.  A caller that holds the lease in this thread (the profiler's
        # own engine steps) lends it; a reader that stops iterating frees it when the generator is closed.
        lease = self.lock
        owner = (lease.held_here() or object()) if isinstance(lease, ModelLease) else None
        if owner is not None:
            lease.acquire(owner)
        try:
            with _acting(lease, owner):
                drafter = Drafter(self.pair.draft, config.sampling, self.vocab_size, should_stop)
                state = _State(list(prompt_ids), self.pair.target.session(), drafter, stop, should_stop)
                proposer.start()
                record = self._first_step(state, proposer, config, gen, inspect)
            step = 0
            while True:
                proposer.observe(record)
                yield record
                if record.finished or (should_stop is not None and should_stop()):
                    return
                step += 1
                with _acting(lease, owner):
                    record = self._step(state, proposer, config, gen, step, inspect)
        except Stopped:   # Stop in the middle of a long prompt's forward: the generation ends there
            return
        finally:
            if owner is not None:
                lease.release(owner)

    def _step(self, state, proposer, config, gen, step, inspect=False) -> StepRecord:
        """Draft a tree, score it in one target forward, verify it, keep the accepted path in both caches."""
        t0 = self._now()
        draft = self._draft(state, proposer, gen)
        t1 = self._now()
        if draft.unread and not getattr(self.pair.target, "device_tokens", False):
            draft = read_draft(draft)   # a target that takes host tokens: read the draft now
        logits = self._verify_forward(state, draft)                                   # [n_nodes, V]
        t2 = self._now()
        draft, walk, p = verify_tree(draft, logits, config.sampling, proposer.mode, gen, inspect, self.device_walk)
        prefix = len(state.target) - draft.tree.n_nodes
        state.target.keep(prefix, [prefix + v for v in walk.path])
        if draft.tree.size:
            state.drafter.commit(walk.path)
        return self._conclude(step, state, draft, p, walk, config, proposer, t0, t1, t2)

    def _first_step(self, state, proposer, config, gen, inspect) -> StepRecord:
        """Step 0: the prompt's forward, whose last row gives the first token (a plain target step)."""
        n_prompt = len(state.committed)
        t0 = self._now()
        logits = self._prefill(state)                                                 # [1, V]
        t1 = self._now()
        draft, walk, p = verify_tree(_plain(state), logits, config.sampling, proposer.mode, gen, inspect,
                                     self.device_walk)
        record = self._conclude(0, state, draft, p, walk, config, proposer, t0, t0, t1)
        return dataclasses.replace(record, prompt_tokens=n_prompt)

    def _conclude(self, step, state, draft, p, walk, config, proposer, t0, t1, t2) -> StepRecord:
        """Commit the walk's tokens and make the step's record; t0..t2: start, drafted, verified."""
        new, reason = self._commit(state, draft, walk, config)
        record = self._record(step, draft, p, walk, new, reason, proposer)
        t3 = self._now()
        if self.device.type == "cuda":   # events: one wait for the last, then the GPU timeline's gaps
            t3.synchronize()
            return _with_times(record, *(a.elapsed_time(b) / 1e3 for a, b in ((t0, t1), (t1, t2), (t2, t3))))
        return _with_times(record, t1 - t0, t2 - t1, t3 - t2)

    def _now(self):
        """A phase boundary: a recorded CUDA event on a GPU (resolved in _conclude), else the clock's reading."""
        if self.device.type == "cuda":
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return self.clock()

    # ------------------------------------------------------------------ a step's parts
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
        # worth of a token on a compute-bound CPU).  A long prompt goes in chunks, Stop read between two.
        return forward_chain(state.target, state.committed, state.should_stop)[:, : self.vocab_size]

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
    should_stop: Callable[[], bool] | None = None          # the caller's Stop, read between chunks of a prompt
    n_new: int = 0


def _with_times(record: StepRecord, draft_s: float, verify_s: float, other_s: float) -> StepRecord:
    return dataclasses.replace(record, draft_s=draft_s, verify_s=verify_s, other_s=other_s)


def model_lock(pair, background: bool = False) -> AbstractContextManager:
    """The pair's one owner of model work (``ModelPair.lock``, a :class:`~sequoia.runtime.lease.ModelLease`),
    held by the current thread: requests' generations, the profiler's measurements and graph captures run on
    different threads over the same runners (one KV cache on llama.cpp, one slot cache and static graph inputs
    on a GPU).  ``background``: after every waiting visitor (the profiler).  A pair without one (a test's
    stand-in) locks nothing."""
    lease = getattr(pair, "lock", None)
    if lease is None:
        return nullcontext()
    return lease.background() if background and isinstance(lease, ModelLease) else lease


def _acting(lease, owner) -> AbstractContextManager:
    """A step run on behalf of its generation (which holds the lease), on whichever thread runs it; without a
    lease (a stand-in pair's lock, or none: ``model_lock`` gives a null context) the step holds ``lease`` itself."""
    return lease.acting(owner) if owner is not None else lease


def sync(device) -> None:
    """Drain the GPU queue: honest times of a GPU run need it (a no-op on CPU)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
