"""The suite's own grouping (tests/conftest.py): under pytest-xdist each test's node id carries its group, which
xdist's scheduler reads.  Should pytest or xdist change how a node id is set again, the groups would be lost in
silence (every test in any worker, both workers holding the full-size models); this fails instead."""

from __future__ import annotations

import pytest

from conftest import FLOAT32, SERVED


def test_under_xdist_a_test_carries_its_modules_group(request):
    if not getattr(request.config.option, "loadgroup", False):
        pytest.skip("not under --dist loadgroup (-n 0 or -s): nothing is grouped")
    assert request.node.nodeid.endswith("@tests/tools/test_suite_groups.py"), request.node.nodeid


def test_the_full_size_groups_are_named_apart():
    assert FLOAT32 != SERVED and "@" not in FLOAT32 + SERVED
