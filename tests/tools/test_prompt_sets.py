"""The shipped prompt sets (assets/prompts/*.jsonl): they load by name, and the long-context sets are long.

No model: character length stands in for token length (the long-context passages were written to be
400-900 Qwen tokens, about 1,800-3,300 characters with the instruction).
"""

from __future__ import annotations

import pytest

from sequoia._meta import ASSETS
from sequoia.tools.bench import load_prompt_sets

PROMPTS = ASSETS / "prompts"
SHIPPED = sorted(p.stem for p in PROMPTS.glob("*.jsonl"))
LONG_CONTEXT = ("summarize", "rag", "edit")


def test_the_long_context_sets_are_shipped_beside_code_and_chat():
    assert {"code", "chat", *LONG_CONTEXT} <= set(SHIPPED)


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_set_loads_by_name_with_at_least_five_distinct_prompts(name):
    (prompt_set,) = load_prompt_sets(name, PROMPTS)
    assert prompt_set.name == name
    assert len(prompt_set.prompts) >= 5
    assert len(set(prompt_set.prompts)) == len(prompt_set.prompts)


def test_long_context_sets_load_together_and_are_long():
    sets = load_prompt_sets(",".join(LONG_CONTEXT), PROMPTS)
    assert [s.name for s in sets] == list(LONG_CONTEXT)
    for s in sets:
        assert min(len(p) for p in s.prompts) >= 1500, s.name


def test_long_context_prompts_are_distinct_across_sets():
    prompts = [p for s in load_prompt_sets(",".join(LONG_CONTEXT), PROMPTS) for p in s.prompts]
    assert len(set(prompts)) == len(prompts)
    # No passage is a near copy of another (the rag prompts share their instruction, so look mid-passage).
    assert len({p[len(p) // 2:len(p) // 2 + 200] for p in prompts}) == len(prompts)
