"""The main job: `bash .ci/bench` runs the benchmarks' entry point (`python -m benchmarks.main`), which
prints the table and writes its three outputs (results.json, results.md, results.png); one or two
quick workloads each."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PNG = b"\x89PNG\r\n\x1a\n"


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
    assert (out / "results.png").read_bytes()[:8] == PNG
    assert "gpupipe fused" in r.stdout


def ci_bench(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """`bash .ci/bench ARGS`, the script itself, run in a tree laid out as the checkout (its .venv and
    benchmarks/) whose .ci/setup.sh only records that it ran: the real set-up reinstalls gpupipe,
    which rebuilds the extension (minutes)."""
    tree = tmp_path / "tree"
    (tree / ".ci").mkdir(parents=True)
    shutil.copy(ROOT / ".ci" / "bench", tree / ".ci" / "bench")
    (tree / ".ci" / "setup.sh").write_text('touch "$(dirname "$0")/../setup-ran"\n')
    for name in (".venv", "benchmarks"):
        (tree / name).symlink_to(ROOT / name)
    return subprocess.run(["bash", str(tree / ".ci" / "bench"), *args], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path)


def test_ci_bench_runs_the_main_job(tmp_path):
    """Through .ci/bench, set up first: the train recipe's pipelines (the gpupipe Loader and a
    DataLoader, gpupipe.bench's runners, epochs timed by its measure) and the seed experiment, into
    the job's table, JSON, markdown and plot."""
    out = tmp_path / "out"
    r = ci_bench(tmp_path, "--quick", "--workloads", "recipe", "seed", "--out", str(out))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert (tmp_path / "tree" / "setup-ran").exists()
    data = json.loads((out / "results.json").read_text())
    assert data["title"] == "gpupipe vs peers (CPU)" and data["environment"]["torch"]
    assert [row["method"] for row in data["results"]] == ["gpupipe Loader", "DataLoader (2 workers)"]
    for row in data["results"]:
        assert row["workload"].startswith("train recipe (train-ta): 256 x 800x533"), row
        assert row["skipped"] is None and row["unit_items"] == 256 and len(row["times"]) == 1, row
        assert row["times"][0] > 0 and row["items_per_s"] == 256 / row["times"][0], row
    table = (out / "results.md").read_text()
    assert table.startswith("# gpupipe vs peers (CPU)\n\n### train recipe (train-ta)")
    assert "| speedup of gpupipe Loader |" in table and "| gpupipe Loader (keyed Compose" in table
    seed = table[table.index("### the seed's experiment"):].splitlines()
    assert [line.split(" | ")[0] for line in seed if line.startswith("| (")] == [
        "| (a) DataLoader + full decode + per-sample transforms", "| (b) DataLoader + decode_and_crop_jpeg in __getitem__",
        "| (c) gpupipe.Loader + BatchAugment"]
    assert (out / "results.png").read_bytes()[:8] == PNG
    assert "| DataLoader (2 workers)" in r.stdout and "| input pipeline | s / step |" in r.stdout
    assert f"wrote {out}/results.json" in r.stdout


def test_the_huffman_workload_times_the_reader_beside_libjpegs_decoder_and_restores_it():
    sys.path.insert(0, str(ROOT))
    from benchmarks import batch_decode
    from helpers import encode, photo

    from gpupipe import _C

    datas = [encode(photo(120 + 8 * i, 160), quality=90) for i in range(4)]
    before = _C._set_huffman_reader(True)
    try:
        rows = batch_decode.huffman_reader({"tiny": datas}, size=32, repeats=1)
        assert _C._set_huffman_reader(True)  # left on, as it was
    finally:
        _C._set_huffman_reader(before)
    assert [(r.workload.split(":")[0], r.method) for r in rows] == [
        (f"Huffman reader, {what}", m) for what in ("RandomResizedCrop 32", "whole image")
        for m in ("gpupipe", "libjpeg's Huffman decoder")]
    assert all(len(r.times) == 1 and r.times[0] > 0 and r.unit_items == 4 for r in rows)
