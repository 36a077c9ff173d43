"""The nvjpeg backend: torchvision.io.decode_jpeg(device="cuda") (nvJPEG, batched full decode),
then crop and antialiased resize on the GPU, for nodes without DALI."""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from gpupipe._backends import hybrid


def unavailable_reason() -> Optional[str]:
    if not torch.cuda.is_available():
        return "the nvjpeg backend needs a CUDA device (torch.cuda.is_available() is False)"
    try:
        from torchvision.io import decode_jpeg  # noqa: F401
    except Exception as e:
        return f"torchvision is not importable ({type(e).__name__}): pip install torchvision"
    return None


def decode_batch_nhwc(datas, boxes: np.ndarray, out_nhwc: torch.Tensor, *, resize, mode, strict, dct_scaling,
                      num_threads, device: torch.device):
    reason = unavailable_reason()
    if reason:
        raise RuntimeError(reason)
    import warnings

    from torchvision.io import ImageReadMode, decode_jpeg
    from torchvision.transforms.v2 import functional as F

    read_mode = ImageReadMode.RGB if mode == "rgb" else ImageReadMode.GRAY

    def decode(idx):
        tensors = [torch.frombuffer(bytearray(datas[i]), dtype=torch.uint8) for i in idx]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            decoded = decode_jpeg(tensors, mode=read_mode, device=device)
        for k, i in enumerate(idx):
            t, l, h, w = (int(v) for v in boxes[i])
            crop = decoded[k][:, t:t + h, l:l + w]
            if resize:
                crop = F.resize(crop, list(out_nhwc.shape[1:3]), antialias=True)
            out_nhwc[i] = crop.permute(1, 2, 0)

    return hybrid.decode_with_fallback("nvJPEG", decode, datas, boxes, out_nhwc, resize=resize, mode=mode,
                                       strict=strict, dct_scaling=dct_scaling, num_threads=num_threads)
