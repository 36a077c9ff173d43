"""The AVX2 3x3 and 6x6 inverse DCTs (csrc/decode/scaled_idct.h) that take over libjpeg's plain-C
jpeg_idct_3x3 / jpeg_idct_6x6 at the 3/8 DCT scale: every block byte for byte as libjpeg's own
function (random blocks: photos' coefficients, any 16-bit coefficients and quantizers, and blocks at
the first pass's int32 bound, where the kernel must hand over to libjpeg), nothing written outside
the block, and decodes of every variant and of damaged files equal to libjpeg's with the kernels
off. On a CPU without AVX2 the kernels never run (libjpeg's functions do) and the block checks skip."""

import warnings

import numpy as np
import pytest

import gpupipe
from gpupipe import _C
from helpers import full_decode, switched

AVX2 = gpupipe.cpu_capability()["supported"] != "default"
needs_avx2 = pytest.mark.skipif(not AVX2, reason="the kernels are AVX2: this CPU runs libjpeg's functions only")


def kernels(on: bool):
    return switched(_C._set_vector_idcts, on)


@needs_avx2
@pytest.mark.parametrize("size", [3, 6])
def test_every_block_equals_libjpegs_function(size):
    c = _C._check_vector_idcts(size, 120_000, size)
    assert c["blocks"] == 120_000 + 2 * 3 ** size  # and each row sign pattern at the bound and past it
    assert c["different"] == 0 and c["overwrote"] == 0, c
    # the bound's two sides both ran: blocks handed to libjpeg (any 16-bit values, one just over)
    # and blocks at it kept by the kernel
    assert 0.3 * c["blocks"] < c["handed"] < 0.45 * c["blocks"], c


def three_eighths_boxes(h: int, w: int, out: tuple, n: int, seed: int) -> list:
    """Boxes decoded at the 3/8 scale for an ``out`` output (2.67x-4x the output each way), at every
    offset parity, flush with the edges too."""
    rng = np.random.default_rng(seed)
    boxes = []
    while len(boxes) < n:
        bh, bw = int(rng.integers(8 * out[0] // 3, 4 * out[0])), int(rng.integers(8 * out[1] // 3, 4 * out[1]))
        if bh > h or bw > w or _C.choose_scale_num(bh, bw, *out) != 3:
            continue
        t = [0, h - bh, int(rng.integers(0, h - bh + 1))][len(boxes) % 3]
        l = [w - bw, int(rng.integers(0, w - bw + 1)), 0][len(boxes) % 3]
        boxes.append((t, l, bh, bw))
    return boxes


@pytest.mark.parametrize("name", ["ycbcr-4:2:0", "ycbcr-4:2:2", "ycbcr-4:4:4", "ycbcr-4:4:0", "ycbcr-4:1:1",
                                  "gray", "rgb", "cmyk", "ycbcr-4:2:0-progressive", "ycbcr-4:2:0-restart-rows",
                                  "pillow-4:2:0-q75"])
def test_three_eighths_decodes_equal_libjpeg_alone(variants, name):
    data = variants[name]
    h, w = full_decode(data).shape[:2]
    out = (max(1, h // 4), max(1, w // 4))
    swaps = _C._vector_idct_swaps()
    for t, l, bh, bw in three_eighths_boxes(h, w, out, 12, seed=len(name)):
        with kernels(True):
            a = gpupipe.decode_crop_jpeg(data, t, l, bh, bw, size=out)
        with kernels(False):
            b = gpupipe.decode_crop_jpeg(data, t, l, bh, bw, size=out)
        assert np.array_equal(a.numpy(), b.numpy()), (name, (t, l, bh, bw), out)
    if AVX2:  # the kernels did run: 3x3 for every scaled component, 6x6 for a 4:2:0 file's chroma
        assert _C._vector_idct_swaps() > swaps


@needs_avx2
def test_a_four_two_zero_file_takes_both_kernels_and_the_baseline_level_neither(variants):
    data = variants["ycbcr-4:2:0"]
    h, w = full_decode(data).shape[:2]
    t, l, bh, bw = three_eighths_boxes(h, w, (h // 4, w // 4), 1, seed=3)[0]
    before = _C._vector_idct_swaps()
    gpupipe.decode_crop_jpeg(data, t, l, bh, bw, size=(h // 4, w // 4))
    assert _C._vector_idct_swaps() - before == 3  # luma's 3x3, both chroma components' 6x6
    level = gpupipe.cpu_capability()["active"]
    try:
        gpupipe.set_cpu_capability("default")
        before = _C._vector_idct_swaps()
        gpupipe.decode_crop_jpeg(data, t, l, bh, bw, size=(h // 4, w // 4))
        assert _C._vector_idct_swaps() == before
    finally:
        gpupipe.set_cpu_capability(level)


def test_damaged_files_decode_as_libjpeg_alone(variants):
    """Corrupt entropy-coded data gives libjpeg's extreme coefficients (the kernels' bound) and its
    warnings: the same pixels and the same warnings either way."""
    base = variants["ycbcr-4:2:0"]
    sos = base.index(b"\xff\xda")
    rng = np.random.default_rng(5)
    h, w = full_decode(base).shape[:2]
    out = (h // 4, w // 4)
    boxes = np.array(three_eighths_boxes(h, w, out, 4, seed=9), np.int64)
    swaps = _C._vector_idct_swaps()
    for k in range(12):
        b = bytearray(base)
        for _ in range(4):
            i = int(rng.integers(sos + 20, len(b) - 2))
            b[i] = int(rng.integers(0, 255))  # (never FF: no marker planted)
        data = bytes(b)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with kernels(True):
                a = gpupipe.decode_crop_jpegs([data] * len(boxes), boxes, size=out, on_error="skip")
            with kernels(False):
                c = gpupipe.decode_crop_jpegs([data] * len(boxes), boxes, size=out, on_error="skip")
        assert np.array_equal(a.images.numpy(), c.images.numpy()), k
        assert dict(a.errors) == dict(c.errors) and dict(a.warnings) == dict(c.warnings), k
    assert _C._vector_idct_swaps() > swaps or not AVX2
