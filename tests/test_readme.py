"""The README's library example runs as written, on the tiny random-weight pair instead of the embedded one.

The example is taken from README.md (the first ``python`` block of its "Library" section) and executed
unchanged; only :func:`sequoia.runtime.models.load_pair` is swapped for one that returns the tiny pair
(a real :class:`~sequoia.runtime.models.ModelPair` with a character tokenizer), so every other line runs
the library's own code.  The README's test command is checked too: CI runs it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sequoia.runtime import models

README = Path(__file__).resolve().parents[1] / "README.md"


def section(title: str) -> str:
    text = README.read_text()
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert match, f"README.md has no '## {title}' section"
    return match.group(1)


def library_example() -> str:
    blocks = re.findall(r"```python\n(.*?)```", section("Library"), re.S)
    assert blocks, "the Library section has no python block"
    return blocks[0]


def test_the_example_is_short_and_loads_the_embedded_pair():
    code = library_example()
    assert len(code.strip().splitlines()) <= 16
    assert "load_pair()" in code  # as written it runs on the embedded pair


def test_the_library_example_runs(tiny_app_pair, monkeypatch, capsys):
    calls = []

    def tiny_load_pair(*args, **kwargs):
        calls.append((args, kwargs))
        return tiny_app_pair

    monkeypatch.setattr(models, "load_pair", tiny_load_pair)
    namespace: dict = {}
    exec(compile(library_example(), "README.md#library", "exec"), namespace)
    assert calls == [((), {})]
    out = capsys.readouterr().out.splitlines()
    steps = [line for line in out if line.startswith("step ")]
    assert len(steps) >= 2 and "accepted" in steps[1] and "verify" in steps[1]
    tokens = namespace["tokens"]
    assert len(tokens) == 32                     # max_new_tokens (the tiny pair has no EOS)
    assert out[-1] == tiny_app_pair.tokenizer.decode(tokens)
    # draft == target in the tiny app pair, so at T=0 the drafted steps accept their whole chain of the tree
    assert any(" 0 accepted" not in line for line in steps[1:])


@pytest.mark.parametrize("command", [
    "pip install -r requirements.txt && python app.py",
    "pip install -r requirements-dev.txt && python -m pytest -q",
])
def test_the_readme_keeps_the_two_commands(command):
    assert f"```bash\n{command}\n```" in README.read_text()


def test_the_readme_stays_short_and_current():
    text = README.read_text()
    assert text.startswith("---\ntitle: Sequoia Studio\n")   # the Spaces front matter stays on top
    assert len(text.splitlines()) < 150
    assert not re.search(r"\b(session|round) \d+", text, re.I), "history belongs in git, not the README"
