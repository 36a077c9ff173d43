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
from loader_data import jpeg_bytes, make_image_folder

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


def test_a_folder_of_shards_with_an_unreadable_one_is_benchmarked_without_it(folder, tmp_path):
    """One bad shard of many stopped the benchmark (DataError): the Loader skips such a shard,
    named, and so does the bench now, saying which it left out; only a folder none of whose shards
    reads is refused."""
    from gpupipe.bench.dataset import DataError, open_data

    samples = sorted((str(p), ["cat", "dog"].index(p.parent.name)) for p in folder.rglob("*.jpg"))
    data = tmp_path / "shards"
    write_tar_shards(((f"s{i:03d}", y, Path(p).read_bytes(), "jpg") for i, (p, y) in enumerate(samples)), data,
                     samples_per_shard=5)
    (data / "zz-broken.tar").write_bytes(b"not a tar archive" * 100)
    got = open_data(str(data))
    assert got.images == 12 and got.classes == 2 and len(got.source.paths) == 3
    assert len(got.left_out) == 1 and got.left_out[0].startswith(str(data / "zz-broken.tar"))
    assert "1 unreadable shard(s) left out, first: " in got.describe()
    only_bad = tmp_path / "bad"
    only_bad.mkdir()
    (only_bad / "a.tar").write_bytes(b"not a tar archive" * 100)
    with pytest.raises(DataError, match="none of its 1 tar shards could be read"):
        open_data(str(only_bad))


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
                                           (["--step-ms", "-5"], "--step-ms must be a finite number"),
                                           (["--step-ms", "nan"], "--step-ms must be a finite number"),
                                           (["--step-ms", "inf"], "--step-ms must be a finite number"),
                                           (["--seed", "-1"], "--seed must be within 0 .. 2**63 - 1"),
                                           (["--seed", str(2**63)], "--seed must be within 0 .. 2**63 - 1"),
                                           (["--seed", str(10**20)], "--seed must be within 0 .. 2**63 - 1"),
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


# --- what the numbers count (found by an audit of the bench) ----------------------------------------

BAD_JPEG = b"\xff\xd8\xff" + bytes(50)  # a JPEG marker, then nothing readable: fails its header


@pytest.fixture(scope="module")
def half_corrupt(tmp_path_factory):
    """16 files, 8 of them failing to decode."""
    root = tmp_path_factory.mktemp("half_corrupt")
    make_image_folder(str(root), classes=("cat", "dog"), per_class=4)
    for i in range(8):
        (root / "cat" / f"bad{i}.jpg").write_bytes(BAD_JPEG)
    return root


def in_process_bench(args) -> int:
    from gpupipe.bench import main

    threads = torch.get_num_threads()
    try:
        return main(args)
    finally:
        torch.set_num_threads(threads)  # main() sets the process's torch threads, as a CLI does


