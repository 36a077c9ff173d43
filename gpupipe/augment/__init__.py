"""Batched augmentation on the device: one ``nn.Module`` for flip, rotation, color jitter,
grayscale and normalisation, with per-sample parameters.

- :class:`BatchAugment` (``engine="fused"`` or ``"kornia"``)
- :func:`color_matrices`: the per-sample 3x4 color matrices of the fused engine
- :func:`warp_affine` / :func:`affine_matrices`: per-sample affine resampling with torchvision's semantics
- :func:`fused_color_affine`: the single-pass kernel (CUDA on CUDA tensors, C++ on CPU)

torchvision's recipes, batched and keyed to (seed, epoch, sample index):

- :class:`TrivialAugmentWide`, :class:`RandAugment`, :class:`AutoAugment`: per-sample policies on uint8
- :class:`RandomErasing`: a box per sample on the normalised batch
- :class:`MixUp`, :class:`CutMix`, :class:`RandomChoice`: batch transforms, ``(images, labels)`` -> soft labels
- :class:`Compose`: a keyed chain (the Loader's ``augment``)
"""

from gpupipe.augment.affine_matrix import affine_matrices
from gpupipe.augment.batch_augment import IMAGENET_MEAN, IMAGENET_STD, BatchAugment
from gpupipe.augment.color_matrix import color_matrices
from gpupipe.augment.fused import cuda_kernel_available, fused_color_affine
from gpupipe.augment.warp_affine import warp_affine

from gpupipe.augment.auto_augment import AutoAugment
from gpupipe.augment.compose import Compose
from gpupipe.augment.cutmix import CutMix
from gpupipe.augment.mixup import MixUp
from gpupipe.augment.rand_augment import RandAugment
from gpupipe.augment.random_choice import RandomChoice
from gpupipe.augment.random_erasing import RandomErasing
from gpupipe.augment.trivial_augment_wide import TrivialAugmentWide

__all__ = ["warp_affine", "affine_matrices", "BatchAugment", "IMAGENET_MEAN", "IMAGENET_STD", "color_matrices", "fused_color_affine", "cuda_kernel_available",
           "TrivialAugmentWide", "RandAugment", "AutoAugment", "RandomErasing", "MixUp", "CutMix", "RandomChoice",
           "Compose"]
