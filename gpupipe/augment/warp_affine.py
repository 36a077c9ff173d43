"""warp_affine: per-sample affine resampling of a uint8 batch in one pass (rotation, translation,
scale, shear, flips), with torchvision's sampling, rounding and fill semantics.

The per-pixel math is ``csrc/augment/augment_pixel.h``, shared by the CUDA kernel and its host build.
"""

from __future__ import annotations

from typing import Optional, Sequence, Union

import torch

from gpupipe import _C
from gpupipe._args import INTERPOLATIONS, parse_interpolation, warp_fill
from gpupipe.augment import _kernels


def _check(x: torch.Tensor, matrix: torch.Tensor) -> None:
    if not isinstance(x, torch.Tensor) or not isinstance(matrix, torch.Tensor):
        raise TypeError("x and matrix must be tensors")
    if x.dtype != torch.uint8:
        raise TypeError(f"x must be uint8, got {x.dtype}")
    if x.dim() != 4 or x.shape[1] not in (1, 3):
        raise ValueError(f"x must be [N, 3, H, W] or [N, 1, H, W] (grayscale), got shape {tuple(x.shape)}")
    if matrix.shape != (x.shape[0], 2, 3):
        raise ValueError(f"matrix must be [{x.shape[0]}, 2, 3] (one 2x3 inverse map per sample), got {tuple(matrix.shape)}")
    if not matrix.is_floating_point():
        raise TypeError(f"matrix must be a float tensor, got {matrix.dtype}")


def _empty_out(x: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    fmt = torch.channels_last if x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous() else torch.contiguous_format
    return torch.empty(x.shape, dtype=out_dtype, device=x.device, memory_format=fmt)


@torch.library.custom_op("gpupipe::warp_affine", mutates_args=())
def _warp_op(x: torch.Tensor, matrix: torch.Tensor, interpolation: int, fill: Optional[list[float]],
             out_dtype: torch.dtype) -> torch.Tensor:
    raise NotImplementedError  # per-device kernels below


@_warp_op.register_kernel("cpu")
def _warp_cpu(x, matrix, interpolation, fill, out_dtype):
    out = _empty_out(x, out_dtype)
    m = matrix.contiguous()
    _C.warp_affine(_kernels.buffer(x), _kernels.buffer(m), _kernels.buffer(out), _kernels.ELEM_TYPES[out_dtype],
                            interpolation, fill, _kernels.num_threads())
    return out


@_warp_op.register_kernel("cuda")
def _(x, matrix, interpolation, fill, out_dtype):
    cuda = _kernels.cuda_module()
    out = _empty_out(x, out_dtype)
    m = matrix.contiguous()
    with torch.cuda.device(x.device):
        cuda.warp_affine(_kernels.buffer(x), _kernels.buffer(m), _kernels.buffer(out), _kernels.ELEM_TYPES[out_dtype],
                         interpolation, fill, _kernels.current_stream(x.device))
    return out


@_warp_op.register_fake
def _(x, matrix, interpolation, fill, out_dtype):
    return _empty_out(x, out_dtype)


def warp_affine(
    x: torch.Tensor,
    matrix: torch.Tensor,
    *,
    interpolation: str = "nearest",
    fill: Union[None, float, Sequence[float]] = None,
    out_dtype: torch.dtype = torch.uint8,
) -> torch.Tensor:
    """Resamples each image of a batch through its own inverse affine map, in one pass.

    ``out[i, :, y, x]`` samples ``x[i]`` at ``matrix[i] @ (x, y, 1)`` (pixel centres at integer
    coordinates, ``align_corners=False``), as torchvision's ``affine`` / ``rotate`` sample through
    ``grid_sample``: ``"nearest"`` reads the pixel at the coordinate rounded half to even,
    ``"bilinear"`` weighs the 4 neighbours. Build ``matrix`` with :func:`affine_matrices` to get
    ``torchvision.transforms.v2.functional.affine`` (and flips) exactly.

    Pixels that map outside the image: ``fill=None`` counts them as 0 (zero padding, torchvision's
    ``fill=None``); a fill value writes it there (nearest) or blends it in as torchvision does
    (bilinear: ``(v - fill) * mask + fill``, ``mask`` the in-image share of the weights).

    Args:
        x: uint8 ``[N, 3, H, W]``, any strides (channels-last is the decoder's output), CPU or CUDA;
            or ``[N, 1, H, W]`` (grayscale: the 3-channel kernel reads its one channel three times).
        matrix: float ``[N, 2, 3]``, output pixel -> input coordinate (used as float32).
        interpolation: ``"nearest"`` (torchvision's default for rotate / affine) or ``"bilinear"``.
        fill: None, a number or 3 numbers (per channel) in [0, 255] (one value for a 1-channel x:
            3 different ones are refused; torchvision refuses any 3).
        out_dtype: ``torch.uint8`` (rounded half to even, as torchvision rounds a uint8 rotate) or
            ``torch.float32`` (the same values before rounding, on the 0..255 scale).

    Returns:
        ``out_dtype`` ``[N, C, H, W]`` (x's channels) on x's device, channels-last when x is, else
        contiguous.

    Example:
        >>> import torch
        >>> from gpupipe.augment import affine_matrices, warp_affine
        >>> x = torch.arange(2 * 3 * 4 * 4, dtype=torch.uint8).reshape(2, 3, 4, 4)
        >>> m = affine_matrices(torch.tensor([0.0, 180.0]), (0, 0), 1.0, (0, 0), size=(4, 4))
        >>> y = warp_affine(x, m)
        >>> torch.equal(y[0], x[0]), torch.equal(y[1], x[1].flip(-1, -2))
        (True, True)
    """
    _check(x, matrix)
    interpolation = parse_interpolation(interpolation)
    if out_dtype not in (torch.uint8, torch.float32):
        raise TypeError(f"out_dtype must be torch.uint8 or torch.float32, got {out_dtype}")
    fill = warp_fill(fill)
    if x.device.type not in ("cpu", "cuda"):
        raise ValueError(f"x must be on a CPU or CUDA device, got {x.device}")
    m = matrix.to(device=x.device, dtype=torch.float32)
    if x.shape[1] == 1:
        return _warp_gray(x, m, INTERPOLATIONS[interpolation], fill, out_dtype)
    if _kernels.eager_cpu(x):
        return _warp_cpu(x, m, INTERPOLATIONS[interpolation], fill, out_dtype)
    return torch.ops.gpupipe.warp_affine(x, m, INTERPOLATIONS[interpolation], fill, out_dtype)


def _warp_gray(x: torch.Tensor, m: torch.Tensor, interpolation: int, fill: Optional[list],
               out_dtype: torch.dtype) -> torch.Tensor:
    """A 1-channel batch through the 3-channel kernel, the first output channel kept
    (:func:`_kernels.as_three_channels`). Each channel is sampled alone, so the result is the
    1-channel warp exactly."""
    _kernels.check_gray_fill(fill)
    three = _kernels.as_three_channels(x)
    if _kernels.eager_cpu(x):
        out = _warp_cpu(three, m, interpolation, fill, out_dtype)
    else:
        out = torch.ops.gpupipe.warp_affine(three, m, interpolation, fill, out_dtype)
    return out[:, :1].clone()


__all__ = ["warp_affine", "INTERPOLATIONS"]
