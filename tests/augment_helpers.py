"""Helpers of the augmentation tests: warp coordinates, and torchvision references applied per
sample (devices and real-photo batches are tests/helpers.py's)."""

from __future__ import annotations

import torch


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


def torchvision_chain(x: torch.Tensor, params: dict, *, interpolation: str, fill, mean, std) -> torch.Tensor:
    """BatchAugment's chain with torchvision.transforms.v2.functional, per sample, same parameters:
    uint8 -> float32 [0, 1], affine (F.rotate's angle convention), hflip, vflip, the color ops in the
    sample's order, rgb_to_grayscale, normalize. float32 [N, C, H, W] on the CPU (C: x's channels,
    or 3 when normalize broadcasts 3 values over 1 channel, as torchvision does)."""
    import torchvision.transforms.v2.functional as F

    mode = {"nearest": F.InterpolationMode.NEAREST, "bilinear": F.InterpolationMode.BILINEAR}[interpolation]
    n, c, h, w = x.shape
    fill01 = None if fill is None else [float(v) / 255 for v in (fill if isinstance(fill, (list, tuple)) else [fill] * c)]
    ops = (F.adjust_brightness, F.adjust_contrast, F.adjust_saturation, F.adjust_hue)
    out = []
    for i in range(n):
        img = F.to_dtype(x[i].cpu(), torch.float32, scale=True)
        tx, ty = (round(float(t) * s) for t, s in zip(params["translate"][i], (w, h)))
        img = F.affine(img, angle=-float(params["angle"][i]), translate=[tx, ty], scale=float(params["scale"][i]),
                       shear=[float(s) for s in params["shear"][i]], interpolation=mode, fill=fill01)
        if params["hflip"][i]:
            img = F.horizontal_flip(img)
        if params["vflip"][i]:
            img = F.vertical_flip(img)
        factors = [float(params[k][i]) for k in ("brightness", "contrast", "saturation", "hue")]
        for op in params["order"][i].tolist():
            img = ops[op](img, factors[op])
        if params["grayscale"][i]:
            img = F.rgb_to_grayscale(img, num_output_channels=c)  # (RandomGrayscale keeps the channels)
        out.append(F.normalize(img, list(mean), list(std)))
    return torch.stack(out)


def levels(out: torch.Tensor, ref: torch.Tensor, std) -> torch.Tensor:
    """|out - ref| of normalised images, back on the 0..255 scale (times std * 255 per channel)."""
    s = torch.tensor(std, dtype=torch.float64)[None, :, None, None] * 255
    return (out.double().cpu() - ref.double().cpu()).abs() * s
