"""The main job: `bash .ci/bench` runs the benchmarks' entry point (`python -m benchmarks.main`), which
prints the table and writes its three outputs (results.json, results.md, results.png); one or two
quick workloads each."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

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


def _benchmarks():
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from benchmarks import augment, datasets, harness, main, policies

    return augment, datasets, harness, main, policies


def strict_json(path: Path):
    def refuse(constant):
        raise ValueError(f"not JSON: {constant}")

    return json.loads(path.read_text(), parse_constant=refuse)


def test_a_failing_peer_is_a_failed_row_not_the_end_of_the_job(tmp_path):
    _, _, harness, _, _ = _benchmarks()
    calls = []

    def broken():
        calls.append(1)
        raise RuntimeError("simplejpeg: unsupported color space\nmore")

    rows = harness.run_side_by_side("decode", {"gpupipe": lambda: None, "simplejpeg": broken}, 4, repeats=3)
    ours, peer = rows
    assert ours.skipped is None and len(ours.times) == 3
    assert peer.skipped == "failed: RuntimeError: simplejpeg: unsupported color space" and peer.times == []
    assert calls == [1]  # dropped at its first failure (the warm-up)
    rows.append(harness.Row("decode", "never timed", 4, times=[float("nan")]))
    harness.save(rows, {"torch": "x"}, tmp_path, "title", "gpupipe")
    data = strict_json(tmp_path / "results.json")  # no NaN in the file
    assert [r["skipped"] for r in data["results"]][:2] == [None, peer.skipped]
    assert data["results"][2]["times"] == [None] and "| simplejpeg | skipped: failed:" in (tmp_path / "results.md").read_text()


def test_the_job_saves_after_each_workload_and_goes_on_past_a_failed_one(tmp_path, monkeypatch, capsys):
    augment, datasets, harness, main, policies = _benchmarks()
    out = tmp_path / "out"
    monkeypatch.setattr(datasets, "SETS", {})  # (no embedded sets made)
    monkeypatch.setattr(augment, "run", lambda threads, repeats: [harness.Row(f"augment, {threads} threads", "gpupipe fused",
                                                                              4, times=[0.1])])

    def policies_fail(repeats):
        saved = strict_json(out / "results.json")  # the rows before this workload are on disk already
        assert [r["workload"] for r in saved["results"]] == ["augment, 1 threads", "augment, 2 threads"]
        raise RuntimeError("a peer's install is broken")

    monkeypatch.setattr(policies, "run", policies_fail)
    with pytest.raises(SystemExit) as e:
        main.main(["--quick", "--workloads", "augment", "policies", "--out", str(out)])
    assert e.value.code == 1
    rows = strict_json(out / "results.json")["results"]
    assert [(r["workload"], r["skipped"]) for r in rows] == [
        ("augment, 1 threads", None), ("augment, 2 threads", None),
        ("policies", "failed: RuntimeError: a peer's install is broken")]
    assert "workloads failed: policies" in capsys.readouterr().err


@pytest.mark.parametrize("where", ["a file", "under a file"])
def test_a_bad_out_folder_stops_the_job_before_it_measures(tmp_path, monkeypatch, capsys, where):
    augment, datasets, _, main, _ = _benchmarks()
    monkeypatch.setattr(datasets, "load_set", lambda name: pytest.fail("ran before --out was checked"))
    monkeypatch.setattr(augment, "run", lambda **kw: pytest.fail("ran before --out was checked"))
    (tmp_path / "afile").write_text("")
    out = tmp_path / "afile" if where == "a file" else tmp_path / "afile" / "out"
    with pytest.raises(SystemExit) as e:
        main.main(["--quick", "--workloads", "augment", "--out", str(out)])
    lines = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(lines) == 1 and lines[0].startswith(f"python -m benchmarks.main: --out {str(out)!r}: ")


def test_per_sample_torchvision_gets_contiguous_images(monkeypatch):
    """x[i] of the channels-last batch is a strided view, on which torchvision's per-sample ops are
    up to 22% slower than on the contiguous CHW images a Dataset hands over (as the policies' rows
    give them): the ratio was inflated."""
    augment, _, _, _, _ = _benchmarks()
    from torchvision.transforms import v2

    seen = []

    class Recording:
        def __init__(self, ops):
            pass

        def __call__(self, img):
            seen.append(img.is_contiguous())
            return img

    monkeypatch.setattr(v2, "Compose", Recording)
    x = torch.zeros((3, 24, 24, 3), dtype=torch.uint8).permute(0, 3, 1, 2)  # channels-last, as gpupipe decodes
    for rotation in (True, False):
        methods, _, _ = augment._chain_methods(x, rotation)
        methods["torchvision v2 per sample"]()
    assert seen == [True] * 6
