"""Scripts cannot rot: every script under scripts/ answers ``--help`` and names only library objects that exist.

``--help`` runs each script as ``python scripts/<name>.py --help`` from the repository root does (its folder first
on ``sys.path``, the root not on it, no PYTHONPATH), so its top-level imports run and its argument parser is built,
but no model is loaded.  One interpreter imports the libraries the scripts share (torch, transformers, gradio, scipy)
once and forks a child per script, which runs it as ``__main__``: nothing of the repository is imported before the
child runs its script, and nothing one script imports is seen by another.  Imports inside functions are not run by
``--help``; the second test reads every ``from sequoia... import name`` in each script's source, wherever it sits,
and checks that it resolves.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted((ROOT / "scripts").rglob("*.py"))


def test_there_are_scripts():
    assert len(SCRIPTS) >= 5


#: Run in one interpreter (``python -c``, from the root, with the scripts' paths as arguments): prints
#: {path: [returncode, stdout, stderr]} as JSON.  ``python -c`` puts the root first on sys.path; a script run as
#: ``python scripts/x.py`` has its own folder there instead.
HELP_ALL = r"""
import json, os, runpy, sys, tempfile, time, traceback
sys.path[:] = [p for p in sys.path if p not in ("", os.getcwd())]
# what the scripts' imports load (the library's too), imported once before the forks
import gradio, gradio_client, numpy, scipy.stats, torch, transformers.modeling_utils
from transformers import AutoModelForCausalLM, AutoTokenizer
base = list(sys.path)

def child(path):
    sys.argv, sys.path[:] = [path, "--help"], [os.path.dirname(os.path.abspath(path))] + base
    try:
        runpy.run_path(os.path.abspath(path), run_name="__main__")
        code = 0
    except SystemExit as exc:   # as the interpreter reads it: None is 0, a message is printed and is 1
        code = exc.code
        if code is not None and not isinstance(code, int):
            print(code, file=sys.stderr)
            code = 1
        code = code or 0
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)

todo, running, out = list(sys.argv[1:]), {}, {}
while todo or running:
    while todo and len(running) < (os.cpu_count() or 1):
        path = todo.pop(0)
        files = tempfile.TemporaryFile(), tempfile.TemporaryFile()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            os.dup2(files[0].fileno(), 1)
            os.dup2(files[1].fileno(), 2)
            child(path)
        running[pid] = path, files, time.monotonic() + 300
    pid, status = os.waitpid(-1, os.WNOHANG)
    if pid == 0:
        for pid, (path, files, deadline) in running.items():
            if time.monotonic() > deadline:
                os.kill(pid, 9)   # reaped below: its returncode says so
        time.sleep(0.02)
        continue
    path, files, _ = running.pop(pid)
    texts = []
    for f in files:
        f.seek(0)
        texts.append(f.read().decode(errors="replace"))
    out[path] = [os.waitstatus_to_exitcode(status)] + texts
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def helps() -> dict[str, subprocess.CompletedProcess]:
    """``--help`` of every script, as :data:`HELP_ALL` runs them; name -> (returncode, stdout, stderr)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    paths = [str(p.relative_to(ROOT)) for p in SCRIPTS]
    proc = subprocess.run([sys.executable, "-c", HELP_ALL, *paths], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = json.loads(proc.stdout)
    return {str(Path(path).relative_to("scripts")): subprocess.CompletedProcess([path, "--help"], *runs[path])
            for path in paths}


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
