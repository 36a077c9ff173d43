"""The nvjpeg backend: nvJPEG through nvImageCodec's engines (``gpupipe._backends.nvimgcodec``):
the GPU's hardware JPEG decoder where it has one (A100, H100, B200), nvJPEG's CUDA decoder for what
the hardware declines (progressive files) or where there is none, whole images, then one kernel
crops and resizes the batch into its slots. What both decline goes to the CPU core inside the batch.

Without nvImageCodec (``pip install 'torch-gpupipe[gpu]'``), or where its decoders do not start,
it falls back to torchvision.io.decode_jpeg(device="cuda") (nvJPEG's batched full decode), then
crop and antialiased resize with torch ops, as before.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import torch

from gpupipe._backends import gpu_fallback, nvimgcodec
from gpupipe._quiet_warnings import quiet as quiet_warnings
from gpupipe.decode_types import BatchStatus, DecodeOptions, HeaderInfos

name = "nvjpeg"


def engines(device: torch.device) -> list:
    """nvImageCodec's engines for ``device`` in the order a sample tries them: the hardware decoder
    where the GPU has one, then the CUDA decoder. Empty where nvImageCodec is absent or its CUDA
    decoder does not start (the reason: ``gpupipe.backends_available()["nvimgcodec"]``)."""
    if engine_failure(device) is not None:
        return []
    return ([nvimgcodec.engine("hardware", device)] if nvimgcodec.hardware_decoder_available(device) else []) + \
        [nvimgcodec.engine("cuda", device)]


def unavailable_reason(device: Optional[torch.device] = None) -> Optional[str]:
    if not torch.cuda.is_available():
        return "the nvjpeg backend needs a CUDA device (torch.cuda.is_available() is False)"
    if nvimgcodec.unavailable_reason(device) is None:
        return None
    try:
        from torchvision.io import decode_jpeg  # noqa: F401
    except Exception as e:
        return (f"the nvjpeg backend needs nvImageCodec ({nvimgcodec.INSTALL}) or torchvision "
                f"(not importable: {type(e).__name__}): pip install torchvision")
    return None


def decode(buffers: Sequence, boxes: np.ndarray, out: torch.Tensor, options: DecodeOptions,
           infos: HeaderInfos) -> BatchStatus:
    reason = unavailable_reason(out.device)
    if reason:
        raise RuntimeError(reason)
    chain = engines(out.device)
    if chain:
        return _decode_on_engines(chain, buffers, boxes, out, options, infos)
    try:
        import torchvision.io  # noqa: F401
    except Exception as e:  # nvImageCodec is there but its CUDA decoder did not start
        raise RuntimeError(f"the nvjpeg backend cannot decode: {engine_failure(out.device)}; torchvision, its "
                           f"fallback, is not importable ({type(e).__name__})") from e
    return _decode_with_torchvision(buffers, boxes, out, options, infos)


def engine_failure(device: torch.device) -> Optional[str]:
    """Why nvImageCodec's CUDA decoder cannot run on ``device``, or None where it does."""
    try:
        nvimgcodec.engine("cuda", device)  # raises nvimgcodec.unavailable_reason first, then a start failure
    except RuntimeError as e:
        return str(e)
    return None


def _decode_on_engines(chain: list, buffers: Sequence, boxes: np.ndarray, out: torch.Tensor, options: DecodeOptions,
                       infos: HeaderInfos) -> BatchStatus:
    sizes = np.stack([infos.column("height"), infos.column("width")], axis=1)

    def gpu_decode(idx: np.ndarray, datas: Sequence) -> gpu_fallback.GpuOutcome:
        routes = np.zeros(len(idx), dtype=np.int64)
        pending = np.arange(len(idx))  # positions in idx not decoded yet
        reasons: dict = {}
        for eng in chain:
            rows = idx[pending]
            declined = eng.decode([datas[i] for i in rows], boxes[rows], out, rows, options, sizes=sizes[rows])
            taken = np.ones(len(pending), dtype=bool)
            taken[list(declined)] = False
            routes[pending[taken]] = eng.route
            reasons.update({int(rows[k]): f"{eng.name} ({why})" for k, why in declined.items()})
            pending = pending[~taken]
            if not len(pending):
                break
        return gpu_fallback.GpuOutcome(routes, {int(idx[p]): reasons[int(idx[p])] for p in pending})

    # The engines decline what they cannot decode and raise only for a device error: that fails the batch.
    return gpu_fallback.decode_with_fallback("nvJPEG", gpu_decode, buffers, boxes, out, options, infos,
                                             device_errors="raise")


def _decode_with_torchvision(buffers: Sequence, boxes: np.ndarray, out: torch.Tensor, options: DecodeOptions,
                             infos: HeaderInfos) -> BatchStatus:
    from torchvision.io import ImageReadMode, decode_jpeg
    from torchvision.transforms.v2 import functional as F

    read_mode = ImageReadMode.RGB if options.mode == "rgb" else ImageReadMode.GRAY

    def gpu_decode(idx: np.ndarray, datas: Sequence) -> None:
        tensors = [torch.frombuffer(bytearray(datas[i]), dtype=torch.uint8) for i in idx]
        with quiet_warnings("torchvision.io", DeprecationWarning):  # its deprecation of decode_jpeg, this thread only
            decoded = decode_jpeg(tensors, mode=read_mode, device=out.device)
        for k, i in enumerate(idx):
            t, l, h, w = (int(v) for v in boxes[i])
            crop = decoded[k][:, t:t + h, l:l + w]
            if options.resize:
                crop = F.resize(crop, list(out.shape[1:3]), antialias=True)
            out[i] = crop.permute(1, 2, 0)

    return gpu_fallback.decode_with_fallback("nvJPEG", gpu_decode, buffers, boxes, out, options, infos)
