"""CutMix: a box of each image replaced by the same box of the previous image, labels by area."""

from __future__ import annotations

import math
from typing import Optional

import numpy as np
import torch

from gpupipe.augment._batch_transform import BatchTransformBase, _check_unit
from gpupipe.augment._keyed_params import GeneratorLike


class CutMix(BatchTransformBase):
    """torchvision v2's ``CutMix`` on ``(images, labels)``, keyed per batch.

    As ``torchvision.transforms.v2.CutMix``: one ``lam ~ Beta(alpha, alpha)`` and one box centre
    ``(r_x, r_y)`` (uniform pixel) per batch; the box has half-sizes ``int(0.5 * sqrt(1 - lam) * W)``
    and ``int(0.5 * sqrt(1 - lam) * H)``, clipped to the image; inside it, sample ``i`` takes the
    pixels of sample ``i - 1`` (``roll(1, 0)``), and the labels mix with ``lam_adjusted = 1 - box
    area / image area``.

    Args:
        alpha: the Beta distribution's parameter (> 0).
        num_classes: number of classes, for one-hot encoding class indices; may be None when labels
            come as probabilities ``[N, C]``.
        generator: ``torch.Generator`` or int seed seeding the unkeyed draws.
        inplace: paste the box over ``images`` (as ``RandomErasing(inplace=True)``): the same
            values, without a batch-sized copy, for a pipeline that owns the batch.

    Shapes:
        images: ``[N, C, H, W]`` of any dtype, any device. labels: int64 ``[N]`` or probabilities
        ``[N, num_classes]``. Returns ``(images, soft labels)``: the images' shape and dtype, float
        ``[N, num_classes]``.

    Parameters: ``n`` (batch size), ``lam`` (float64 scalars), ``center`` (float64 ``[2]``: uniforms
    giving ``r_x = floor(center[0] * W)``, ``r_y = floor(center[1] * H)``; see :meth:`box`). Keyed as
    :class:`MixUp`, on stream ``keyed.stream_of("CutMix")``.

    Example:
        >>> import torch
        >>> from gpupipe.augment import CutMix
        >>> cut = CutMix(alpha=1.0, num_classes=10)
        >>> images, labels = torch.rand(4, 3, 16, 16), torch.tensor([0, 3, 3, 9])
        >>> out, soft = cut(images, labels, params=cut.sample_params(4, seed=0))
        >>> (x1, y1, x2, y2), lam = cut.box(cut.last_params, 16, 16)
        >>> torch.equal(out[1:, :, y1:y2, x1:x2], images[:-1, :, y1:y2, x1:x2])
        True
    """

    _stream_name = "CutMix"
    _param_keys = ("lam", "center")

    def __init__(self, alpha: float = 1.0, num_classes: Optional[int] = None, generator: GeneratorLike = None,
                 inplace: bool = False):
        super().__init__(alpha, num_classes, generator)
        self.inplace = bool(inplace)

    def _params_from_rng(self, rng: np.random.Generator) -> dict:
        lam = rng.beta(self.alpha, self.alpha)  # first: the draws' order is part of the keyed stream
        return {"lam": torch.tensor(lam, dtype=torch.float64), "center": torch.from_numpy(rng.random(2))}

    def _check_values(self, params: dict) -> None:
        super()._check_values(params)
        _check_unit(params["center"], "center", 2)

    @staticmethod
    def box(params: dict, height: int, width: int) -> tuple[tuple[int, int, int, int], float]:
        """``((x1, y1, x2, y2), lam_adjusted)`` for images of ``height x width``, as torchvision's
        ``CutMix.make_params``."""
        lam = float(params["lam"])
        cx, cy = (float(v) for v in params["center"])
        r_x, r_y = min(int(cx * width), width - 1), min(int(cy * height), height - 1)
        r = 0.5 * math.sqrt(1.0 - lam)
        r_w_half, r_h_half = int(r * width), int(r * height)
        x1, y1 = max(r_x - r_w_half, 0), max(r_y - r_h_half, 0)
        x2, y2 = min(r_x + r_w_half, width), min(r_y + r_h_half, height)
        return (x1, y1, x2, y2), float(1.0 - (x2 - x1) * (y2 - y1) / (width * height))

    def _transform(self, images: torch.Tensor, labels: torch.Tensor, params: dict):
        (x1, y1, x2, y2), lam = self.box(params, images.shape[-2], images.shape[-1])
        output = images if self.inplace else images.clone()
        output[..., y1:y2, x1:x2] = images[..., y1:y2, x1:x2].roll(1, 0)  # roll only the box (a copy first)
        return output, self.mix_labels(labels, lam)

    def extra_repr(self) -> str:
        return f"alpha={self.alpha}, num_classes={self.num_classes}" + (", inplace=True" if self.inplace else "")
