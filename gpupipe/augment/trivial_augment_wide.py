"""TrivialAugmentWide: one random op at a random magnitude per sample, on a uint8 batch."""

from __future__ import annotations

from typing import Any, Optional

import torch

from gpupipe.augment._auto_augment_ops import (TRIVIAL_AUGMENT_WIDE_SPACE, PolicyBase, check_bins, negate_draw,
                                               uniform_index)
from gpupipe.augment._keyed_params import GeneratorLike


class TrivialAugmentWide(PolicyBase):
    """torchvision's ``TrivialAugmentWide``, batched: each sample gets its own op and magnitude.

    Per sample, as ``torchvision.transforms.v2.TrivialAugmentWide`` draws it: one op uniformly among
    Identity, ShearX, ShearY, TranslateX, TranslateY, Rotate, Brightness, Color, Contrast, Sharpness,
    Posterize, Solarize, AutoContrast, Equalize; a magnitude bin uniformly in
    ``[0, num_magnitude_bins)``; for signed ops a sign (negative with probability 1/2). The op is
    applied exactly as torchvision applies it to that sample (see ``docs/semantics.md``, "Policies",
    for the per-op tolerance): integer ops are bit-exact, the float blends round as torchvision's float
    path, geometric ops are one warp.

    Args:
        num_magnitude_bins: number of magnitude bins (>= 2), 31 as torchvision.
        interpolation: ``"nearest"`` (torchvision's default) or ``"bilinear"``, for the geometric ops.
        fill: value of pixels outside the image after a geometric op: None (torchvision's default,
            zeros), a number or 3 numbers on the 0..255 scale.
        generator: ``torch.Generator`` or int seed for the unkeyed draws (``sample_params`` without
            ``seed``); None uses torch's global generator.

    Shapes:
        input: uint8 ``[N, 3, H, W]`` (any memory format; channels-last is gpupipe's decode output),
        on the CPU. Output: uint8 ``[N, 3, H, W]``, same memory format and device.

    Parameters (``sample_params``, ``last_params``): ``op`` int64 ``[N]`` (index into the op list
    above), ``bin`` int64 ``[N]``, ``negate`` bool ``[N]``. Keyed draws use the stream
    ``keyed.stream_of("TrivialAugmentWide")``.

    Example:
        >>> import torch
        >>> from gpupipe.augment import TrivialAugmentWide
        >>> aug = TrivialAugmentWide()
        >>> x = torch.randint(0, 256, (4, 3, 37, 45), dtype=torch.uint8)
        >>> p = aug.sample_params(4, seed=0, epoch=1, indices=[10, 11, 12, 13])
        >>> sorted(p)
        ['bin', 'negate', 'op']
        >>> y = aug(x, params=p)
        >>> y.shape, y.dtype
        (torch.Size([4, 3, 37, 45]), torch.uint8)
        >>> torch.equal(aug(x, params=aug.last_params), y)
        True
    """

    _space = TRIVIAL_AUGMENT_WIDE_SPACE
    _stream_name = "TrivialAugmentWide"
    samples_independent = True  #: each sample's ops from its own row (gpupipe.keyed.samples_independent)
    _draws = 3

    def __init__(self, num_magnitude_bins: int = 31, interpolation: Any = "nearest", fill: Any = None,
                 generator: GeneratorLike = None):
        self._num_bins = check_bins(num_magnitude_bins)
        super().__init__(interpolation, fill, generator)

    @property
    def num_magnitude_bins(self) -> int:
        return self._num_bins

    def forward(self, x: torch.Tensor, params: Optional[dict] = None) -> torch.Tensor:
        """Augments a batch: uint8 ``[N, 3, H, W]`` -> uint8 ``[N, 3, H, W]``, same device and memory format.

        ``params=None`` draws new parameters in ``train()`` mode and applies none in ``eval()``
        mode (x is returned as is); ``params=p`` (e.g. ``last_params``) replays exactly.
        """
        return self._forward((x,), params)  # this class's own code object (see PolicyBase)

    def _params_from_uniforms(self, u: torch.Tensor) -> dict:
        return {"op": uniform_index(u[:, 0], len(self._space)), "bin": uniform_index(u[:, 1], self._num_bins),
                "negate": negate_draw(u[:, 2])}

    def _param_spec(self):
        return {"op": (), "bin": (), "negate": ()}, {"op": torch.int64, "bin": torch.int64, "negate": torch.bool}

    def _slot_rows(self, params: dict) -> list:
        self._check_range(params, "op", len(self._space))
        self._check_range(params, "bin", self._num_bins)
        return [self._row(params["op"], params["bin"], params["negate"])]

    def extra_repr(self) -> str:
        return f"num_magnitude_bins={self._num_bins}, " + super().extra_repr()
