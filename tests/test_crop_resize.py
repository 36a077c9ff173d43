"""The ragged crop-resize (gpupipe._backends.crop_resize): whole decoded images, each its own size and
row pitch, cropped and resized into slots of one NHWC batch. The host build must give the CPU core's
bytes (decode_crop_jpegs with dct_scaling=False, both window modes) and Pillow's; the CUDA kernels
the host build's (same per-value functions, csrc/decode/crop_resize_kernels.h)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import gpupipe
from gpupipe import _C
from gpupipe._backends.crop_resize import crop_resize_ragged
from helpers import DEVICES, encode, full_decode, photo
from test_resize import pil_resize

# (height, width, photo): sizes that are not multiples of 8; the last one wide enough for 4x downscales
IMAGES = [(157, 203, "astronaut"), (150, 190, "coffee"), (61, 47, "chelsea"), (301, 455, "rocket")]
# output sizes: downscale, upscale, one pixel, tall and wide (vertical-first for tall boxes)
SIZES = [(37, 53), (96, 131), (1, 1), (20, 90), (90, 20)]


def horizontal_first(box_hw, out_hw) -> bool:
    """Resampler::pillow_horizontal_first of the cropped image (window=False)."""
    return not (box_hw[0] - out_hw[0] > 0 and box_hw[0] - out_hw[0] > 2 * (box_hw[1] - out_hw[1]))


class Photos:
    """The JPEGs and their full decodes (HWC, each row padded by `pad` bytes: a pitch > width * C)."""

    def __init__(self, mode: str, pad: int = 5):
        self.mode = mode
        self.jpegs = [encode(photo(h, w, name)) for h, w, name in IMAGES]
        self.full = [np.ascontiguousarray(full_decode(j, mode)) for j in self.jpegs]
        self.padded = []
        for f in self.full:
            h, w, c = f.shape
            buf = np.zeros((h, w * c + pad), np.uint8)
            buf[:, :w * c] = f.reshape(h, w * c)
            self.padded.append(buf)

    def rows(self, indices) -> np.ndarray:
        """crop_resize_ragged's images argument for the host images `indices`."""
        return np.array([[self.padded[i].ctypes.data, *self.full[i].shape[:2], self.padded[i].strides[0]]
                         for i in indices], np.int64)


@pytest.fixture(scope="module", params=["rgb", "gray"])
def photos(request):
    return Photos(request.param)


def batch_boxes(rng, photos: Photos, out_hw, count: int = 8):
    """(image indices, boxes [n, 4] int64): every edge case once per image, then random boxes."""
    idx, boxes = [], []
    for i, f in enumerate(photos.full):
        h, w = f.shape[:2]
        special = [(0, 0, h, w),                       # the whole image
                   (h - 1, w - 1, 1, 1),                # one pixel, bottom-right corner
                   (0, w - min(w, 13), min(h, 41), min(w, 13)),  # top-right edge, tall
                   (h - min(h, 9), 0, min(h, 9), w)]    # bottom edge, full width
        for _ in range(count):
            bh, bw = int(rng.integers(1, h + 1)), int(rng.integers(1, w + 1))
            special.append((int(rng.integers(0, h - bh + 1)), int(rng.integers(0, w - bw + 1)), bh, bw))
        idx += [i] * len(special)
        boxes += special
    return idx, np.array(boxes, np.int64)


def core_reference(photos: Photos, idx, boxes, out_hw, window: bool) -> torch.Tensor:
    """The CPU core's ROI decode + Resampler of the same boxes, NHWC."""
    got = gpupipe.decode_crop_jpegs([photos.jpegs[i] for i in idx], boxes, size=out_hw, dct_scaling=False,
                                    window=window, mode=photos.mode)
    return got.images.permute(0, 2, 3, 1).contiguous()


def run_host(photos: Photos, idx, boxes, out_hw, *, window=False, resize=True, slots=None, batch=None):
    n = len(idx)
    slots = np.arange(n, dtype=np.int64) if slots is None else slots
    out = torch.zeros((batch or n, *out_hw, photos.full[0].shape[2]), dtype=torch.uint8)
    crop_resize_ragged(photos.rows(idx), boxes, out, slots, resize=resize, window=window)
    return out


@pytest.mark.parametrize("window", [False, True])
@pytest.mark.parametrize("out_hw", SIZES)
def test_host_build_is_the_cpu_core_bit_for_bit(photos, out_hw, window):
    rng = np.random.default_rng(hash((out_hw, window)) % 2**32)
    idx, boxes = batch_boxes(rng, photos, out_hw)
    got = run_host(photos, idx, boxes, out_hw, window=window)
    np.testing.assert_array_equal(got.numpy(), core_reference(photos, idx, boxes, out_hw, window).numpy())


