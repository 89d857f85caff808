"""The methods the Compare tab offers, the ones it ticks, and the ones a request runs.

Kept apart from the tab's layout and from the run itself (:mod:`components.compare.compare_run`): the choice lists are
data the page's checkboxes, the Full comparison button and the ``/compare`` API must agree on.  The checkboxes'
choices are fixed when the page is built, often before the pair has loaded; so :func:`offered` reads nothing that
loading changes in a way that adds a method (a hardware profile found at load once added "Sequoia (auto)" to the
full list only, and Full comparison was refused: issue 42).  :func:`ticked` is always a subset of
:func:`offered`, before and after loading.
"""

from __future__ import annotations

from dataclasses import dataclass

from components.app_state.context import AppContext
from components.compare import compare_view


@dataclass(frozen=True)
class CompareMethod:
    """One method the tab can run."""

    label: str          # the checkbox's label and the row's name in the bars and the table (colours:
                        # components.method_color); for engine methods also the live tab's method label
    key: str            # its name in the /compare API's rows
    hf: str = ""        # a Hugging Face baseline's runner name (sequoia.runtime.measuring.timing.HF_METHODS), else ""
    runtime: str = ""   # "llamacpp": the target alone on that runtime (AppContext.reference_context), else ""


#: Every method the tab offers, in run order; the first is the reference and always runs.
METHODS = (
    CompareMethod(compare_view.REFERENCE, "target only"),
    CompareMethod(compare_view.LLAMACPP_REFERENCE, "llama.cpp target only", runtime="llamacpp"),
    CompareMethod("Chain", "chain"),
    CompareMethod("SpecInfer", "specinfer"),
    CompareMethod("Sequoia (budget & depth)", "sequoia"),
    CompareMethod("Sequoia (auto)", "sequoia-auto"),
    CompareMethod("Sequoia (dynamic)", "sequoia-dynamic"),
    CompareMethod("Sequoia + n-gram copies", "sequoia-ngram"),
    CompareMethod("n-gram copies only", "ngram"),
    CompareMethod("HF assisted", "hf assisted", hf="hf-assisted"),
    CompareMethod("HF prompt lookup", "hf prompt lookup", hf="hf-prompt-lookup"),
)
BY_LABEL = {m.label: m for m in METHODS}
#: Labels accepted from scripts besides the checkboxes' ("Target only": the request parser's alias too).
ALIASES = {"Target only": compare_view.REFERENCE}
#: The API's method names by row label.
API_KEYS = {m.label: m.key for m in METHODS}
#: The full comparison ("Full comparison", and the /compare API): every method the tab offers (the tree shapes and
#: each kind of drafting: draft model, copies, both), on FULL_TOKENS tokens.
FULL_METHODS = ("Target alone", "llama.cpp target alone", "Chain", "SpecInfer", "Sequoia (budget & depth)",
                "Sequoia (auto)", "Sequoia (dynamic)", "Sequoia + n-gram copies", "n-gram copies only", "HF assisted",
                "HF prompt lookup")
FULL_TOKENS = 64
#: Ticked when the tab opens: a run a class can wait for on a 2-vCPU CPU: the target alone, the llama.cpp
#: reference where offered, the automatic methods and one fixed tree (components.compare.compare_tab.DEFAULT_TOKENS
#: tokens, components.compare.compare_run.DEFAULT_ROUNDS rounds: the arithmetic is there).
DEFAULT_METHODS = ("Target alone", "llama.cpp target alone", "Sequoia (budget & depth)", "Sequoia (auto)",
                   "Sequoia (dynamic)")

#: The runtimes each Hugging Face baseline runs on: ``generate`` needs the target (and assisted the draft) in torch.
_HF_RUNTIMES = {"hf-assisted": ("hf",), "hf-prompt-lookup": ("hf", "mixed")}


def offered(ctx: AppContext) -> list[str]:
    """The checkbox labels: the llama.cpp reference only where the server offers it, the Hugging Face baselines
    only where the pair's runtime (the one it will load on, before it is loaded) runs them.  Sequoia (auto) is
    always offered: without a hardware profile it runs under the conservative stand-in (the target alone's
    work, and its row says so), and a profile found when the pair loads must not add a method the page's
    checkboxes lack."""
    started = ctx.hardware.runtime
    backend = ctx.pair().backend if ctx.loaded else started.backend if started is not None else "hf"
    return [m.label for m in METHODS if (not m.runtime or ctx.offers_reference)
            and (not m.hf or backend in _HF_RUNTIMES[m.hf])]


def ticked(ctx: AppContext, full: bool = False) -> list[str]:
    """The checkboxes :data:`DEFAULT_METHODS` (``full``: :data:`FULL_METHODS`) that this server offers."""
    return [m for m in (FULL_METHODS if full else DEFAULT_METHODS) if m in offered(ctx)]


def choose_methods(ctx: AppContext, methods=None, include_hf: bool = True) -> list[CompareMethod]:
    """The methods to run, in run order, the reference first; ValueError on an unknown label.

    ``methods``: checkbox labels (None: :data:`FULL_METHODS` that this server offers);
    ``include_hf=False`` drops the Hugging Face baselines.
    """
    if methods is None:
        methods = ticked(ctx, full=True)
    methods = [ALIASES.get(m, m) for m in methods]
    unknown = [m for m in methods if m not in BY_LABEL]
    if unknown:
        raise ValueError(f"unknown method(s) {', '.join(map(str, unknown))}; choose from {', '.join(BY_LABEL)}")
    picked = set(methods) | {METHODS[0].label}
    return [m for m in METHODS if m.label in picked and (include_hf or not m.hf)
            and (not m.runtime or ctx.offers_reference)]
