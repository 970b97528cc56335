"""A front end never touches a model or an accelerator: importing it (all that runs in a
front end process) loads no backend (onnxruntime, torch), so only the engine can hold
weights or a CUDA context (issue 16, item 3)."""

from __future__ import annotations

import subprocess
import sys


def test_a_front_end_imports_no_backend() -> None:
    code = (
        "import sys, inferd.engine.front_end, inferd.engine.supervisor\n"
        "print(sorted(m for m in ('onnxruntime', 'torch', 'onnx') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
