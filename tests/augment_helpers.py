"""Helpers of the augmentation tests: devices, real-photo batches (scikit-image's bundled photos),
and torchvision references applied per sample."""

from __future__ import annotations

import numpy as np
import pytest
import torch

DEVICES = [pytest.param("cpu"),
           pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"))]

PHOTOS = ("astronaut", "coffee", "chelsea", "rocket")


def photo_batch(n: int, h: int, w: int, *, seed: int = 0, device: str = "cpu", channels_last: bool = True) -> torch.Tensor:
    """uint8 ``[n, 3, h, w]``: a different random crop of a real photo per sample (resized with
    Lanczos), channels-last as gpupipe's decoder writes it."""
    import skimage.data
    from PIL import Image

    rng = np.random.default_rng(seed)
    imgs = []
    for i in range(n):
        pil = Image.fromarray(np.asarray(getattr(skimage.data, PHOTOS[i % len(PHOTOS)])())).convert("RGB")
        side = int(rng.integers(min(pil.size) // 2, min(pil.size) + 1))
        top = int(rng.integers(0, pil.size[1] - side + 1))
        left = int(rng.integers(0, pil.size[0] - side + 1))
        imgs.append(np.asarray(pil.crop((left, top, left + side, top + side)).resize((w, h), Image.LANCZOS)))
    x = torch.from_numpy(np.stack(imgs)).permute(0, 3, 1, 2)  # NHWC memory
    if not channels_last:
        x = x.contiguous()
    return x.to(device)


def source_coordinates(m: torch.Tensor, h: int, w: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact (float64) input coordinates ``[N, h, w]`` read by each output pixel through matrices m."""
    yy, xx = torch.meshgrid(torch.arange(h, dtype=torch.float64), torch.arange(w, dtype=torch.float64), indexing="ij")
    m = m.double().cpu()
    sx = m[:, 0, 0, None, None] * xx + m[:, 0, 1, None, None] * yy + m[:, 0, 2, None, None]
    sy = m[:, 1, 0, None, None] * xx + m[:, 1, 1, None, None] * yy + m[:, 1, 2, None, None]
    return sx, sy


def near_rounding_boundary(m: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """bool ``[N, h, w]``: pixels whose exact source coordinate lies within ``2^-21 * max(h, w)`` of a
    half-integer (a nearest-neighbour rounding boundary) on either axis. float32 coordinates, in
    torchvision's grid and in this kernel alike, are off by at most ~2^-22 * max(h, w) (measured:
    1.04 ULP of the image size); only there can the two pick different neighbours."""
    sx, sy = source_coordinates(m, h, w)
    eps = 2.0**-21 * max(h, w)
    return ((sx - sx.floor() - 0.5).abs() < eps) | ((sy - sy.floor() - 0.5).abs() < eps)
