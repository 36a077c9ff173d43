"""decode_crop_jpeg: bit-exact against the full decode cropped, close to Pillow, every error path."""

import threading
import warnings

import numpy as np
import pytest
import torch

import gpupipe
from helpers import HEIGHT, WIDTH, full_decode, patch_sof, pil_decode, stress


def edge_boxes(h: int, w: int) -> list[tuple[int, int, int, int]]:
    """Crops that stress the window logic: iMCU-aligned edges, 1-px strips, corners, full image."""
    boxes = [(0, 0, h, w), (0, 0, 1, 1), (h - 1, w - 1, 1, 1), (0, w - 1, h, 1), (h - 1, 0, 1, w),
             (0, 0, 16, 16), (16, 16, 16, 16), (8, 8, 8, 8), (15, 15, 2, 2), (16, 32, h - 16, w - 32),
             (h - 17, w - 17, 17, 17), (1, 1, h - 2, w - 2), (h // 2, 0, 1, w), (0, w // 2, h, 1)]
    for x in (1, 2, 3, 4, 7, 8, 9, 14, 15, 16, 17, 31, 32, 33):  # left edges around iMCU columns
        boxes.append((x % h, x, min(20, h - x % h), min(25, w - x)))
        boxes.append((x, w - x - 5, 5, 5))  # right edges around iMCU columns
    return boxes


def random_boxes(h: int, w: int, n: int, seed: int):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        t, l = int(rng.integers(0, h)), int(rng.integers(0, w))
        out.append((t, l, int(rng.integers(1, h - t + 1)), int(rng.integers(1, w - l + 1))))
    return out


@pytest.mark.parametrize("mode", ["rgb", "gray"])
def test_crop_is_bit_exact_to_full_decode(variants, mode):
    for name, data in variants.items():
        ref = full_decode(data, mode)
        assert ref.shape == (HEIGHT, WIDTH, 3 if mode == "rgb" else 1)
        for t, l, h, w in edge_boxes(HEIGHT, WIDTH) + random_boxes(HEIGHT, WIDTH, 60, seed=len(name)):
            got = gpupipe.decode_crop_jpeg(data, t, l, h, w, mode=mode)
            assert got.shape == (ref.shape[2], h, w) and got.dtype == torch.uint8
            np.testing.assert_array_equal(got.permute(1, 2, 0).numpy(), ref[t:t + h, l:l + w], err_msg=f"{name} {(t, l, h, w)}")


@pytest.mark.parametrize("size", [(1, 1), (7, 9), (16, 16), (17, 33), (64, 48)])
def test_small_and_odd_images(pixels, size):
    from helpers import encode

    img = np.ascontiguousarray(pixels[: size[0], : size[1]])
    for opts in ({}, {"h_samp": 1, "v_samp": 1}, {"progressive": True}, {"h_samp": 4, "v_samp": 1}):
        data = encode(img, **opts)
        ref = full_decode(data)
        for t, l, h, w in random_boxes(*size, 20, seed=1) + [(0, 0, *size)]:
            np.testing.assert_array_equal(gpupipe.decode_crop_jpeg(data, t, l, h, w).permute(1, 2, 0).numpy(), ref[t:t + h, l:l + w])


# Independent references with their own libjpeg-turbo builds. Tolerances: color decodes use the
# same ISLOW IDCT and fancy upsampling, so at most 1 level apart from Pillow (in practice
# identical). "gray" mode is libjpeg's Y channel, as torchvision's ImageReadMode.GRAY (<= 1 level);
# Pillow's convert("L") recomputes luma from clipped RGB, so only its mean is close (< 1 level).
@pytest.mark.parametrize("name", ["ycbcr-4:2:0", "ycbcr-4:4:4", "ycbcr-4:2:2", "ycbcr-4:2:0-progressive",
                                  "ycbcr-4:2:0-arithmetic", "rgb", "gray", "cmyk", "ycck",
                                  "pillow-4:2:0-q75", "pillow-progressive"])
def test_full_decode_matches_pillow(variants, name):
    ours = full_decode(variants[name]).astype(int)
    diff = np.abs(ours - pil_decode(variants[name]).astype(int))
    assert diff.max() <= 1, name
    ours_gray = full_decode(variants[name], "gray").astype(int)
    assert np.abs(ours_gray - pil_decode(variants[name], "L").astype(int)).mean() < 1.0, name
    if name not in ("cmyk", "ycck"):  # torchvision cannot decode CMYK to gray
        from torchvision.io import ImageReadMode, decode_jpeg

        tv = decode_jpeg(torch.frombuffer(bytearray(variants[name]), dtype=torch.uint8), mode=ImageReadMode.GRAY)
        assert np.abs(ours_gray - tv.permute(1, 2, 0).numpy().astype(int)).max() <= 1, name


def test_grayscale_is_replicated_in_rgb_mode(variants):
    rgb = full_decode(variants["gray"])
    assert (rgb[..., 0] == rgb[..., 1]).all() and (rgb[..., 1] == rgb[..., 2]).all()
    np.testing.assert_array_equal(rgb[..., :1], full_decode(variants["gray"], "gray"))


@pytest.mark.parametrize("kind", [bytes, bytearray, memoryview, "numpy", "tensor"])
def test_input_types_give_identical_crops(jpeg, kind):
    data = {"numpy": lambda b: np.frombuffer(b, np.uint8), "tensor": lambda b: torch.frombuffer(bytearray(b), dtype=torch.uint8)}.get(kind, kind)(jpeg)
    torch.testing.assert_close(gpupipe.decode_crop_jpeg(data, 5, 7, 40, 50), gpupipe.decode_crop_jpeg(jpeg, 5, 7, 40, 50), rtol=0, atol=0)


def test_seed_alias(jpeg):
    torch.testing.assert_close(gpupipe.decode_and_crop_jpeg(jpeg, 10, 20, 30, 40), gpupipe.decode_crop_jpeg(jpeg, 10, 20, 30, 40), rtol=0, atol=0)


@pytest.mark.parametrize("box", [(0, 0, HEIGHT + 1, 10), (0, 0, 10, WIDTH + 1), (HEIGHT, 0, 1, 1), (0, WIDTH - 5, 10, 6),
                                 (-1, 0, 10, 10), (0, -3, 10, 10), (0, 0, 0, 10), (0, 0, 10, 0)])
def test_crop_outside_image_is_value_error_with_size(jpeg, box):
    with pytest.raises(ValueError, match=f"not inside the image of {WIDTH}x{HEIGHT}"):
        gpupipe.decode_crop_jpeg(jpeg, *box)


def test_bad_arguments(jpeg):
    with pytest.raises(ValueError, match="mode must be"):
        gpupipe.decode_crop_jpeg(jpeg, 0, 0, 8, 8, mode="bgr")
    with pytest.raises(TypeError, match="must be bytes"):
        gpupipe.decode_crop_jpeg("a string", 0, 0, 8, 8)
    with pytest.raises(ValueError, match="CPU tensor|1-D uint8"):
        gpupipe.decode_crop_jpeg(torch.zeros(3, 3, dtype=torch.uint8), 0, 0, 8, 8)
    strided = memoryview(np.frombuffer(jpeg, np.uint8).repeat(2))[::2]  # the file's bytes, not contiguous
    for first in (jpeg, memoryview(jpeg), bytearray(jpeg)):  # (bytes and memoryviews: the Loader's fast path)
        with pytest.raises(ValueError, match=r"datas\[1\] must be a contiguous memoryview"):
            gpupipe.decode_crop_jpegs([first, strided], np.array([[0, 0, 8, 8]] * 2), size=(8, 8))


@pytest.mark.parametrize("data,match", [
    (b"", "Empty input file"),
    (b"\xff\xd8", "no image"),
    (b"\x89PNG\r\n\x1a\n" + bytes(200), "Not a JPEG file: starts with 0x89 0x50"),
    (b"\xff\xd8\xff\xe0" + bytes(range(256)) * 4, "JPEG"),
])
def test_non_jpeg_and_garbage(data, match):
    with pytest.raises(gpupipe.JpegError, match=match):
        gpupipe.decode_crop_jpeg(data, 0, 0, 1, 1)


def test_truncated_data_warns_by_default_and_fails_when_strict(jpeg):
    cut = jpeg[: int(len(jpeg) * 0.6)]
    with pytest.warns(gpupipe.JpegWarning, match="Premature end of JPEG file"):
        img = gpupipe.decode_crop_jpeg(cut, 0, 0, HEIGHT, WIDTH)
    ref = full_decode(jpeg)
    np.testing.assert_array_equal(img.permute(1, 2, 0).numpy()[:16], ref[:16])  # the top survives
    with pytest.raises(gpupipe.JpegError, match="Premature end of JPEG file.*strict=True"):
        gpupipe.decode_crop_jpeg(cut, 0, 0, HEIGHT, WIDTH, strict=True)
    # A crop entirely above the damage decodes cleanly, without warning.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_array_equal(gpupipe.decode_crop_jpeg(cut, 0, 0, 16, 30, strict=True).permute(1, 2, 0).numpy(), ref[:16, :30])


def test_corrupt_entropy_data_warns(jpeg):
    b = bytearray(jpeg)
    sos = b.find(b"\xff\xda")
    for i in range(sos + 40, len(b) - 10, 97):
        b[i] = 0xFF if b[i] != 0xFF else 0x00
    with pytest.warns(gpupipe.JpegWarning, match="Corrupt JPEG data"):
        gpupipe.decode_crop_jpeg(bytes(b), 0, 0, HEIGHT, WIDTH)
    with pytest.raises(gpupipe.JpegError, match="Corrupt JPEG data"):
        gpupipe.decode_crop_jpeg(bytes(b), 0, 0, HEIGHT, WIDTH, strict=True)


def test_twelve_bit_and_lossless(jpeg):
    with pytest.raises(gpupipe.JpegError, match="precision 12"):
        gpupipe.decode_crop_jpeg(patch_sof(jpeg, precision=12), 0, 0, 8, 8)
    with pytest.raises(gpupipe.JpegError, match="lossless"):
        gpupipe.decode_crop_jpeg(patch_sof(jpeg, marker=0xC3), 0, 0, 8, 8)


def test_pixel_limit_refuses_before_allocating(jpeg):
    huge = patch_sof(jpeg, height=65500, width=65500)  # 4.3 gigapixels declared
    with pytest.raises(gpupipe.DecompressionBombError, match="65500x65500 .* max_pixels"):
        gpupipe.decode_crop_jpeg(huge, 0, 0, 16, 16)
    old = gpupipe.set_limits(max_pixels=HEIGHT * WIDTH - 1)
    try:
        with pytest.raises(gpupipe.DecompressionBombError, match="max_pixels limit of"):
            gpupipe.decode_crop_jpeg(jpeg, 0, 0, 8, 8)
        assert issubclass(gpupipe.DecompressionBombError, gpupipe.JpegError)
    finally:
        gpupipe.set_limits(*old)
    assert gpupipe.get_limits() == old
    gpupipe.decode_crop_jpeg(jpeg, 0, 0, 8, 8)


def test_rubbish_then_valid_input_still_decodes(jpeg):
    ref = gpupipe.decode_crop_jpeg(jpeg, 3, 4, 50, 60)
    for rubbish in (b"", b"\xff\xd8\xff", bytes(1000), patch_sof(jpeg, precision=12), jpeg[:300]):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", gpupipe.JpegWarning)
            try:
                gpupipe.decode_crop_jpeg(rubbish, 0, 0, 1, 1)
            except (gpupipe.JpegError, ValueError):
                pass
        torch.testing.assert_close(gpupipe.decode_crop_jpeg(jpeg, 3, 4, 50, 60), ref, rtol=0, atol=0)


def test_many_threads_at_once_equal_serial(variants):
    jobs = [(data, box) for data in list(variants.values())[:10] for box in random_boxes(HEIGHT, WIDTH, 12, seed=3)]
    serial = [gpupipe.decode_crop_jpeg(d, *b) for d, b in jobs]

    def work(k):
        for i in (range(len(jobs)) if k % 2 else reversed(range(len(jobs)))):
            torch.testing.assert_close(gpupipe.decode_crop_jpeg(jobs[i][0], *jobs[i][1]), serial[i], rtol=0, atol=0)

    stress(work, threads=8)


def test_gil_is_released_during_decode(variants):
    """A decode on one thread must not block another Python thread (GIL released in C++)."""
    data = variants["ycbcr-4:2:0-progressive"]
    stop = threading.Event()
    ticks = []

    def ticker():
        while not stop.is_set():
            ticks.append(1)

    t = threading.Thread(target=ticker)
    t.start()
    try:
        for _ in range(30):
            gpupipe.decode_crop_jpeg(data, 0, 0, HEIGHT, WIDTH)
    finally:
        stop.set()
        t.join()
    assert len(ticks) > 100


def test_opcheck(jpeg):
    data = torch.frombuffer(bytearray(jpeg), dtype=torch.uint8)
    for args in [(data, 3.0, 5.0, 40.0, 50.0, 40, 50, False, 0, False, True, False),
                 (data, 0.0, 0.0, HEIGHT, WIDTH, 32, 48, True, 1, False, True, False),
                 (data, 10.5, 0.25, 100.75, 120.0, 32, 48, True, 0, False, False, True)]:
        torch.library.opcheck(torch.ops.gpupipe.decode_crop_jpeg.default, args)


def test_works_under_torch_compile(jpeg):
    data = torch.frombuffer(bytearray(jpeg), dtype=torch.uint8)

    def crop_and_scale(x):
        return gpupipe.decode_crop_jpeg(x, 10, 20, 64, 64).float() / 255

    compiled = torch.compile(crop_and_scale, backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(compiled(data), crop_and_scale(data))
