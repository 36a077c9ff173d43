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

from gpupipe import _C

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
        float64 ``[N, 2, 3]`` on the CPU: ``src = M[:, :, :2] @ (x, y) + M[:, :, 2]``; not
        differentiable (parameters, computed in native code; gradients do not flow through them).

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
    h = w = 0
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

    args = tuple(t.detach() for t in (angle, translate, scale, shear, center, *_flips(hflip, vflip, n)))
    if torch.compiler.is_compiling() or any(type(t) is not torch.Tensor for t in args):
        return torch.ops.gpupipe.affine_matrices(*args, h, w)  # the same native code, opaque to a trace
    return _inverse_affine(args, h, w)


def _inverse_affine(args, height: int, width: int) -> torch.Tensor:
    """The maps in native code (csrc/augment/augment_params.h): a few microseconds for a batch, where the
    same as small torch ops cost more than the CUDA kernel's whole batch; libm's cos / sin / tan,
    the functions torchvision's own ``math`` calls use."""
    return torch.from_numpy(_C.inverse_affine(*(t.numpy() for t in args), height, width))


def _flips(hflip, vflip, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    none = torch.zeros(n, dtype=torch.bool)
    return tuple(none if f is None else torch.as_tensor(f, dtype=torch.bool).cpu().expand(n) for f in (hflip, vflip))


@torch.library.custom_op("gpupipe::affine_matrices", mutates_args=())
def _affine_op(angle: torch.Tensor, translate: torch.Tensor, scale: torch.Tensor, shear: torch.Tensor,
               center: torch.Tensor, hflip: torch.Tensor, vflip: torch.Tensor, height: int, width: int) -> torch.Tensor:
    return _inverse_affine((angle, translate, scale, shear, center, hflip, vflip), height, width)


@_affine_op.register_fake
def _(angle, translate, scale, shear, center, hflip, vflip, height, width):
    return angle.new_empty((angle.shape[0], 2, 3))


__all__ = ["affine_matrices"]
