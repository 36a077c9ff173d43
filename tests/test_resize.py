"""Resized crops: the C++ resampler against Pillow, and the DCT-scaled path against libjpeg's own
scaled full decode."""

import math

import numpy as np
import pytest
import torch
import PIL
from PIL import Image

import gpupipe
from gpupipe import _C
from helpers import HEIGHT, WIDTH, encode, full_decode, legal_samplings, photo


PILLOW_MAJOR = int(PIL.__version__.split(".")[0])


def pil_resize(hwc: np.ndarray, out_hw, box=None) -> np.ndarray:
    """Pillow's bilinear (antialiased) resize: the reference the resampler equals bit for bit, in
    Pillow 13's arithmetic (the suite's requirement); older releases round differently by 1 level."""
    if PILLOW_MAJOR < 13:
        pytest.skip(f"Pillow {PIL.__version__}: the resampler is bit-exact to Pillow >= 13's arithmetic")
    img = Image.fromarray(hwc[..., 0] if hwc.shape[2] == 1 else hwc)
    out = np.asarray(img.resize((out_hw[1], out_hw[0]), Image.BILINEAR, box=box, reducing_gap=None))
    return out[..., None] if out.ndim == 2 else out


def scaled_crop(data: bytes, m: int, box, mode: int = 0) -> np.ndarray:
    """The box (t, l, h, w) of the frame scaled by m/8, decoded by our decoder (HWC numpy)."""
    t, l, h, w = box
    out = torch.empty((h, w, 3 if mode == 0 else 1), dtype=torch.uint8)
    _C.decode_into(data, out.data_ptr(), out.numel(), t, l, h, w, h, w, mode=mode, scale_num=m, scaled_box=True)
    return out.numpy()


def scaled_full_decode(data: bytes, m: int, mode: int = 0) -> np.ndarray:
    """libjpeg's whole image decoded at scale m/8, by libjpeg alone (without gpupipe's Huffman reader)."""
    h, w = gpupipe.read_header(data)[:2]
    before = _C._set_huffman_reader(False)
    try:
        return scaled_crop(data, m, (0, 0, math.ceil(h * m / 8), math.ceil(w * m / 8)), mode)
    finally:
        _C._set_huffman_reader(before)


BOXES_AND_SIZES = [
    ((0, 0, HEIGHT, WIDTH), (64, 80)),     # whole image, downscale
    ((10, 13, 120, 150), (50, 61)),        # downscale, odd factors
    ((5, 7, 30, 40), (64, 80)),            # upscale
    ((0, 0, 40, 200), (80, 50)),           # up in y, down in x
    ((3, 3, 50, 50), (50, 50)),            # same size: a copy
    ((20, 30, 100, 100), (1, 1)),          # to one pixel
    ((HEIGHT - 33, WIDTH - 47, 33, 47), (16, 16)),  # bottom-right corner
    ((1, 47, 131, 46), (77, 88)),          # height shrinks > 2x the width's: Pillow >= 13 goes vertical first
    ((0, 0, 150, 40), (20, 36)),           # the same, both down
]


@pytest.mark.parametrize("box,size", BOXES_AND_SIZES)
@pytest.mark.parametrize("mode", ["rgb", "gray"])
def test_resize_without_dct_scaling_is_bit_exact_to_pillow(jpeg, box, size, mode):
    t, l, h, w = box
    ref = pil_resize(np.ascontiguousarray(full_decode(jpeg, mode)[t:t + h, l:l + w]), size)
    got = gpupipe.decode_crop_jpeg(jpeg, *box, size=size, dct_scaling=False, mode=mode).permute(1, 2, 0).numpy()
    np.testing.assert_array_equal(got, ref)


def test_resize_random_boxes_is_bit_exact_to_pillow(jpeg):
    """Random whole-pixel boxes and output sizes, up and down, from 1 pixel to wider than several
    8-output vector groups (the RGB pass gathers eight outputs at a time and leaves outputs whose taps
    reach the row's last pixel to the scalar loop): every one equal to Pillow."""
    full = full_decode(jpeg)
    rng = np.random.default_rng(7)
    for _ in range(150):
        h, w = int(rng.integers(1, HEIGHT + 1)), int(rng.integers(1, WIDTH + 1))
        t, l = int(rng.integers(0, HEIGHT - h + 1)), int(rng.integers(0, WIDTH - w + 1))
        size = (int(rng.integers(1, 2 * h + 9)), int(rng.integers(1, 2 * w + 9)))
        ref = pil_resize(np.ascontiguousarray(full[t:t + h, l:l + w]), size)
        got = gpupipe.decode_crop_jpeg(jpeg, t, l, h, w, size=size, dct_scaling=False).permute(1, 2, 0).numpy()
        np.testing.assert_array_equal(got, ref, err_msg=str(((t, l, h, w), size)))


