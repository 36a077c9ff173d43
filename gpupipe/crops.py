"""Crop samplers: boxes for a whole batch, computed from header dimensions before decoding.

Every sampler maps ``(heights, widths, seed, epoch, indices)`` to int64 boxes ``[N, 4]`` =
(top, left, height, width). A box depends only on (seed, epoch, sample index), never on the batch
it falls in, the thread count or the order of decoding: the random draws come from a counter-based
hash of those three numbers (:func:`gpupipe.keyed.uniforms`, stream 0), vectorised over the batch
(no per-sample Python; RandomResizedCrop's tries in native code).

The parameter semantics and distributions follow torchvision's transforms (the same statistics,
not the same random stream).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from gpupipe import _C, keyed
from gpupipe._args import Size, flag, is_int, positive_pair, size_pair
from gpupipe.decode_types import DecodeOptions
from gpupipe.keyed import key_int, uniforms


def _dims(heights: Any, widths: Any) -> tuple[np.ndarray, np.ndarray]:
    h = np.asarray(heights, dtype=np.int64).reshape(-1)
    w = np.asarray(widths, dtype=np.int64).reshape(-1)
    if h.shape != w.shape:
        raise ValueError("heights and widths must have the same length")
    if (h < 1).any() or (w < 1).any():
        raise ValueError(f"image sizes must be positive; sample(s) {np.flatnonzero((h < 1) | (w < 1)).tolist()} are not")
    return h, w


def _randint(u: np.ndarray, high: np.ndarray) -> np.ndarray:
    """Uniform integers in [0, high) from uniforms u."""
    return np.minimum((u * high).astype(np.int64), high - 1)


class CropSampler:
    """Base class. ``size`` is the output (height, width); ``resize`` says whether boxes are
    resized to it (pass ``size=sampler.size`` to the decoder) or already have that size;
    ``window`` whether a resized box is a window of the whole resized image (pass ``window=``)."""

    size: tuple[int, int]
    resize: bool
    window: bool = False
    dct_scaling: bool = True  #: with resize: decode boxes >= 2x the size already downscaled (opt out: False)
    pads: bool = False  #: an image smaller than the crop is zero-padded (:meth:`placement`), not refused

    def boxes(self, heights: Any, widths: Any, *, seed: int = 0, epoch: int = 0, indices: Any = None) -> np.ndarray:
        raise NotImplementedError

    def decode_options(self, **options: Any) -> DecodeOptions:
        """The decode options of this sampler's crops (output size, resize, window, DCT scaling),
        with the caller's ``options`` (threads, backend, device, ...)."""
        return DecodeOptions(size=self.size, resize=self.resize, window=self.window, dct_scaling=self.dct_scaling,
                             **options)

    def plan(self, heights: Any, widths: Any, *, seed: int = 0, epoch: int = 0,
             indices: Any = None) -> tuple[np.ndarray, dict]:
        """Boxes for a batch in which some sizes may be unknown (-1: unreadable) or too small for a
        crop that does not resize. Returns (boxes [N, 4], {index: message} for the images too small);
        those and the unknown ones get a placeholder box, never decoded."""
        h, w = (np.asarray(a, dtype=np.int64).reshape(-1) for a in (heights, widths))
        known = (h > 0) & (w > 0)
        small = {}
        if not self.resize and not self.pads:
            th, tw = self.size
            for i in np.flatnonzero(known & ((h < th) | (w < tw))):
                small[int(i)] = (f"image {w[i]}x{h[i]} (width x height) is smaller than the {tw}x{th} crop of "
                                 f"{type(self).__name__}")
            known &= (h >= th) & (w >= tw)
        safe_h = np.where(known, h, max(self.size[0], 1))
        safe_w = np.where(known, w, max(self.size[1], 1))
        return self.boxes(safe_h, safe_w, seed=seed, epoch=epoch, indices=self._indices(indices, len(h))), small

    def placement(self, heights: Any, widths: Any) -> np.ndarray:
        """int64 ``[N, 2]``: where each box sits in its output slot (top, left), the rest of the
        slot zeros; (0, 0) where the box fills it (every sampler's box but a padding one's)."""
        return np.zeros((len(_dims(heights, widths)[0]), 2), np.int64)

    def _indices(self, indices: Any, n: int) -> np.ndarray:
        if indices is None:
            return np.arange(n, dtype=np.int64)
        idx = keyed.key_indices(indices).reshape(-1)  # (a float index would be truncated to another sample's)
        if idx.shape[0] != n:
            raise ValueError(f"indices has {idx.shape[0]} entries for {n} images")
        return idx

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({fields})"


