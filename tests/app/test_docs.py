"""The README and docs/ cannot rot: the library example runs, the commands stay, every path a page names exists.

The example is taken from README.md (the first ``python`` block of its "Library" section) and executed
unchanged; only :func:`sequoia.runtime.models.load_pair` is swapped for one that returns the tiny pair
(a real :class:`~sequoia.runtime.models.ModelPair` with a character tokenizer), so every other line runs
the library's own code.  The README's test command is checked too: CI runs it.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import io
import os
import re
import tokenize
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
    files = {str(p.relative_to(ROOT)) for p in (ROOT / "docs" / "data").iterdir() if p.name != "__pycache__"}
    assert files - cited == set(), "docs/data files no page cites (remove them; git keeps them)"


@pytest.mark.parametrize("page", DOCS, ids=lambda p: p.name)
def test_docs_describe_the_present(page):
    assert not re.search(r"\b(session|round) \d+", page.read_text(), re.I), \
        f"{page.name}: history belongs in git, not the docs"


# ------------------------------------------------------------------ every reference resolves against the tree
# Read statically (ast, no imports): the whole check takes about a second.  Paths count when their first folder is
# one of the repository's (`out/x.json`, `DIR/report.md` and another project's `speculative/...` are the reader's
# or another repository's); `../` paths leave the repository.  `module.name` references count when they start at
# one of the project's packages.
PAGES = [README] + DOCS + sorted((ROOT / "docs" / "data").glob("*.md"))
PRODUCT = [ROOT / "app.py", *sorted((ROOT / "sequoia").rglob("*.py")), *sorted((ROOT / "components").rglob("*.py")),
           *sorted((ROOT / "scripts").rglob("*.py"))]
PACKAGES = ("sequoia", "components", "app", "scripts")
_EXT = r"(?:py|md|json|jsonl|sh|txt|toml|ya?ml|css|js|gguf|png|svg|csv|html)"
_PATH = re.compile(rf"(?<![\w/.:~$-])((?:[\w.-]+/)+[\w-][\w.-]*\.{_EXT})(?![\w/])")
_REF = re.compile(rf"(?<![\w.])((?:{'|'.join(PACKAGES)})(?:\.[A-Za-z_]\w*)+)")
_RUN = re.compile(r"\b(?:python3?|sh|bash)\s+(?:-m\s+([\w.]+)|((?:[\w.-]+/)*[\w.-]+\.(?:py|sh)))")
_URL = re.compile(r"[a-z]+://\S+")


def _tree() -> tuple[set[str], set[str]]:
    """Every file and folder of the working tree (relative paths), and every folder's name."""
    paths, names = set(), set()
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in ("__pycache__", "node_modules")]
        rel = Path(folder).relative_to(ROOT)
        paths.update(str(rel / f) for f in files + dirs)
        names.update(dirs)
    return {p.removeprefix("./") for p in paths}, names


TREE, FOLDERS = _tree()


def _prose(path: Path) -> str:
    """A page's text, or a Python file's docstrings and comments (its prose, where paths and names are cited)."""
    if path.suffix == ".md":
        return _URL.sub("", path.read_text())
    source = path.read_text()
    out = [ast.get_docstring(node, clean=False) or "" for node in ast.walk(ast.parse(source))
           if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))]
    out += [t.string for t in tokenize.generate_tokens(io.StringIO(source).readline) if t.type == tokenize.COMMENT]
    return _URL.sub("", "\n".join(out))


def _stale_paths(text: str) -> list[str]:
    """Repository paths the text names that match no file or folder (a suffix match: `core/x.py` may name
    `sequoia/core/x.py`, as the docs write paths relative to the package they describe)."""
    out = []
    for path in _PATH.findall(text):
        path = path.removeprefix("./")
        if path.startswith("../") or path.split("/")[0] not in FOLDERS | {p for p in TREE if "/" not in p}:
            continue
        if not any(p == path or p.endswith("/" + path) for p in TREE):
            out.append(path)
    return out


def _module_file(parts: list[str]) -> Path | None:
    folder = ROOT.joinpath(*parts)
    for path in (folder / "__init__.py", folder.with_suffix(".py")):
        if path.is_file():
            return path
    return None


