"""The libFuzzer smoke: the C++ core under ASan + UBSan, replaying the corpus of every variant and
then fuzzing for GPUPIPE_FUZZ_SECONDS (default 60). Any finding fails the suite."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CLANG = shutil.which("clang++") or shutil.which("clang++-14")


@pytest.mark.slow
@pytest.mark.skipif(CLANG is None, reason="clang++ not installed (apt-get install clang-14 libclang-rt-14-dev)")
def test_libfuzzer_smoke_finds_nothing():
    seconds = os.environ.get("GPUPIPE_FUZZ_SECONDS", "60")
    env = dict(os.environ, FUZZ_CXX=CLANG)
    r = subprocess.run(["bash", str(ROOT / "csrc" / "fuzz" / "run.sh"), seconds], capture_output=True, text=True,
                       timeout=int(seconds) + 600, env=env, cwd=ROOT)
    tail = (r.stdout + r.stderr)[-4000:]
    assert r.returncode == 0, tail
    assert "stat::number_of_executed_units" in tail
