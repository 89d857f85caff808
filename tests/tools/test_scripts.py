"""Scripts cannot rot: every script under scripts/ answers ``--help`` and names only library objects that exist.

``--help`` runs each script as a user would (``python scripts/<name>.py --help`` from the repository
root, no PYTHONPATH), so its top-level imports run and its argument parser is built, but no model is
loaded.  The scripts start in parallel (each imports torch, most transformers: ~5-20 s apiece on a
busy 2-core machine).  Imports inside functions are not run by ``--help``; the second test reads every
``from sequoia... import name`` in each script's source, wherever it sits, and checks that it resolves.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted((ROOT / "scripts").rglob("*.py"))


def test_there_are_scripts():
    assert len(SCRIPTS) >= 5


@pytest.fixture(scope="module")
def helps() -> dict[str, subprocess.CompletedProcess]:
    """``--help`` of every script, all started at once; name -> (returncode, stdout, stderr)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # eleven interpreters at once: no thread pools fighting
    procs = {str(p.relative_to(ROOT / "scripts")):
             subprocess.Popen([sys.executable, str(p.relative_to(ROOT)), "--help"], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for p in SCRIPTS}
    out = {}
    for name, proc in procs.items():
        try:
            stdout, stderr = proc.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            proc.kill()
            stdout, stderr = proc.communicate()
        out[name] = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    return out


@pytest.mark.parametrize("script", [str(p.relative_to(ROOT / "scripts")) for p in SCRIPTS])
def test_script_help_exits_0(helps, script):
    res = helps[script]
    assert res.returncode == 0, f"{script} --help exited {res.returncode}:\n{res.stderr[-3000:]}"
    assert "usage:" in res.stdout, f"{script} --help printed no usage (does it parse its arguments?)"


def _library_imports(path: Path) -> list[tuple[str, str | None]]:
    """(module, name) for every import of ``sequoia`` in the file, at any depth; name None for ``import m``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and \
                node.module.split(".")[0] == "sequoia":
            found += [(node.module, a.name) for a in node.names]
        elif isinstance(node, ast.Import):
            found += [(a.name, None) for a in node.names if a.name.split(".")[0] == "sequoia"]
    return found


@pytest.mark.parametrize("script", [str(p.relative_to(ROOT / "scripts")) for p in SCRIPTS])
def test_script_imports_resolve(script):
    path = ROOT / "scripts" / script
    for module, name in _library_imports(path):
        mod = importlib.import_module(module)
        if name is not None and name != "*":
            assert hasattr(mod, name) or importlib.util.find_spec(f"{module}.{name}") is not None, \
                f"{script}: `from {module} import {name}`: no such name"


def test_profile_step_finds_every_function_it_times():
    """profile_step.py wraps library functions by module and attribute name; each must exist.

    ``instrument`` patches the library's classes, so it runs in a child process.
    """
    code = ("import sys; sys.path[:0] = ['scripts/measure', '.']; import profile_step as p; "
            "p.instrument('sequoia', p.Timers()); print('ok')")
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr[-3000:]
