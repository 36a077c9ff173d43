"""Crop samplers: torchvision's semantics, and boxes that depend only on (seed, epoch, index)."""

import math

import numpy as np
import pytest
import torch

from gpupipe import crops, keyed

SAMPLERS = [crops.RandomResizedCrop(224), crops.RandomCrop((100, 120)), crops.CenterCrop(96), crops.Resize((64, 48))]


def dims(n, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(130, 900, n), rng.integers(130, 900, n)


@pytest.mark.parametrize("sampler", SAMPLERS, ids=lambda s: type(s).__name__)
def test_boxes_are_inside_images_and_shaped(sampler):
    H, W = dims(500)
    b = sampler.boxes(H, W, seed=1, epoch=2)
    assert b.dtype == np.int64 and b.shape == (500, 4)
    top, left, h, w = b.T
    assert (top >= 0).all() and (left >= 0).all() and (h >= 1).all() and (w >= 1).all()
    assert (top + h <= H).all() and (left + w <= W).all()
    if not sampler.resize:
        assert (h == sampler.size[0]).all() and (w == sampler.size[1]).all()


@pytest.mark.parametrize("sampler", SAMPLERS[:2], ids=lambda s: type(s).__name__)
def test_boxes_depend_only_on_seed_epoch_index(sampler):
    H, W = dims(64)
    idx = np.arange(1000, 1064)
    full = sampler.boxes(H, W, seed=7, epoch=3, indices=idx)
    # any batch split and order gives the same box per index
    perm = np.random.default_rng(0).permutation(64)
    parts = np.concatenate([sampler.boxes(H[perm[:20]], W[perm[:20]], seed=7, epoch=3, indices=idx[perm[:20]]),
                            sampler.boxes(H[perm[20:]], W[perm[20:]], seed=7, epoch=3, indices=idx[perm[20:]])])
    np.testing.assert_array_equal(parts, full[perm])
    np.testing.assert_array_equal(sampler.boxes(H, W, seed=7, epoch=3, indices=idx), full)
    assert (sampler.boxes(H, W, seed=7, epoch=4, indices=idx) != full).any(axis=1).mean() > 0.9
    assert (sampler.boxes(H, W, seed=8, epoch=3, indices=idx) != full).any(axis=1).mean() > 0.9


def test_uniforms_are_uniform_and_independent():
    u = crops.uniforms(0, 0, np.arange(20000), 4)
    assert u.min() >= 0 and u.max() < 1
    assert abs(u.mean() - 0.5) < 0.01 and abs(u.var() - 1 / 12) < 0.003
    c = np.corrcoef(u.T)
    assert np.abs(c - np.eye(4)).max() < 0.03
    # neighbouring indices and epochs are not correlated
    v = crops.uniforms(0, 1, np.arange(20000), 4)
    assert abs(np.corrcoef(u[:, 0], v[:, 0])[0, 1]) < 0.03
    assert abs(np.corrcoef(u[:-1, 0], u[1:, 0])[0, 1]) < 0.03


def _torchvision_rrc(h, w, n, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)):
    from torchvision.transforms import RandomResizedCrop

    torch.manual_seed(0)
    img = torch.empty(1, h, w)
    return np.array([RandomResizedCrop.get_params(img, list(scale), list(ratio)) for _ in range(n)])


def _stats(b, h, w):
    top, left, bh, bw = b.T.astype(float)
    return {
        "area": (bh * bw / (h * w)).mean(),
        "log_aspect": np.log(bw / bh).mean(),
        "log_aspect_std": np.log(bw / bh).std(),
        "cy": ((top + bh / 2) / h).mean(),
        "cx": ((left + bw / 2) / w).mean(),
        "full": ((bh == h) | (bw == w)).mean(),
    }


