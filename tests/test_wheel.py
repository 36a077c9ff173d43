"""The wheel a user installs: `.ci/wheel` builds it, auditwheel makes it a manylinux wheel carrying
its libjpeg-turbo, and a fresh venv that installs only that wheel (and what it declares) imports
gpupipe from outside the source tree, decodes a crop, augments a batch and runs the README's quickstart
verbatim (~2 minutes: the wheel links the editable install's objects; the fresh venv installs torch)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("python3") is None, reason="no python3 to make the fresh venv")
def test_the_wheel_installs_in_a_fresh_venv_and_works_outside_the_tree():
    r = subprocess.run(["bash", str(ROOT / ".ci" / "wheel")], cwd=ROOT, capture_output=True, text=True, timeout=1200,
                       env=dict(os.environ, GPUPIPE_WHEEL_NO_SETUP="1"))
    log = r.stdout + r.stderr
    assert r.returncode == 0, log[-4000:]
    wheels = list((ROOT / "dist").glob("torch_gpupipe-*-manylinux_*_x86_64.whl"))
    assert len(wheels) == 1, log[-2000:]
    assert "libjpeg-" in log and "LIBJPEGTURBO_6.2" in log  # grafted: the wheel carries its libjpeg-turbo
    assert "[wheel] smoke ok: gpupipe" in log and "site-packages/gpupipe/__init__.py" in log
    assert "[wheel] the README's quickstart ran verbatim" in log
