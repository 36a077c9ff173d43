"""The per-pixel math of csrc/augment/augment_pixel.h, held to its rounding contract: the host build must
equal, bit for bit, a float32 emulation of the device's arithmetic (each step one IEEE binary32
operation rounded to nearest even, in the header's order, never fused: what __fmul_rn / __fadd_rn /
__fdiv_rn compute). numpy's float32 ufuncs are exactly that on every x86-64 CPU (AVX2 or AVX-512):
one correctly rounded operation per call, no contraction. A host build that contracted an FMA,
reassociated or used an approximate reciprocal would differ here in the last bits."""

import numpy as np
import pytest
import torch

from gpupipe.augment import affine_matrices, warp_affine
from helpers import photo_batch

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


# --- the whole engine: BatchAugment's two passes, emulated -------------------------------------------

def emulate_hue(r, g, b, shift):
    maxc = np.maximum(np.maximum(r, g), b)
    minc = np.minimum(np.minimum(r, g), b)
    gray = maxc == minc
    rng = maxc - minc
    s = rng / np.where(gray, f32(1), maxc)
    inv = f32(1) / np.where(gray, f32(1), rng)
    rc, gc, bc = (maxc - r) * inv, (maxc - g) * inv, (maxc - b) * inv
    h = np.where(maxc == r, bc - gc, np.where(maxc == g, (rc + f32(2)) - bc, (gc + f32(4)) - rc))
    h = h * f32(1.0 / 6.0) + f32(1)
    h = np.where(h >= 1, h - f32(1), h)
    h = h + shift
    h = h - np.floor(h)
    h6 = h * f32(6)
    i = np.floor(h6)
    f = h6 - i
    i = np.where(i == 6, f32(0), i)
    v = maxc
    sf = s * f
    one_minus_s = f32(1) - s
    q = np.clip((f32(1) - sf) * v, 0, 1)
    t = np.clip((sf + one_minus_s) * v, 0, 1)
    p = np.clip(one_minus_s * v, 0, 1)
    pick = lambda *vals: np.select([i == k for k in range(6)], vals)  # noqa: E731
    return pick(v, q, p, p, t, v).astype(f32), pick(t, v, v, q, p, p).astype(f32), pick(p, p, t, v, v, q).astype(f32)


def emulate_luma(r, g, b, weights=(0.2989, 0.587, 0.114)):
    return (r * f32(weights[0]) + g * f32(weights[1])) + b * f32(weights[2])


def emulate_op(op, rgb, factor, contrast_term):
    r, g, b = rgb
    if op == 0:
        return tuple(np.clip(c * factor, 0, 1) for c in rgb)
    if op == 1:
        return tuple(np.clip(c * factor + contrast_term, 0, 1) for c in rgb)
    if op == 2:
        term = (f32(1) - factor) * emulate_luma(r, g, b)
        return tuple(np.clip(c * factor + term, 0, 1) for c in rgb)
    return emulate_hue(r, g, b, factor)


def active(op, factor):
    return factor != 0 if op == 3 else factor != 1


def emulate_engine(x, packed, interpolation, fill, color, mean, std):
    """BatchAugment's engine in float32 numpy, sample by sample, in the kernels' order of operations."""
    n, _, h, w = x.shape
    yy, xx = np.meshgrid(np.arange(h, dtype=f32), np.arange(w, dtype=f32), indexing="ij")
    mean32, inv_std = np.asarray(mean, dtype=f32), (1 / np.asarray(std, dtype=np.float64)).astype(f32)
    out = np.empty((n, 3, h, w), dtype=f32)
    inv255 = f32(1.0 / 255.0)
    for i in range(n):
        P = packed[i]
        sx, sy = emulate_affine_source(P[:6], xx.ravel(), yy.ravel())
        v = emulate_sample(x[i], interpolation, fill, sx, sy)
        order = [int(k) for k in P[10:14]]
        factors = P[6:10]
        needs_mean = P[21] != 0 if color == "linear" else factors[1] != 1
        mean_value = f32(0)
        if needs_mean:
            if color == "linear":
                luma = emulate_luma(*v, weights=(0.299, 0.587, 0.114)) * inv255
            else:
                rgb = tuple(c * inv255 for c in v)
                for op in order:
                    if op == 1:
                        break
                    if active(op, factors[op]):
                        rgb = emulate_op(op, rgb, factors[op], f32(0))
                luma = emulate_luma(*rgb)
            total = int(np.rint(luma * f32(2**24)).astype(np.int64).sum())
            mean_value = f32(total / (float(h * w) * 2**24))
        if color == "linear":
            A, t, u = P[6:15].reshape(3, 3), P[15:18], P[18:21]
            res = [((A[c, 0] * v[0] + A[c, 1] * v[1]) + A[c, 2] * v[2]) + (t[c] + mean_value * u[c]) for c in range(3)]
        else:
            term = (f32(1) - factors[1]) * mean_value
            rgb = tuple(c * inv255 for c in v)
            for op in order:
                if active(op, factors[op]):
                    rgb = emulate_op(op, rgb, factors[op], term)
            if P[14] != 0:
                rgb = (emulate_luma(*rgb),) * 3
            res = [(rgb[c] - mean32[c]) * inv_std[c] for c in range(3)]
        out[i] = np.stack(res).reshape(3, h, w)
    return out


@pytest.mark.parametrize("color", ["torchvision", "linear"])
@pytest.mark.parametrize("interpolation", ["nearest", "bilinear"])
@pytest.mark.parametrize("fill", [0, None, (10, 250, 99)])
def test_engine_host_build_equals_device_arithmetic(color, interpolation, fill):
    """0 ULP: the host build of BatchAugment's engine against the emulated device arithmetic, with
    every op of the chain active (rotation and flips, all four color ops in random orders, hue,
    grayscale), for both passes (contrast's exact fixed-point mean included)."""
    from gpupipe.augment import BatchAugment

    h, w = 45, 67
    x = photo_batch(12, h, w, seed=22)
    aug = BatchAugment(hflip=0.5, vflip=0.5, rotation=40, translate=(0.1, 0.1), scale=(0.8, 1.2), shear=10,
                       interpolation=interpolation, fill=fill, brightness=0.5, contrast=0.5, saturation=0.5, hue=0.2,
                       grayscale=0.3, color=color)
    p = aug.sample_params(12, seed=5)
    p["angle"][0] = 0.0  # an axis-aligned sample (the host's direct-read path)
    p["translate"][0] = 0.0
    p["scale"][0] = 1.0
    p["shear"][0] = 0.0
    got = aug(x, params=p).numpy()
    want = emulate_engine(x.numpy(), aug.pack_params(p, h, w).numpy(), interpolation,
                          None if fill is None else aug.fill, color, aug.mean, aug.std)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
