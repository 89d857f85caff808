"""Step mode: one target call replayed phase by phase, from its :class:`~sequoia.core.statistics.trace.StepRecord`.

A live run streams a dozen steps in seconds; a class needs one at a time, each part of the step in turn:

``draft``     the draft grows the tree one level per forward (level 1, 2, ... of the tree on screen);
``verify``    the target scores every node in one forward (the tree mask: each node sees its ancestors);
``test``      one child's test, in verification order: u against min(1, p/q) (at T=0: is it the argmax?);
``residual``  after a rejection, what the target's distribution becomes: norm(max(p − q, 0));
``bonus``     the token the target draws after the accepted path, and what the call commits.

Everything shown is read from the record: the tree, the tokens, and the checks verification recorded
(``generate(..., inspect=True)``, as the Live tab decodes); a record without checks shows the walk's outcome
at once.  :func:`phases` lists a record's phases, :func:`figure` and :func:`markdown` draw one, and
:func:`advance` moves the cursor; all pure (the Gradio wiring is :mod:`components.live.live_teaching`).
"""

from __future__ import annotations

from dataclasses import dataclass

import plotly.graph_objects as go

from sequoia.core.statistics.trace import ACCEPTED, REJECTED, NodeCheck, StepRecord
from sequoia.core.verification.sampling import acceptance_probability

from components.live import inspector_view
from components.widgets import tree_view
from components.widgets.tree_view import escape_token, label_length, visible

DRAFT, VERIFY, TEST, RESIDUAL, BONUS, WALK = "draft", "verify", "test", "residual", "bonus", "walk"
#: Node groups (legend names) of the phases before the walk has decided a node.
DRAFTED, SENT, WAITING = "drafted (q)", "in the target's forward", "not tested yet"
_GROUP_COLORS = {DRAFTED: "#ff7f0e", SENT: "#17becf", WAITING: "#b8b8b8"}
_CURRENT = "this phase"   # the ring on the node(s) a phase is about


@dataclass(frozen=True)
class Phase:
    """One screen of step mode."""

    kind: str                       # DRAFT, VERIFY, TEST, RESIDUAL, BONUS or WALK
    level: int = 0                  # DRAFT: the depth the tree has reached
    check: NodeCheck | None = None  # TEST / RESIDUAL: the child's test
    decided: int = 0                # TEST / RESIDUAL: how many children are decided (this one included)


def phases(record: StepRecord) -> tuple[Phase, ...]:
    """The phases of one target call, in the order they happened."""
    tree = record.tree
    if tree.size == 0:   # the prompt's forward, or a step that drafted nothing
        return Phase(VERIFY), Phase(BONUS)
    out = [Phase(DRAFT, level=d) for d in range(1, tree.depth + 1)] + [Phase(VERIFY)]
    tests = [c for c in record.checks if c.node < tree.n_nodes]
    if not tests:
        return (*out, Phase(WALK), Phase(BONUS))
    for i, c in enumerate(tests, start=1):
        out.append(Phase(TEST, check=c, decided=i))
        if not c.accepted and c.residual:
            out.append(Phase(RESIDUAL, check=c, decided=i))
    return (*out, Phase(BONUS))


def advance(step: int, phase: int, n_phases: int, n_records: int) -> tuple[int, int]:
    """The cursor after one press of Step: the next phase, else the next call's first, else where it is."""
    if phase + 1 < n_phases:
        return step, phase + 1
    if step + 1 < n_records:
        return step + 1, 0
    return step, phase


# ------------------------------------------------------------------------------------------- figures
def figure(record: StepRecord, phase: Phase) -> go.Figure:
    """The tree as this phase leaves it; the residual's bars (the inspector's figure) for a residual phase."""
    if phase.kind == RESIDUAL:
        return inspector_view.figure(record, phase.check.node)
    if phase.kind in (BONUS, WALK):
        return tree_view.figure(record)
    return _partial_tree(record, phase)


