"""One decode mechanism: decode_crop_jpegs, DecodeCropDataset and the Loader deliver the same samples
(same pixels, same failures with the same kinds) from a real-world folder, on every backend."""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import gpupipe
from gpupipe import crops, sources
from gpupipe.decode_types import DecodeOptions
from gpupipe.routing import as_buffers, probe
from helpers import BACKEND_DEVICES, encode, photo, run_child
from test_orientation import with_orientation

CROP = crops.RandomResizedCrop((40, 48))
EXPECTED_FAILURES = {"truncated_header.jpg": "CORRUPT", "empty.jpg": "NOT_JPEG", "garbage.jpg": "NOT_JPEG",
                     "text.png": "NOT_JPEG", "bomb.jpg": "PIXEL_LIMIT"}


def _png(pixels, mode="RGB") -> bytes:
    buf = io.BytesIO()
    Image.fromarray(pixels).convert(mode).save(buf, "PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def messy_folder(tmp_path_factory):
    """The kinds of files a real folder holds: JPEG variants, PNGs (one named .jpg, one RGBA), CMYK,
    progressive, EXIF-rotated, truncated in the scan and in the headers, empty, garbage, a bomb."""
    from helpers import patch_sof

    root = tmp_path_factory.mktemp("real_world")
    d = root / "mixed"
    d.mkdir()
    names = ["astronaut", "coffee", "chelsea", "rocket"]
    files = {}
    for i in range(8):
        files[f"jpeg{i}.jpg"] = encode(photo(120 + 9 * i, 150 + 7 * i, names[i % 4]), quality=85)
    files["progressive.jpg"] = encode(photo(130, 170, "coffee"), progressive=True)
    cmyk = np.concatenate([255 - photo(110, 140), np.full((110, 140, 1), 30, np.uint8)], axis=2)
    files["cmyk.jpg"] = encode(cmyk, colorspace="cmyk")
    files["gray.jpg"] = encode(photo(100, 100), colorspace="gray")
    files["rotated6.jpg"] = with_orientation(photo(90, 160, "rocket"), 6)
    files["image.png"] = _png(photo(100, 130, "chelsea"))
    files["png_named.jpg"] = _png(photo(95, 125, "astronaut"))
    files["rgba.png"] = _png(photo(105, 115, "coffee"), "RGBA")
    files["truncated_scan.jpg"] = files["jpeg0.jpg"][: len(files["jpeg0.jpg"]) * 2 // 3]
    files["truncated_header.jpg"] = files["jpeg1.jpg"][:150]
    files["empty.jpg"] = b""
    files["garbage.jpg"] = os.urandom(500)
    files["text.png"] = b"not a png at all"
    files["bomb.jpg"] = patch_sof(files["jpeg2.jpg"], height=60000, width=60000)
    for name, data in files.items():
        (d / name).write_bytes(data)
    return root


def _loader_samples(root, backend, device):
    loader = gpupipe.Loader(sources.ImageFolder(root), batch_size=6, crop=CROP, shuffle=False, seed=3,
                            apply_exif_orientation=True, backend=backend, device=device, on_error="skip")
    with pytest.warns(gpupipe.JpegWarning, match=r"1 of \d+ delivered samples decoded with warnings.*truncated_scan"):
        images = torch.cat([x.cpu() for x, _ in loader])  # per sample in stats(); counted once an epoch
    st = loader.stats()
    failed = {os.path.basename(f.key): f.kind.name for f in st["skipped"]}
    return images, failed, st


@pytest.mark.filterwarnings("ignore::gpupipe.SkippedSamplesWarning")  # counted below
@pytest.mark.parametrize("backend,device", BACKEND_DEVICES)
def test_three_entry_points_deliver_the_same_samples(messy_folder, backend, device):
    src = sources.ImageFolder(messy_folder)
    images, failed, st = _loader_samples(messy_folder, backend, device)
    assert failed == EXPECTED_FAILURES
    assert images.shape[0] == len(src) - len(EXPECTED_FAILURES)
    assert st["routes"]["pillow"] == 3 and len(st["warnings"]) == 1  # the PNGs; the truncated scan
    if backend != "cpu":
        assert st["routes"]["cpu-fallback"] >= 1  # CMYK

    ds = gpupipe.data.DecodeCropDataset(src, CROP, seed=3, apply_exif_orientation=True)
    dl = torch.utils.data.DataLoader(ds, batch_size=6, collate_fn=gpupipe.data.collate)
    with pytest.warns(gpupipe.JpegWarning):
        dataset_images = torch.cat([x for x, _ in dl])
    assert torch.equal(dataset_images, images) if backend == "cpu" else dataset_images.shape == images.shape
    if backend != "cpu":  # the GPU decoder's resize is not Pillow's: the tolerance of test_backends.py
        reference, _, _ = _loader_samples(messy_folder, "cpu", "cpu")
        assert (images.float() - reference.float()).abs().mean() < 1.5

    datas = [src.read(i) for i in range(len(src))]
    infos = probe(as_buffers(datas), DecodeOptions(size=CROP.size))
    h, w = infos.sizes(displayed=True)
    boxes, small = CROP.plan(h, w, seed=3, epoch=0, indices=np.arange(len(src)))
    assert not small
    with pytest.warns(gpupipe.JpegWarning):
        batch = gpupipe.decode_crop_jpegs(datas, boxes, size=CROP.size, on_error="skip", apply_exif_orientation=True,
                                          backend=backend, device=device)
    assert {os.path.basename(src.keys[i]): k.name for i, k in batch.kinds.items()} == EXPECTED_FAILURES
    got = batch.images[batch.ok.to(batch.images.device)].cpu()
    if backend == "cpu":
        assert torch.equal(got, images)
    else:  # which samples a GPU backend hands to the CPU core depends on the batch it is in
        assert (got.float() - images.float()).abs().mean() < 1.5


def test_failures_reach_the_caller_with_kind_and_key(messy_folder):
    src = sources.ImageFolder(messy_folder)
    ds = gpupipe.data.DecodeCropDataset(src, CROP, on_error="raise")
    i = next(k for k, key in enumerate(src.keys) if key.endswith("bomb.jpg"))
    with pytest.raises(gpupipe.PixelLimitError, match="bomb.jpg.*max_pixels"):
        ds[i]
    skip = gpupipe.data.DecodeCropDataset(src, CROP, on_error="skip")
    with pytest.warns(gpupipe.SkippedSamplesWarning, match=rf"sample {i} \(.*bomb\.jpg'\) skipped .*PIXEL_LIMIT"):
        skipped = skip[i]  # (heard where last_failure is not: in a DataLoader worker)
    assert not skipped and skipped.key.endswith("bomb.jpg") and skip.last_failure.kind == gpupipe.ErrorKind.PIXEL_LIMIT
    assert skipped.failure == skip.last_failure
    replace = gpupipe.data.DecodeCropDataset(src, CROP, on_error="replace")
    with pytest.warns(gpupipe.SkippedSamplesWarning, match="bomb.jpg'\\) replaced by a zero image"):
        image, _ = replace[i]
    assert image.shape == (3, 40, 48) and not image.any()


@pytest.mark.filterwarnings("ignore::gpupipe.SkippedSamplesWarning", "ignore::gpupipe.JpegWarning")
def test_seeds_epochs_and_indices_are_whole_numbers_everywhere(messy_folder):
    """A float, text or bool seed or epoch keyed another value's draws silently (1.5 was 1, "3" was
    3) in the samplers, the native plan, DecodeCropDataset and Loader.set_epoch; ds[-1] was keyed as
    index 2**64 - 1 (another crop of the last file). Now TypeErrors, negative indices as a list's."""
    from gpupipe.routing import plan_batch

    src = sources.ImageFolder(messy_folder)
    datas = [Path(k).read_bytes() for k in src.keys[:3]]
    samplers = [CROP, crops.RandomCrop(8), crops.CenterCrop(8), crops.Resize(8), crops.ResizeCenterCrop(8, 10)]
    for bad in (1.5, "3", True, None):
        for sampler in samplers[:2]:
            for kw in ({"seed": bad}, {"epoch": bad}):
                with pytest.raises(TypeError, match="(seed|epoch) must be an int"):
                    sampler.boxes([100], [120], **kw)
                with pytest.raises(TypeError, match="(seed|epoch) must be an int"):
                    plan_batch(datas, sampler, sampler.decode_options(), indices=[0, 1, 2], **{"seed": 0, "epoch": 0, **kw})
        with pytest.raises(TypeError, match="seed must be an int"):
            gpupipe.data.DecodeCropDataset(src, CROP, seed=bad)
        for epochs in (gpupipe.data.DecodeCropDataset(src, CROP), gpupipe.Loader(src, batch_size=2, crop=CROP)):
            with pytest.raises(TypeError, match="epoch must be an int"):
                epochs.set_epoch(bad)
    for sampler in samplers:  # numpy ints are ints
        assert np.array_equal(sampler.boxes([100], [120], seed=np.int64(3), epoch=np.uint8(2)),
                              sampler.boxes([100], [120], seed=3, epoch=2))
    with pytest.raises(ValueError, match="seed must be >= 0"):
        gpupipe.data.DecodeCropDataset(src, CROP, seed=-1)  # (as the Loader refuses it)
    with pytest.raises(ValueError, match="epoch must be >= 0"):
        gpupipe.Loader(src, batch_size=2, crop=CROP).set_epoch(-1)
    ds = gpupipe.data.DecodeCropDataset(src, CROP, seed=5)
    n = len(ds)
    last = next(k for k in range(n - 1, -1, -1) if ds[k])
    assert torch.equal(ds[last - n][0], ds[last][0]) and torch.equal(ds[np.int64(last)][0], ds[last][0])
    for bad, error in ((n, IndexError), (-n - 1, IndexError), (True, TypeError), (1.0, TypeError)):
        with pytest.raises(error, match="DecodeCropDataset ind"):
            ds[bad]


@pytest.mark.filterwarnings("ignore::gpupipe.SkippedSamplesWarning")
@pytest.mark.parametrize("position", ["first", "later"])
def test_default_collate_takes_good_batches_and_names_a_skipped_sample(messy_folder, position):
    """DataLoader's default collate stacks the dataset's samples; it cannot drop one, so a skipped
    sample stops it with a message naming the sample and gpupipe.data.collate, wherever it sits."""
    src = sources.ImageFolder(messy_folder)
    ds = gpupipe.data.DecodeCropDataset(src, CROP, on_error="skip")
    bad = next(k for k, key in enumerate(src.keys) if key.endswith("bomb.jpg"))
    good = [k for k in range(len(src)) if os.path.basename(src.keys[k]) not in EXPECTED_FAILURES][:3]
    images, labels = torch.utils.data.default_collate([ds[k] for k in good])
    assert images.shape == (3, 3, 40, 48) and labels.tolist() == [int(src.labels[k]) for k in good]
    order = [bad] + good if position == "first" else good + [bad]
    with pytest.raises(TypeError, match=r"bomb\.jpg.*skipped.*collate_fn=gpupipe\.data\.collate"):
        torch.utils.data.default_collate([ds[k] for k in order])
    images, _ = gpupipe.data.collate([ds[k] for k in order])
    assert images.shape[0] == len(good)
    one_by_one = torch.utils.data.DataLoader(torch.utils.data.Subset(ds, order), batch_size=None)
    with pytest.raises(TypeError, match=r"bomb\.jpg.*skipped.*batch_size=None"):
        list(one_by_one)


def test_a_crop_larger_than_the_image_is_an_invalid_argument_with_its_key(messy_folder):
    loader = gpupipe.Loader(sources.ImageFolder(messy_folder), batch_size=32, crop=crops.RandomCrop(125), shuffle=False,
                            on_error="skip")
    with pytest.warns(gpupipe.SkippedSamplesWarning, match="INVALID_ARGUMENT"):
        list(loader)
    small = [f for f in loader.stats()["skipped"] if f.kind == gpupipe.ErrorKind.INVALID_ARGUMENT]
    assert small and all("smaller than the 125x125 crop of RandomCrop" in f.message for f in small)
    assert any(f.key.endswith("gray.jpg") for f in small)  # 100x100


@pytest.mark.filterwarnings("ignore::gpupipe.SkippedSamplesWarning", "ignore::gpupipe.JpegWarning")
@pytest.mark.parametrize("size", [125, (90, 400)])
def test_center_crop_zero_pads_smaller_images_as_torchvision(messy_folder, size):
    """torchvision's CenterCrop zero-pads an image smaller than the crop; gpupipe failed the sample.
    Each sample of the real-world folder (JPEG variants, PNGs, EXIF-rotated) through the Loader and
    DecodeCropDataset equals torchvision's center_crop of the whole decoded image."""
    from torchvision.transforms.v2 import functional as F

    src = sources.ImageFolder(messy_folder)
    crop = crops.CenterCrop(size)
    ds = gpupipe.data.DecodeCropDataset(src, crop, apply_exif_orientation=True)
    padded, expected = 0, []
    for i in range(len(src)):
        data = Path(src.keys[i]).read_bytes()
        h, w = probe([data], DecodeOptions(size=(1, 1), apply_exif_orientation=True)).sizes(displayed=True)
        try:
            whole = gpupipe.decode_crop_jpeg(data, 0, 0, int(h[0]), int(w[0]), apply_exif_orientation=True)
        except (gpupipe.JpegError, gpupipe.DecompressionBombError, ValueError):
            assert not ds[i]
            continue
        padded += int(h[0]) < crop.size[0] or int(w[0]) < crop.size[1]
        expected.append(F.center_crop(whole, list(crop.size)))
        assert torch.equal(ds[i][0], expected[-1]), src.keys[i]
    assert padded >= 3
    loader = gpupipe.Loader(src, batch_size=8, crop=crop, shuffle=False, apply_exif_orientation=True)
    assert torch.equal(torch.cat([x for x, _ in loader]), torch.stack(expected))


def test_a_huge_non_jpeg_is_refused_from_its_header(tmp_path):
    """The Pillow route checks max_pixels on the size Pillow reads from the header, before any pixel
    is decoded (a 100 KB PNG of 9500x9500 must not grow the process); Pillow's own hard limit is a
    PixelLimitError too. In a child: its peak memory is this call's alone."""
    out = run_child("""
        import io, resource, gpupipe
        from PIL import Image

        def png(side):
            buf = io.BytesIO()
            Image.new("1", (side, side)).save(buf, "PNG")
            return buf.getvalue()

        datas = [png(9500), png(13400)]  # over max_pixels; over 2x Pillow's MAX_IMAGE_PIXELS
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        r = gpupipe.decode_crop_jpegs(datas, [[0, 0, 8, 8]] * 2, on_error="skip")
        grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
        assert grown < 20, grown
        assert r.kinds == {0: gpupipe.ErrorKind.PIXEL_LIMIT, 1: gpupipe.ErrorKind.PIXEL_LIMIT}, r.kinds
        assert "max_pixels" in r.errors[0] and "Pillow" in r.errors[1]
        print("ok")
    """)
    assert out.stdout.strip() == "ok"
