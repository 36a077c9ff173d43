"""apply_exif_orientation: crops in the displayed frame equal PIL.ImageOps.exif_transpose then crop."""

import io

import numpy as np
import pytest
import torch
from PIL import Image, ImageOps

import gpupipe
from gpupipe import crops, orientation
from helpers import BACKEND_DEVICES, assert_close_to_core, photo


def with_orientation(pixels: np.ndarray, o: int) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = o
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "JPEG", quality=92, exif=exif.tobytes())
    return buf.getvalue()


def displayed(data: bytes) -> np.ndarray:
    return np.asarray(ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert("RGB"))


@pytest.fixture(scope="module")
def oriented():
    pixels = photo(90, 140, "rocket")
    return {o: with_orientation(pixels, o) for o in range(1, 9)}


@pytest.mark.parametrize("o", range(1, 9))
def test_crop_matches_exif_transpose_then_crop(oriented, o):
    data = oriented[o]
    ref = displayed(data)
    h, w = ref.shape[:2]
    info = gpupipe.read_header(data)
    assert orientation.display_sizes([info.height], [info.width], [o]) == ([h], [w])
    rng = np.random.default_rng(o)
    for _ in range(15):
        t, l = int(rng.integers(0, h - 20)), int(rng.integers(0, w - 20))
        bh, bw = int(rng.integers(1, h - t + 1)), int(rng.integers(1, w - l + 1))
        got = gpupipe.decode_crop_jpeg(data, t, l, bh, bw, apply_exif_orientation=True)
        np.testing.assert_array_equal(got.permute(1, 2, 0).numpy(), ref[t:t + bh, l:l + bw])


def test_batch_of_mixed_orientations_with_resize(oriented):
    datas = [oriented[o] for o in range(1, 9)] * 2
    hs, ws = zip(*[displayed(d).shape[:2] for d in datas])
    boxes = crops.RandomResizedCrop((24, 32)).boxes(hs, ws, seed=1)
    batch = gpupipe.decode_crop_jpegs(datas, boxes, size=(24, 32), apply_exif_orientation=True, dct_scaling=False)
    assert batch.images.shape == (16, 3, 24, 32) and batch.ok.all()
    for i, (d, (t, l, h, w)) in enumerate(zip(datas, boxes)):
        ref = np.asarray(Image.fromarray(displayed(d)[t:t + h, l:l + w]).resize((32, 24), Image.BILINEAR, reducing_gap=None))
        diff = np.abs(batch.images[i].permute(1, 2, 0).numpy().astype(int) - ref.astype(int))
        assert diff.max() <= 1  # the resize passes run in the stored frame: rounding may differ by 1
    plain = gpupipe.decode_crop_jpegs(datas[:1], boxes[:1], size=(24, 32), dct_scaling=False)
    torch.testing.assert_close(plain.images[0], batch.images[0], rtol=0, atol=0)  # orientation 1: unchanged


@pytest.mark.parametrize("backend,device", BACKEND_DEVICES)
def test_errors_keep_their_index(oriented, backend, device):
    datas = [oriented[6], b"not a jpeg", oriented[3]]
    r = gpupipe.decode_crop_jpegs(datas, [[0, 0, 10, 10]] * 3, apply_exif_orientation=True, on_error="skip",
                                  backend=backend, device=device)
    assert r.ok.tolist() == [True, False, True] and list(r.errors) == [1]


@pytest.mark.parametrize("backend,device", BACKEND_DEVICES)
def test_loader_applies_orientation(oriented, tmp_path, backend, device):
    d = tmp_path / "cls"
    d.mkdir()
    for o, data in oriented.items():
        (d / f"{o}.jpg").write_bytes(data)
    src = gpupipe.sources.ImageFolder(tmp_path)
    loader = gpupipe.Loader(src, batch_size=8, crop=crops.CenterCrop((60, 40)), shuffle=False, apply_exif_orientation=True,
                            backend=backend, device=device)
    (images, _), = list(loader)
    images = images.cpu()
    for i, key in enumerate(src.keys):
        with open(key, "rb") as f:
            ref = displayed(f.read())
        h, w = ref.shape[:2]
        t, l = round((h - 60) / 2), round((w - 40) / 2)
        assert_close_to_core(images[i].permute(1, 2, 0), ref[t:t + 60, l:l + 40], backend, device)


def test_an_unreadable_exif_block_means_no_orientation_on_every_route():
    """A damaged EXIF block (here its byte-order mark) orients nothing, in a JPEG (the core) as in a
    PNG (Pillow, whose exif_transpose would raise reading it): the file decodes, as without orientation."""
    import struct
    import zlib

    pixels = photo(40, 60, "rocket")
    bad = b"MX\0*\0\0\0\x08\0\x01" + struct.pack(">HHIHH", 0x0112, 3, 1, 6, 0) + b"\0\0\0\0"
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "PNG")
    png = buf.getvalue()
    chunk = struct.pack(">I", len(bad)) + b"eXIf" + bad + struct.pack(">I", zlib.crc32(b"eXIf" + bad) & 0xFFFFFFFF)
    at = png.find(b"IDAT") - 4
    jpeg = with_orientation(pixels, 1)
    payload = b"Exif\0\0" + bad
    for data in (png[:at] + chunk + png[at:], jpeg[:2] + b"\xff\xe1" + struct.pack(">H", len(payload) + 2) + payload + jpeg[2:]):
        plain = gpupipe.decode_crop_jpegs([data], [[0, 0, 20, 30]])
        oriented = gpupipe.decode_crop_jpegs([data], [[0, 0, 20, 30]], apply_exif_orientation=True)
        assert plain.ok.all() and oriented.ok.all() and torch.equal(plain.images, oriented.images)
