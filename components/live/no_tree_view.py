"""The Live tab's plain words for an automatic method that draws no tree on this machine, or took a fallback.

Where the hardware profile says no tree beats the target alone (verifying k
tokens costs about k plain steps, as on a compute-bound CPU), the automatic
methods run the target alone every step.  The summary says so with the
profile's own figures, in place of a passing toast, so the reader knows the
empty tree view is the machine's verdict and how to see a tree anyway.
"""

from __future__ import annotations

from collections.abc import Callable

from sequoia.core.profiles.profile import HardwareProfile
from sequoia.core.requests.request import METHOD_OF_LABEL
from sequoia.core.statistics.words import counted

#: Tokens whose verification the line prices against one (capped at the profile's largest measured forward).
SHOWN_TOKENS = 16
#: The page's label of the method whose budget draws a tree whatever it costs.
TREE_LABEL = next(label for label, name in METHOD_OF_LABEL.items() if name == "sequoia")


def declines_every_tree(name: str, proposer) -> bool:
    """Whether the automatic method ``name`` is set, by its profile, to run the target alone every step."""
    if name in ("sequoia-dynamic", "sequoia-ngram"):
        return not proposer.can_pay
    if name == "sequoia-auto":
        return proposer.tree.size == 0
    return False


def no_tree_line(profile: HardwareProfile, name: str) -> str:
    """Markdown: why ``name`` draws no tree here, with the profile's price of verifying many tokens."""
    n = min(SHOWN_TOKENS, max(profile.target_n))
    one = float(profile.target(1))
    ratio = float(profile.target(n)) / one
    copies = " (copied continuations still are, where one pays)" if name == "sequoia-ngram" else ""
    return (f"**No tree pays on this machine**: verifying {counted(n, 'token')} costs {ratio:.1f}× one here "
            f"({one:.0f} ms for one token), so each step is the target alone{copies}. "
            f"Pick *{TREE_LABEL}* with a budget to see a tree anyway.")


def explain(profile: HardwareProfile | None, name: str, proposer) -> str:
    """The line for a request, or "" where the method may draw trees (or no measured profile prices it:
    the page's note about the missing profile says that)."""
    if profile is None or not declines_every_tree(name, proposer):
        return ""
    return no_tree_line(profile, name)


def fallback_note(profile: HardwareProfile | None, name: str, proposer, missing_profile: Callable[[], str]) -> str:
    """The warning for a fallback an automatic method took on this server ("" when none); ``missing_profile()``:
    the page's words while no profile is measured (the method then runs under the conservative stand-in)."""
    if name not in ("sequoia-auto", "sequoia-dynamic", "sequoia-ngram", "ngram"):
        return ""
    if profile is None:  # priced with the conservative stand-in: the target runs alone
        return missing_profile()
    if name == "sequoia-auto" and proposer.tree.size == 0:
        return ("Under this machine's hardware profile no tree beats the target alone, so the optimizer chose "
                "the root-only tree: plain target steps. Pick Sequoia (budget & depth) to see trees.")
    if name == "sequoia-dynamic" and not proposer.can_pay:
        return ("Under this machine's profile no tree beats the target alone (verifying k tokens costs "
                "about k times one), so the dynamic policy drafts nothing: every step is a plain target "
                "step. Pick Sequoia (budget & depth) to see trees.")
    return ""


def run_words(profile: HardwareProfile | None, name: str, proposer,
              missing_profile: Callable[[], str]) -> tuple[str, str]:
    """(the summary's no-tree line, a warning for any other fallback): one of them at most is not ""."""
    note = fallback_note(profile, name, proposer, missing_profile)
    line = explain(profile, name, proposer)
    return line, "" if line else note