@pytest.mark.parametrize("h,w,scale,ratio", [(533, 800, (0.08, 1.0), (3 / 4, 4 / 3)), (300, 300, (0.5, 1.0), (3 / 4, 4 / 3)),
                                             (120, 900, (0.08, 1.0), (3 / 4, 4 / 3)), (800, 533, (0.25, 0.9), (0.5, 2.0))])
def test_random_resized_crop_matches_torchvision_distribution(h, w, scale, ratio):
    n = 6000
    ours = crops.RandomResizedCrop(224, scale=scale, ratio=ratio).boxes(np.full(n, h), np.full(n, w), seed=3)
    ref = _torchvision_rrc(h, w, n, scale, ratio)
    a, b = _stats(ours, h, w), _stats(ref, h, w)
    for key in a:
        assert abs(a[key] - b[key]) < 0.02 + 0.05 * abs(b[key]), (key, a[key], b[key])


def test_random_resized_crop_fallback_is_torchvision_center_crop():
    # A 1x50 strip: no try can fit the aspect ratio, so every box is the fallback.
    b = crops.RandomResizedCrop(8).boxes([10], [500])
    assert b.tolist() == [[0, (500 - round(10 * 4 / 3)) // 2, 10, round(10 * 4 / 3)]]
    b = crops.RandomResizedCrop(8).boxes([500], [10])
    assert b.tolist() == [[(500 - round(10 / (3 / 4))) // 2, 0, round(10 / (3 / 4)), 10]]


def test_random_crop_is_uniform_and_exact_when_sizes_match():
    b = crops.RandomCrop(10).boxes(np.full(20000, 30), np.full(20000, 40))
    counts = np.bincount(b[:, 0], minlength=21)
    assert counts.min() > 0.8 * 20000 / 21 and counts.max() < 1.2 * 20000 / 21
    assert b[:, 1].max() == 30 and b[:, 0].max() == 20
    assert crops.RandomCrop((30, 40)).boxes([30], [40]).tolist() == [[0, 0, 30, 40]]


@pytest.mark.parametrize("H,W,size", [(533, 800, 224), (101, 99, (50, 51)), (224, 224, 224), (300, 201, (7, 200))])
def test_center_crop_matches_torchvision(H, W, size):
    from torchvision.transforms.v2 import functional as F

    img = torch.arange(H * W, dtype=torch.int64).reshape(1, H, W)
    tv = F.center_crop(img, list(size) if isinstance(size, tuple) else [size, size])
    top, left = int(tv[0, 0, 0]) // W, int(tv[0, 0, 0]) % W
    b = crops.CenterCrop(size).boxes([H], [W])[0]
    assert (b[0], b[1]) == (top, left) and (b[2], b[3]) == tuple(tv.shape[1:])


def test_too_small_images_name_the_sample():
    with pytest.raises(ValueError, match=r"RandomCrop\(100, 100\) is larger than image 2 .*50x80"):
        crops.RandomCrop(100).boxes([200, 300, 80, 90], [200, 300, 50, 10])


@pytest.mark.parametrize("H,W,size", [(20, 200, 100), (7, 9, (8, 10)), (50, 40, (51, 3)), (1, 1, 5), (9, 64, (12, 64))])
def test_center_crop_pads_a_smaller_image_as_torchvision(H, W, size):
    """torchvision zero-pads an image smaller than the crop: the box is the image's whole extent in
    that dimension, placed at (h - H) // 2 (it raised here)."""
    from torchvision.transforms.v2 import functional as F

    img = torch.arange(1, H * W + 1, dtype=torch.int64).reshape(1, H, W)
    tv = F.center_crop(img, list(size) if isinstance(size, tuple) else [size, size])[0]
    sampler = crops.CenterCrop(size)
    (t, l, h, w), (dy, dx) = sampler.boxes([H], [W])[0], sampler.placement([H], [W])[0]
    ours = torch.zeros_like(tv)
    ours[dy:dy + h, dx:dx + w] = img[0, t:t + h, l:l + w]
    assert torch.equal(ours, tv)


def test_argument_validation():
    with pytest.raises(ValueError):
        crops.RandomResizedCrop(0)
    with pytest.raises(ValueError):
        crops.RandomResizedCrop(10, scale=(1.0, 0.5))
    for bad in ((1,), (float("nan"), 1.5), (0.5, float("inf")), (0.0, 1.0), 0.5, ("a", 1)):
        with pytest.raises(ValueError, match="scale must be"):
            crops.RandomResizedCrop(10, scale=bad)
        with pytest.raises(ValueError, match="ratio must be"):
            crops.RandomResizedCrop(10, ratio=bad)
    with pytest.raises(ValueError, match="size must be"):
        crops.RandomResizedCrop(10.5)
    assert crops.RandomResizedCrop(np.int64(10), scale=(0.5, 1.5)).size == (10, 10)  # scale > 1: torchvision's
    with pytest.raises(ValueError, match="same length"):
        crops.Resize(8).boxes([1, 2], [3])
    with pytest.raises(ValueError, match="indices"):
        crops.RandomCrop(1).boxes([5, 5], [5, 5], indices=[1])
    assert "RandomResizedCrop" in repr(crops.RandomResizedCrop(10))


def test_keyed_streams_are_independent_and_stream_0_is_the_crops():
    from gpupipe import keyed

    idx = np.arange(5000)
    base = keyed.uniforms(3, 1, idx, 2)
    np.testing.assert_array_equal(crops.uniforms(3, 1, idx, 2), base)
    other = keyed.uniforms(3, 1, idx, 2, stream=keyed.stream_of("BatchAugment"))
    assert abs(np.corrcoef(base[:, 0], other[:, 0])[0, 1]) < 0.05
    # draw k does not depend on how many draws were asked for
    np.testing.assert_array_equal(keyed.uniforms(3, 1, idx, 5)[:, :2], base)
    assert keyed.stream_of("x") == keyed.stream_of("x") != keyed.stream_of("y")
    assert keyed.derive_seed(1, 0) != keyed.derive_seed(1, 1) != keyed.derive_seed(2, 0)


def test_resize_center_crop_is_torchvisions_eval_transform():
    """Resize(256) + CenterCrop(224) on Pillow images of assorted sizes and aspect ratios: the
    exact decode (dct_scaling=False) equal to it (the tall ones are where Pillow >= 13 resizes
    vertically first); the default (DCT-scaled) within a mean of 1 level."""
    import io

    from PIL import Image
    from torchvision import transforms as T

    import gpupipe
    from helpers import encode, photo

    sampler = crops.ResizeCenterCrop(224, 256)
    tv = T.Compose([T.Resize(256), T.CenterCrop(224)])
    shapes = [(533, 800), (800, 533), (256, 256), (300, 1000), (1280, 1920), (257, 383), (480, 481), (1017, 313),
              (690, 259), (1130, 430)]
    datas = [encode(photo(h, w, ["coffee", "astronaut", "chelsea", "rocket"][k % 4]), quality=92)
             for k, (h, w) in enumerate(shapes)]
    H, W = zip(*shapes)
    boxes = sampler.boxes(H, W)
    assert boxes.dtype == np.float64 and sampler.window and sampler.resize
    ref = np.stack([np.asarray(tv(Image.open(io.BytesIO(d)).convert("RGB"))) for d in datas])
    exact = gpupipe.decode_crop_jpegs(datas, boxes, size=224, window=True, dct_scaling=False)
    diff = np.abs(exact.images.permute(0, 2, 3, 1).numpy().astype(int) - ref.astype(int))
    assert diff.max() == 0, [int(d.max()) for d in diff]
    fast = gpupipe.decode_crop_jpegs(datas, boxes, size=224, window=True)
    diff = np.abs(fast.images.permute(0, 2, 3, 1).numpy().astype(int) - ref.astype(int))
    assert diff.mean() < 1.0, diff.mean()
    # without the window, the border columns lose the pixels the full resize reads around the crop
    cropped = gpupipe.decode_crop_jpegs(datas, boxes, size=224, dct_scaling=False)
    assert (cropped.images != exact.images).any()


@pytest.mark.parametrize("fmt", ["PNG", "WEBP"])
def test_resize_center_crop_of_files_pillow_decodes_is_torchvisions_eval_transform_too(fmt):
    """The Pillow route (PNG, WebP, ...) resizes the whole image and crops where the box falls on
    whole pixels of the resized frame, as torchvision does: equal to Resize + CenterCrop, as JPEGs."""
    import io

    from PIL import Image
    from torchvision import transforms as T

    import gpupipe
    from helpers import photo

    for size, resize in ((224, 256), (224, 232), (64, 72)):
        sampler = crops.ResizeCenterCrop(size, resize)
        tv = T.Compose([T.Resize(resize), T.CenterCrop(size)])
        shapes = [(652, 156), (300, 1000), (533, 800), (257, 383), (1017, 313)]
        datas = []
        for k, (h, w) in enumerate(shapes):
            buf = io.BytesIO()
            Image.fromarray(photo(h, w, ["coffee", "astronaut", "chelsea"][k % 3])).save(buf, fmt, lossless=True)
            datas.append(buf.getvalue())
        ref = np.stack([np.asarray(tv(Image.open(io.BytesIO(d)).convert("RGB"))) for d in datas])
        got = gpupipe.decode_crop_jpegs(datas, sampler.boxes(*zip(*shapes)), size=size, window=True, dct_scaling=False)
        assert got.ok.all() and (got.images.permute(0, 2, 3, 1).numpy() == ref).all(), (size, resize)


def test_resize_center_crop_boxes_never_leave_the_image():
    """Each edge is computed once and the far one clamped: no box overshoots by an ulp (it did for
    3% of sizes with crop == resize), and such images decode."""
    import gpupipe

    for sampler in (crops.ResizeCenterCrop(224, 224), crops.ResizeCenterCrop((224, 224), (224, 224)),
                    crops.ResizeCenterCrop(224, 256)):
        H, W = np.meshgrid(np.arange(225, 1000, 7), np.arange(225, 1400, 11))
        b = sampler.boxes(H.ravel(), W.ravel())
        assert (b[:, 0] + b[:, 2] <= H.ravel()).all() and (b[:, 1] + b[:, 3] <= W.ravel()).all()
    jpeg = gpupipe._C.encode_jpeg(np.full((225, 225, 3), 90, np.uint8), 225, 225, 3)
    box = crops.ResizeCenterCrop(224, 224).boxes([225], [225])
    assert gpupipe.decode_crop_jpegs([jpeg], box, size=224, window=True).ok.all()


def test_resize_center_crop_sizes_and_errors():
    s = crops.ResizeCenterCrop((200, 100), (300, 150))
    assert s.resized_sizes([1000], [10])[0].tolist() == [300] and s.boxes([600], [300]).tolist() == [[100, 50, 400, 200]]
    with pytest.raises(ValueError, match="larger than the resized image"):
        crops.ResizeCenterCrop(300, 256)
    with pytest.raises(ValueError, match="larger than the resized image"):  # a square image: 256 x 256
        crops.ResizeCenterCrop((224, 300), 256)
    with pytest.raises(ValueError, match="resize_size must be"):
        crops.ResizeCenterCrop(224, 256.0)
    with pytest.raises(ValueError, match="crop_size must be"):
        crops.ResizeCenterCrop((224,), 256)


def test_sizes_are_whole_numbers_given_any_way():
    """A size is an int or two of them: a tuple, a list, a 1-D integer array or tensor; 2.7 is an
    error (not 2), in the crop samplers and the decode ops alike."""
    import gpupipe
    from helpers import encode, photo

    for size in (24, (24, 32), [24, 32], np.array([24, 32]), torch.tensor([24, 32])):
        assert crops.CenterCrop(size).size == ((24, 24) if isinstance(size, int) else (24, 32))
    data = encode(photo(48, 64))
    assert gpupipe.decode_crop_jpeg(data, 0, 0, 40, 40, size=np.array([20, 10])).shape == (3, 20, 10)
    for bad in (2.7, (24, 2.5), np.array([24.0, 32.0]), "24", (0, 3)):
        with pytest.raises(ValueError, match="size"):
            crops.CenterCrop(bad)
        with pytest.raises(ValueError, match="size"):
            gpupipe.decode_crop_jpeg(data, 0, 0, 40, 40, size=bad)


def numpy_random_resized_crop(sampler, H, W, *, seed, epoch, indices):
    """The numpy definition of RandomResizedCrop.boxes, the reference of its native code
    (csrc/common/crop_sampling.h): 10 tries of 4 keyed draws, vectorised over the batch."""
    from gpupipe.crops import _randint

    n, tries = H.shape[0], 10
    u = keyed.uniforms(seed, epoch, indices, 4 * tries).reshape(n, tries, 4)
    area = (H * W).astype(np.float64)[:, None]
    target = area * (sampler.scale[0] + u[..., 0] * (sampler.scale[1] - sampler.scale[0]))
    lo, hi = math.log(sampler.ratio[0]), math.log(sampler.ratio[1])
    aspect = np.exp(lo + u[..., 1] * (hi - lo))
    w = np.round(np.sqrt(target * aspect)).astype(np.int64)  # round half to even, as Python
    h = np.round(np.sqrt(target / aspect)).astype(np.int64)
    fits = (w > 0) & (w <= W[:, None]) & (h > 0) & (h <= H[:, None])
    first = np.argmax(fits, axis=1)
    rows = np.arange(n)
    found = fits[rows, first]
    h_sel, w_sel = h[rows, first], w[rows, first]
    top = _randint(u[rows, first, 2], H - h_sel + 1)
    left = _randint(u[rows, first, 3], W - w_sel + 1)
    in_ratio = W / H
    fw, fh = W.copy(), H.copy()
    narrow, wide = in_ratio < sampler.ratio[0], in_ratio > sampler.ratio[1]
    fh[narrow] = np.round(W[narrow] / sampler.ratio[0]).astype(np.int64)
    fw[wide] = np.round(H[wide] * sampler.ratio[1]).astype(np.int64)
    out = np.stack([top, left, h_sel, w_sel], axis=1)
    fallback = np.stack([(H - fh) // 2, (W - fw) // 2, fh, fw], axis=1)
    return np.where(found[:, None], out, fallback).astype(np.int64)


@pytest.mark.parametrize("scale,ratio", [((0.08, 1.0), (3 / 4, 4 / 3)), ((0.5, 0.5), (1.0, 1.0)),
                                         ((0.9, 1.5), (0.2, 5.0)), ((1e-4, 0.01), (1 / 3, 3.0))])
def test_random_resized_crop_native_boxes_are_the_numpy_definition(scale, ratio):
    rng = np.random.default_rng(17)
    n = 200_000
    H = np.concatenate([rng.integers(1, 4000, n // 2), rng.integers(1, 12, n // 4), np.full(n // 4, 7)])
    W = np.concatenate([rng.integers(1, 4000, n // 2), rng.integers(1, 3000, n // 4), np.full(n // 4, 4000)])
    idx = rng.integers(-2**62, 2**62, n)
    sampler = crops.RandomResizedCrop(224, scale=scale, ratio=ratio)
    for seed, epoch in ((0, 0), (2**64 - 1, 7), (-5, 2**70)):
        ref = numpy_random_resized_crop(sampler, H, W, seed=seed, epoch=epoch, indices=idx)
        got = sampler.boxes(H, W, seed=seed, epoch=epoch, indices=idx)
        assert got.dtype == np.int64 and got.shape == (n, 4)
        np.testing.assert_array_equal(got, ref)