class RandomResizedCrop(CropSampler):
    """torchvision's ``RandomResizedCrop.get_params``: up to 10 tries of an area fraction in
    ``scale`` and a log-uniform aspect ratio in ``ratio``, else a center crop with the ratio
    clamped. The box is then resized to ``size``."""

    resize = True

    def __init__(self, size: Size, scale: Sequence[float] = (0.08, 1.0), ratio: Sequence[float] = (3 / 4, 4 / 3)):
        self.size = size_pair(size)
        self.scale = positive_pair(scale, "scale")
        self.ratio = positive_pair(ratio, "ratio")

    def boxes(self, heights, widths, *, seed=0, epoch=0, indices=None):
        H, W = _dims(heights, widths)
        # In native code (csrc/common/crop_sampling.h), operation for operation as the numpy
        # definition tests/test_crops.py keeps: up to 10 tries of 4 keyed draws each (stream 0).
        return _C.random_resized_crop_boxes(key_int(seed, "seed"), key_int(epoch, "epoch"), H, W,
                                            self._indices(indices, len(H)), *self.native_range())

    def native_range(self) -> tuple:
        """(scale0, scale1, log ratio0, log ratio1, ratio0, ratio1): the native sampler's arguments."""
        return (self.scale[0], self.scale[1], math.log(self.ratio[0]), math.log(self.ratio[1]), self.ratio[0],
                self.ratio[1])


class RandomCrop(CropSampler):
    """torchvision's ``RandomCrop(size)`` (no padding): a uniformly placed ``size`` window."""

    resize = False

    def __init__(self, size: Size):
        self.size = size_pair(size)

    def boxes(self, heights, widths, *, seed=0, epoch=0, indices=None):
        H, W = _dims(heights, widths)
        th, tw = self.size
        _check_fits(H, W, th, tw, type(self).__name__)
        u = uniforms(seed, epoch, self._indices(indices, H.shape[0]), 2)
        top = _randint(u[:, 0], H - th + 1)
        left = _randint(u[:, 1], W - tw + 1)
        return np.stack([top, left, np.full_like(H, th), np.full_like(W, tw)], axis=1)


