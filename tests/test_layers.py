"""The layers of the library, checked: imports flow core -> runners -> runtime -> tools/app, never back, never in a cycle.

Read off the source with :mod:`ast` (nothing is imported), so a violation names
the file and line.  Module-level and function-level imports both count: an
import hidden inside a function still makes a cycle at run time.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("sequoia", "components")

#: What each layer may import from this project (by module-name prefix).
ALLOWED = {
    "sequoia.core": ("sequoia.core", "sequoia._meta"),
    "sequoia.runners": ("sequoia.core", "sequoia.runners", "sequoia._meta"),
    "sequoia.runtime": ("sequoia.core", "sequoia.runners", "sequoia.runtime", "sequoia._meta"),
    "sequoia.tools": ("sequoia.core", "sequoia.runners", "sequoia.runtime", "sequoia.tools", "sequoia._meta"),
    "components": ("sequoia.core", "sequoia.runners", "sequoia.runtime", "sequoia._meta", "components"),
}
#: Third-party packages the pure core must never import.
NOT_IN_CORE = ("transformers", "gradio", "accelerate", "gguf", "plotly", "networkx")


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _imports(path: Path) -> list[tuple[str, int]]:
    """(absolute module imported, line) for every import in the file, relative ones resolved."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.extend((a.name, node.lineno) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.append((mod, node.lineno))
            # "from . import x" / "from .pkg import mod": the names may be modules themselves
            out.extend((f"{mod}.{a.name}", node.lineno) for a in node.names)
    return out


def _project_graph() -> dict[str, list[tuple[str, int]]]:
    files = [p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")]
    modules = {_module_name(p): p for p in files}
    graph = {}
    for mod, path in modules.items():
        graph[mod] = sorted({(m, line) for m, line in _imports(path) if m in modules and m != mod})
    return graph


def _layer(mod: str) -> str | None:
    return next((layer for layer in ALLOWED if mod == layer or mod.startswith(layer + ".")), None)


def test_each_layer_imports_only_the_layers_below_it():
    bad = []
    for mod, deps in _project_graph().items():
        layer = _layer(mod)
        if layer is None:
            continue
        for dep, line in deps:
            if _layer(dep) == layer or dep.startswith(ALLOWED[layer]) or dep in ("sequoia",):
                continue
            bad.append(f"{mod}:{line} imports {dep}")
    assert not bad, "layering violations:\n" + "\n".join(bad)


def test_core_never_imports_heavy_packages():
    bad = []
    for path in (ROOT / "sequoia" / "core").rglob("*.py"):
        for mod, line in _imports(path):
            if mod.split(".")[0] in NOT_IN_CORE:
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {mod}")
    assert not bad, "the pure core must not import these:\n" + "\n".join(bad)


def test_no_import_cycles():
    graph = {m: [d for d, _ in deps] for m, deps in _project_graph().items()}
    # Importing a package runs its __init__, so "a.b" depends on "a" too -- but our __init__ files are empty
    # of imports, and counting that edge would flag every package; only explicit imports are edges.
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for d in graph.get(m, ()):
            if state.get(d) == 1:
                cycles.append(stack[stack.index(d):] + [d])
            elif d not in state:
                visit(d)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


@pytest.mark.slow
def test_importing_the_core_loads_no_heavy_package():
    """The real check behind the static one: import every core module in a fresh interpreter."""
    core = sorted(_module_name(p) for p in (ROOT / "sequoia" / "core").rglob("*.py"))
    code = ("import sys\n" + "".join(f"import {m}\n" for m in core)
            + f"bad = [m for m in {NOT_IN_CORE!r} if m in sys.modules]\nprint(','.join(bad))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "", f"importing sequoia.core pulled in: {out.stdout.strip()}"


def test_imports_inside_functions_say_why():
    """Imports belong at the top; the few optional heavy ones kept local carry a comment saying why."""
    bad = []
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            lines = path.read_text().splitlines()
            for node in ast.walk(ast.parse("\n".join(lines), str(path))):
                if isinstance(node, (ast.Import, ast.ImportFrom)) and node.col_offset > 0:
                    here, above = lines[node.lineno - 1], lines[node.lineno - 2] if node.lineno > 1 else ""
                    if "#" not in here and not above.strip().startswith("#"):
                        bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: {here.strip()}")
    assert not bad, f"{len(bad)} local imports without a reason:\n" + "\n".join(bad)
