"""Every decoding method as a proposer for the one engine loop.

=================  ==========================================  ==================
name               tree                                        children drawn
=================  ==========================================  ==================
``ar``             root only (target alone)                    -
``chain``          a chain of ``budget`` tokens                 without replacement
``specinfer``      ``width`` independent chains, ``depth`` long  with replacement
``kary``           full ``width``-ary tree, ``depth`` levels     without replacement
``sequoia``        DP-optimal for the acceptance vector          without replacement
``sequoia-auto``   budget and depth chosen by the optimizer      without replacement
``sequoia-dynamic`` grown each step from the draft's confidence   without replacement
                   under the hardware profile (proposers.dynamic)
``file``           any tree from a JSON file                    without replacement
``ngram``          copied continuations of the context only      fixed (no draft model)
                   (proposers.ngram_proposer)
``sequoia-ngram``  copied branches + the dynamic tree, one        fixed, then without
                   cost model (proposers.ngram_dynamic)          replacement
=================  ==========================================  ==================

The automatic methods (``sequoia-auto``, ``sequoia-dynamic``, ``ngram``,
``sequoia-ngram``) run under the price gate (:mod:`sequoia.runtime.proposers.price`)
unless ``price=None``: they measure what their steps cost against the target
alone and back off to smaller trees, then to none, when drafting loses.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

from ..core.config import check_budget
from ..core.ngrams.ngram_acceptance import NgramAcceptance, ngram_prior
from ..core.profiles.calibration import Calibration
from ..core.profiles.cost import conservative_profile
from ..core.requests.request import ENGINE_METHODS, LABEL_OF, PRICED_METHODS, MethodSpec
from ..core.trees.dp import optimal_tree
from ..core.trees.optimizer import choose_tree
from ..core.trees.tree import Tree
from .drafter import StaticTreeProposer
from .proposers.dynamic import MAX_DEPTH, DynamicTreeProposer
from .proposers.ngram_dynamic import NgramDynamicProposer
from .proposers.ngram_proposer import NgramProposer, NgramSettings
from .proposers.price import PLAIN, SMALL, PriceGate, PriceSettings

#: Deepest static tree the hardware-aware optimizer may choose (``sequoia-auto``) unless asked otherwise.
STATIC_DEPTH = 16

# The registry (names, labels, what budget and depth mean per method) is pure data in sequoia.core.requests.request,
# so the page can read it without importing models; re-exported here for the CLI and the bench.
__all__ = ["ENGINE_METHODS", "LABEL_OF", "PRICED_METHODS", "STATIC_DEPTH", "DEFAULT_ACCEPTANCE", "make_method"]

#: Measured on the embedded pair (int8 draft, greedy, teacher-forced); used when
#: no acceptance vector is given.  See assets/acceptance/ for measured files.
DEFAULT_ACCEPTANCE = (0.797, 0.104, 0.048, 0.020, 0.010, 0.005)


#: Draft tokens a step when none is given (the other methods have no budget, or choose their own).
DEFAULT_BUDGET = {"chain": 4, "sequoia": 32, "sequoia-dynamic": 48, "sequoia-ngram": 48,
                  "ngram": NgramSettings().budget}
#: Levels of the fixed-shape trees when none is given.
DEFAULT_DEPTH = {"specinfer": 4, "kary": 4}


@dataclass(frozen=True)
class MethodArgs:
    """A method's arguments after defaults and checks: what each builder of :data:`BUILDERS` reads."""

    name: str
    budget: int | None
    depth: int | None
    width: int
    acceptance: tuple[float, ...]
    profile: object = None
    tree_path: str | None = None
    calibration: object = None
    copy_acceptance: NgramAcceptance | None = None
    price: PriceSettings | None = None