def test_the_cases_take_both_pass_orders_and_both_directions(photos):
    rng = np.random.default_rng(0)
    orders, up, down = set(), False, False
    for out_hw in SIZES:
        _, boxes = batch_boxes(rng, photos, out_hw)
        for b in boxes:
            orders.add(horizontal_first(b[2:], out_hw))
            up |= bool(b[2] < out_hw[0] or b[3] < out_hw[1])
            down |= bool(b[2] > 2 * out_hw[0] and b[3] > 2 * out_hw[1])
    assert orders == {True, False} and up and down


@pytest.mark.parametrize("out_hw", SIZES)
def test_host_build_is_pillows_resize_of_the_crop(photos, out_hw):
    rng = np.random.default_rng(7)
    idx, boxes = batch_boxes(rng, photos, out_hw, count=4)
    got = run_host(photos, idx, boxes.astype(np.float64), out_hw).numpy()
    for k, (i, (t, l, h, w)) in enumerate(zip(idx, boxes)):
        crop = np.ascontiguousarray(photos.full[i][t:t + h, l:l + w])
        np.testing.assert_array_equal(got[k], pil_resize(crop, out_hw), err_msg=f"sample {k}: box {(t, l, h, w)}")


@pytest.mark.parametrize("box,out_hw", [((0, 0, 8, 8), (10, 10)), ((0, 0, 30, 40), (32, 42)),
                                        ((0, 0, 155, 201), (157, 203)), ((2, 3, 30, 40), (33, 44))])
def test_a_window_whose_region_has_the_output_size_is_still_resized(photos, box, out_hw):
    """A window's margin on one side only (a box at the image's origin or edge) can make the region
    the output's size while the box is smaller: that is a resize (Pillow's resize(box=)), not a copy
    of the region, in the CPU core and in the host build alike."""
    t, l, h, w = box
    ref = pil_resize(photos.full[0], out_hw, box=(l, t, l + w, t + h))
    got = run_host(photos, [0], np.array([box], np.int64), out_hw, window=True).numpy()[0]
    core = core_reference(photos, [0], np.array([box], np.int64), out_hw, window=True).numpy()[0]
    np.testing.assert_array_equal(got, ref)
    np.testing.assert_array_equal(core, ref)


def test_a_fractional_box_at_the_origin_is_resized_by_the_core(photos):
    """A fractional box is the CPU core's alone (whole pixels here); its rounded-up region may have
    the output's size: still Pillow's resize of the box."""
    out_hw = (10, 10)
    got = gpupipe.decode_crop_jpegs([photos.jpegs[0]], np.array([[0, 0, 9.5, 9.5]]), size=out_hw, dct_scaling=False,
                                    mode=photos.mode).images.permute(0, 2, 3, 1).numpy()[0]
    np.testing.assert_array_equal(got, pil_resize(photos.full[0], out_hw, box=(0, 0, 9.5, 9.5)))


def test_without_resize_each_box_is_copied(photos):
    boxes = np.array([[0, 0, 30, 40], [157 - 30, 203 - 40, 30, 40], [5, 3, 30, 40], [1, 2, 30, 40]], np.int64)
    idx = [0, 0, 1, 2]
    got = run_host(photos, idx, boxes, (30, 40), resize=False).numpy()
    for k, (i, (t, l, h, w)) in enumerate(zip(idx, boxes)):
        np.testing.assert_array_equal(got[k], photos.full[i][t:t + h, l:l + w])


def test_only_the_given_slots_are_written_and_the_pool_runs_it(photos):
    idx, boxes = [0, 1, 3], np.array([[3, 4, 100, 150], [0, 0, 150, 190], [10, 20, 250, 400]], np.int64)
    slots = np.array([4, 0, 2], np.int64)
    out = torch.full((6, 45, 67, photos.full[0].shape[2]), 77, dtype=torch.uint8)
    threads = torch.get_num_threads()
    _C.shutdown_pool()
    torch.set_num_threads(3)
    try:
        crop_resize_ragged(photos.rows(idx), boxes, out, slots, resize=True)
        assert _C.pool_threads() == 3  # the rows went to the pool of 3, not the calling thread alone
    finally:
        torch.set_num_threads(threads)
    for untouched in (1, 3, 5):
        assert (out[untouched] == 77).all()
    one = torch.zeros_like(out)
    _C.crop_resize_ragged(photos.rows(idx), boxes, slots, one.data_ptr(), one.numel(), *one.shape, True, False, 1)
    np.testing.assert_array_equal(out[slots].numpy(), one[slots].numpy())
    np.testing.assert_array_equal(out[slots].numpy(), core_reference(photos, idx, boxes, (45, 67), False).numpy())


