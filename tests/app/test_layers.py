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

ROOT = Path(__file__).resolve().parents[2]
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


#: Rooms inside a layer: what each package may import of its own layer, besides itself.  The page: widgets at the
#: bottom, the app's state above them, one package per tab above both (a tab never imports another tab, but the
#: Hardware tab runs Compare's rounds).  The runtime: the engine room (the package itself), then the proposers,
#: the checks (teacher forcing and the baselines among them), the measuring, each importing only those before it.
ROOMS = {
    "components.widgets": ("components.widgets",),
    "components.app_state": ("components.widgets", "components.app_state"),
    "components.live": ("components.widgets", "components.app_state", "components.live"),
    "components.compare": ("components.widgets", "components.app_state", "components.compare"),
    "components.dp_explorer": ("components.widgets", "components.app_state", "components.dp_explorer"),
    "components.distribution": ("components.widgets", "components.app_state", "components.distribution"),
    "components.hardware": ("components.widgets", "components.app_state", "components.hardware",
                            "components.compare.compare_run"),
    "sequoia.runtime.proposers": ("sequoia.runtime.proposers",),
    "sequoia.runtime.checks": ("sequoia.runtime.proposers", "sequoia.runtime.checks"),
    "sequoia.runtime.measuring": ("sequoia.runtime.proposers", "sequoia.runtime.checks", "sequoia.runtime.measuring"),
}
#: The packages whose rooms ROOMS orders; a module directly in one (the engine room, components' colours) is below
#: every room of it.
ROOMED = ("components", "sequoia.runtime")


def _room(mod: str) -> str | None:
    return next((r for r in ROOMS if mod == r or mod.startswith(r + ".")), None)


def test_each_room_imports_only_the_rooms_below_it():
    bad = []
    for mod, deps in _project_graph().items():
        room = _room(mod)
        if room is None:
            continue
        outer = next(p for p in ROOMED if room.startswith(p + "."))
        for dep, line in deps:
            if not dep.startswith(outer + ".") or _room(dep) is None:
                continue   # another layer (checked above), or the package's own ground floor
            if not dep.startswith(ROOMS[room]):
                bad.append(f"{mod}:{line} imports {dep}")
    assert not bad, "room violations:\n" + "\n".join(bad)


def test_the_ground_floor_of_a_package_imports_none_of_its_rooms():
    """The engine room (sequoia/runtime/*.py) and components' colours never reach up into the rooms above them
    (but the page's served trees, which read two tabs' defaults, and the engine room's method factory, which
    builds every proposer by name)."""
    allowed = {"components.served_trees", "sequoia.runtime.methods"}
    bad = []
    for mod, deps in _project_graph().items():
        outer = next((p for p in ROOMED if mod.rpartition(".")[0] == p or mod == p), None)
        if outer is None or mod in allowed:
            continue
        bad.extend(f"{mod}:{line} imports {dep}" for dep, line in deps if _room(dep) and dep.startswith(outer + "."))
    assert not bad, "\n".join(bad)


