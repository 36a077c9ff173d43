import io
import struct

import numpy as np
import pytest
import torch

import gpupipe
from helpers import HEIGHT, WIDTH, SAMPLINGS, patch_sof


@pytest.mark.parametrize("name,expected", [
    *[(f"ycbcr-{s}", dict(colorspace="ycbcr", subsampling=s, channels=3, progressive=False)) for s in SAMPLINGS],
    ("ycbcr-4:2:0-progressive", dict(colorspace="ycbcr", subsampling="4:2:0", progressive=True)),
    ("ycbcr-4:2:0-arithmetic", dict(arithmetic=True)),
    ("ycbcr-4:2:0-restart-rows", dict(restart_interval=(WIDTH + 15) // 16)),
    ("ycbcr-4:2:2-restart-blocks", dict(restart_interval=5)),
    ("rgb", dict(colorspace="rgb", subsampling="4:4:4", channels=3)),
    ("gray", dict(colorspace="gray", subsampling="gray", channels=1)),
    ("cmyk", dict(colorspace="cmyk", channels=4)),
    ("ycck", dict(colorspace="ycck", channels=4)),
])
def test_read_header_fields(variants, name, expected):
    info = gpupipe.read_header(variants[name])
    assert (info.height, info.width) == (HEIGHT, WIDTH)
    assert info.orientation == 1 and info.precision == 8
    for key, value in expected.items():
        assert getattr(info, key) == value, key


@pytest.mark.parametrize("kind", [bytes, bytearray, memoryview, "numpy", "tensor"])
def test_read_header_input_types(jpeg, kind):
    data = {"numpy": lambda b: np.frombuffer(b, np.uint8), "tensor": lambda b: torch.frombuffer(bytearray(b), dtype=torch.uint8)}.get(kind, kind)(jpeg)
    assert gpupipe.read_header(data)[:2] == (HEIGHT, WIDTH)


def test_read_header_rejects_wrong_types(jpeg):
    with pytest.raises(TypeError, match="must be bytes"):
        gpupipe.read_header([1, 2, 3])
    with pytest.raises(ValueError, match="1-D uint8"):
        gpupipe.read_header(np.zeros((2, 2), np.uint8))
    with pytest.raises(ValueError, match="1-D uint8"):
        gpupipe.read_header(torch.zeros(8, dtype=torch.int32))


@pytest.mark.parametrize("orientation", range(1, 9))
def test_exif_orientation_pillow(pixels, orientation):
    from PIL import Image

    exif = Image.Exif()
    exif[0x0112] = orientation
    exif[0x010F] = "gpupipe test camera"  # a tag before Orientation
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "JPEG", exif=exif.tobytes())
    assert gpupipe.read_header(buf.getvalue()).orientation == orientation


def _with_app1(jpeg: bytes, payload: bytes) -> bytes:
    return jpeg[:2] + b"\xff\xe1" + struct.pack(">H", len(payload) + 2) + payload + jpeg[2:]


@pytest.mark.parametrize("payload,expected", [
    # big-endian TIFF, one IFD entry: Orientation SHORT = 8
    (b"Exif\0\0MM\0*\0\0\0\x08\0\x01\x01\x12\0\x03\0\0\0\x01\0\x08\0\0", 8),
    (b"Exif\0\0II*\0\x08\0\0\0\x01\0\x12\x01\x03\0\x01\0\0\0\x03\0\0\0", 3),
    (b"Exif\0\0II*\0\x08\0\0\0\x01\0\x12\x01\x03\0\x01\0\0\0\x09\0\0\0", 1),  # out of range
    (b"Exif\0\0II*\0\xff\xff\0\0", 1),  # IFD offset past the end
    (b"Exif\0\0XX", 1),  # not TIFF
    (b"http://ns.adobe.com/xap/1.0/\0<x/>", 1),  # XMP, not EXIF
])
def test_exif_orientation_handcrafted(jpeg, payload, expected):
    assert gpupipe.read_header(_with_app1(jpeg, payload)).orientation == expected


@pytest.mark.parametrize("data,match", [
    (b"", "Empty input file"),
    (b"\xff\xd8", "no image"),
    (b"\x89PNG\r\n\x1a\n" + b"\0" * 64, "Not a JPEG file"),
    (b"GIF89a" + b"\0" * 64, "Not a JPEG file"),
])
def test_read_header_errors(data, match):
    with pytest.raises(gpupipe.JpegError, match=match):
        gpupipe.read_header(data)


def test_twelve_bit_and_lossless_are_clear_errors(jpeg):
    with pytest.raises(gpupipe.JpegError, match="precision 12.*8-bit JPEGs only"):
        gpupipe.read_header(patch_sof(jpeg, precision=12))
    with pytest.raises(gpupipe.JpegError, match="SOF type 0xc3.*lossless"):
        gpupipe.read_header(patch_sof(jpeg, marker=0xC3))


def test_header_is_info_only_for_huge_images(jpeg):
    # A header may declare 65500x65500: reading it must not allocate or decode anything.
    info = gpupipe.read_header(patch_sof(jpeg, height=65500, width=65500))
    assert (info.height, info.width) == (65500, 65500)