def make_method(
    name: str | MethodSpec,
    *,
    budget: int | None = None,
    depth: int | None = None,
    width: int = 2,
    acceptance=None,
    profile=None,
    tree_path: str | None = None,
    calibration=None,
    copy_acceptance: NgramAcceptance | None = None,
    price: PriceSettings | None = PriceSettings(),
):
    """Build a proposer; all parameters are validated here with readable errors.

    ``name``: a method name, or a :class:`~sequoia.core.requests.request.MethodSpec` (a parsed request's method), whose
    budget and depth mean what the registry says for that method (e.g. a chain of min(budget, depth) tokens,
    SpecInfer's budget // depth chains); its keywords then replace ``budget``, ``depth`` and ``width``.

    ``copy_acceptance``: the measured acceptance of copied tokens for ``ngram`` / ``sequoia-ngram``
    (:func:`sequoia.runtime.measuring.finder.find_ngram_acceptance`); None: the hand-set prior
    (:func:`sequoia.core.ngrams.ngram_acceptance.ngram_prior`).

    ``price``: how the automatic methods' price gate weighs measured step costs (None: no price gate, the
    cost model's predictions alone decide).
    """
    if isinstance(name, MethodSpec):
        args = name.engine_args(dynamic_depth=MAX_DEPTH)
        name, budget, depth, width = name.name, args.get("budget"), args.get("depth"), args.get("width", width)
    if name not in ENGINE_METHODS:
        raise ValueError(f"unknown method {name!r}; choose one of {', '.join(ENGINE_METHODS)}")
    budget = DEFAULT_BUDGET.get(name) if budget is None else budget
    depth = DEFAULT_DEPTH.get(name) if depth is None else depth
    SIZE_CHECKS.get(name, _budget_and_depth)(budget, depth, width)
    acceptance = tuple(acceptance) if acceptance is not None else DEFAULT_ACCEPTANCE
    return BUILDERS[name](MethodArgs(name, budget, depth, width, acceptance, profile, tree_path, calibration,
                                     copy_acceptance, price))


def _budget_and_depth(budget: int | None, depth: int | None, width: int) -> None:
    check_budget(budget, depth)


#: The one check of a method's size, in the terms that bound its shape (others: budget and depth).
SIZE_CHECKS = {
    "ar": lambda budget, depth, width: None,          # no size
    "file": lambda budget, depth, width: None,        # the file's own
    "sequoia-auto": lambda budget, depth, width: None,   # the optimizer's, within the limits
    "chain": lambda budget, depth, width: check_budget(budget),   # a chain's depth is its budget
    "specinfer": lambda budget, depth, width: check_budget(width * depth, depth),
    "kary": lambda budget, depth, width: check_budget(1, depth),
}


def _fixed_shape(a: MethodArgs) -> StaticTreeProposer:
    """The trees whose shape the arguments fix: the target alone, a chain, SpecInfer's chains, k-ary, a file."""
    name, budget, depth, width, tree_path = a.name, a.budget, a.depth, a.width, a.tree_path
    if name == "ar":
        return StaticTreeProposer(Tree.root_only(), name="ar")
    if name == "chain":
        return StaticTreeProposer(Tree.chain(budget), name="chain")
    if name == "file":
        if not tree_path:
            raise ValueError("method 'file' needs a tree file (--tree-file)")
        return StaticTreeProposer(Tree.from_json(tree_path), name="file")
    tree = Tree.specinfer(width, depth) if name == "specinfer" else Tree.k_ary(width, depth)
    mode = "with_replacement" if name == "specinfer" else "without_replacement"
    return StaticTreeProposer(tree, mode=mode, name=name)


def _copies_only(a: MethodArgs) -> NgramProposer:
    """``ngram``: copied continuations of the context alone."""
    settings = NgramSettings(budget=a.budget)
    return NgramProposer(profile=a.profile or conservative_profile(), settings=settings,
                         max_depth=a.depth or settings.length, accept=_accept(a.copy_acceptance), price=a.price)


def _copies_and_dynamic(a: MethodArgs) -> NgramDynamicProposer:
    """``sequoia-ngram``: copied branches and the dynamic tree."""
    dyn = _dynamic(a)
    return NgramDynamicProposer(profile=dyn.profile, calibration=dyn.calibration, acceptance=dyn.acceptance,
                                budget=dyn.budget, max_depth=dyn.max_depth, accept=_accept(a.copy_acceptance),
                                price=a.price)