def test_no_source_folder_holds_more_than_15_files_and_every_package_says_its_job():
    crowded, silent = [], []
    for folder in [ROOT / "components", ROOT / "sequoia", ROOT / "scripts",
                   *(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*") if p.is_dir())]:
        if folder.name == "__pycache__":
            continue
        files = [f for f in folder.iterdir() if f.is_file() and f.suffix in (".py", ".sh")]
        if len(files) > 15:
            crowded.append(f"{folder.relative_to(ROOT)}: {len(files)} files")
        init = folder / "__init__.py"
        if folder.name != "scripts" and folder != ROOT and files and (not init.exists() or not ast.get_docstring(
                ast.parse(init.read_text()))):
            silent.append(str(folder.relative_to(ROOT)))
    assert not crowded, crowded
    assert not silent, f"packages whose __init__ says nothing: {silent}"


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


# ------------------------------------------------------------------ no process-wide switches
#: The one place allowed to write ``torch.backends``: oneDNN's counted one-row switch (torch offers no per-module
#: choice of its bf16 matmul kernel, so the switch turns the process's flag off for a forward and restores it).
BACKEND_WRITERS = {("sequoia/runners/hf/onednn.py", "_OneDnnSwitch")}
_SETTERS = ("flags", "set_flags")


def _dotted(node: ast.AST) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return ".".join(reversed(parts))


def _backend_writes(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, enclosing class or function) of every write to torch.backends.* or torch._C._set_* in ``tree``."""
    out = []

    def visit(node: ast.AST, owner: str) -> None:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            owner = owner or node.name
        targets = []
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        elif isinstance(node, ast.Call):
            name = _dotted(node.func)
            if name.startswith("torch.backends.") and name.rsplit(".", 1)[-1] in _SETTERS \
                    or name.startswith("torch._C._set_"):
                out.append((node.lineno, owner))
            if name == "setattr" and node.args and _dotted(node.args[0]).startswith("torch.backends"):
                out.append((node.lineno, owner))
        out.extend((node.lineno, owner) for t in targets if _dotted(t).startswith("torch.backends."))
        for child in ast.iter_child_nodes(node):
            visit(child, owner)

    visit(tree, "")
    return out


def _sources():
    for pkg in (*PACKAGES, "scripts"):
        yield from sorted((ROOT / pkg).rglob("*.py"))
    yield ROOT / "app.py"


def test_torch_backends_are_written_only_by_the_one_scoped_switch():
    bad, found = [], set()
    for path in _sources():
        rel = str(path.relative_to(ROOT))
        for line, owner in _backend_writes(ast.parse(path.read_text(), rel)):
            if (rel, owner) in BACKEND_WRITERS:
                found.add((rel, owner))
            else:
                bad.append(f"{rel}:{line} writes torch.backends (in {owner or 'the module'})")
    assert not bad, "process-wide torch switches outside the scoped helper:\n" + "\n".join(bad)
    assert found == BACKEND_WRITERS   # the guard sees the one writer it allows


def _module_level(tree: ast.Module):
    """Statements that run at import: the module's own, and those inside its top-level if/try blocks."""
    todo = list(tree.body)
    while todo:
        node = todo.pop(0)
        if isinstance(node, (ast.If, ast.Try)):
            todo.extend(node.body + node.orelse + getattr(node, "finalbody", [])
                        + [s for h in getattr(node, "handlers", []) for s in h.body])
        else:
            yield node


def test_the_llamacpp_package_does_nothing_at_import():
    """No llama.cpp call runs at import (backend init, log callback): the backend is set up on first use."""
    bad = []
    for path in sorted((ROOT / "sequoia" / "runners" / "llamacpp").glob("*.py")):
        rel = path.relative_to(ROOT)
        for node in _module_level(ast.parse(path.read_text(), str(rel))):
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
                bad.append(f"{rel}:{node.lineno}: a call at import")
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                bad.extend(f"{rel}:{d.lineno}: a decorator calls llama_cpp at import"
                           for d in node.decorator_list if _dotted(d).startswith("llama_cpp"))
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                bad.extend(f"{rel}:{c.lineno}: {_dotted(c.func)}() at import" for c in ast.walk(node.value)
                           if isinstance(c, ast.Call) and _dotted(c.func).startswith("llama_cpp"))
    assert not bad, "\n".join(bad)


def test_importing_the_llamacpp_runner_initialises_no_backend():
    """The real check behind the static one, where llama-cpp-python is installed: no backend call at import."""
    pytest.importorskip("llama_cpp")
    code = ("import llama_cpp\ncalls = []\n"
            "for name in ('llama_backend_init', 'llama_log_set', 'llama_numa_init'):\n"
            "    setattr(llama_cpp, name, lambda *a, _n=name: calls.append(_n))\n"
            "import sequoia.runners.llamacpp.runner, sequoia.runners.llamacpp.load, sequoia.runners.llamacpp.quantize\n"
            "from sequoia.runners.llamacpp.backend import backend_ready\n"
            "print(calls, backend_ready())")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["[]", "False"]


# ------------------------------------------------------------------ no module-level mutable state in components/
#: Module-level state the page still keeps, each with why; the room split of issue 32 is to move them onto the
#: app's state.  (file, name): reason.
KNOWN_MODULE_STATE: dict[tuple[str, str], str] = {
    ("components/app_state/serving.py", "spaces"):
        "the process's ZeroGPU surface: the spaces package, or the stand-in SEQUOIA_ZEROGPU_STANDIN=1 puts there "
        "before the page is built",
    ("components/app_state/pair_room.py", "_current"):
        "the GPU call this process serves: ZeroGPU runs one call at a time in a worker process made for it, so the "
        "call is a fact of the process (None in the server itself)",
}
_CONTAINERS = (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)
_CONTAINER_CALLS = ("dict", "list", "set", "OrderedDict", "defaultdict", "deque", "Counter")
_MUTATORS = ("append", "extend", "insert", "add", "update", "setdefault", "pop", "popitem", "clear", "remove",
             "discard", "move_to_end", "appendleft", "popleft")
#: Objects that are not state themselves (a lock guards state; it holds none).
_STATELESS_CALLS = ("threading.Lock", "threading.RLock", "Lock", "RLock", "TypeVar")


def _module_state(tree: ast.Module) -> dict[str, int]:
    """Module-level names that hold state: a container the module mutates, an instance of one of its own classes,
    or a name a function rebinds with ``global``."""
    classes = {n.name for n in tree.body if isinstance(n, ast.ClassDef)}
    containers, found = {}, {}
    for node in _module_level(tree):
        if not isinstance(node, (ast.Assign, ast.AnnAssign)) or node.value is None:
            continue
        for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
            if not isinstance(target, ast.Name):
                continue
            value, call = node.value, _dotted(getattr(node.value, "func", None) or ast.Pass())
            if isinstance(value, _CONTAINERS) or call.rsplit(".", 1)[-1] in _CONTAINER_CALLS:
                containers[target.id] = node.lineno
            elif isinstance(value, ast.Call) and call in classes and call not in _STATELESS_CALLS:
                found[target.id] = node.lineno
    for node in ast.walk(tree):
        if isinstance(node, ast.Global):
            found.update((name, node.lineno) for name in node.names)
        mutated = None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _MUTATORS:
            mutated = node.func.value
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.Delete)):
            for t in node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]:
                if isinstance(t, ast.Subscript):
                    mutated = t.value
        if isinstance(mutated, ast.Name) and mutated.id in containers:
            found[mutated.id] = containers[mutated.id]
    return found


