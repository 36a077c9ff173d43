"""``BatchAugment(engine="kornia")``: the same chain, op by op on float tensors with Kornia's warp and
color functions (the slow reference, and the route for devices without a gpupipe kernel).

- geometry: ``kornia.geometry.transform.warp_affine`` with the forward map of the sample's matrix
  (pixel centres at integers), ``align_corners=False`` as torchvision's ``grid_sample``, zero
  padding; a fill is applied as torchvision applies it (a warped mask of ones: nearest writes the
  fill where the mask is 0, bilinear blends ``(v - fill) * mask + fill``). ``align_corners=True``
  would collapse an axis of one pixel (every coordinate maps onto that pixel, none falls outside);
  a Kornia that normalises for ``align_corners=True`` only (its ``normalize_homography`` without
  ``align_corners``, before Kornia's PR #3945) gets ``align_corners=True`` with 1-pixel axes
  zero-padded to 2 (the padding reads as outside, as zero padding does);
- color: ``adjust_brightness_accumulative``, ``adjust_contrast_with_mean_subtraction``,
  ``adjust_saturation_with_gray_subtraction``, ``adjust_hue`` (HSV), each clamped to [0, 1], in the
  sample's order: round k applies, to every sample, the op ``order[:, k]`` names (all four are
  computed and one is selected per sample, so no data-dependent Python runs);
- ``rgb_to_grayscale`` with torchvision's weights (0.2989, 0.587, 0.114), then normalisation.

All of it in float32 whatever ``torch.autocast`` says (a bfloat16 warp moves pixels by up to ~110
levels); the output dtype is the module's ``out_dtype``.

Kornia's contrast and saturation use its own luma (0.299, 0.587, 0.114) and its HSV adds an epsilon,
so the engines differ slightly (tested against torchvision with the fused engine's tolerance).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import math

import torch
import torch.nn.functional as F

from gpupipe._errors import import_extra
from gpupipe.augment.affine_matrix import affine_matrices


@functools.lru_cache(maxsize=None)
def _honours_align_corners(normalize_homography) -> bool:
    """Whether Kornia's warp normalises for ``align_corners=False`` too (Kornia PR #3945)."""
    return "align_corners" in inspect.signature(normalize_homography).parameters


def kornia_augment(module, x: torch.Tensor, params: dict) -> torch.Tensor:
    kornia = import_extra("kornia", "kornia", "BatchAugment(engine='kornia')")
    # the reference computes in float32: autocast would run Kornia's warp in bfloat16 / float16
    off = (torch.autocast(x.device.type, enabled=False) if torch.amp.is_autocast_available(x.device.type)
           else contextlib.nullcontext())
    with off:
        return _augment(kornia, module, x, params)


def _augment(kornia, module, x: torch.Tensor, params: dict) -> torch.Tensor:
    from kornia.enhance import (adjust_brightness_accumulative, adjust_contrast_with_mean_subtraction, adjust_hue,
                                adjust_saturation_with_gray_subtraction)

    n, _, h, w = x.shape
    dev = x.device
    p = {k: v.to(dev) for k, v in params.items()}
    xf = x.float().mul(1.0 / 255)
    shift = torch.round(params["translate"].double().cpu() * torch.tensor([w, h], dtype=torch.float64))
    inv = affine_matrices(-params["angle"].double().cpu(), shift, params["scale"].double().cpu(),
                          params["shear"].double().cpu(), None, params["hflip"].cpu(), params["vflip"].cpu(), size=(h, w))
    full = torch.cat([inv, torch.tensor([0.0, 0.0, 1.0], dtype=torch.float64).expand(n, 1, 3)], 1)
    forward = torch.linalg.inv(full)[:, :2].to(device=dev, dtype=torch.float32)
    mode = module.interpolation

    if _honours_align_corners(kornia.geometry.conversions.normalize_homography):
        def warp(t):
            return kornia.geometry.transform.warp_affine(t, forward, (h, w), mode=mode, padding_mode="zeros",
                                                         align_corners=False)
    else:
        hp, wp = max(h, 2), max(w, 2)

        def warp(t):
            t = F.pad(t, (0, wp - w, 0, hp - h))
            return kornia.geometry.transform.warp_affine(t, forward, (hp, wp), mode=mode, padding_mode="zeros",
                                                         align_corners=True)[:, :, :h, :w]

    xf = warp(xf)
    if module.fill is not None:
        mask = warp(torch.ones(n, 1, h, w, device=dev))
        fill = torch.tensor(module.fill, device=dev)[None, :, None, None] / 255
        xf = torch.where(mask < 0.5, fill, xf) if mode == "nearest" else (xf - fill) * mask + fill

    f = {k: p[k].float() for k in ("brightness", "contrast", "saturation", "hue")}
    ops = (lambda t: adjust_brightness_accumulative(t, f["brightness"]).clamp(0, 1),
           lambda t: adjust_contrast_with_mean_subtraction(t, f["contrast"]).clamp(0, 1),
           lambda t: adjust_saturation_with_gray_subtraction(t, f["saturation"]).clamp(0, 1),
           lambda t: adjust_hue(t, f["hue"] * 2 * math.pi).clamp(0, 1))
    order = p["order"]
    for k in range(4):
        candidates = torch.stack([op(xf) for op in ops])  # [4, N, 3, H, W]
        xf = candidates[order[:, k], torch.arange(n, device=dev)]
    gray = kornia.color.rgb_to_grayscale(xf, rgb_weights=torch.tensor([0.2989, 0.587, 0.114], device=dev)).expand_as(xf)
    xf = torch.where(p["grayscale"][:, None, None, None], gray, xf)
    mean = torch.tensor(module.mean, device=dev)[None, :, None, None]
    std = torch.tensor(module.std, device=dev)[None, :, None, None]
    return ((xf - mean) / std).to(module.out_dtype).contiguous(memory_format=module.out_memory_format)
