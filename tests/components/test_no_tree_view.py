"""The Live tab's words where no tree pays (components.live.no_tree_view): a line in the summary, with the profile's figures."""

from __future__ import annotations

from sequoia.core.profiles.profile import HardwareProfile
from sequoia.runtime.methods import make_method

from components.live import live_tab, no_tree_view

#: Verifying n tokens costs n plain steps: nothing pays.
LINEAR = HardwareProfile.hand_made(target=lambda n: 40.0 * n, draft=lambda w: 20.0)
#: Verification nearly free: trees pay.
FLAT = HardwareProfile.hand_made(target=lambda n: 100.0 + 2.0 * n, draft=lambda w: 10.0 + 0.5 * w)


def test_the_default_method_says_plainly_why_it_draws_no_tree():
    line = no_tree_view.explain(LINEAR, "sequoia-dynamic", make_method("sequoia-dynamic", profile=LINEAR))
    assert line.startswith("**No tree pays on this machine**")
    assert "verifying 16 tokens costs 16.0× one here (40 ms for one token)" in line
    assert "each step is the target alone" in line and f"*{no_tree_view.TREE_LABEL}*" in line
    session = live_tab.LiveSession(no_tree=line)
    assert line in live_tab.summary(session)


def test_no_line_where_a_tree_pays_or_no_profile_prices_it():
    for name in ("sequoia-dynamic", "sequoia-ngram", "sequoia-auto"):
        assert no_tree_view.explain(FLAT, name, make_method(name, profile=FLAT)) == ""
        assert no_tree_view.explain(LINEAR, name, make_method(name, profile=LINEAR)) != ""
    assert no_tree_view.explain(None, "sequoia-dynamic", make_method("sequoia-dynamic")) == ""
    assert no_tree_view.explain(LINEAR, "sequoia", make_method("sequoia")) == ""
    assert "copied continuations" in no_tree_view.no_tree_line(LINEAR, "sequoia-ngram")