def _partial_tree(record: StepRecord, phase: Phase) -> go.Figure:
    tree = record.tree
    shown = tree.n_nodes if phase.kind != DRAFT else sum(1 for d in tree.depths if d <= phase.level)
    decided = {c.node: c.accepted for c in _tests(record)[:phase.decided]}
    groups = ["root"]
    for i in range(1, shown):
        if i in decided:
            groups.append(ACCEPTED if decided[i] else REJECTED)
        else:
            groups.append({DRAFT: DRAFTED, VERIFY: SENT}.get(phase.kind, WAITING))
    parents = tree.parents[:shown]
    texts = record.texts or tuple(str(t) for t in record.tokens)
    width = label_length(sum(1 for i in range(shown) if i not in set(parents)))
    labels = [escape_token(texts[i], width) for i in range(shown)]
    hovers = [f"node {i}: {escape_token(texts[i], 40)} · depth {tree.depths[i]}" for i in range(shown)]
    highlight = {(tree.parents[n], n) for n, ok in decided.items() if ok}
    return tree_view.draw_tree(parents, groups, labels, hovers, highlight, colors=_GROUP_COLORS,
                               title=_title(record, phase), ring=_ring(record, phase), ring_name=_CURRENT)


def _tests(record: StepRecord) -> list[NodeCheck]:
    return [c for c in record.checks if c.node < record.tree.n_nodes]


def _ring(record: StepRecord, phase: Phase) -> list[int]:
    if phase.kind == DRAFT:
        return list(record.tree.levels[phase.level])
    return [phase.check.node] if phase.check is not None else []


def _title(record: StepRecord, phase: Phase) -> str:
    tree = record.tree
    if phase.kind == DRAFT:
        return (f"step {record.step} · draft level {phase.level} of {tree.depth} · "
                f"{len(tree.levels[phase.level])} new, {sum(len(v) for v in tree.levels[1:phase.level + 1])} drafted")
    if phase.kind == VERIFY:
        return f"step {record.step} · one target forward over {tree.n_nodes} tokens"
    c = phase.check
    verdict = "accepted" if c.accepted else "rejected"
    if c.u is None:
        return f"step {record.step} · test of node {c.node} (T=0: the target's argmax?): {verdict}"
    _, _, chance, u = _printed(record, c)
    return f"step {record.step} · test of node {c.node} · u = {u} vs min(1, p/q) = {chance}: {verdict}"


def _chance(record: StepRecord, c: NodeCheck) -> float:
    """min(1, p/q) of a test, by the verifier's rule (a copied child is a point mass: q = 1)."""
    q = 1.0 if inspector_view.copied(record, c.node) else c.q_token
    return acceptance_probability(c.p_token, q) if q > 0 else 1.0


def _printed(record: StepRecord, c: NodeCheck) -> tuple[str, str, str, str]:
    """(p, q, min(1, p/q), u) of a test as printed: digits enough to redo it by hand
    (:func:`components.live.inspector_view.rule_numbers`)."""
    q = 1.0 if inspector_view.copied(record, c.node) else c.q_token
    return inspector_view.rule_numbers(c.p_token, q, c.u)


def next_rejection(records, step: int, phase: int) -> tuple[int, int] | None:
    """The (call, phase) of the first rejected test after ``(step, phase)``, wrapping to the run's start; None
    when the run rejected nothing (or its records hold no tests)."""
    spots = [(i, k) for i, rec in enumerate(records) for k, ph in enumerate(phases(rec))
             if ph.kind == TEST and not ph.check.accepted]
    if not spots:
        return None
    return next((spot for spot in spots if spot > (step, phase)), spots[0])


# ------------------------------------------------------------------------------------------- words
def markdown(record: StepRecord, index: int) -> str:
    """What phase ``index`` of ``record`` does, in plain words with the record's numbers."""
    all_phases = phases(record)
    phase = all_phases[index]
    head = f"**Target call {record.step} · phase {index + 1} of {len(all_phases)}: {_NAMES[phase.kind]}**"
    return f"{head}\n\n{_WORDS[phase.kind](record, phase)}"


_NAMES = {DRAFT: "the draft grows the tree", VERIFY: "the target verifies", TEST: "a child's test",
          RESIDUAL: "the residual", BONUS: "the bonus token", WALK: "the walk"}


