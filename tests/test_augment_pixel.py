"""The per-pixel math of csrc/augment_pixel.h, held to its rounding contract: the host build must
equal, bit for bit, a float32 emulation of the device's arithmetic (each step one IEEE binary32
operation rounded to nearest even, in the header's order, never fused: what __fmul_rn / __fadd_rn /
__fdiv_rn compute). numpy's float32 ufuncs are exactly that on every x86-64 CPU (AVX2 or AVX-512):
one correctly rounded operation per call, no contraction. A host build that contracted an FMA,
reassociated or used an approximate reciprocal would differ here in the last bits."""

import numpy as np
import pytest
import torch

from augment_helpers import photo_batch
from gpupipe.augment import affine_matrices, warp_affine

f32 = np.float32


def emulate_affine_source(m, x, y):
    return (m[0] * x + m[1] * y) + m[2], (m[3] * x + m[4] * y) + m[5]


def emulate_sample(img, interpolation, fill, sx, sy):
    """img uint8 [3, H, W]; sx, sy float32 arrays; returns float32 [3, ...] (augment_pixel.h::sample)."""
    h, w = img.shape[1:]
    last_x, last_y = f32(w - 1), f32(h - 1)
    fill_v = None if fill is None else np.asarray(fill, dtype=f32)
    if interpolation == "nearest":
        fx, fy = np.rint(sx), np.rint(sy)
        inside = (fx >= 0) & (fx <= last_x) & (fy >= 0) & (fy <= last_y)
        ix, iy = np.where(inside, fx, 0).astype(np.int64), np.where(inside, fy, 0).astype(np.int64)
        v = img[:, iy, ix].astype(f32)
        outside = fill_v[:, None] if fill_v is not None else f32(0)
        return np.where(inside, v, np.broadcast_to(outside, v.shape)).astype(f32)
    x0, y0 = np.floor(sx), np.floor(sy)
    wx1, wy1 = sx - x0, sy - y0
    wx0, wy0 = f32(1) - wx1, f32(1) - wy1
    in_x0, in_x1 = (x0 >= 0) & (x0 <= last_x), (x0 >= -1) & (x0 < last_x)
    in_y0, in_y1 = (y0 >= 0) & (y0 <= last_y), (y0 >= -1) & (y0 < last_y)
    w00 = np.where(in_y0 & in_x0, wy0 * wx0, f32(0))
    w01 = np.where(in_y0 & in_x1, wy0 * wx1, f32(0))
    w10 = np.where(in_y1 & in_x0, wy1 * wx0, f32(0))
    w11 = np.where(in_y1 & in_x1, wy1 * wx1, f32(0))
    cx0 = np.where(in_x0, x0, 0).astype(np.int64)
    cx1 = np.where(in_x1, x0 + 1, 0).astype(np.int64)
    cy0 = np.where(in_y0, y0, 0).astype(np.int64)
    cy1 = np.where(in_y1, y0 + 1, 0).astype(np.int64)
    mask = ((w00 + w01) + w10) + w11
    p = lambda cy, cx: img[:, cy, cx].astype(f32)  # noqa: E731
    v = ((w00 * p(cy0, cx0) + w01 * p(cy0, cx1)) + w10 * p(cy1, cx0)) + w11 * p(cy1, cx1)
    if fill_v is not None:
        v = (v - fill_v[:, None]) * mask + fill_v[:, None]
    return v.astype(f32)


def emulate_warp(x, m, interpolation, fill):
    n, _, h, w = x.shape
    yy, xx = np.meshgrid(np.arange(h, dtype=f32), np.arange(w, dtype=f32), indexing="ij")
    out = np.empty((n, 3, h, w), dtype=f32)
    for i in range(n):
        sx, sy = emulate_affine_source(m[i].reshape(6).astype(f32), xx.ravel(), yy.ravel())
        out[i] = emulate_sample(x[i], interpolation, fill, sx, sy).reshape(3, h, w)
    return out


@pytest.mark.parametrize("interpolation", ["nearest", "bilinear"])
@pytest.mark.parametrize("fill", [None, (12.0, 250.0, 99.5)])
def test_warp_host_build_equals_device_arithmetic(interpolation, fill):
    h, w = 61, 83
    x = photo_batch(4, h, w, seed=20)
    g = torch.Generator().manual_seed(21)
    m = affine_matrices(torch.rand(4, generator=g, dtype=torch.float64) * 360, (torch.rand(4, 2, generator=g) - 0.5) * 20,
                        0.6 + torch.rand(4, generator=g, dtype=torch.float64), (torch.rand(4, 2, generator=g) - 0.5) * 30,
                        size=(h, w)).float()
    got = warp_affine(x, m, interpolation=interpolation, fill=fill, out_dtype=torch.float32).numpy()
    want = emulate_warp(x.numpy(), m.numpy(), interpolation, fill)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_the_emulation_sees_a_contraction():
    """Guard on the test itself: an FMA-contracted coordinate (m0 x + m1 y rounded once) differs from
    the header's two-rounding sequence on these inputs, so a contracting build could not pass."""
    g = np.random.default_rng(0)
    m = g.uniform(-2, 2, 6).astype(f32)
    x, y = np.arange(512, dtype=f32), g.uniform(0, 512, 512).astype(f32)
    separate, _ = emulate_affine_source(m, x, y)
    contracted = (np.float64(m[0]) * x + np.float64(f32(m[1] * y))).astype(f32) + m[2]
    assert not np.array_equal(separate, contracted)
