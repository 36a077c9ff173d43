"""The fused engine's color model: every color op is affine in RGB, so the chain folds into one
per-sample 3x4 matrix ``[A | t]`` with ``out = A @ rgb + t``.

Order: brightness -> contrast -> saturation -> hue -> grayscale -> normalise, on values in [0, 1]:

- brightness ``b``:  ``x * b``
- contrast ``c``:    ``c * x + (1 - c) * m``, ``m`` the mean gray level (ITU-R 601 luma) of the
  image at that point (computed from the input's channel means, since the ops before are affine)
- saturation ``s``:  ``s * x + (1 - s) * gray(x)``
- hue ``h`` (turns): a rotation of the chroma plane of YIQ by ``-2*pi*h`` (Kornia/torchvision rotate
  hue in HSV; YIQ is the linear approximation)
- grayscale:         ``gray(x)`` in all three channels
- normalise:         ``(x - mean) / std``

Differences from Kornia/torchvision, by design: no clamping to [0, 1] between ops (they clamp after
brightness, contrast and saturation), hue in YIQ instead of HSV, and a fixed op order (torchvision
draws a random order per call; Kornia's ``ColorJitter(order=(0, 1, 2, 3))`` is the same fixed order).
Where no clamp is active and hue is 0, the engines agree to float rounding (tested).
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import torch

LUMA = (0.299, 0.587, 0.114)
_YIQ = ((0.299, 0.587, 0.114), (0.595716, -0.274453, -0.321263), (0.211456, -0.522591, 0.311135))


def _yiq(dtype, device):
    t = torch.tensor(_YIQ, dtype=dtype, device=device)
    return t, torch.linalg.inv(t)


def color_matrices(
    params: dict,
    mean: Sequence[float],
    std: Sequence[float],
    *,
    input_scale: float = 1.0,
    channel_means: Optional[torch.Tensor] = None,
    dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """Per-sample ``[N, 3, 4]`` matrices of the fused engine.

    Args:
        params: ``(N,)`` tensors ``brightness, contrast, saturation, hue, grayscale`` (as sampled by
            :meth:`BatchAugment.sample_params`).
        mean, std: normalisation, per channel, on the [0, 1] scale.
        input_scale: multiplies the input first (``1/255`` for uint8 input).
        channel_means: ``[N, 3]`` per-image channel means of the input on its own scale; needed
            when any contrast factor differs from 1.
        dtype: computation dtype (float64: the matrices are tiny).
    """
    b = params["brightness"].to(dtype)
    n = b.shape[0]
    device = b.device
    eye = torch.eye(3, dtype=dtype, device=device).expand(n, 3, 3)
    w = torch.tensor(LUMA, dtype=dtype, device=device)
    ones_w = torch.ones(3, 1, dtype=dtype, device=device) @ w[None, :]  # 1 w^T: gray in all channels

    A = eye * (b * input_scale)[:, None, None]
    t = torch.zeros(n, 3, dtype=dtype, device=device)

    c = params["contrast"].to(dtype)
    if channel_means is not None:
        # mean gray after the ops so far: w . (A m + t)
        gray_mean = ((A @ channel_means.to(dtype)[:, :, None])[:, :, 0] + t) @ w
    elif bool((c != 1).any()):
        raise ValueError("channel_means are needed when a contrast factor differs from 1")
    else:
        gray_mean = torch.zeros(n, dtype=dtype, device=device)
    A = A * c[:, None, None]
    t = t * c[:, None] + ((1 - c) * gray_mean)[:, None]

    s = params["saturation"].to(dtype)[:, None, None]
    S = eye * s + (1 - s) * ones_w
    A, t = S @ A, (S @ t[:, :, None])[:, :, 0]

    theta = -2 * math.pi * params["hue"].to(dtype)
    T, T_inv = _yiq(dtype, device)
    R = torch.zeros(n, 3, 3, dtype=dtype, device=device)
    R[:, 0, 0] = 1
    R[:, 1, 1] = torch.cos(theta)
    R[:, 1, 2] = -torch.sin(theta)
    R[:, 2, 1] = torch.sin(theta)
    R[:, 2, 2] = torch.cos(theta)
    H = T_inv @ R @ T
    A, t = H @ A, (H @ t[:, :, None])[:, :, 0]

    g = params["grayscale"].to(torch.bool)[:, None, None]
    G = torch.where(g, ones_w.expand(n, 3, 3), eye)
    A, t = G @ A, (G @ t[:, :, None])[:, :, 0]

    inv_std = 1 / torch.tensor(std, dtype=dtype, device=device)
    mu = torch.tensor(mean, dtype=dtype, device=device)
    A = A * inv_std[None, :, None]
    t = (t - mu) * inv_std
    return torch.cat([A, t[:, :, None]], dim=2)
