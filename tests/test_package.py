"""What a new user meets first: the distribution's name and declared dependencies, a clear message
naming the extra when an optional package is missing, losses that are heard (a warning per epoch,
an error when nothing is delivered), numbers checked as numbers, and reprs that say what an object
is."""

from __future__ import annotations

import re
import sys
import tomllib
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import gpupipe
from gpupipe import crops, sources
from gpupipe._errors import import_extra

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def folder(tmp_path):
    """root/cat/: four 40x50 JPEGs, a corrupt one, a PNG that is not one."""
    (tmp_path / "cat").mkdir()
    for i in range(4):
        (tmp_path / "cat" / f"{i}.jpg").write_bytes(gpupipe._C.encode_jpeg(np.full((40, 50, 3), 9 * i, np.uint8),
                                                                           40, 50, 3))
    (tmp_path / "cat" / "bad.jpg").write_bytes(b"\xff\xd8 not a scan")
    (tmp_path / "cat" / "x.png").write_bytes(b"\x89PNG\r\n\x1a\n junk")
    return tmp_path


def test_the_distribution_has_its_own_name_and_declares_what_the_default_paths_import():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["name"] == "torch-gpupipe"  # "gpupipe" on the index is another project
    deps = " ".join(project["dependencies"]).lower()
    assert "pillow" in deps and "torch" in deps and "numpy" in deps  # Pillow: the non-JPEG route, EXIF
    assert "kornia" not in deps and "tqdm" not in deps
    extras = project["optional-dependencies"]
    assert extras["kornia"] == ["kornia"] and extras["progress"] == ["tqdm"] and "dali" in extras


def test_a_missing_optional_package_names_its_extra(monkeypatch):
    with pytest.raises(ModuleNotFoundError, match=re.escape("pip install 'torch-gpupipe[kornia]'")):
        import_extra("gpupipe_no_such_module", "kornia", "BatchAugment(engine='kornia')")
    monkeypatch.setitem(sys.modules, "tqdm", None)  # as if tqdm were not installed
    with pytest.raises(ModuleNotFoundError, match=re.escape("Loader(progress=True) needs tqdm: pip install "
                                                            "'torch-gpupipe[progress]'")):
        gpupipe.Loader(sources.FileList(["x.jpg"], [0]), batch_size=1, crop=crops.CenterCrop(8), progress=True)


def test_skipped_samples_are_heard_once_per_epoch(folder):
    loader = gpupipe.Loader(sources.ImageFolder(folder), batch_size=2, crop=crops.CenterCrop(16), shuffle=False,
                            num_threads=1)
    for epoch in range(2):
        loader.set_epoch(epoch)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            n = sum(x.shape[0] for x, _ in loader)
        heard = [w for w in caught if issubclass(w.category, gpupipe.SkippedSamplesWarning)]
        assert n == 4 and len(heard) == 1
        assert re.search(rf"epoch {epoch}: 2 of 6 samples skipped .*1 CORRUPT, 1 NOT_JPEG; first: '.*bad\.jpg'",
                         str(heard[0].message))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a clean epoch says nothing
        clean = gpupipe.Loader(sources.FileList(sorted(str(p) for p in (folder / "cat").glob("?.jpg")), [0] * 4),
                               batch_size=2, crop=crops.CenterCrop(16), num_threads=1)
        assert sum(x.shape[0] for x, _ in clean) == 4


def test_a_crop_larger_than_every_image_is_an_error_not_empty_batches(folder):
    """torchvision's RandomCrop raises on an image smaller than the crop; an epoch that delivers
    nothing raises too (instead of yielding [0, 3, 4000, 4000] batches), naming the reason."""
    loader = gpupipe.Loader(sources.ImageFolder(folder), batch_size=2, crop=crops.RandomCrop(4000), num_threads=1)
    with pytest.raises(ValueError, match=r"epoch 0 delivered no image: all 6 samples failed \(4 INVALID_ARGUMENT.*"
                                         r"smaller than the 4000x4000 crop of RandomCrop"):
        list(loader)


@pytest.mark.parametrize("name, value, error", [("batch_size", 2.5, TypeError), ("batch_size", True, TypeError),
                                                ("batch_size", 0, ValueError), ("seed", 1.5, TypeError),
                                                ("num_threads", 2.0, TypeError), ("num_threads", 0, ValueError),
                                                ("augment_threads", 0, ValueError)])
def test_numbers_are_checked_as_numbers(folder, name, value, error):
    kwargs = {"batch_size": 2, name: value}
    with pytest.raises(error, match=name):
        gpupipe.Loader(sources.ImageFolder(folder), crop=crops.CenterCrop(8), **kwargs)


def test_reprs_say_what_an_object_is(folder, tmp_path):
    from gpupipe.augment import BatchAugment
    from gpupipe.data import DecodeCropDataset

    src = sources.ImageFolder(folder)
    assert repr(src).splitlines() == ["ImageFolder", "    Number of datapoints: 6", f"    Root location: {folder}",
                                      "    Classes: 1"]
    loader = gpupipe.Loader(src, batch_size=2, crop=crops.RandomResizedCrop(16), augment=BatchAugment(), seed=3)
    text = repr(loader)
    assert text.startswith("Loader(batch_size=2, crop=RandomResizedCrop(size=(16, 16)") and "seed=3" in text
    assert "augment=BatchAugment(" in text and "Number of datapoints: 6" in text
    assert "mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)" in repr(BatchAugment())
    assert repr(DecodeCropDataset(src, crops.CenterCrop(8))).startswith("DecodeCropDataset(crop=CenterCrop(size=(8, 8))")
    shard = tmp_path / "a.tar"
    shard.write_bytes(b"")
    assert repr(sources.TarShards([shard])) == f"TarShards(1 shards from {str(shard)!r}, shuffle_buffer=1000)"
    batch = gpupipe.decode_crop_jpegs([p.read_bytes() for p in sorted((folder / "cat").iterdir())], [(0, 0, 8, 8)] * 6,
                                      on_error="skip")
    assert repr(batch) == ("DecodedBatch(images=torch.uint8 [6, 3, 8, 8] on cpu, backend='cpu', failed=2, warnings=0, "
                           "fallback=0)")
    assert "tensor(" not in repr(batch)


def test_a_failed_bench_pipeline_is_one_line_in_the_table():
    from gpupipe.bench.run import one_line

    wrapped = RuntimeError("Caught UnidentifiedImageError in DataLoader worker process 0.\nOriginal Traceback (most "
                           "recent call last):\n  File \"worker.py\", line 375\n    data = fetcher.fetch(index)\n"
                           "PIL.UnidentifiedImageError: cannot identify image file 'x.png'\n")
    assert one_line(wrapped) == "PIL.UnidentifiedImageError: cannot identify image file 'x.png' (in a DataLoader worker)"
    assert one_line(ValueError("bad\nsecond line")) == "ValueError: bad"
    assert len(one_line(ValueError("x" * 1000))) == 200


def test_version_license_and_classifiers():
    import subprocess

    out = subprocess.run([sys.executable, "-m", "gpupipe", "--version"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == f"gpupipe {gpupipe.__version__} (distribution torch-gpupipe)"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["version"] == gpupipe.__version__
    assert "License :: OSI Approved :: Apache Software License" in project["classifiers"]
    assert (ROOT / "LICENSE").read_text().lstrip().startswith("Apache License")