@pytest.mark.parametrize("mode", ["rgb", "gray"])
def test_resize_vector_pass_edges_are_bit_exact_to_pillow(jpeg, mode):
    """The vector passes' edges (resize.cpp): the RGB horizontal pass takes four outputs of two rows
    at a time (odd row counts, fewer than four outputs, the last four overlapping, windows read from
    the copy of the row's end, several windows an output past five taps); the vertical pass 64 and
    32 output bytes at a time, then the scalar loop. Every one equal to Pillow."""
    full = full_decode(jpeg, mode)
    for out_w in (1, 2, 3, 4, 5, 7, 8, 9, 13, 21, 22, 32, 43):
        for ratio in (0.3, 1.0, 1.1, 1.9, 2.6, 5.2):
            w = min(WIDTH - 1, max(1, round(out_w * ratio)))
            for out_h, h in ((1, 3), (2, 2), (3, 7), (5, 40)):
                box = (1, WIDTH - 1 - w, h, w)  # flush with the frame's right edge but one pixel
                ref = pil_resize(np.ascontiguousarray(full[1:1 + h, WIDTH - 1 - w:WIDTH - 1]), (out_h, out_w))
                got = gpupipe.decode_crop_jpeg(jpeg, *box, size=(out_h, out_w), dct_scaling=False, mode=mode)
                np.testing.assert_array_equal(got.permute(1, 2, 0).numpy(), ref, err_msg=str((box, (out_h, out_w))))


@pytest.mark.parametrize("name", ["ycbcr-4:2:0", "ycbcr-4:4:4", "ycbcr-4:2:2", "ycbcr-4:4:0", "ycbcr-4:1:1",
                                  "ycbcr-4:2:0-progressive", "gray", "cmyk", "rgb"])
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 6, 7])
def test_scaled_region_is_bit_exact_to_scaled_full_decode(variants, name, m):
    data = variants[name]
    ref = scaled_full_decode(data, m)
    sh, sw = ref.shape[:2]
    rng = np.random.default_rng(m)
    for _ in range(12):
        t, l = int(rng.integers(0, sh)), int(rng.integers(0, sw))
        h, w = int(rng.integers(1, sh - t + 1)), int(rng.integers(1, sw - l + 1))
        out = torch.empty((h, w, 3), dtype=torch.uint8)
        _C.decode_into(data, out.data_ptr(), out.numel(), t, l, h, w, h, w, scale_num=m, scaled_box=True)
        np.testing.assert_array_equal(out.numpy(), ref[t:t + h, l:l + w], err_msg=f"{name} m={m} {(t, l, h, w)}")


def _random_scaled_boxes(sh, sw, n, rng):
    for _ in range(n):
        t, l = int(rng.integers(0, sh)), int(rng.integers(0, sw))
        yield t, l, int(rng.integers(1, sh - t + 1)), int(rng.integers(1, sw - l + 1))