def _bound(node: ast.AST) -> list[str]:
    """The names a module-level statement binds (in either branch of an ``if`` or ``try``)."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return [(a.asname or a.name).split(".")[0] for a in node.names]
    if isinstance(node, (ast.If, ast.Try)):
        return [name for child in ast.iter_child_nodes(node) for name in _bound(child)]
    return []


@functools.lru_cache(maxsize=None)
def _names(path: Path) -> tuple[frozenset[str], dict[str, frozenset[str] | None]]:
    """A module's top-level names, and per class its members (None: it inherits, so any member may exist).  A
    module resolving names on first use (PEP 562 ``__getattr__``) binds the names its table spells out."""
    tree = ast.parse(path.read_text())
    lazy = set()
    if any(isinstance(n, ast.FunctionDef) and n.name == "__getattr__" for n in tree.body):
        lazy = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
                and n.value.isidentifier()}
    classes = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            members = {n for child in node.body for n in _bound(child)}
            members |= {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)
                        and isinstance(n.value, ast.Name) and n.value.id == "self" and isinstance(n.ctx, ast.Store)}
            classes[node.name] = None if node.bases else frozenset(members)
    return frozenset(lazy | {n for node in tree.body for n in _bound(node)}), classes


def _resolves(ref: str) -> bool:
    """``package.module.name[.member]`` names a module of the tree and a name it binds (a class's member too)."""
    parts = ref.split(".")
    if parts[-1] in ("py", "md", "json", "sh"):      # a file name written with its suffix: a path, checked above
        return True
    cut = next((i for i in range(len(parts), 0, -1) if _module_file(parts[:i])), None)
    if cut is None:
        return False
    rest = parts[cut:]
    if not rest:
        return True
    names, classes = _names(_module_file(parts[:cut]))
    if rest[0] not in names:
        return False
    members = classes.get(rest[0])
    return len(rest) == 1 or members is None or rest[1] in members


def _stale_refs(text: str) -> list[str]:
    return [ref for ref in _REF.findall(text) if not _resolves(ref)]


_CONST = re.compile(r"`((?!SEQUOIA_)[A-Z][A-Z0-9_]{2,})`")       # a module's constant (SEQUOIA_*: variables)
_PY = re.compile(r"`((?:[\w.-]+/)*[\w-]+\.py)`")
_SENTENCE = re.compile(r"\.\s+|\n\s*\n|\n\s*(?:\d+\.|[-*])\s")   # a sentence, a paragraph, a list item


def _defines(path: Path) -> set[str]:
    """The names a module defines itself (imports re-export a name; they do not say where to change it)."""
    return {n for node in ast.parse(path.read_text()).body if not isinstance(node, (ast.Import, ast.ImportFrom))
            for n in _bound(node)}


def _misplaced_constants(text: str) -> list[str]:
    """Backticked constants a sentence places in the backticked files it names, defined in none of them
    (architecture.md once sent readers to `sequoia/runtime/models.py` to add a name to `BACKENDS`, which that
    module only imports)."""
    out = []
    for sentence in _SENTENCE.split(text):
        names, files = _CONST.findall(sentence), [ROOT / p for cited in _PY.findall(sentence) for p in TREE
                                                   if p == cited or p.endswith("/" + cited)]
        out += [name for name in names if files and not any(name in _defines(f) for f in files)]
    return out


@pytest.mark.parametrize("source", PAGES + PRODUCT, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_path_and_module_name_resolves_against_the_tree(source):
    text = _prose(source)
    stale = _stale_paths(text) + _stale_refs(text) + _misplaced_constants(text)
    assert not stale, f"{source.relative_to(ROOT)} names what the tree does not hold: {sorted(set(stale))}"


@pytest.mark.parametrize("text, stale", [
    ("the batched form of `core/sampling.py`'s rule", ["core/sampling.py"]),
    ("``scripts/gpu_check.py`` measures them", ["scripts/gpu_check.py"]),
    ("the Gradio wiring is :mod:`components.step_panel`", ["components.step_panel"]),
    ("see :mod:`sequoia.runtime.kernels`", ["sequoia.runtime.kernels"]),
    ("`sequoia/runtime/models.py`: add its name to `sequoia.runtime.models.BACKEND_NAMES`",
     ["sequoia.runtime.models.BACKEND_NAMES"]),
    (":func:`sequoia.runners.hf.graphs.graph_runner.GraphRunner.no_such_method`",
     ["sequoia.runners.hf.graphs.graph_runner.GraphRunner.no_such_method"]),
    ("write `out/retrieval.json`; SGLang's `speculative/eagle_utils.py`; ../shared/GPU.md", []),
    ("`core/verification/sampling.py`, :func:`sequoia.runtime.models.load_pair`, `drafter.py`", []),
    ("2. Make it loadable (`sequoia/runtime/models.py`: add its name to `BACKENDS` and\n   a branch to `load_pair`)",
     ["BACKENDS"]),
    ("add its name to `BACKENDS` in\n   `sequoia/core/profiles/runtimes.py` and a branch to `load_pair`", []),
])
def test_the_reference_check_catches_what_went_stale(text, stale):
    """The check has power: the stale references issue 59 found, put back, are caught; the present ones and the
    reader's own paths are not."""
    assert _stale_paths(text) + _stale_refs(text) + _misplaced_constants(text) == stale


# ------------------------------------------------------------------ the scripts the docs tell readers to run
def _runs(text: str) -> set[str]:
    """What ``python X.py``, ``python -m X`` and ``sh X.sh`` lines of a text run: this project's (a module of its
    packages, a file under one of its folders or at its root), not another project's or a machine's own."""
    out = set()
    for module, path in _RUN.findall(text):
        if module and module.split(".")[0] in PACKAGES:
            out.add(module)
        elif path and (path in TREE or path.split("/")[0] in FOLDERS and "/" in path):
            out.add(path)
    return out


RUN = sorted(set().union(*(_runs(_prose(p)) for p in PAGES + PRODUCT)))


def test_the_docs_tell_readers_to_run_scripts():
    assert "docs/data/bench-gate.py" in RUN and "sequoia" in RUN and "app.py" in RUN


def _imports_resolve(path: Path) -> list[str]:
    """The top-level imports of a script that resolve nowhere: the project's by the tree (statically, as above),
    a sibling module by its folder, the rest by the installed packages."""
    bad = []
    for node in ast.parse(path.read_text(), str(path)).body:
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            mods = [(node.module, a.name) for a in node.names]
        elif isinstance(node, ast.Import):
            mods = [(a.name, None) for a in node.names]
        else:
            continue
        for module, name in mods:
            if module.split(".")[0] in PACKAGES:
                ok = _resolves(module if name in (None, "*") else f"{module}.{name}") or \
                    _module_file([*module.split("."), name or ""]) is not None
            else:
                ok = (path.parent / f"{module.split('.')[0]}.py").exists() or \
                    importlib.util.find_spec(module.split(".")[0]) is not None
            if not ok:
                bad.append(f"{module}{'.' + name if name else ''}")
    return bad


@pytest.mark.parametrize("target", RUN)
def test_every_script_the_docs_run_exists_compiles_and_imports_what_is_there(target):
    if not target.endswith((".py", ".sh")):       # python -m <module>
        assert _module_file(target.split(".")), f"the docs run python -m {target}, which is not in the tree"
        return
    matches = [ROOT / p for p in TREE if p == target or p.endswith("/" + target)]
    assert matches, f"the docs run {target}, which is not in the tree"
    if target.endswith(".py"):
        for path in matches:
            compile(path.read_text(), str(path), "exec")
            assert _imports_resolve(path) == [], f"{target} imports what is not there: {_imports_resolve(path)}"


def test_the_script_check_catches_a_dead_import(tmp_path):
    script = tmp_path / "bench.py"
    script.write_text("import json\nfrom sequoia.core.profile import HardwareProfile\n"
                      "from sequoia.runtime.measuring.timing import run_with_records, no_such_name\n")
    assert _imports_resolve(script) == ["sequoia.core.profile.HardwareProfile",
                                        "sequoia.runtime.measuring.timing.no_such_name"]


# ------------------------------------------------------------------ every SEQUOIA_* variable is documented
NOT_VARIABLES = {"SEQUOIA_OK"}   # the marker file of a converted model folder (sequoia/runners/embedded.py)


def test_every_sequoia_variable_the_code_reads_is_documented():
    read = set().union(*(re.findall(r"\bSEQUOIA_[A-Z0-9_]+\b", p.read_text()) for p in PRODUCT)) - NOT_VARIABLES
    documented = set().union(*(re.findall(r"\bSEQUOIA_[A-Z0-9_]+\b", p.read_text()) for p in [README] + DOCS))
    assert read - documented == set(), "read by the code, named in no doc (README.md or docs/configuration.md)"
    assert {"SEQUOIA_OWNER", "SEQUOIA_DTYPE", "SEQUOIA_TARGET_QUANT", "SEQUOIA_BLOCKED_WEIGHTS",
            "SEQUOIA_REFERENCE_GGUF"} <= read


def test_architecture_names_every_runtime_module_that_knows_transformers():
    """docs/architecture.md says which modules of sequoia/runtime/ import transformers (the rest speak to the
    runner seam only): the list is the tree's."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    said = re.search(r"\(In `runtime/`, only (.*?) know transformers\.\)", text, re.S)
    assert said, "architecture.md no longer says which runtime/ modules know transformers"
    named = set(re.findall(r"`([\w/]+\.py)`", said[1]))
    runtime = ROOT / "sequoia" / "runtime"
    importing = {str(p.relative_to(runtime)) for p in runtime.rglob("*.py")
                 if re.search(r"^\s*(from|import) transformers\b", p.read_text(), re.M)}
    assert named == importing
