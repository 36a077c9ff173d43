"""Batched augmentation on the device, with torchvision's semantics and per-sample parameters.

- :class:`BatchAugment`: rotation / affine, flips, color jitter, grayscale and normalisation as one
  module, run in one pass per output pixel (``engine="fused"``) or op by op (``engine="kornia"``)
- :func:`warp_affine` / :func:`affine_matrices`: per-sample affine resampling with torchvision's
  sampling and fill semantics
- :func:`linear_color_params`: the per-sample matrices of ``color="linear"``

torchvision's recipes, batched and keyed to (seed, epoch, sample index):

- :class:`TrivialAugmentWide`, :class:`RandAugment`, :class:`AutoAugment`: per-sample policies on uint8
- :class:`RandomErasing`: a box per sample on the normalised batch
- :class:`MixUp`, :class:`CutMix`, :class:`RandomChoice`: batch transforms, ``(images, labels)`` -> soft labels
- :class:`Compose`: a keyed chain (the Loader's ``augment``)
"""

from gpupipe.augment.affine_matrix import affine_matrices
from gpupipe.augment.batch_augment import IMAGENET_MEAN, IMAGENET_STD, BatchAugment
from gpupipe.augment.color_linear import linear_color_params
from gpupipe.augment.fused import cuda_kernel_available
from gpupipe.augment.warp_affine import warp_affine

from gpupipe.augment.auto_augment import AutoAugment
from gpupipe.augment.compose import Compose
from gpupipe.augment.cutmix import CutMix
from gpupipe.augment.mixup import MixUp
from gpupipe.augment.rand_augment import RandAugment
from gpupipe.augment.random_choice import RandomChoice
from gpupipe.augment.random_erasing import RandomErasing
from gpupipe.augment.trivial_augment_wide import TrivialAugmentWide

__all__ = ["BatchAugment", "IMAGENET_MEAN", "IMAGENET_STD", "warp_affine", "affine_matrices", "linear_color_params",
           "cuda_kernel_available", "TrivialAugmentWide", "RandAugment", "AutoAugment", "RandomErasing", "MixUp",
           "CutMix", "RandomChoice", "Compose"]