def test_failed_samples_are_not_counted_as_images(half_corrupt, tmp_path):
    """The raw row decoded with on_error="replace" and counted every slot: a folder of corrupt files
    reported thousands of images/s. Both rows now count the samples that decoded, report those that
    failed, and give ms per full batch (seconds per image x batch size), not per shortened batch."""
    out = tmp_path / "out"
    r = gpupipe_cli(["bench", *QUICK, "--data", half_corrupt, "--methods", "gpupipe", "raw", "--out", out], tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    data = json.loads((out / "results.json").read_text())
    gp, raw = data["results"]
    assert gp["method"] == "gpupipe Loader" and raw["method"] == "raw decode_crop_jpegs"
    # the same samples in the same order: the same failures, the same images
    assert gp["failed_samples"] == raw["failed_samples"] and gp["images"] == raw["images"]
    assert gp["failed_samples"][0] > 0 and gp["images"][0] + gp["failed_samples"][0] == 8  # 2 timed batches of 4
    for row in (gp, raw):
        assert row["ms_per_batch"] == pytest.approx(1e3 * 4 / row["images_per_s"])
    assert data["gpu_fed_down_to_ms_per_step"] == pytest.approx(gp["ms_per_batch"])
    assert r.stdout.count(f"{gp['failed_samples'][0]} samples failed to decode, not counted") == 2
    assert f"({gp['failed_samples'][0]} samples failed to decode and were skipped)" in r.stdout


def test_a_folder_of_corrupt_files_measures_nothing_and_exits_1(tmp_path):
    data = tmp_path / "corrupt"
    (data / "a").mkdir(parents=True)
    for i in range(8):
        (data / "a" / f"{i}.jpg").write_bytes(BAD_JPEG)
    r = gpupipe_cli(["bench", *QUICK, "--data", data, "--methods", "gpupipe", "raw", "--out", tmp_path / "out"], tmp_path)
    assert r.returncode == 1, r.stdout[-3000:]
    rows = {row["method"]: row for row in json.loads((tmp_path / "out" / "results.json").read_text())["results"]}
    assert rows["raw decode_crop_jpegs"]["skipped"].startswith("failed: RuntimeError: raw decode_crop_jpegs decoded "
                                                                "no image in epoch 0: all 8 samples failed")
    assert rows["gpupipe Loader"]["skipped"].startswith("failed:")
    assert "no pipeline was measured" in r.stderr


def test_loader_stats_add_up_the_timed_batches_of_every_epoch_and_repeat(folder, tmp_path, capsys):
    """The stage table and loader_stats described the Loader's last epoch only (often a partial
    one, or one decoded ahead): they now add up the timed batches of every epoch and repeat, and
    agree with the timed rows. DALI's note on its semantics is printed only where DALI ran."""
    out = tmp_path / "out"
    # 12 images, batch 4: 3 batches an epoch; 5 timed after 1 warm-up cross into a third epoch
    assert in_process_bench([*QUICK, "--data", str(folder), "--methods", "gpupipe", "--steps", "5", "--warmup", "1",
                             "--repeats", "2", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    data = json.loads((out / "results.json").read_text())
    (row,) = data["results"]
    stats = data["loader_stats"]
    assert row["images"] == [20, 20] and stats["images"] == 40 and stats["batches"] == 10
    assert stats["wall_s"] > 0 and stats["images_per_s"] == pytest.approx(40 / stats["wall_s"])
    assert 0 < stats["decode_pool"]["utilisation"] <= 1 and stats["routes"]["cpu"] == 40
    assert "the Loader's stages over its timed batches (10 in 2 repeat(s), added up):" in text
    assert "note: DALI" not in text


def test_add_stats_adds_epochs_and_takes_a_snapshot_away():
    from gpupipe.bench.run import add_stats

    def epoch(images, wall, skipped, share):
        return {"images": images, "batches": images // 4, "wall_s": wall, "wait_s": wall / 2,
                "busy_s": {"decode": wall / 4}, "host_s": {"plan": 1e-4 * images}, "routes": {"cpu": images},
                "skipped": skipped, "images_per_s": images / wall, "host_us_per_image": 100.0,
                "decode_pool": {"threads": 2, "busy_s": wall, "utilisation": 0.5, "decoding_s": wall},
                "shares": share}

    first, second = epoch(8, 1.0, ["a"], {"cpu": 0.5}), epoch(4, 3.0, ["b", "c"], {"cpu": 0.7})
    both = add_stats(second, first)
    assert both["images"] == 12 and both["batches"] == 3 and both["wall_s"] == 4.0 and both["wait_s"] == 2.0
    assert both["busy_s"] == {"decode": 1.0} and both["routes"] == {"cpu": 12} and both["skipped"] == ["a", "b", "c"]
    assert both["images_per_s"] == 3.0 and both["host_us_per_image"] == pytest.approx(100.0)
    assert both["decode_pool"]["utilisation"] == pytest.approx(4.0 / (2 * 4.0)) and both["shares"] == {"cpu": 0.7}
    since = add_stats(both, first, sign=-1)  # what the second epoch added
    assert since["images"] == 4 and since["skipped"] == ["b", "c"] and since["wall_s"] == 3.0
    assert since["decode_pool"]["utilisation"] == pytest.approx(0.5) and since["images_per_s"] == pytest.approx(4 / 3)
    assert add_stats({}, {}) == {} and add_stats(first, {}) == first


def test_raw_row_decodes_with_the_loaders_backend_and_device(folder, monkeypatch):
    """It always decoded with the CPU core: on a CUDA host the default hybrid Loader was compared
    with a CPU-only "ceiling"."""
    from types import SimpleNamespace

    from gpupipe.bench.dataset import open_data
    from gpupipe.bench.run import RawDecodeRun

    calls = []
    real = gpupipe.decode_crop_jpegs

    def spy(*a, **kw):
        calls.append((kw["backend"], kw["device"]))
        return real(*a, **{**kw, "backend": "cpu"})  # (DALI need not be installed)

    monkeypatch.setattr(gpupipe, "decode_crop_jpegs", spy)
    data = open_data(str(folder))
    parts = recipes.get("crop").build(data.num_classes)
    args = SimpleNamespace(batch_size=4, threads=2, seed=0, backend="dali", lookahead=True)
    run = RawDecodeRun(data, parts, args, torch.device("cpu"))
    it = run.batches()
    next(it)
    it.close()
    assert calls == [("dali", torch.device("cpu"))]


def test_every_row_starts_with_an_empty_entropy_index(folder, tmp_path, monkeypatch):
    """The raw row ran right after the Loader on the same bytes and started from the rows the
    Loader's epoch had put in the entropy index (1.13x)."""
    from gpupipe.bench import run

    seen = []
    measure = run.measure

    def spy(runner, **kw):
        seen.append((type(runner).__name__, gpupipe.entropy_index_stats()["files"]))
        return measure(runner, **kw)

    monkeypatch.setattr(run, "measure", spy)
    assert in_process_bench([*QUICK, "--data", str(folder), "--methods", "gpupipe", "raw", "--repeats", "2",
                             "--out", str(tmp_path / "out")]) == 0
    assert seen == [("LoaderRun", 0), ("RawDecodeRun", 0)] * 2
    assert gpupipe.entropy_index_stats()["files"] > 0  # (the rows do fill it)


@pytest.mark.parametrize("where", ["a file", "under a file"])
def test_a_bad_out_folder_is_a_one_line_error_before_anything_is_measured(folder, tmp_path, capsys, monkeypatch, where):
    from gpupipe.bench import run

    monkeypatch.setattr(run, "measure", lambda *a, **k: pytest.fail("measured before --out was checked"))
    (tmp_path / "afile").write_text("")
    out = tmp_path / "afile" if where == "a file" else tmp_path / "afile" / "out"
    assert in_process_bench([*QUICK, "--data", str(folder), "--out", str(out)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    expected = "is a file, not a folder" if where == "a file" else "cannot create the folder"
    assert len(lines) == 1 and lines[0].startswith(f"gpupipe bench: --out {str(out)!r}: {expected}"), lines


def test_peer_seeds_stay_within_int64(folder):
    """--seed 1e17 made the DataLoader row fail ("Overflow when unpacking long long" from
    seed * 1000 + epoch); seeds at or over 2**63 are refused up front (test_bad_arguments_exit_2)."""
    from types import SimpleNamespace

    from gpupipe.bench import run
    from gpupipe.bench.dataset import open_data

    data = open_data(str(folder))
    args = SimpleNamespace(batch_size=4, threads=0, seed=10**17)
    run.DataLoaderRun(data, recipes.get("crop").build(data.num_classes), args, torch.device("cpu"), epoch=1).close()
    assert run.peer_seed(0, 3) == 3 and run.peer_seed(10**17, 1) == (10**20 + 1) % 2**63


def test_results_json_is_strict_json(tmp_path):
    from gpupipe.bench import report

    def refuse(constant):
        raise ValueError(f"not JSON: {constant}")

    gp = report.Result("gpupipe Loader", seconds=[1.0], images=[8], waited=[0.0], batches=2, batch_size=4)
    path = tmp_path / "results.json"
    report.save_json(path, args={"step_ms": float("nan")}, env={}, data={}, recipe={}, results=[gp], baseline=None,
                     loader_stats={"wall_s": float("nan")}, fed_ms=float("inf"), batch_size=4)
    doc = json.loads(path.read_text(), parse_constant=refuse)
    assert doc["args"]["step_ms"] is None and doc["gpu_fed_down_to_ms_per_step"] is None
    assert doc["loader_stats"] == {"wall_s": None} and doc["results"][0]["ms_per_batch"] == 500.0


def test_no_measured_row_exits_1(tmp_path, capsys):
    """--methods raw on tar shards measured nothing (the raw row needs files in a folder) and
    exited 0."""
    samples = [(f"s{i}", i % 2, jpeg_bytes(i, i % 2, 64, 80), "jpg") for i in range(8)]
    write_tar_shards(samples, tmp_path / "shards", samples_per_shard=4)
    assert in_process_bench([*QUICK, "--data", str(tmp_path / "shards"), "--methods", "raw",
                             "--out", str(tmp_path / "out")]) == 1
    out, err = capsys.readouterr()
    assert "skipped: failed: ValueError: the raw decode row needs a folder or file list" in out
    assert "no pipeline was measured" in err and "note: DALI" not in out


def test_dali_failure_names_the_operator_the_cause_and_what_dali_printed():
    from gpupipe.bench.run import one_line

    said = ("Critical error in pipeline:\nCritical error in pipeline:\nError in CPU operator "
            "`nvidia.dali.fn.decoders.image_random_crop`,\nwhich was used in the pipeline definition with the "
            "following traceback:\n\n  File \"run.py\", line 251, in pipe\n    return parts.dali(fn)\n\nencountered:"
            "\n\nnvImageCodec failure: '#3'\nCurrent pipeline object is no longer valid.\nCurrent pipeline object is "
            "no longer valid.\nDALI printed: [ERROR] [jpeg_parser] Invalid marker")
    assert one_line(RuntimeError(said)) == ("RuntimeError: Error in CPU operator `nvidia.dali.fn.decoders."
                                            "image_random_crop`: nvImageCodec failure: '#3'; DALI printed: [ERROR] "
                                            "[jpeg_parser] Invalid marker")
    assert one_line(ValueError("one\ntwo")) == "ValueError: one"


def test_what_dali_prints_while_running_goes_into_the_failure_and_the_report(half_corrupt, capfd):
    """DALI's decoders print what is wrong with a file ("[ERROR] [jpeg_parser] Invalid marker") from
    their threads, to stderr, while the pipeline runs; the exception says only "Critical error in
    pipeline". Caught while the pipeline is iterated, they go into the row's failure."""
    from types import SimpleNamespace

    from gpupipe.bench import run
    from gpupipe.bench.dataset import open_data

    if run.dali_missing():
        pytest.skip(run.dali_missing())
    data = open_data(str(half_corrupt))
    args = SimpleNamespace(batch_size=4, threads=2, seed=0)
    run.DALI_RUN_PRINTED.clear()
    cpu = torch.device("cpu")
    with pytest.raises(RuntimeError) as e:
        run.measure(run.DaliRun(data, recipes.get("crop").build(data.num_classes), args, cpu), warmup=1, steps=3,
                    step_s=0.0, device=cpu)
    cell = run.one_line(e.value)
    assert cell.startswith("RuntimeError: Error in ") and "DALI printed: " in cell, cell
    assert run.DALI_RUN_PRINTED and all(line in cell for line in run.DALI_RUN_PRINTED)
    assert "[ERROR]" not in capfd.readouterr().err
