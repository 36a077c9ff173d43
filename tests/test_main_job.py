"""The main job's entry point (`bash .ci/bench` = `python -m benchmarks.main`) runs and writes its
three outputs (one quick workload)."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_bench_entry_point_writes_json_markdown_and_plot(tmp_path):
    out = tmp_path / "bench"
    r = subprocess.run([sys.executable, "-m", "benchmarks.main", "--quick", "--workloads", "augment", "--out", str(out)],
                       capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    data = json.loads((out / "results.json").read_text())
    assert data["environment"]["torch"] and data["environment"]["cores_affinity"] >= 1
    methods = {row["method"] for row in data["results"]}
    assert "gpupipe fused" in methods and "PIL chain (per sample)" in methods
    assert "speedup of gpupipe fused" in (out / "results.md").read_text()
    assert (out / "results.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "gpupipe fused" in r.stdout


def test_ci_bench_runs_the_main_job():
    script = (ROOT / ".ci" / "bench").read_text()
    assert "python -m benchmarks.main" in script
