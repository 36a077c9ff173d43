"""Batched augmentation on the device, with torchvision's semantics and per-sample parameters.

- :class:`BatchAugment`: rotation / affine, flips, color jitter, grayscale and normalisation as one
  module, run in one pass per output pixel (``engine="fused"``) or op by op (``engine="kornia"``)
- :func:`warp_affine` / :func:`affine_matrices`: per-sample affine resampling with torchvision's
  sampling and fill semantics
- :func:`linear_color_params`: the per-sample matrices of ``color="linear"``
"""

from gpupipe.augment.affine_matrix import affine_matrices
from gpupipe.augment.batch_augment import IMAGENET_MEAN, IMAGENET_STD, BatchAugment
from gpupipe.augment.color_linear import linear_color_params
from gpupipe.augment.fused import cuda_kernel_available
from gpupipe.augment.warp_affine import warp_affine

__all__ = ["BatchAugment", "IMAGENET_MEAN", "IMAGENET_STD", "warp_affine", "affine_matrices", "linear_color_params",
           "cuda_kernel_available"]