@pytest.mark.parametrize("device", DEVICES)
def test_an_empty_batch_writes_nothing(device):
    out = torch.full((2, 5, 6, 3), 9, dtype=torch.uint8, device=device)
    crop_resize_ragged(np.zeros((0, 4), np.int64), np.zeros((0, 4)), out, np.zeros(0, np.int64), resize=True)
    assert (out == 9).all()


BAD = {  # name: (change to the valid arguments, message)
    "slot out of range": (lambda a: a.update(slots=np.array([0, 5], np.int64)), r"sample 1: slot 5 is outside the batch of 3"),
    "negative slot": (lambda a: a.update(slots=np.array([-1, 0], np.int64)), r"sample 0: slot -1 is outside"),
    "duplicate slots": (lambda a: a.update(slots=np.array([2, 2], np.int64)), r"sample 1: slot 2 is also sample 0's"),
    "box outside": (lambda a: a["boxes"].__setitem__((1, 0), 150), r"sample 1: crop box .* is not inside the image of 190x150"),
    "negative box": (lambda a: a["boxes"].__setitem__((0, 1), -1), r"sample 0: crop box .* is not inside"),
    "empty box": (lambda a: a["boxes"].__setitem__((1, 2), 0), r"sample 1: crop box .* is not inside"),
    "fractional box": (lambda a: a.update(boxes=a["boxes"].astype(np.float64) + [[0, 0.5, 0, 0], [0, 0, 0, 0]]),
                       r"sample 0: crop box \(top=2, left=3.5, .* is fractional"),
    "box size without resize": (lambda a: a.update(resize=False), r"sample 0: crop box .* differs from the output size 20x30 but resize is off"),
    "null image": (lambda a: a["images"].__setitem__((1, 0), 0), r"sample 1: the image address is null"),
    "short pitch": (lambda a: a["images"].__setitem__((0, 3), 10), r"sample 0: .*row pitch"),
    "4 channels": (lambda a: a.update(out=torch.full((3, 20, 30, 4), 9, dtype=torch.uint8)), r"1 or 3 channels, got 4"),
    "float images": (lambda a: a.update(images=a["images"].astype(np.float64)), r"images, \[n, 4\] rows .* must be a C-contiguous int64"),
    "int32 slots": (lambda a: a.update(slots=a["slots"].astype(np.int32)), r"slots, \[n\], must be a C-contiguous int64"),
    "int32 boxes": (lambda a: a.update(boxes=a["boxes"].astype(np.int32)), r"boxes must be a C-contiguous int64 or float64"),
    "too few boxes": (lambda a: a.update(boxes=a["boxes"][:1]), r"boxes must be .* of shape \[2, 4\]"),
    "float out": (lambda a: a.update(out=torch.zeros((3, 20, 30, 3))), r"out must be a contiguous uint8 tensor"),
    "strided out": (lambda a: a.update(out=torch.full((3, 30, 20, 3), 9, dtype=torch.uint8).transpose(1, 2)),
                    r"out must be a contiguous uint8 tensor"),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(BAD))
def test_bad_arguments_are_value_errors_naming_the_sample(name, device):
    full = [np.array(photo(150, 190)), np.array(photo(150, 190, "coffee"))]  # writable copies
    imgs = [torch.from_numpy(f).to(device) for f in full]
    args = dict(images=np.array([[t.data_ptr(), 150, 190, 570] for t in imgs], np.int64),
                boxes=np.array([[2, 3, 40, 50], [5, 6, 70, 80]], np.int64), slots=np.array([0, 2], np.int64),
                out=torch.full((3, 20, 30, 3), 9, dtype=torch.uint8), resize=True)
    BAD[name][0](args)
    args["out"] = args["out"].to(device)
    out = args.pop("out")
    with pytest.raises(ValueError, match=BAD[name][1]):
        crop_resize_ragged(args.pop("images"), args.pop("boxes"), out, args.pop("slots"), **args)
    if out.dtype == torch.uint8:
        assert (out == 9).all()  # nothing written: every check comes before any pixel


def test_a_batch_larger_than_the_output_is_refused_before_its_slot_table():
    out = torch.zeros((1, 2, 2, 3), dtype=torch.uint8)
    with pytest.raises(ValueError, match="output buffer holds 12 bytes"):
        _C.crop_resize_ragged(np.zeros((0, 4), np.int64), np.zeros((0, 4)), np.zeros(0, np.int64), out.data_ptr(),
                              out.numel(), 10**15, 2, 2, 3, True, False, 1)


def test_an_output_overlapping_an_image_is_refused(photos):
    f = photos.full[0]
    out = torch.from_numpy(f[None, :20, :30].copy())
    rows = np.array([[out.data_ptr(), 20, 30, 30 * f.shape[2]]], np.int64)
    with pytest.raises(ValueError, match="overlaps input 0"):
        crop_resize_ragged(rows, np.array([[0, 0, 10, 10]]), out, np.zeros(1, np.int64), resize=True)


