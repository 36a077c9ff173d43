"""Inverse affine matrices with torchvision's semantics, for :func:`gpupipe.augment.warp_affine`.

``torchvision.transforms.v2.functional.affine(img, angle, translate, scale, shear, center=c)``
rotates by ``angle`` degrees (clockwise on screen) about ``c``, scales, shears by ``shear`` degrees
(x, y), then translates by ``translate`` pixels; it samples the input through the inverse map built
by ``_get_inverse_affine_matrix`` in a frame centred on the image. Here that inverse is written in
pixel-index coordinates (pixel ``(x, y)`` centred at integers, ``align_corners=False``):

    src = A @ (F @ out + f - c' - t) + c'

with ``A`` torchvision's inverse rotation-scale-shear, ``t`` the translation, ``c' = c - 0.5`` the
centre in index coordinates (torchvision's ``center`` counts from the image's top-left corner, so
the image centre is ``(W / 2, H / 2)``), and ``F, f`` the optional flips that follow the affine
(``x -> W - 1 - x``, ``y -> H - 1 - y``).
"""

from __future__ import annotations

import math
from typing import Optional, Sequence, Union

import torch

TensorLike = Union[torch.Tensor, float, Sequence[float]]


def _column(value: TensorLike, n: int, name: str, width: int = 0) -> torch.Tensor:
    """float64 ``[n]`` (width 0) or ``[n, width]``, broadcast from a scalar / per-sample values."""
    t = torch.as_tensor(value, dtype=torch.float64)
    if t.device.type != "cpu":
        t = t.cpu()
    shape = (n,) if width == 0 else (n, width)
    try:
        return t.expand(shape) if t.dim() <= len(shape) else t.reshape(shape)
    except RuntimeError:
        raise ValueError(f"{name} must broadcast to {list(shape)}, got shape {tuple(t.shape)}") from None


def _batch_size(*values) -> int:
    for v in values:
        if isinstance(v, torch.Tensor) and v.dim() >= 1:
            return v.shape[0]
    return 1


def affine_matrices(
    angle: TensorLike,
    translate: TensorLike,
    scale: TensorLike,
    shear: TensorLike,
    center: Optional[TensorLike] = None,
    hflip: Optional[torch.Tensor] = None,
    vflip: Optional[torch.Tensor] = None,
    *,
    size: Optional[Sequence[int]] = None,
) -> torch.Tensor:
    """Per-sample inverse maps (output pixel -> input coordinate) of torchvision's ``affine``.

    ``warp_affine(x, affine_matrices(angle, translate, scale, shear, center))`` computes
    ``torchvision.transforms.v2.functional.affine(x, angle, translate, scale, shear, center=center)``
    per sample; with ``hflip`` / ``vflip`` it is followed by ``F.horizontal_flip`` / ``F.vertical_flip``
    where those are True. ``F.rotate(x, a)`` is ``affine(-a, (0, 0), 1, (0, 0))``.

    Args:
        angle: degrees ``[N]`` (or a scalar), torchvision ``affine``'s sign convention.
        translate: pixels ``[N, 2]`` (x, y) (or ``[2]``).
        scale: ``[N]`` (or a scalar), > 0.
        shear: degrees ``[N, 2]`` (x, y) (or ``[2]``).
        center: ``[N, 2]`` (or ``[2]``) in torchvision's convention, the image's top-left corner
            at (0, 0); None: the image centre ``(W / 2, H / 2)`` (needs ``size``).
        hflip, vflip: bool ``[N]`` or None.
        size: ``(H, W)``, needed for ``center=None`` and for the flips.

    Returns:
        float64 ``[N, 2, 3]`` on the CPU: ``src = M[:, :, :2] @ (x, y) + M[:, :, 2]``.

    Example:
        >>> import torch
        >>> from gpupipe.augment import affine_matrices
        >>> m = affine_matrices(torch.tensor([90.0]), (0, 0), 1.0, (0, 0), size=(5, 5))
        >>> m.round(decimals=6) + 0.0  # a quarter turn about the centre pixel (2, 2)
        tensor([[[ 0.,  1.,  0.],
                 [-1.,  0.,  4.]]], dtype=torch.float64)
    """
    n = _batch_size(angle, translate, scale, shear, center, hflip, vflip)
    angle = _column(angle, n, "angle")
    translate = _column(translate, n, "translate", 2)
    scale = _column(scale, n, "scale")
    shear = _column(shear, n, "shear", 2)
    if size is not None:
        if len(size) != 2 or min(int(s) for s in size) < 1:
            raise ValueError(f"size must be (H, W) with H, W >= 1, got {size}")
        h, w = (int(s) for s in size)
    if center is None:
        if size is None:
            raise ValueError("center=None (the image centre) needs size=(H, W)")
        center = (w / 2, h / 2)
    center = _column(center, n, "center", 2)
    if (hflip is not None or vflip is not None) and size is None:
        raise ValueError("hflip / vflip need size=(H, W)")
    if not torch.compiler.is_compiling() and not bool((scale > 0).all()):
        raise ValueError("scale must be > 0")

    # torchvision's _get_inverse_affine_matrix, vectorised.
    rot = angle * (math.pi / 180)
    sx, sy = shear[:, 0] * (math.pi / 180), shear[:, 1] * (math.pi / 180)
    a = torch.cos(rot - sy) / torch.cos(sy)
    b = -(a * torch.tan(sx) + torch.sin(rot))
    c = torch.sin(rot - sy) / torch.cos(sy)
    d = torch.cos(rot) - c * torch.tan(sx)
    A = torch.stack([torch.stack([d, -b], -1), torch.stack([-c, a], -1)], -2) / scale[:, None, None]

    c_idx = center - 0.5  # index coordinates of the centre
    offset = -c_idx - translate
    lin = A
    if hflip is not None or vflip is not None:
        sign = torch.ones(n, 2, dtype=torch.float64)
        shift = torch.zeros(n, 2, dtype=torch.float64)
        for axis, flip, extent in ((0, hflip, w), (1, vflip, h)):
            if flip is not None:
                f = torch.as_tensor(flip, dtype=torch.bool).cpu().expand(n)
                sign[:, axis] = torch.where(f, -1.0, 1.0)
                shift[:, axis] = torch.where(f, float(extent - 1), 0.0)
        lin = A * sign[:, None, :]
        offset = offset + shift
    t = (A @ offset[:, :, None])[:, :, 0] + c_idx
    return torch.cat([lin, t[:, :, None]], dim=2)


__all__ = ["affine_matrices"]
