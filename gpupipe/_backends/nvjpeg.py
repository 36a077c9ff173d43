"""The nvjpeg backend: torchvision.io.decode_jpeg(device="cuda") (nvJPEG, batched full decode),
then crop and antialiased resize on the GPU, for nodes without DALI."""

from __future__ import annotations

import warnings
from typing import Optional, Sequence

import numpy as np
import torch

from gpupipe._backends import gpu_fallback
from gpupipe.decode_types import BatchStatus, DecodeOptions, HeaderInfos

name = "nvjpeg"


def unavailable_reason(device: Optional[torch.device] = None) -> Optional[str]:
    if not torch.cuda.is_available():
        return "the nvjpeg backend needs a CUDA device (torch.cuda.is_available() is False)"
    try:
        from torchvision.io import decode_jpeg  # noqa: F401
    except Exception as e:
        return f"torchvision is not importable ({type(e).__name__}): pip install torchvision"
    return None


def decode(buffers: Sequence, boxes: np.ndarray, out: torch.Tensor, options: DecodeOptions,
           infos: HeaderInfos) -> BatchStatus:
    reason = unavailable_reason(out.device)
    if reason:
        raise RuntimeError(reason)
    from torchvision.io import ImageReadMode, decode_jpeg
    from torchvision.transforms.v2 import functional as F

    read_mode = ImageReadMode.RGB if options.mode == "rgb" else ImageReadMode.GRAY

    def gpu_decode(idx: np.ndarray) -> None:
        tensors = [torch.frombuffer(bytearray(buffers[i]), dtype=torch.uint8) for i in idx]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            decoded = decode_jpeg(tensors, mode=read_mode, device=out.device)
        for k, i in enumerate(idx):
            t, l, h, w = (int(v) for v in boxes[i])
            crop = decoded[k][:, t:t + h, l:l + w]
            if options.resize:
                crop = F.resize(crop, list(out.shape[1:3]), antialias=True)
            out[i] = crop.permute(1, 2, 0)

    return gpu_fallback.decode_with_fallback("nvJPEG", gpu_decode, buffers, boxes, out, options, infos)
