"""The CPU backend: the C++ libjpeg-turbo core. The reference every other backend is tested against."""

from __future__ import annotations

import warnings
from typing import Any, Sequence

import numpy as np
import torch

from gpupipe import _C
from gpupipe._buffers import as_buffer
from gpupipe._errors import JpegWarning
from gpupipe.limits import check_output_size

MODES = {"rgb": 0, "gray": 1}
CHANNELS = {"rgb": 3, "gray": 1}



def decode_one_hwc(
    data: Any,
    box: Sequence[int],
    out_hw: tuple[int, int],
    *,
    resize: bool,
    mode: str,
    strict: bool,
    dct_scaling: bool,
    what: str = "data",
    stacklevel: int = 3,
) -> torch.Tensor:
    """Decodes one box into a new uint8 [H, W, C] tensor."""
    # An empty or negative size allocates nothing: the decoder then reports the box, with the image size.
    oh, ow = (max(v, 0) for v in out_hw)
    check_output_size(oh, ow)
    out = torch.empty((oh, ow, CHANNELS[mode]), dtype=torch.uint8)
    top, left, height, width = box
    warning, _, _ = _C.decode_into(
        as_buffer(data, what), out.data_ptr(), out.numel(), top, left, height, width,
        oh, ow, resize, MODES[mode], strict, dct_scaling,
    )
    if warning is not None:
        warnings.warn(f"{what}: {warning}", JpegWarning, stacklevel=stacklevel)
    return out


def decode_batch_nhwc(
    datas: Sequence[Any],
    boxes: np.ndarray,
    out_nhwc: torch.Tensor,
    *,
    resize: bool,
    mode: str,
    strict: bool,
    dct_scaling: bool,
    num_threads: int,
) -> tuple[dict[int, tuple[type, str]], dict[int, str]]:
    """Decodes every box into its slot of ``out_nhwc`` (uint8 [N, H, W, C], contiguous).

    Returns ({index: (exception class, message)} for failures, {index: warning}).
    """
    n, h, w, _ = out_nhwc.shape
    args = (boxes, out_nhwc.data_ptr(), out_nhwc.numel(), h, w, resize, MODES[mode], strict,
            dct_scaling, num_threads)
    try:
        errors, warns = _C.decode_batch_into(datas, *args)
    except (TypeError, BufferError):
        # Some inputs do not export a buffer (torch tensors): convert them and retry.
        converted = [as_buffer(d, f"datas[{i}]") for i, d in enumerate(datas)]
        errors, warns = _C.decode_batch_into(converted, *args)
    return ({i: (_C.ERROR_CLASSES[k], msg) for i, k, msg in errors}, dict(warns))
