"""EXIF orientation for crops: boxes in the displayed frame (what ``PIL.ImageOps.exif_transpose``
shows) mapped to the stored frame, and decoded crops turned into the displayed frame.

Orientation ``o`` (EXIF 1-8) and what ``exif_transpose`` does to the stored image ``S`` (H x W):

| o | displayed image D | D[y, x] |
|---|---|---|
| 1 | S | S[y, x] |
| 2 | mirrored left-right | S[y, W-1-x] |
| 3 | rotated 180 | S[H-1-y, W-1-x] |
| 4 | mirrored top-bottom | S[H-1-y, x] |
| 5 | transposed | S[x, y] |
| 6 | rotated 90 clockwise | S[H-1-x, y] |
| 7 | transversed | S[H-1-x, W-1-y] |
| 8 | rotated 90 counter-clockwise | S[x, W-1-y] |

A crop of D is the same transform of the matching crop of S, so only the box moves.
"""

from __future__ import annotations

import numpy as np
import torch

TRANSPOSED = (5, 6, 7, 8)  # the displayed frame swaps height and width


def display_sizes(heights, widths, orientations) -> tuple[np.ndarray, np.ndarray]:
    """Displayed (height, width) of stored images."""
    h, w, o = (np.asarray(a, dtype=np.int64) for a in (heights, widths, orientations))
    swap = np.isin(o, TRANSPOSED)
    return np.where(swap, w, h), np.where(swap, h, w)


def stored_boxes(boxes, orientations, heights, widths) -> np.ndarray:
    """[N, 4] boxes in the stored frame (int64, or float64 for fractional boxes) for boxes (top,
    left, h, w) in the displayed frame; heights, widths are the stored image sizes."""
    b = np.asarray(boxes)
    b = b.astype(np.float64 if b.dtype.kind == "f" else np.int64)  # fractional boxes stay fractional
    t, l, h, w = b.T
    o = np.asarray(orientations, dtype=np.int64)
    H, W = np.asarray(heights).astype(b.dtype), np.asarray(widths).astype(b.dtype)
    cases = {
        1: (t, l, h, w),
        2: (t, W - l - w, h, w),
        3: (H - t - h, W - l - w, h, w),
        4: (H - t - h, l, h, w),
        5: (l, t, w, h),
        6: (H - l - w, t, w, h),
        7: (H - l - w, W - t - h, w, h),
        8: (l, W - t - h, w, h),
    }
    out = b.copy()
    for k, v in cases.items():
        m = o == k
        if m.any():
            out[m] = np.stack(v, axis=1)[m]
    return out


def to_display(stored_nhwc: torch.Tensor, orientation: int) -> torch.Tensor:
    """The displayed-frame view of stored-frame crops [N, h, w, C] of one orientation."""
    x = stored_nhwc
    if orientation == 2:
        return x.flip(2)
    if orientation == 3:
        return x.flip(1).flip(2)
    if orientation == 4:
        return x.flip(1)
    if orientation == 5:
        return x.transpose(1, 2)
    if orientation == 6:
        return x.transpose(1, 2).flip(2)
    if orientation == 7:
        return x.flip(1).flip(2).transpose(1, 2)
    if orientation == 8:
        return x.transpose(1, 2).flip(1)
    return x