# --- CUDA: the kernels against the host build -------------------------------------------------------

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


def device_rows(tensors) -> np.ndarray:
    return np.array([[t.data_ptr(), t.shape[0], t.shape[1], t.stride(0)] for t in tensors], np.int64)


@CUDA
@pytest.mark.parametrize("resize", [True, False])
@pytest.mark.parametrize("window", [False, True])
@pytest.mark.parametrize("out_hw", SIZES)
def test_cuda_is_the_host_build_bit_for_bit(photos, out_hw, window, resize):
    rng = np.random.default_rng(11)
    if resize:
        idx, boxes = batch_boxes(rng, photos, out_hw)
    else:  # every box of the output's size, where the image holds it
        idx = [i for i, f in enumerate(photos.full) if f.shape[0] >= out_hw[0] and f.shape[1] >= out_hw[1]] * 3
        boxes = np.array([[rng.integers(0, photos.full[i].shape[0] - out_hw[0] + 1),
                           rng.integers(0, photos.full[i].shape[1] - out_hw[1] + 1), *out_hw] for i in idx], np.int64)
    n = len(idx)
    slots = rng.permutation(n + 3)[:n].astype(np.int64)  # a bigger batch: 3 slots left alone
    host = torch.full((n + 3, *out_hw, photos.full[0].shape[2]), 5, dtype=torch.uint8)
    crop_resize_ragged(photos.rows(idx), boxes, host, slots, resize=resize, window=window)
    dev_images = [torch.from_numpy(p).cuda() for p in photos.padded]  # the padded pitch, on the device
    rows = photos.rows(idx)
    rows[:, 0] = [dev_images[i].data_ptr() for i in idx]
    dev = torch.full_like(host, 5, device="cuda")
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):  # torch's current stream, not the default one
        crop_resize_ragged(rows, boxes.astype(np.float64), dev, slots, resize=resize, window=window)
    stream.synchronize()
    np.testing.assert_array_equal(dev.cpu().numpy(), host.numpy())


@CUDA
def test_cuda_large_boxes_into_224(photos):
    """The benchmark's shape, smaller: 1920x1280-class boxes (wide filters, long intermediates) into 224x224."""
    rng = np.random.default_rng(3)
    c = photos.full[0].shape[2]
    big = [torch.from_numpy(rng.integers(0, 256, (h, w, c), dtype=np.uint8)) for h, w in [(1280, 1920), (1080, 1440)]]
    idx = [0, 1, 0, 1, 0, 1]
    boxes = np.array([[0, 0, 1280, 1920], [0, 0, 1080, 1440], [100, 300, 1100, 1500], [7, 9, 1000, 300],
                      [1279, 0, 1, 1920], [3, 5, 224, 224]], np.int64)
    slots = np.arange(6, dtype=np.int64)
    host = torch.zeros((6, 224, 224, c), dtype=torch.uint8)
    crop_resize_ragged(device_rows([big[i] for i in idx]), boxes, host, slots, resize=True)
    dev_big = [t.cuda() for t in big]
    dev = torch.zeros_like(host, device="cuda")
    crop_resize_ragged(device_rows([dev_big[i] for i in idx]), boxes, dev, slots, resize=True)
    np.testing.assert_array_equal(dev.cpu().numpy(), host.numpy())


@CUDA
@pytest.mark.parametrize("boxes_of", ["one pass each", "more samples than a grid's 65535 rows"])
def test_cuda_batches_that_skip_a_launch_or_loop_over_samples(boxes_of):
    """A batch whose every sample needs one pass (the second launch is skipped), and one of 70,000
    samples (blockIdx.y loops over them): the device writes the host build's bytes."""
    rng = np.random.default_rng(5)
    img = torch.from_numpy(rng.integers(0, 256, (40, 60, 3), dtype=np.uint8))
    if boxes_of == "one pass each":  # the width kept: only the vertical pass runs
        n, out_hw = 64, (16, 60)
        boxes = np.array([[int(rng.integers(0, 10)), 0, 30, 60] for _ in range(n)], np.int64)
    else:
        n, out_hw = 70_000, (2, 2)
        boxes = np.stack([rng.integers(0, 39, n), rng.integers(0, 59, n), np.ones(n, np.int64), np.ones(n, np.int64)],
                         axis=1).astype(np.int64)
    slots = np.arange(n, dtype=np.int64)
    host = torch.zeros((n, *out_hw, 3), dtype=torch.uint8)
    crop_resize_ragged(device_rows([img] * n), boxes, host, slots, resize=True)
    dev_img = img.cuda()
    dev = torch.zeros_like(host, device="cuda")
    crop_resize_ragged(device_rows([dev_img] * n), boxes, dev, slots, resize=True)
    np.testing.assert_array_equal(dev.cpu().numpy(), host.numpy())