@pytest.mark.parametrize("components", [1, 3, 4])
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 6, 7, 8])
def test_every_legal_sampling_crops_exactly_at_every_scale(pixels, components, m):
    """Every sampling a baseline file may carry (luma 4x2 and 2x4, chroma above luma, Cb != Cr), every
    DCT scale (m = 8: the unscaled crop): the crop equals libjpeg's whole scaled decode cropped, and the
    same call twice gives the same pixels. libjpeg-turbo 2.1.5's jpeg_crop_scanline miscounts the
    width of a component whose IDCT scaling differs from luma's (fix_cropped_downsampled_widths)."""
    if components == 4:
        img = np.concatenate([255 - pixels, (255 - pixels.max(axis=2, keepdims=True)) // 2], axis=2)
        colorspace = "ycck"
    else:
        img, colorspace = (pixels, "ycbcr") if components == 3 else (pixels[..., :1], "gray")
    samplings = legal_samplings(components)
    rng = np.random.default_rng(m * 10 + components)
    if components == 4:  # 719 of them: a random quarter per scale, every one over the 8 scales
        samplings = [s for i, s in enumerate(samplings) if i % 4 == m % 4]
    for sampling in samplings:
        data = encode(np.ascontiguousarray(img), sampling=list(sampling), colorspace=colorspace)
        ref = scaled_full_decode(data, m)
        for box in _random_scaled_boxes(*ref.shape[:2], 4, rng):
            t, l, h, w = box
            got = scaled_crop(data, m, box)
            np.testing.assert_array_equal(got, ref[t:t + h, l:l + w], err_msg=f"{sampling} m={m} {box}")
            np.testing.assert_array_equal(scaled_crop(data, m, box), got, err_msg=f"{sampling} m={m} {box} twice")


@pytest.mark.parametrize("sampling", [((4, 2), (1, 1), (1, 1)), ((2, 4), (1, 1), (1, 1)),
                                      ((1, 1), (1, 1), (2, 4)), ((4, 1), (1, 4), (2, 1))])
@pytest.mark.parametrize("coding", [{"progressive": True}, {"restart_rows": 1}, {"restart_blocks": 3}])
def test_sampling_with_scaled_chroma_idct_other_codings_and_gray(pixels, sampling, coding):
    """The samplings whose chroma IDCT DCT scaling enlarges while upsampling remains: progressive
    (multi-scan buffers), restart markers (the restart route), to gray, every scale."""
    rng = np.random.default_rng(3)
    data = encode(pixels, sampling=list(sampling), **coding)
    for m in range(1, 9):
        for mode in (0, 1):
            ref = scaled_full_decode(data, m, mode)
            for box in _random_scaled_boxes(*ref.shape[:2], 6, rng):
                t, l, h, w = box
                np.testing.assert_array_equal(scaled_crop(data, m, box, mode), ref[t:t + h, l:l + w],
                                              err_msg=f"{sampling} {coding} m={m} mode={mode} {box}")


@pytest.mark.parametrize("sampling", [((4, 2), (1, 1), (1, 1)), ((2, 4), (1, 1), (1, 1)), ((2, 2), (1, 1), (1, 1))])
def test_dct_scaled_resize_of_any_sampling_is_within_the_documented_bound(sampling):
    """A resized crop (RandomResizedCrop's default path) of 4:1:0 and 2x4 files is as close to the
    full-resolution resize as 4:2:0's: mean |diff| < 2.5 levels (docs/semantics.md)."""
    data = encode(photo(600, 800, "coffee"), sampling=list(sampling), quality=92)
    for box, size in (((100, 200, 400, 380), (64, 64)), ((0, 0, 600, 800), (100, 75)), ((37, 51, 333, 517), (80, 120))):
        a = gpupipe.decode_crop_jpeg(data, *box, size=size).int()
        b = gpupipe.decode_crop_jpeg(data, *box, size=size, dct_scaling=False).int()
        assert (a - b).abs().float().mean() < 2.5, (sampling, box, size)
        torch.testing.assert_close(gpupipe.decode_crop_jpeg(data, *box, size=size).int(), a, rtol=0, atol=0)


def test_fractional_sampling_is_unsupported(pixels):
    """Luma 3x1 over chroma 2x1: legal in a JPEG, not implemented by libjpeg: a typed error on every path."""
    data = bytearray(encode(pixels, sampling=[(2, 1), (1, 1), (1, 1)]))
    sof = data.index(b"\xff\xc0")
    data[sof + 11], data[sof + 14] = 0x31, 0x21  # Y 3x1, Cb 2x1 (Cr stays 1x1)
    for kwargs in ({}, {"size": (20, 20)}):
        for box in ((0, 0, HEIGHT, WIDTH), (10, 10, 50, 60)):
            with pytest.raises(gpupipe.UnsupportedJpegError, match="Fractional sampling"):
                gpupipe.decode_crop_jpeg(bytes(data), *box, **kwargs)


def test_scaled_full_decode_matches_pillow_draft(jpeg):
    """Independent check of the scaled frame: Pillow's draft() uses libjpeg's DCT scaling too."""
    import io

    for m, denom in ((4, 2), (2, 4), (1, 8)):
        im = Image.open(io.BytesIO(jpeg))
        im.draft("RGB", (WIDTH // denom, HEIGHT // denom))  # draft picks scale = size // request
        pil = np.asarray(im.convert("RGB"))
        ours = scaled_full_decode(jpeg, m)
        assert pil.shape == ours.shape
        assert np.abs(pil.astype(int) - ours.astype(int)).max() <= 1


@pytest.mark.parametrize("box,size", [((0, 0, HEIGHT, WIDTH), (40, 50)), ((11, 9, 130, 170), (32, 40)),
                                      ((1, 2, 100, 97), (12, 12)), ((HEIGHT - 80, WIDTH - 90, 80, 90), (33, 20))])
def test_dct_scaled_resize_is_exact_to_its_definition(jpeg, box, size):
    """Scaled path = libjpeg's scaled full decode, cut to the pixels covering the box, then resized
    from the box's fractional position (Pillow's resize with box=), bit for bit."""
    t, l, h, w = box
    m = _C.choose_scale_num(h, w, *size)
    assert m < 8
    full = scaled_full_decode(jpeg, m)
    k = m / 8
    x0, y0 = math.floor(l * k), math.floor(t * k)
    x1, y1 = min(full.shape[1], math.ceil((l + w) * k)), min(full.shape[0], math.ceil((t + h) * k))
    region = np.ascontiguousarray(full[y0:y1, x0:x1])
    ref = pil_resize(region, size, box=(l * k - x0, t * k - y0, (l + w) * k - x0, (t + h) * k - y0))
    got = gpupipe.decode_crop_jpeg(jpeg, *box, size=size).permute(1, 2, 0).numpy()
    np.testing.assert_array_equal(got, ref)


def test_dct_scaled_resize_is_close_to_full_resolution_pillow():
    """Against the independent reference (full-resolution crop resized by Pillow): the DCT-domain
    downscale is a different low-pass filter, so the tolerance is on the mean absolute difference
    (< 2.5 levels of 255) and on 99% of pixels (<= 12 levels)."""
    img = photo(600, 800, "coffee")
    data = encode(img, quality=92)
    full = full_decode(data)
    rng = np.random.default_rng(0)
    for _ in range(20):
        h, w = int(rng.integers(200, 600)), int(rng.integers(200, 800))
        t, l = int(rng.integers(0, 600 - h + 1)), int(rng.integers(0, 800 - w + 1))
        size = (int(rng.integers(32, h // 2 + 1)), int(rng.integers(32, w // 2 + 1)))
        ref = pil_resize(np.ascontiguousarray(full[t:t + h, l:l + w]), size).astype(int)
        got = gpupipe.decode_crop_jpeg(data, t, l, h, w, size=size).permute(1, 2, 0).numpy().astype(int)
        diff = np.abs(got - ref)
        assert diff.mean() < 2.5 and np.percentile(diff, 99) <= 12, ((t, l, h, w), size, diff.mean())


@pytest.mark.parametrize("box_hw,out_hw,expected", [
    ((100, 100), (60, 60), 8),    # < 2x: no scaling
    ((200, 200), (100, 100), 4),  # exactly 2x: 1/2
    ((300, 300), (100, 100), 3),  # 3/8 of 300 = 112.5 >= 100
    ((800, 800), (100, 100), 1),  # 8x: 1/8
    ((799, 800), (100, 100), 2),  # 1/8 of 799 < 100
    ((1000, 250), (100, 100), 4),  # limited by the narrow side
    ((1000, 199), (100, 100), 8),  # narrow side < 2x
])
def test_choose_scale_num(box_hw, out_hw, expected):
    assert _C.choose_scale_num(*box_hw, *out_hw) == expected


def test_resize_uses_scaled_decode_only_when_allowed(jpeg):
    a = gpupipe.decode_crop_jpeg(jpeg, 0, 0, HEIGHT, WIDTH, size=(32, 32))
    b = gpupipe.decode_crop_jpeg(jpeg, 0, 0, HEIGHT, WIDTH, size=(32, 32), dct_scaling=False)
    assert not torch.equal(a, b)  # the scaled path really is a different computation
    assert (a.int() - b.int()).abs().float().mean() < 3
