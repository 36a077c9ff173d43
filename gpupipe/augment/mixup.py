"""MixUp: the batch blended with itself rolled by one, labels alike."""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from gpupipe import _C
from gpupipe.augment import _kernels
from gpupipe.augment._batch_transform import BatchTransformBase
from gpupipe.augment._keyed_params import GeneratorLike


class MixUp(BatchTransformBase):
    """torchvision v2's ``MixUp`` on ``(images, labels)``, keyed per batch.

    As ``torchvision.transforms.v2.MixUp``: one ``lam ~ Beta(alpha, alpha)`` per batch; sample ``i``
    is paired with sample ``i - 1`` (``roll(1, 0)``); ``images = lam * images + (1 - lam) *
    images.roll(1, 0)`` and the same for the one-hot labels (torchvision's expressions, so equal to
    torchvision's output bit for bit for the same ``lam``).

    Args:
        alpha: the Beta distribution's parameter (> 0).
        num_classes: number of classes, for one-hot encoding class indices; may be None when labels
            come as probabilities ``[N, C]``.
        generator: ``torch.Generator`` or int seed seeding the unkeyed draws.
        inplace: write the blend over ``images`` (as ``RandomErasing(inplace=True)``): the same
            values, without a batch-sized output to allocate, for a pipeline that owns the batch
            (the Loader's ``batch_transform``).

    Shapes:
        images: floating ``[N, C, H, W]``, any device. labels: int64 class indices ``[N]`` or
        probabilities ``[N, num_classes]``. Returns ``(images, soft labels)``: the images' shape and
        dtype, float ``[N, num_classes]`` on the labels' device.

    Parameters (``sample_params``, ``last_params``): ``n`` (batch size), ``lam`` (float64 scalars).
    With a ``seed`` they are a pure function of (seed, epoch, the batch's first index), drawn from
    ``numpy.random.default_rng(keyed.derive_seed(seed, epoch, first, keyed.stream_of("MixUp")))``.

    Example:
        >>> import torch
        >>> from gpupipe.augment import MixUp
        >>> mix = MixUp(alpha=0.2, num_classes=10)
        >>> images, labels = torch.rand(4, 3, 8, 8), torch.tensor([0, 3, 3, 9])
        >>> p = mix.sample_params(4, seed=0, epoch=2, indices=[40, 41, 42, 43])
        >>> out, soft = mix(images, labels, params=p)
        >>> soft.shape, torch.allclose(soft.sum(1), torch.ones(4))
        (torch.Size([4, 10]), True)
    """

    _stream_name = "MixUp"
    _param_keys = ("lam",)

    def __init__(self, alpha: float = 1.0, num_classes: Optional[int] = None, generator: GeneratorLike = None,
                 inplace: bool = False):
        super().__init__(alpha, num_classes, generator)
        self.inplace = bool(inplace)

    def _params_from_rng(self, rng: np.random.Generator) -> dict:
        return {"lam": torch.tensor(rng.beta(self.alpha, self.alpha), dtype=torch.float64)}

    def _transform(self, images: torch.Tensor, labels: torch.Tensor, params: dict):
        if not images.is_floating_point():
            raise TypeError(f"images must be floating point for MixUp (a blend of two images), got {images.dtype}")
        lam = float(params["lam"])
        if images.device.type == "cpu" and images.dtype == torch.float32 and images.is_contiguous() and \
                not torch.compiler.is_compiling() and _kernels.untracked(images):
            # one pass, no temporaries, the same rounding as the expressions below (csrc/augment/mix_cpu.cpp)
            if self.inplace:
                _C.mixup_rolled_inplace(_kernels.buffer(images), lam, _kernels.num_threads())
                torch.autograd.graph.increment_version(images)  # as torch's in-place ops (a saved x is refused)
                return images, self.mix_labels(labels, lam)
            mixed = torch.empty_like(images)
            _C.mixup_rolled(_kernels.buffer(images), _kernels.buffer(mixed), lam, _kernels.num_threads())
        elif self.inplace:  # the rolled copy is taken first; q + p == p + q exactly: torchvision's values
            rolled = images.roll(1, 0).mul_(1.0 - lam)
            mixed = images.mul_(lam).add_(rolled)
        else:
            mixed = images.roll(1, 0).mul_(1.0 - lam).add_(images.mul(lam))
        return mixed, self.mix_labels(labels, lam)

    def extra_repr(self) -> str:
        return f"alpha={self.alpha}, num_classes={self.num_classes}" + (", inplace=True" if self.inplace else "")