def test_components_keep_no_module_level_mutable_state():
    """State lives on the app's objects (passed to each tab), not in module globals that every session shares."""
    bad = []
    for path in sorted((ROOT / "components").rglob("*.py")):
        rel = str(path.relative_to(ROOT))
        for name, line in _module_state(ast.parse(path.read_text(), rel)).items():
            if (rel, name) not in KNOWN_MODULE_STATE:
                bad.append(f"{rel}:{line}: module-level state {name!r}")
    assert not bad, "keep state on the app's objects, or list it in KNOWN_MODULE_STATE with why:\n" + "\n".join(bad)


def test_the_module_state_guard_sees_what_it_forbids():
    code = ("import threading\nclass Memo:\n    pass\nSEEN = {}\nFIXED = {'a': 1}\nLOCK = threading.Lock()\n"
            "MEMO = Memo()\n_pool = None\ndef f(k):\n    SEEN[k] = 1\n    return FIXED[k]\n"
            "def g():\n    global _pool\n    _pool = 1\n")
    assert set(_module_state(ast.parse(code))) == {"SEEN", "MEMO", "_pool"}


def test_test_folders_are_on_the_path_and_their_names_unique():
    """Tests import each other's helpers by module name: every folder holding tests is on pytest's path, and no
    two test files share a name (one would shadow the other)."""
    import tomllib
    paths = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["pythonpath"])
    files = sorted((ROOT / "tests").rglob("test_*.py"))
    folders = {str(f.parent.relative_to(ROOT)) for f in files}
    assert folders <= paths, folders - paths
    names = [f.name for f in files]
    assert len(names) == len(set(names))
