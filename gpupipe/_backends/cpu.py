"""The CPU backend: the C++ libjpeg-turbo core, decoding a batch on its thread pool with the GIL
released once. The reference every other backend is tested against."""

from __future__ import annotations

import warnings
from typing import Any, Optional, Sequence

import numpy as np
import torch

from gpupipe import _C
from gpupipe.decode_types import MODES, BatchStatus, DecodeOptions, HeaderInfos, Route
from gpupipe._buffers import as_buffer
from gpupipe._errors import JpegWarning
from gpupipe.limits import check_output_size

name = "cpu"
_CPU = int(Route.CPU)


def unavailable_reason(device: Optional[torch.device] = None) -> Optional[str]:
    if device is not None and device.type == "cuda" and not torch.cuda.is_available():
        return "CPU decode; CUDA outputs need a CUDA device"
    return None


def decode(buffers: Sequence, boxes: np.ndarray, out: torch.Tensor, options: DecodeOptions,
           infos: Optional[HeaderInfos] = None) -> BatchStatus:
    """Decodes every box into its slot of ``out`` (uint8 NHWC, contiguous; on the CPU, or on CUDA
    through a pinned host buffer and one non-blocking copy)."""
    n, h, w, _ = out.shape
    host = out if out.device.type == "cpu" else torch.empty(out.shape, dtype=torch.uint8, pin_memory=True)
    result = _C.decode_batch_into(buffers, boxes, host.data_ptr(), host.numel(), h, w, options.resize,
                                  MODES[options.mode], options.strict, options.dct_scaling, options.num_threads,
                                  options.window)
    if host is not out:
        out.copy_(host, non_blocking=True)
    errors, warns, busy = result
    status = _status(n, errors, warns)
    status.cpu_busy_seconds = busy
    return status


def start(buffers: Sequence, boxes: np.ndarray, out: torch.Tensor, options: DecodeOptions) -> "_C.PendingDecode":
    """:func:`decode` into a CPU ``out``, started on the pool: returns at once; :func:`wait` gives
    its status. Started batches queue on the pool, so its threads go from one batch to the next
    without idling (the Loader starts batch k + 1 before it waits for batch k). The pending decode
    holds the buffers and ``out`` until it ends."""
    n, h, w, _ = out.shape
    return _C.decode_batch_start(buffers, boxes, out, out.data_ptr(), out.numel(), h, w, options.resize,
                                 MODES[options.mode], options.strict, options.dct_scaling, options.num_threads,
                                 options.window)


def wait(pending: "_C.PendingDecode", n: int) -> BatchStatus:
    status = _status(n, *pending.wait())
    status.cpu_busy_seconds = pending.busy_seconds()
    return status


def _status(n: int, errors: list, warns: list) -> BatchStatus:
    status = BatchStatus(np.zeros(n, np.int64), np.full(n, _CPU, np.int64))
    for i, kind, message in errors:
        status.fail(i, kind, message)
    status.warnings.update({int(i): m for i, m in warns})
    return status


def decode_one_hwc(data: Any, box: Sequence, out_hw: tuple[int, int], *, resize: bool, mode: str, strict: bool,
                   dct_scaling: bool, window: bool = False, what: str = "data", stacklevel: int = 3) -> torch.Tensor:
    """Decodes one box into a new uint8 [H, W, C] tensor (the single op's path: no batch)."""
    # An empty or negative size allocates nothing: the decoder then reports the box, with the image size.
    oh, ow = (max(v, 0) for v in out_hw)
    check_output_size(oh, ow)
    out = torch.empty((oh, ow, 3 if mode == "rgb" else 1), dtype=torch.uint8)
    top, left, height, width = box
    warning, _, _ = _C.decode_into(as_buffer(data, what), out.data_ptr(), out.numel(), top, left, height, width,
                                   oh, ow, resize, MODES[mode], strict, dct_scaling, window=window)
    if warning is not None:
        warnings.warn(f"{what}: {warning}", JpegWarning, stacklevel=stacklevel)
    return out
