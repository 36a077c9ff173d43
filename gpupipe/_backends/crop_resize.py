"""Crop-and-resize over a ragged batch of whole decoded images into one NHWC batch buffer: what the GPU
decode engines (whole images, each its own allocation) need after decoding. The CPU core's semantics
(Pillow's antialiased BILINEAR, exactly); the host build for CPU outputs, one CUDA kernel chain for
CUDA outputs, both from the C++ core's plan (csrc/decode/crop_resize.h)."""

from __future__ import annotations

import numpy as np
import torch

from gpupipe import _C
from gpupipe.augment._kernels import cuda_module, current_stream, num_threads


def crop_resize_ragged(images: np.ndarray, boxes: np.ndarray, out: torch.Tensor, slots: np.ndarray, *,
                       resize: bool, window: bool = False) -> None:
    """Crops box i of image i and resizes it into ``out[slots[i]]``, all samples in one call.

    Bit-identical to ``gpupipe.decode_crop_jpegs(..., size=(OH, OW), dct_scaling=False,
    window=window)`` on the same pixels (Pillow's antialiased BILINEAR): ``window=False`` is
    torchvision's resized_crop (the taps stay inside the box), ``window=True`` lets them read the image
    around the box. Slots not named in ``slots`` are not written.

    Args:
        images: int64 ``[N, 4]`` rows (data_ptr, height, width, row_pitch_bytes) of HWC uint8 images
            with ``out.shape[-1]`` channels, in out's memory space (host pointers for a CPU out,
            device pointers for a CUDA out). The caller keeps them alive until the work ran (on CUDA:
            until torch's current stream gets there).
        boxes: float64 or int64 ``[N, 4]`` (top, left, height, width), whole numbers inside the image.
        out: uint8 ``[B, OH, OW, C]`` contiguous, C 1 or 3, on the CPU or a CUDA device.
        slots: int64 ``[N]``, distinct slots of ``out``.
        resize: resize each box to (OH, OW); ``False``: every box is (OH, OW), a copy (``window``
            then does nothing, as in the CPU core).
        window: see above.

    CPU out: the host build on the C++ pool of ``torch.get_num_threads()`` threads, GIL released.
    CUDA out: three kernel launches on torch's current stream of out's device, with a scratch buffer
    allocated there (size: the plan's, see csrc/decode/crop_resize.h).

    Raises:
        ValueError: a bad argument (dtype, shape, slot out of range or repeated, a box outside its
            image or fractional, ...), naming the sample; nothing is written then.
        RuntimeError: a CUDA out without the CUDA kernels built, or a failed launch.
    """
    if not isinstance(out, torch.Tensor) or out.dtype != torch.uint8 or out.dim() != 4 or not out.is_contiguous():
        raise ValueError("out must be a contiguous uint8 tensor [B, OH, OW, C]")
    if out.device.type not in ("cpu", "cuda"):
        raise ValueError(f"out must be on the CPU or a CUDA device, not {out.device}")
    images, boxes, slots = (np.ascontiguousarray(a) for a in (images, boxes, slots))
    batch, out_h, out_w, channels = out.shape
    args = (images, boxes, slots, out.data_ptr(), out.numel(), batch, out_h, out_w, channels, bool(resize),
            bool(window))
    if out.device.type == "cpu":
        _C.crop_resize_ragged(*args, num_threads=num_threads())
        return
    table, scratch_bytes = _C.crop_resize_plan(*args)  # the core's checks, before any allocation
    if not table:
        return
    kernels = cuda_module()
    with torch.cuda.device(out.device):
        # Allocated on the stream the kernels run on: the caching allocator hands this block out again
        # only to work queued after them on that stream, so dropping it on return is safe (the
        # record_stream a side stream would need).
        scratch = torch.empty(scratch_bytes, dtype=torch.uint8, device=out.device)
        kernels.crop_resize_ragged(table, out.data_ptr(), out.numel(), batch, out_h, out_w, channels,
                                   scratch.data_ptr(), scratch_bytes, current_stream(out.device))
