"""``color="linear"``: the color chain as one per-sample affine map of RGB (DALI-like; opt-in).

Every op is taken as affine in RGB, so the chain folds into ``out = A @ rgb + t + mean * u`` per
sample (``rgb`` the warped pixel on the 0..255 scale, normalisation folded in), in the fixed order
brightness -> contrast -> saturation -> hue -> grayscale -> normalise, on values in [0, 1]:

- brightness ``b``:  ``x * b``
- contrast ``c``:    ``c * x + (1 - c) * m``, ``m`` the warped image's mean BT.601 luma times ``b``
  (the ops before contrast are linear); the engine's first pass measures that mean
- saturation ``s``:  ``s * x + (1 - s) * gray(x)``, ``gray`` BT.601 (0.299, 0.587, 0.114)
- hue ``h`` (turns): a rotation of the chroma plane of YIQ by ``-2*pi*h``
- grayscale:         ``gray(x)`` in all three channels
- normalise:         ``(x - mean) / std``

How it differs from ``color="torchvision"`` (the default, torchvision's definitions): no clamping
to [0, 1] between ops, YIQ rotation instead of HSV hue, BT.601 luma instead of torchvision's
(0.2989, 0.587, 0.114), one fixed op order instead of ColorJitter's per-sample order (``order`` is
ignored). The measured difference is in docs/semantics.md.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

LUMA = (0.299, 0.587, 0.114)
_YIQ = ((0.299, 0.587, 0.114), (0.595716, -0.274453, -0.321263), (0.211456, -0.522591, 0.311135))


def linear_color_params(params: dict, mean: Sequence[float], std: Sequence[float]) -> torch.Tensor:
    """float64 ``[N, 16]``: ``A`` (3x3, row-major), ``t`` (3), ``u`` (3) and whether the mean is
    needed (1 where contrast != 1), for ``out = A @ rgb255 + t + mean * u``.

    Args:
        params: ``(N,)`` CPU tensors ``brightness, contrast, saturation, hue, grayscale``.
        mean, std: normalisation per channel on the [0, 1] scale.
    """
    f64 = torch.float64
    b = params["brightness"].to(f64)
    n = b.shape[0]
    eye = torch.eye(3, dtype=f64).expand(n, 3, 3)
    ones_w = torch.ones(3, 1, dtype=f64) @ torch.tensor(LUMA, dtype=f64)[None, :]  # gray in all channels
    c = params["contrast"].to(f64)
    s = params["saturation"].to(f64)[:, None, None]
    S = eye * s + (1 - s) * ones_w
    theta = -2 * math.pi * params["hue"].to(f64)
    T = torch.tensor(_YIQ, dtype=f64)
    R = torch.zeros(n, 3, 3, dtype=f64)
    R[:, 0, 0] = 1
    R[:, 1, 1] = torch.cos(theta)
    R[:, 1, 2] = -torch.sin(theta)
    R[:, 2, 1] = torch.sin(theta)
    R[:, 2, 2] = torch.cos(theta)
    H = torch.linalg.inv(T) @ R @ T
    G = torch.where(params["grayscale"].to(torch.bool)[:, None, None], ones_w.expand(n, 3, 3), eye)
    D = torch.diag(1 / torch.tensor(std, dtype=f64))
    after = D @ G @ H @ S  # the ops after contrast, normalisation's scale included
    A = after * (c * b / 255)[:, None, None]
    u = (after @ torch.ones(n, 3, 1, dtype=f64))[:, :, 0] * ((1 - c) * b)[:, None]  # (1 - c) * (b * mean) * 1
    t = (-(D @ torch.tensor(mean, dtype=f64))).expand(n, 3)
    return torch.cat([A.reshape(n, 9), t, u, (c != 1).to(f64)[:, None]], dim=1)


__all__ = ["linear_color_params", "LUMA"]