class CenterCrop(CropSampler):
    """torchvision's ``CenterCrop(size)``: offsets ``round((H - h) / 2)``. An image smaller than
    the crop in a dimension is zero-padded as torchvision pads it: its whole extent is the box in
    that dimension, placed at ``(h - H) // 2`` in the output (:meth:`placement`)."""

    resize = False
    pads = True

    def __init__(self, size: Size):
        self.size = size_pair(size)

    def boxes(self, heights, widths, *, seed=0, epoch=0, indices=None):
        H, W = _dims(heights, widths)
        th, tw = self.size
        top = np.where(H < th, 0, np.round((H - th) / 2.0)).astype(np.int64)
        left = np.where(W < tw, 0, np.round((W - tw) / 2.0)).astype(np.int64)
        return np.stack([top, left, np.minimum(H, th), np.minimum(W, tw)], axis=1)

    def placement(self, heights, widths):
        H, W = _dims(heights, widths)
        th, tw = self.size
        return np.stack([np.where(H < th, (th - H) // 2, 0), np.where(W < tw, (tw - W) // 2, 0)], axis=1)


class Resize(CropSampler):
    """The whole image resized to ``size`` = (height, width); an int means a square.

    Unlike torchvision's ``Resize(int)`` (shorter side, variable output), a batch needs one output
    size, so an int is a square here; for torchvision's ``Resize(256)`` + ``CenterCrop(224)`` use
    :class:`ResizeCenterCrop`.
    """

    resize = True

    def __init__(self, size: Size):
        self.size = size_pair(size)

    def boxes(self, heights, widths, *, seed=0, epoch=0, indices=None):
        H, W = _dims(heights, widths)
        zeros = np.zeros_like(H)
        return np.stack([zeros, zeros, H, W], axis=1)


class ResizeCenterCrop(CropSampler):
    """torchvision's evaluation transform ``Resize(resize_size)`` then ``CenterCrop(crop_size)``, as
    one decode: the window of the resized image that the crop keeps, mapped back to the original
    image (a fractional box), decoded with ROI + DCT scaling and resampled to ``crop_size`` from
    its exact edges, the filter reading around the window as the full resize does (``window``).

    Args:
        crop_size: the output (an int: square), as ``CenterCrop(crop_size)``.
        resize_size: ``Resize``'s size: an int resizes the shorter side to it (the longer to
            ``int(resize_size * long / short)``), a pair is the exact (height, width).
        dct_scaling: ``False`` (default): the exact resample (see below).
            ``True``: windows >= 2x the output are decoded already downscaled by libjpeg, faster,
            measured mean difference 0.76 levels on 16 photos (1.42 on the worst;
            ``benchmarks/dct_tolerance.py``).

    With ``dct_scaling=False`` the output equals torchvision's PIL path (``Resize`` with Pillow's
    (>= 13) antialiased BILINEAR, then ``CenterCrop``): identical on every size tested (58), and
    within 1 level by construction (a filter tap's weight could round the other way where the box's
    fractional edge differs from the resize's own geometry in the last bits).

    Example:
        >>> from gpupipe import crops
        >>> crops.ResizeCenterCrop(224, 256).boxes([533], [800]).round(2).tolist()
        [[33.31, 166.67, 466.38, 466.67]]
    """

    resize = True
    window = True

    def __init__(self, crop_size: Size = 224, resize_size: Size = 256, *, dct_scaling: bool = False):
        self.size = size_pair(crop_size, "crop_size")
        self.dct_scaling = flag(dct_scaling, "dct_scaling")
        if is_int(resize_size):
            if resize_size < 1:
                raise ValueError(f"resize_size must be positive, got {resize_size}")
            self.resize_size: Any = int(resize_size)
            # the shorter side becomes resize_size, on any image (a square one: both sides)
            too_large = max(self.size) > self.resize_size
        else:
            self.resize_size = size_pair(resize_size, "resize_size")
            too_large = self.size[0] > self.resize_size[0] or self.size[1] > self.resize_size[1]
        if too_large:
            raise ValueError(f"crop_size {self.size} is larger than the resized image ({self.resize_size}) on some "
                             "images: torchvision would pad; resize to at least the crop size")

    def resized_sizes(self, heights: Any, widths: Any) -> tuple[np.ndarray, np.ndarray]:
        """torchvision's ``Resize`` output (height, width) for each image."""
        H, W = _dims(heights, widths)
        if not isinstance(self.resize_size, int):
            return np.full_like(H, self.resize_size[0]), np.full_like(W, self.resize_size[1])
        short, long = np.minimum(H, W), np.maximum(H, W)
        new_long = (self.resize_size * long.astype(np.float64) / short).astype(np.int64)  # int(): truncation
        wide = W > H  # torchvision: w <= h means the width is the short side
        return np.where(wide, self.resize_size, new_long), np.where(wide, new_long, self.resize_size)

    def boxes(self, heights, widths, *, seed=0, epoch=0, indices=None):
        H, W = _dims(heights, widths)
        rh, rw = self.resized_sizes(H, W)
        th, tw = self.size
        top = np.round((rh - th) / 2.0)  # CenterCrop's anchor in the resized image
        left = np.round((rw - tw) / 2.0)
        sy, sx = H / rh, W / rw  # resized pixel -> original pixels
        # Each edge computed once, the far one kept inside the image (a product may round 1 ulp past
        # it), the size taken as their difference: the box never leaves the image.
        y0, x0 = top * sy, left * sx
        y1, x1 = np.minimum((top + th) * sy, H), np.minimum((left + tw) * sx, W)
        return np.stack([y0, x0, y1 - y0, x1 - x0], axis=1).astype(np.float64)


def _check_fits(H: np.ndarray, W: np.ndarray, th: int, tw: int, name: str) -> None:
    small = np.flatnonzero((H < th) | (W < tw))
    if small.size:
        i = int(small[0])
        raise ValueError(
            f"{name}({th}, {tw}) is larger than image {i} of the batch ({W[i]}x{H[i]} width x "
            f"height); {small.size} image(s) too small. Resize first or use RandomResizedCrop."
        )


__all__ = ["CropSampler", "RandomResizedCrop", "RandomCrop", "CenterCrop", "Resize", "ResizeCenterCrop", "uniforms"]
