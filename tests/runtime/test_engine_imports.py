"""The engine knows token ids and runners only: importing it loads no transformers, gradio or llama.cpp."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ENGINE = Path(__file__).resolve().parents[2] / "sequoia" / "runtime" / "engine.py"


def test_the_engine_imports_no_model_framework():
    code = ("import sys, sequoia.runtime.engine; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'transformers', 'gradio', 'llama_cpp', 'plotly'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_the_engine_never_decodes_text():
    """Texts and stop strings are the caller's (sequoia.runtime.texts): the engine has no tokenizer to call."""
    assert "tokenizer" not in ENGINE.read_text()
