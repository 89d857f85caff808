"""The README and docs/ cannot rot: the library example runs, the commands stay, every path a page names exists.

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

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


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
    assert len(text.splitlines()) < 175   # a user guide; the reference is docs/
    assert not re.search(r"\b(session|round) \d+", text, re.I), "history belongs in git, not the README"


def test_the_space_front_matter_names_a_python_and_a_torch_every_space_kind_offers():
    """ZeroGPU offers Python 3.10.13 and 3.12.12 only and installs a torch of its own list (2.8-2.11 today: a pin
    it cannot match fails the build); CPU and GPU Spaces take any.  The torch requirement admits ZeroGPU's newest
    and the CPU build on disk here (2.13.0+cpu), nothing newer (untested)."""
    from packaging.specifiers import SpecifierSet

    front = README.read_text().split("---\n")[1]
    assert re.search(r'^python_version: "3\.12"$', front, re.M)
    requirements = (ROOT / "requirements.txt").read_text()
    sdk = re.search(r"^sdk_version: (\S+)$", front, re.M)[1]
    assert f"gradio=={sdk}\n" in requirements
    torch_spec = SpecifierSet(re.search(r"^torch([<>=!~][^\s#]*)", requirements, re.M)[1])
    assert {"2.11.0", "2.13.0", "2.13.0+cpu"} <= set(torch_spec.filter(["2.11.0", "2.13.0", "2.13.0+cpu", "2.14.0"]))
    assert "2.14.0" not in torch_spec
    # llama-cpp-python builds from its sdist on install: a Space needs cmake and a C++ compiler (Debian packages)
    assert {"cmake", "build-essential"} <= set((ROOT / "packages.txt").read_text().split())


# ------------------------------------------------------------------ docs/ as a reference
DOCS = sorted((ROOT / "docs").glob("*.md"))
PATH_PREFIXES = ("docs/", "assets/", "scripts/", "sequoia/", "components/", "tests/")


def _expand(path: str) -> list[str]:
    """``a/{b,c}.json`` -> ``a/b.json``, ``a/c.json`` (one brace group, as the docs write them)."""
    m = re.search(r"\{([^{}]*)\}", path)
    if not m:
        return [path]
    return [path[:m.start()] + alt + path[m.end():] for alt in m.group(1).split(",")]


def _cited_paths(md: Path) -> set[str]:
    """Repository paths a page names: relative links, and backticked paths under the project's folders."""
    text = md.read_text()
    out = set()
    for link in re.findall(r"\]\(([^)#\s]+)\)", text):
        if not re.match(r"[a-z]+://", link):
            out.add(str((md.parent / link).resolve().relative_to(ROOT)))
    for path in re.findall(r"`([^`\s]+)`", text):
        path = path.rstrip(".,;:")
        if path.startswith(PATH_PREFIXES) and "<" not in path and "*" not in path:
            out.update(_expand(path))
    return out


@pytest.mark.parametrize("page", [README] + DOCS, ids=lambda p: p.name)
def test_every_path_a_page_names_exists(page):
    missing = sorted(p for p in _cited_paths(page) if not (ROOT / p).exists())
    assert not missing, f"{page.name} names paths that do not exist: {missing}"


def test_docs_data_holds_only_files_the_docs_cite():
    cited = set().union(*(_cited_paths(p) for p in [README] + DOCS + sorted((ROOT / "docs" / "data").glob("*.md"))))
    files = {str(p.relative_to(ROOT)) for p in (ROOT / "docs" / "data").iterdir()}
    assert files - cited == set(), "docs/data files no page cites (remove them; git keeps them)"


@pytest.mark.parametrize("page", DOCS, ids=lambda p: p.name)
def test_docs_describe_the_present(page):
    assert not re.search(r"\b(session|round) \d+", page.read_text(), re.I), \
        f"{page.name}: history belongs in git, not the docs"