def _accept(copy_acceptance: NgramAcceptance | None):
    return ngram_prior if copy_acceptance is None else copy_acceptance.prob


@lru_cache(maxsize=64)
def _dp_tree(acceptance: tuple[float, ...], budget: int, depth: int | None) -> Tree:
    """The DP tree of a vector, budget and depth, solved once per server (a few KB each; the table is dropped)."""
    return optimal_tree(acceptance, budget, depth).tree()


def _sequoia(a: MethodArgs) -> StaticTreeProposer:
    """``sequoia``: the DP tree of the vector, budget and depth."""
    return StaticTreeProposer(_dp_tree(tuple(float(p) for p in a.acceptance), a.budget, a.depth), name="sequoia")


def _auto(a: MethodArgs) -> StaticTreeProposer:
    """Let the hardware-aware optimizer choose budget and depth (and, under the price gate, a smaller tree)."""
    acceptance, profile, budget, depth, price = a.acceptance, a.profile, a.budget, a.depth, a.price
    # Without a measured profile: a stand-in under which no tree pays (the root-only tree), as for sequoia-dynamic.
    profile = profile or conservative_profile()
    choice = choose_tree(acceptance, profile, max_budget=budget, max_depth=depth or STATIC_DEPTH)
    if price is None or choice.tree.size == 0:
        return StaticTreeProposer(choice.tree, name="sequoia-auto")
    gate = PriceGate(profile, price)
    small = max(1, round(choice.tree.size * price.small_fraction))
    # The DP tree of that budget, not the optimizer's choice under it: that may be the root alone, and a
    # level that drafts nothing yields no evidence of what drafting costs.
    small_tree = _dp_tree(tuple(float(p) for p in acceptance), small, min(depth or STATIC_DEPTH, small))
    return PricedTreeProposer(choice.tree, name="sequoia-auto", small=small_tree, gate=gate)


@dataclass
class PricedTreeProposer(StaticTreeProposer):
    """A static tree under the price gate: ``tree``, ``small``, or the root alone, by measured step costs."""

    small: Tree = field(default_factory=Tree.root_only)
    gate: PriceGate | None = None     # required; a default only because the parent's fields have them

    def __post_init__(self) -> None:
        if self.gate is None:
            raise ValueError("PricedTreeProposer needs a price gate (gate=PriceGate(profile, settings))")

    def start(self) -> None:
        self.gate.start()

    def observe(self, record) -> None:
        self.gate.observe(record)

    def wants_draft(self) -> bool:
        level = self.gate.decide().level
        return level != PLAIN and (self.small if level == SMALL else self.tree).size > 0

    def propose(self, drafter, generator):
        if self.gate.decision.level == SMALL:
            return StaticTreeProposer(self.small, self.mode, self.name).propose(drafter, generator)
        return super().propose(drafter, generator)


def _dynamic(a: MethodArgs) -> DynamicTreeProposer:
    """``sequoia-dynamic``; ``calibration``: a Calibration, a path to one, or None for the identity a(q) = q."""
    acceptance, profile, budget, depth, calibration, price = (a.acceptance, a.profile, a.budget, a.depth,
                                                              a.calibration, a.price)
    if isinstance(calibration, (str, bytes)) or hasattr(calibration, "__fspath__"):
        calibration = Calibration.load(calibration)
    return DynamicTreeProposer(calibration=calibration or Calibration.identity(), acceptance=acceptance,
                               profile=profile or conservative_profile(), budget=budget, max_depth=depth or MAX_DEPTH,
                               price=price)


#: Every method's builder by name: a new proposer is its file under sequoia/runtime/proposers/, its row here and
#: its row in the page's registry (sequoia.core.requests.request.METHODS).
BUILDERS = {
    "ar": _fixed_shape, "chain": _fixed_shape, "specinfer": _fixed_shape, "kary": _fixed_shape, "file": _fixed_shape,
    "sequoia": _sequoia,
    "sequoia-auto": _auto,
    "sequoia-dynamic": _dynamic,
    "ngram": _copies_only,
    "sequoia-ngram": _copies_and_dynamic,
}