def _draft_words(record: StepRecord, phase: Phase) -> str:
    tree = record.tree
    new = tree.levels[phase.level]
    parents = sorted({tree.parents[i] for i in new})
    words = ", ".join(f"`{visible(record.texts[i])}`" for i in new[:8]) if record.texts else ""
    text = (f"One draft forward over {_count(len(parents), 'node')} of depth {phase.level - 1} gives q at each, "
            f"and {_count(len(new), 'child token')} {'is' if len(new) == 1 else 'are'} drawn from it"
            f"{': ' + words if words else ''}"
            f"{' …' if len(new) > 8 else ''}. Children of one node are drawn in sampling order; the first "
            "(leftmost) is tested first.")
    if phase.level == tree.depth:
        text += f" The tree is complete: {tree.size} drafted tokens in {record.draft_s * 1000:.0f} ms of drafting."
    return text


def _verify_words(record: StepRecord, phase: Phase) -> str:
    if record.prompt_tokens:
        return (f"The target reads the prompt ({record.prompt_tokens} tokens) in one forward and draws the first "
                f"token from its last row ({record.verify_s * 1000:.0f} ms). Nothing is drafted yet.")
    if record.tree.size == 0:
        return (f"Nothing was drafted this call: the target reads one token and draws the next "
                f"({record.verify_s * 1000:.0f} ms), as the target alone would.")
    return (f"The target reads all {record.tree.n_nodes} tokens (the root and {record.tree.size} drafts) in **one** "
            "forward: each node attends to its ancestors only (the tree mask), at the position of its depth, so "
            f"this one call gives the target's p after every node ({record.verify_s * 1000:.0f} ms). The walk "
            "below decides which drafts to keep.")


def _test_words(record: StepRecord, phase: Phase) -> str:
    c = phase.check
    who = (f"Node {c.node} ({inspector_view.child_name(record, c.node)} of node {c.parent}), "
           + _token(record, c.node))
    if c.u is None:
        if c.accepted:
            return f"{who}: at T=0 a child passes when it is the target's most likely token. It is: **accepted**."
        return f"{who}: at T=0 a child passes when it is the target's most likely token. It is not: **rejected**."
    p, q, chance, u = _printed(record, c)
    rule = f"u = {u} against min(1, p/q) = min(1, {p} / {q}) = {chance}{inspector_view.zero_p(c.p_token)}"
    if c.accepted:
        return f"{who}: {rule}. u is below: **accepted**; its own children are tested next."
    return f"{who}: {rule}. u is not below: **rejected**."


def _residual_words(record: StepRecord, phase: Phase) -> str:
    c = phase.check
    siblings = record.tree.children[c.parent]
    later = [s for s in siblings if siblings.index(s) > siblings.index(c.node) and record.status[s] != "unreached"]
    then = (f"node {later[0]}, the next sibling, is tested against it" if later
            else "no sibling is left to test, so the bonus token is drawn from it")
    return (f"After rejecting {_token(record, c.node)}, the target's distribution at node {c.parent} becomes the "
            "residual norm(max(p − q, 0)) (purple bars): tokens the draft over-offered lose their mass, so the "
            f"output stays distributed exactly as p. Then {then}.")


def _bonus_words(record: StepRecord, phase: Phase) -> str:
    n_acc = record.n_accepted
    commits = (f"This call commits {record.n_new} token{'s' if record.n_new != 1 else ''}: {n_acc} accepted "
               f"draft{'s' if n_acc != 1 else ''} and the target's own token.")
    if record.checks:
        return inspector_view.explain(record, record.tree.n_nodes).split("\n\n", 1)[1] + "\n\n" + commits
    return f"The target draws one more token, `{visible(record.bonus_text)}`, after the accepted path. {commits}"


def _walk_words(record: StepRecord, phase: Phase) -> str:
    return (f"The walk accepted {record.n_accepted} of {record.tree.size} drafts (green path). This step was "
            "recorded without each test's numbers; decode on the Live tab to see them one by one.")


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _token(record: StepRecord, node: int) -> str:
    return f"`{visible(record.texts[node])}`" if record.texts else f"token {record.tokens[node]}"


_WORDS = {DRAFT: _draft_words, VERIFY: _verify_words, TEST: _test_words, RESIDUAL: _residual_words,
          BONUS: _bonus_words, WALK: _walk_words}
