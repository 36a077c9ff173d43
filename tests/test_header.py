import io
import struct
import warnings

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


def _ifd(le: bool, entries: list) -> bytes:
    """An EXIF APP1 payload: a TIFF header and one IFD of (tag, type, count, 4 value bytes) entries."""
    e = "<" if le else ">"
    body = struct.pack(e + "H", len(entries)) + b"".join(struct.pack(e + "HHI", t, ty, c) + v for t, ty, c, v in entries)
    return b"Exif\0\0" + (b"II*\0" if le else b"MM\0*") + struct.pack(e + "I", 8) + body + b"\0\0\0\0"


def _xmp(text: str) -> bytes:
    return b"http://ns.adobe.com/xap/1.0/\0" + text.encode()


ORIENTATION_CASES = {  # name: APP1 payloads in file order
    "LONG": [_ifd(True, [(0x0112, 4, 1, struct.pack("<I", 6))])],
    "SSHORT": [_ifd(False, [(0x0112, 8, 1, struct.pack(">hH", 5, 0))])],
    "SLONG": [_ifd(True, [(0x0112, 9, 1, struct.pack("<i", 7))])],
    "negative SSHORT": [_ifd(True, [(0x0112, 8, 1, struct.pack("<hH", -6, 0))])],
    "BYTE": [_ifd(True, [(0x0112, 1, 1, b"\x03\0\0\0")])],
    "SBYTE": [_ifd(True, [(0x0112, 6, 1, b"\x03\0\0\0")])],
    "UNDEFINED": [_ifd(True, [(0x0112, 7, 1, b"\x04\0\0\0")])],
    "ASCII": [_ifd(True, [(0x0112, 2, 2, b"6\0\0\0")])],
    "RATIONAL 6/1": [_ifd(True, [(0x0112, 5, 1, struct.pack("<I", 26))]) + struct.pack("<II", 6, 1)],
    "RATIONAL 13/2": [_ifd(True, [(0x0112, 5, 1, struct.pack("<I", 26))]) + struct.pack("<II", 13, 2)],
    "FLOAT": [_ifd(False, [(0x0112, 11, 1, struct.pack(">f", 8.0))])],
    "count 0": [_ifd(True, [(0x0112, 3, 0, struct.pack("<HH", 6, 0))])],
    "count 2": [_ifd(True, [(0x0112, 3, 2, struct.pack("<HH", 6, 3))])],
    "count 3, the values after the IFD": [_ifd(True, [(0x0112, 3, 3, struct.pack("<I", 26))]) + struct.pack("<HHH", 7, 1, 1)],
    "count 3, the values past the end": [_ifd(True, [(0x0112, 3, 3, struct.pack("<I", 9000))])],
    "XMP attribute": [_xmp('<x:xmpmeta><rdf:Description tiff:Orientation="6"/></x:xmpmeta>')],
    "XMP element": [_xmp("<rdf:Description><tiff:Orientation>8</tiff:Orientation></rdf:Description>")],
    "XMP without a digit": [_xmp('<rdf:Description tiff:Orientation="x"/>')],
    "EXIF without the tag, then XMP": [_ifd(True, [(0x010F, 2, 4, b"cam\0")]), _xmp("<tiff:Orientation>3</tiff:Orientation>")],
    "EXIF's tag wins over XMP": [_ifd(True, [(0x0112, 3, 1, struct.pack("<HH", 1, 0))]),
                                 _xmp("<tiff:Orientation>6</tiff:Orientation>")],
    "the last XMP": [_xmp("<tiff:Orientation>6</tiff:Orientation>"), _xmp("<tiff:Orientation>0</tiff:Orientation>")],
    "XMP before EXIF": [_xmp("<tiff:Orientation>5</tiff:Orientation>"), _ifd(True, [(0x0112, 3, 1, struct.pack("<HH", 2, 0))])],
}


@pytest.mark.parametrize("case", list(ORIENTATION_CASES))
def test_exif_orientation_is_the_one_pillows_exif_transpose_applies(jpeg, case):
    """The orientation found as Pillow's getexif finds it (an integer tag of any integer type and
    count 1; else XMP's tiff:Orientation in the last XMP packet) and exif_transpose applies it (2..8)."""
    from PIL import Image

    data = jpeg
    for payload in reversed(ORIENTATION_CASES[case]):
        data = _with_app1(data, payload)
    with warnings.catch_warnings():  # Pillow warns of a tag of too many entries (it keeps the first)
        warnings.simplefilter("ignore")
        try:
            value = Image.open(io.BytesIO(data)).getexif().get(0x0112, 1)
        except Exception:  # unreadable (a tag of no value): orientation 1, as gpupipe's Pillow route
            value = 1
    pillows = {o: o for o in range(2, 9)}.get(value, 1)  # exif_transpose's lookup (6 == 6.0 == 6/1)
    assert gpupipe.read_header(data).orientation == pillows


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
