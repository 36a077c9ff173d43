"""Helpers shared by the test modules (import this, never conftest)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import gpupipe

TESTS = Path(__file__).resolve().parent


@contextlib.contextmanager
def limits(**kwargs):
    """gpupipe.set_limits(**kwargs) for the duration of the block."""
    old = gpupipe.set_limits(**kwargs)
    try:
        yield
    finally:
        gpupipe.set_limits(*old)


def run_child(code: str, timeout: float = 120, env: dict | None = None) -> subprocess.CompletedProcess:
    """Runs `code` in a fresh interpreter (tests/ importable, warnings ignored), so that a crash, an
    abort or a hang fails the test instead of killing the suite. Asserts the child exits 0 and
    writes nothing to stderr; returns the finished process (stdout for the caller)."""
    prologue = "import sys, warnings\nsys.path.insert(0, %r)\nwarnings.simplefilter('ignore')\n" % str(TESTS)
    r = subprocess.run([sys.executable, "-c", prologue + textwrap.dedent(code)], capture_output=True, text=True,
                       timeout=timeout, env=dict(os.environ, **(env or {})))
    assert r.returncode == 0, f"child died with {r.returncode}:\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
    assert r.stderr == "", f"child wrote to stderr:\n{r.stderr[-4000:]}"
    return r
