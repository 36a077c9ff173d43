"""RandAugment: ``num_ops`` random ops at one fixed magnitude per sample, on a uint8 batch."""

from __future__ import annotations

from typing import Any, Optional

import torch

from gpupipe._args import is_python_int
from gpupipe.augment._auto_augment_ops import RAND_AUGMENT_SPACE, PolicyBase, check_bins, negate_draw, uniform_index
from gpupipe.augment._keyed_params import GeneratorLike


class RandAugment(PolicyBase):
    """torchvision's ``RandAugment``, batched: each sample draws its own ops and signs.

    Per sample, as ``torchvision.transforms.v2.RandAugment`` draws it: ``num_ops`` times, an op
    uniformly among Identity, ShearX, ShearY, TranslateX, TranslateY, Rotate, Brightness, Color,
    Contrast, Sharpness, Posterize, Solarize, AutoContrast, Equalize, at magnitude bin ``magnitude``
    of ``num_magnitude_bins`` (translations scale with the image: 150/331 of its width or height at
    the last bin), with a random sign for signed ops; the ops are applied one after the other, each
    exactly as torchvision applies it (tolerances per op in ``docs/semantics.md``, "Policies").

    Args:
        num_ops: ops applied in sequence per sample (>= 0).
        magnitude: the magnitude bin, in ``[0, num_magnitude_bins)``.
        num_magnitude_bins: number of bins (>= 2).
        interpolation: ``"nearest"`` (default) or ``"bilinear"`` for the geometric ops.
        fill: None (zeros, torchvision's default), a number or 3 numbers on the 0..255 scale.
        generator: ``torch.Generator`` or int seed for the unkeyed draws.

    Shapes:
        input: uint8 ``[N, 3, H, W]``, any memory format, on the CPU. Output: uint8, same shape,
        memory format and device.

    Parameters: ``op`` int64 ``[N, num_ops]`` (indices into the op list above), ``negate`` bool
    ``[N, num_ops]``. Keyed stream: ``keyed.stream_of("RandAugment")``.

    Example:
        >>> import torch
        >>> from gpupipe.augment import RandAugment
        >>> aug = RandAugment(num_ops=2, magnitude=9)
        >>> x = torch.randint(0, 256, (4, 3, 37, 45), dtype=torch.uint8)
        >>> y = aug(x, params=aug.sample_params(4, seed=0))
        >>> aug.last_params["op"].shape, y.dtype
        (torch.Size([4, 2]), torch.uint8)
    """

    _space = RAND_AUGMENT_SPACE
    _stream_name = "RandAugment"
    samples_independent = True  #: each sample's ops from its own row (gpupipe.keyed.samples_independent)

    def __init__(self, num_ops: int = 2, magnitude: int = 9, num_magnitude_bins: int = 31, interpolation: Any = "nearest",
                 fill: Any = None, generator: GeneratorLike = None):
        super().__init__(interpolation, fill, generator)
        self._num_bins = check_bins(num_magnitude_bins)
        self.num_ops = num_ops
        self.magnitude = magnitude

    @property
    def num_magnitude_bins(self) -> int:
        return self._num_bins

    # num_ops and magnitude are checked whenever they are set (a magnitude schedule sets them between
    # epochs): a bin past the last would read the next op's row of the magnitude table
    @property
    def num_ops(self) -> int:
        return self._num_ops

    @num_ops.setter
    def num_ops(self, num_ops: int) -> None:
        if not is_python_int(num_ops) or num_ops < 0:
            raise ValueError(f"num_ops must be a non-negative int, got {num_ops!r}")
        self._num_ops = num_ops
        self._draws = 2 * num_ops

    @property
    def magnitude(self) -> int:
        return self._magnitude

    @magnitude.setter
    def magnitude(self, magnitude: int) -> None:
        if not is_python_int(magnitude) or not 0 <= magnitude < self._num_bins:
            raise ValueError(f"magnitude must be an int bin in [0, num_magnitude_bins={self._num_bins}), "
                             f"got {magnitude!r}")
        self._magnitude = magnitude

    def forward(self, x: torch.Tensor, params: Optional[dict] = None) -> torch.Tensor:
        """Augments a batch: uint8 ``[N, 3, H, W]`` -> uint8 ``[N, 3, H, W]``, same device and memory format.

        ``params=None`` draws new parameters in ``train()`` mode and applies none in ``eval()``
        mode (x is returned as is); ``params=p`` (e.g. ``last_params``) replays exactly.
        """
        return self._forward((x,), params)  # this class's own code object (see PolicyBase)

    def _params_from_uniforms(self, u: torch.Tensor) -> dict:
        return {"op": uniform_index(u[:, 0::2], len(self._space)), "negate": negate_draw(u[:, 1::2])}

    def _param_spec(self):
        shape = (self.num_ops,)
        return {"op": shape, "negate": shape}, {"op": torch.int64, "negate": torch.bool}

    def _slot_rows(self, params: dict) -> list:
        self._check_range(params, "op", len(self._space))
        op, negate = params["op"], params["negate"]
        bins = torch.full((op.shape[0],), self.magnitude, dtype=torch.int64)
        return [self._row(op[:, k], bins, negate[:, k]) for k in range(self.num_ops)]

    def extra_repr(self) -> str:
        return (f"num_ops={self.num_ops}, magnitude={self.magnitude}, num_magnitude_bins={self._num_bins}, "
                + super().extra_repr())
