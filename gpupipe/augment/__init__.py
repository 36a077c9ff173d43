"""Batched augmentation on the device: one ``nn.Module`` for flip, rotation, color jitter,
grayscale and normalisation, with per-sample parameters.

- :class:`BatchAugment` (``engine="fused"`` or ``"kornia"``)
- :func:`color_matrices`: the per-sample 3x4 color matrices of the fused engine
- :func:`warp_affine` / :func:`affine_matrices`: per-sample affine resampling with torchvision's semantics
- :func:`fused_color_affine`: the single-pass kernel (CUDA on CUDA tensors, C++ on CPU)
"""

from gpupipe.augment.affine_matrix import affine_matrices
from gpupipe.augment.batch_augment import IMAGENET_MEAN, IMAGENET_STD, BatchAugment
from gpupipe.augment.color_matrix import color_matrices
from gpupipe.augment.fused import cuda_kernel_available, fused_color_affine
from gpupipe.augment.warp_affine import warp_affine

__all__ = ["warp_affine", "affine_matrices", "BatchAugment", "IMAGENET_MEAN", "IMAGENET_STD", "color_matrices", "fused_color_affine", "cuda_kernel_available"]
