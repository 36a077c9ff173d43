"""``python -m gpupipe bench`` and ``python -m gpupipe info`` as an installed package runs them:
in a subprocess whose working folder is outside the checkout and where ``benchmarks`` cannot be
imported, on small generated data, in quick mode (seconds, not measurements)."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import gpupipe
from gpupipe.bench import recipes
from gpupipe.sources import write_tar_shards
from loader_data import make_image_folder

# `python -m gpupipe ...` with the checkout's `benchmarks` made unimportable, as after `pip install .`
# (the editable install puts the checkout on sys.path).
LAUNCH = ("import runpy, sys; sys.modules['benchmarks'] = None; sys.argv = ['gpupipe'] + sys.argv[1:]; "
          "runpy.run_module('gpupipe', run_name='__main__', alter_sys=True)")
QUICK = ["--quick", "--batch-size", "4", "--steps", "2", "--threads", "2"]


def gpupipe_cli(args, cwd, env_extra=None, timeout=300):
    env = {**os.environ, "GPUPIPE_CACHE": str(Path(cwd) / "cache"), **(env_extra or {})}
    return subprocess.run([sys.executable, "-c", LAUNCH, *map(str, args)], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("images")
    make_image_folder(str(root), classes=("cat", "dog"), per_class=6)
    return root


def check_results(out: Path, methods: list, recipe: str, exact: bool = True) -> dict:
    data = json.loads((out / "results.json").read_text())
    assert data["recipe"]["name"] == recipe
    env = data["environment"]
    assert env["torch"] and env["gpupipe"] == gpupipe.__version__ and env["cores_affinity"] >= 1 and env["cpu"]
    assert env["libjpeg_turbo"] == gpupipe._C.libjpeg_turbo_version
    rows = {r["method"]: r for r in data["results"]}
    assert list(rows)[: len(methods)] == methods
    for name in methods:
        assert not rows[name]["skipped"], rows[name]["skipped"]
        assert rows[name]["images_per_s"] > 0 and rows[name]["ms_per_batch"] > 0
        # 2 timed batches of 4 (streamed shards: each DataLoader worker ends on its own partial batch)
        assert rows[name]["images"] == [8] if exact else 0 < rows[name]["images"][0] <= 8
    base = rows["DataLoader (2 workers)"]
    assert data["baseline"] == base["method"] and base["ratio_vs_baseline"] == pytest.approx(1.0)
    gp = rows["gpupipe Loader"]
    assert gp["ratio_vs_baseline"] == pytest.approx(gp["images_per_s"] / base["images_per_s"])
    assert data["gpu_fed_down_to_ms_per_step"] == pytest.approx(gp["ms_per_batch"])
    assert isinstance(data["loader_stats"]["busy_s"], dict) and data["loader_stats"]["images"] > 0
    assert (out / "results.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return data


def test_benchmarks_are_not_importable_in_these_runs(tmp_path):
    r = subprocess.run([sys.executable, "-c", LAUNCH.split("sys.argv")[0] + "import benchmarks"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "benchmarks" in r.stderr


@pytest.mark.parametrize("recipe, device", [("train", "cpu"), ("eval", "cpu"), ("forum", "cpu"), ("train", "cuda")])
def test_bench_on_an_image_folder(folder, tmp_path, recipe, device):
    from gpupipe.bench.run import dali_missing

    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    out = tmp_path / "out"
    methods = ["gpupipe", "dataloader"] + (["dali"] if recipe == "train" else [])  # DALI: once per device
    r = gpupipe_cli(["bench", *QUICK, "--data", folder, "--recipe", recipe, "--device", device, "--methods", *methods,
                     "--out", out], tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    dali = "DALI " + ("GPU" if device == "cuda" else "CPU")
    ran = ["gpupipe Loader", "DataLoader (2 workers)"] + ([dali] if "dali" in methods and not dali_missing() else [])
    data = check_results(out, ran, recipe)
    assert data["args"]["device"] == device and (device == "cpu" or data["environment"]["cuda_available"])
    if "dali" in methods and dali_missing():
        assert data["results"][2]["skipped"] == dali_missing()
    assert data["data"] == {"kind": "imagefolder", "path": str(folder), "images": 12, "classes": 2}
    assert "| gpupipe Loader" in r.stdout and "vs DataLoader (2 workers)" in r.stdout
    assert "gpupipe keeps a GPU fed down to" in r.stdout and "| decode |" in r.stdout


@pytest.mark.parametrize("kind", ["csv", "tar", "flat"])
def test_bench_on_a_file_list_tar_shards_and_a_flat_folder(folder, tmp_path, kind):
    samples = sorted((str(p), ["cat", "dog"].index(p.parent.name)) for p in folder.rglob("*.jpg"))
    if kind == "csv":
        data = tmp_path / "list.csv"
        with open(data, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["path", "label"])
            w.writerows(samples)
    elif kind == "tar":
        data = tmp_path / "shards"
        write_tar_shards(((f"s{i:03d}", y, Path(p).read_bytes(), "jpg") for i, (p, y) in enumerate(samples)), data,
                         samples_per_shard=5)
    else:
        data = tmp_path / "flat"
        data.mkdir()
        for i, (p, _) in enumerate(samples):
            (data / f"{i}.jpg").write_bytes(Path(p).read_bytes())
    out = tmp_path / "out"
    r = gpupipe_cli(["bench", *QUICK, "--data", data, "--methods", "gpupipe", "dataloader", "--out", out], tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    result = check_results(out, ["gpupipe Loader", "DataLoader (2 workers)"], "train", exact=kind != "tar")
    assert result["data"]["kind"] == {"csv": "csv", "tar": "tar", "flat": "folder"}[kind]
    assert result["data"]["images"] == 12 and result["data"]["classes"] == (1 if kind == "flat" else 2)


def bad_data(tmp_path, case) -> Path:
    data = tmp_path / "data"
    if case == "empty":
        data.mkdir()
    elif case == "empty-classes":
        (data / "cat").mkdir(parents=True)
    elif case == "empty-csv":
        data = tmp_path / "list.csv"
        data.write_text("path,label\n")
    elif case == "bad-csv":
        data = tmp_path / "list.csv"
        data.write_text("file,class\nx.jpg,0\n")
    elif case == "not-data":
        data = tmp_path / "notes.txt"
        data.write_text("hello")
    return data


def test_simulated_step_reports_the_wait_without_a_baseline(folder, tmp_path, capsys):
    """--step-ms sleeps per batch and reports how long the step waited; with the Loader alone there
    is no DataLoader baseline and no ratio (in process: threads only, nothing forked)."""
    from gpupipe.bench import main

    out = tmp_path / "out"
    threads = torch.get_num_threads()
    try:
        assert main([*QUICK, "--data", str(folder), "--methods", "gpupipe", "--step-ms", "20", "--out", str(out)]) == 0
    finally:
        torch.set_num_threads(threads)  # main() sets the process's torch threads, as a CLI does
    text = capsys.readouterr().out
    assert "step waits for data |" in text and "the step waits for the Loader" in text
    data = json.loads((out / "results.json").read_text())
    (row,) = data["results"]
    assert data["baseline"] is None and row["ratio_vs_baseline"] is None
    assert row["seconds"][0] >= 2 * 0.020 and 0 <= row["waited"][0] <= row["seconds"][0]
    assert data["gpu_fed_down_to_ms_per_step"] is None


def test_what_dali_prints_while_building_goes_into_the_report(folder, tmp_path, capfd, monkeypatch):
    """DALI's GPU pipeline printed its bundled nvImageCodec's start-up lines ("[ERROR] [nvjpeg2k_ext]
    Failed to load nvJPEG2000 library ...") to stderr in the middle of the bench's output, once per
    repeat; they become one note of the report."""
    from gpupipe.bench import main, run

    if run.dali_missing():
        pytest.skip(run.dali_missing())
    from nvidia.dali import pipeline

    build = pipeline.Pipeline.build
    line = b"\x1b[0;31m[ERROR] \x1b[0m[nvjpeg2k_ext] Failed to load nvJPEG2000 library or retrieve version.\n"

    def noisy_build(self, *args, **kwargs):  # build() is called again by run(): it prints the first time
        if not self._built:
            os.write(2, line)
        return build(self, *args, **kwargs)

    monkeypatch.setattr(pipeline.Pipeline, "build", noisy_build)
    monkeypatch.setattr(run, "DALI_PRINTED", set())
    threads = torch.get_num_threads()
    try:
        assert main([*QUICK, "--data", str(folder), "--methods", "gpupipe", "dali", "--repeats", "2",
                     "--out", str(tmp_path / "out")]) == 0
    finally:
        torch.set_num_threads(threads)
    out, err = capfd.readouterr()
    assert "nvjpeg2k_ext" not in err and "[ERROR]" not in err
    notes = [s for s in out.splitlines() if s.startswith("note: DALI printed")]
    # one note, once for both repeats (DALI's codec library may add its own lines, e.g. where nvImageCodec's
    # wheel is installed and no GPU driver is: "[nvjpeg-ext] Failed to load nvJPEG library")
    prefix = "note: DALI printed while building its pipeline: "
    assert len(notes) == 1 and notes[0].startswith(prefix)
    said = notes[0][len(prefix):].split(" | ")
    assert "[ERROR] [nvjpeg2k_ext] Failed to load nvJPEG2000 library or retrieve version." in said
    assert len(said) == len(set(said))


def test_plot_and_progress_bar_are_optional(tmp_path, monkeypatch):
    from gpupipe.bench import report, run

    result = report.Result("gpupipe Loader", seconds=[1.0], images=[8], waited=[0.5], batches=2)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    monkeypatch.setitem(sys.modules, "tqdm", None)
    why = report.plot(tmp_path / "results.png", [result], None, "title", None)
    assert "pip install matplotlib" in why and not (tmp_path / "results.png").exists()
    assert run._progress(10, quiet=False) is None


def test_missing_data_folder_is_a_one_line_error(tmp_path):
    data = tmp_path / "data"
    r = gpupipe_cli(["bench", "--quick", "--data", data, "--out", tmp_path / "out"], tmp_path)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines() == [f"gpupipe bench: --data {data}: no such file or folder"]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("case", ["empty", "empty-classes", "empty-csv", "bad-csv", "not-data"])
def test_unusable_data_is_a_one_line_error(tmp_path, case, capsys):
    from gpupipe.bench import main

    data = bad_data(tmp_path, case)
    assert main(["--quick", "--data", str(data), "--out", str(tmp_path / "out")]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"gpupipe bench: --data {data}: "), lines
    expected = {"empty": "holds no images", "empty-classes": "holds no images", "empty-csv": "no rows",
                "bad-csv": "needs 'path' and 'label' columns", "not-data": "must be a .csv file list or a .tar shard"}
    assert expected[case] in lines[0]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("args, message", [(["--batch-size", "0"], "--batch-size must be >= 1"),
                                           (["--steps", "0"], "--steps must be >= 1"),
                                           (["--device", "tpu"], "--device must be cpu or cuda"),
                                           (["--backend", "nvjpeg"], "nvjpeg"),
                                           (["--batch-size", "13"], "--batch-size 13 is larger than the data set")])
def test_bad_arguments_exit_2(folder, tmp_path, capsys, args, message):
    from gpupipe.bench import main

    assert main(["--quick", "--batch-size", "4", "--data", str(folder), "--out", str(tmp_path / "out"), *args]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
    with pytest.raises(SystemExit) as e:
        main(["--recipe", "nope"])
    assert e.value.code == 2 and "invalid choice" in capsys.readouterr().err


def test_default_data_set_run(tmp_path):
    pytest.importorskip("skimage", reason="the default data set is made from scikit-image's photos")
    out = tmp_path / "out"
    r = gpupipe_cli(["bench", *QUICK, "--images", "9", "--methods", "gpupipe", "dataloader", "--out", out], tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    data = check_results(out, ["gpupipe Loader", "DataLoader (2 workers)"], "train")
    made = Path(data["data"]["path"])
    assert data["data"]["kind"] == "default" and made.is_relative_to(tmp_path / "cache")
    files = sorted(made.rglob("*.jpg"))
    assert len(files) == 9 and data["data"]["classes"] == 7  # one class per photo
    sizes = {gpupipe.read_header(f.read_bytes())[:2] for f in files}
    assert len(sizes) >= 2 and any(h > w for h, w in sizes) and any(h < w for h, w in sizes)  # assorted aspects


def test_default_data_set_without_scikit_image_says_what_to_install(tmp_path):
    fake = tmp_path / "fake"
    (fake / "skimage").mkdir(parents=True)
    (fake / "skimage" / "__init__.py").write_text("raise ImportError('scikit-image is not installed')\n")
    r = gpupipe_cli(["bench", "--quick", "--out", tmp_path / "out"], tmp_path, {"PYTHONPATH": str(fake)})
    assert r.returncode == 2 and "pip install scikit-image" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_info(tmp_path):
    r = gpupipe_cli(["info"], tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr
    v = gpupipe._C.libjpeg_turbo_version
    assert f"gpupipe {gpupipe.__version__}" in r.stdout
    assert f"libjpeg-turbo {v // 1000000}.{v // 1000 % 1000}.{v % 1000}" in r.stdout
    assert "CUDA kernels: " + ("built" if gpupipe.augment.cuda_kernel_available() else "not built") in r.stdout
    for name, b in gpupipe.backends_available().items():
        assert f"| {name} | {'yes' if b['available'] else 'no'} |" in r.stdout
        assert b["reason"] in r.stdout


def test_cli_lists_every_command(capsys):
    from gpupipe.__main__ import main

    with pytest.raises(SystemExit) as e:
        main(["--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0 and all(c in out for c in ("prepare", "bench", "info"))


# --- recipes ---------------------------------------------------------------------------------------


def test_train_ta_is_listed_exactly_when_gpupipe_has_its_pieces(monkeypatch):
    assert ("train-ta" in recipes.available()) == (recipes.train_ta_missing() is None)
    for name in recipes.TA_OPS:
        monkeypatch.setattr(gpupipe.augment, name, object, raising=False)

    class LoaderWithBatchTransform(gpupipe.Loader):
        def __init__(self, source, *, batch_transform=None, **kw):
            super().__init__(source, **kw)

    monkeypatch.setattr(gpupipe, "Loader", LoaderWithBatchTransform)
    assert recipes.train_ta_missing() is None and "train-ta" in recipes.available()
    monkeypatch.delattr(gpupipe.augment, "CutMix")
    assert "gpupipe.augment.CutMix" in recipes.train_ta_missing() and "train-ta" not in recipes.available()


def test_train_ta_recipe_runs(folder, tmp_path):
    reason = recipes.train_ta_missing()
    if reason:
        pytest.skip(f"train-ta: {reason} (issue 14)")
    out = tmp_path / "out"
    r = gpupipe_cli(["bench", *QUICK, "--data", folder, "--recipe", "train-ta", "--methods", "gpupipe", "dataloader",
                     "--out", out], tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    check_results(out, ["gpupipe Loader", "DataLoader (2 workers)"], "train-ta")


@pytest.mark.parametrize("name", sorted(recipes.RECIPES))
def test_each_recipe_builds_matching_output_sizes(name):
    if recipes.RECIPES[name].missing():
        pytest.skip(recipes.RECIPES[name].missing())
    from PIL import Image

    parts = recipes.get(name).build(3)
    x = parts.torchvision(Image.new("RGB", (300, 200), (120, 60, 30)))
    assert tuple(x.shape) == (3, *parts.crop.size)


def test_pyspy_summary_counts_self_samples_per_function_and_thread():
    from benchmarks.pyspy_summary import summarise

    raw = ["thread (0x1): gpupipe-collect;_collect (gpupipe/_backends/hybrid.py:520);wait (threading.py:320) 6",
           "thread (0x1): gpupipe-collect;_collect (gpupipe/_backends/hybrid.py:521) 2",
           "thread (0x2): gpupipe-pool-3;run (x.py:1) 2", "garbage line", ""]
    text = summarise(raw, top=3)
    assert "py-spy samples: 10" in text
    assert "60.0%  wait (threading.py)" in text  # line numbers dropped, all threads
    assert "gpupipe-collect: 8 samples (80%)" in text and "gpupipe-pool: 2 samples (20%)" in text
    assert " 25.0%  _collect (gpupipe/_backends/hybrid.py)" in text  # 2 of the thread's 8


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message a machine without CUDA gets")
def test_sync_probe_says_it_needs_cuda(capsys):
    from benchmarks.sync_probe import main

    assert main([]) == 2
    assert "no CUDA device" in capsys.readouterr().out
