"""The fuzz smokes. libFuzzer: the C++ core under ASan + UBSan (decode, transcode, restart index, routes),
replaying each corpus, then fuzzing for GPUPIPE_FUZZ_SECONDS in all (default 60). Atheris: the
public Python API for GPUPIPE_FUZZ_API_SECONDS (default 20). Any finding fails the suite."""

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CLANG = shutil.which("clang++") or shutil.which("clang++-14")


@pytest.mark.slow
@pytest.mark.skipif(CLANG is None, reason="clang++ not installed (apt-get install clang-14 libclang-rt-14-dev)")
def test_libfuzzer_smoke_finds_nothing():
    seconds = os.environ.get("GPUPIPE_FUZZ_SECONDS", "60")
    env = dict(os.environ, FUZZ_CXX=CLANG, PYTHON=sys.executable)
    r = subprocess.run(["bash", str(ROOT / "csrc" / "fuzz" / "run.sh"), seconds], capture_output=True, text=True,
                       timeout=int(seconds) + 900, env=env, cwd=ROOT)
    tail = (r.stdout + r.stderr)[-4000:]
    assert r.returncode == 0, tail
    for harness in ("decode", "transcode", "restart", "routes"):
        assert f"[fuzz] {harness}: replaying" in r.stdout + r.stderr, tail
    assert (r.stdout + r.stderr).count("stat::number_of_executed_units") == 4, tail


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("atheris") is None, reason="atheris not installed (pip install atheris)")
def test_atheris_api_smoke_finds_nothing(tmp_path):
    seconds = os.environ.get("GPUPIPE_FUZZ_API_SECONDS", "20")
    corpus = tmp_path / "corpus"
    subprocess.run([sys.executable, str(ROOT / "tests" / "fuzz" / "make_corpus.py"), str(corpus)], check=True,
                   capture_output=True, cwd=ROOT)
    r = subprocess.run([sys.executable, str(ROOT / "tests" / "fuzz" / "fuzz_api.py"), str(corpus / "api"),
                        f"-max_total_time={seconds}", "-timeout=20", f"-artifact_prefix={tmp_path}/"],
                       capture_output=True, text=True, timeout=int(seconds) + 600, cwd=ROOT)
    tail = (r.stdout + r.stderr)[-4000:]
    assert r.returncode == 0, tail
    assert "DONE" in tail or "Done" in tail, tail
