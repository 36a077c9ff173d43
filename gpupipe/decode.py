"""Public decode ops: one crop (:func:`decode_crop_jpeg`) and a batch (:func:`decode_crop_jpegs`)."""

from __future__ import annotations

import dataclasses
import math
import warnings
from typing import Any, Optional, Sequence, Union

import numpy as np
import torch

from gpupipe import backends
from gpupipe._backends import cpu
from gpupipe._buffers import as_buffer
from gpupipe._errors import JpegWarning
from gpupipe.limits import check_output_size

Size = Union[int, Sequence[int]]

ON_ERROR = ("raise", "skip", "replace")


def _check_mode(mode: str) -> None:
    if mode not in cpu.MODES:
        raise ValueError(f"mode must be 'rgb' or 'gray', got {mode!r}")


def _as_size(size: Size) -> tuple[int, int]:
    if isinstance(size, int):
        size = (size, size)
    h, w = (int(v) for v in size)
    if h < 1 or w < 1:
        raise ValueError(f"size must be positive, got {tuple(size)}")
    check_output_size(h, w)
    return h, w


def _box(top, left, height, width, resize: bool) -> tuple:
    """The box as whole pixels, or as floats when it is resized (a fractional box is resampled
    exactly); a fractional crop without a resize is an error."""
    box = tuple(float(v) for v in (top, left, height, width))
    if resize:
        return box
    if not all(math.isfinite(v) and v == int(v) for v in box):
        raise ValueError(f"crop box {box} is fractional (or not finite): only a resized box (size=...) may be")
    return tuple(int(v) for v in box)


def decode_crop_jpeg(
    data: Any,
    top: int,
    left: int,
    height: int,
    width: int,
    *,
    mode: str = "rgb",
    strict: bool = False,
    size: Optional[Size] = None,
    dct_scaling: bool = True,
    backend: str = "auto",
    device: Any = "cpu",
    apply_exif_orientation: bool = False,
) -> torch.Tensor:
    """Decodes only the window ``[top, top + height) x [left, left + width)`` of a JPEG.

    Rows above the window are entropy-decoded but not reconstructed, rows below are never read,
    and columns outside it are not reconstructed. The result is bit-identical to decoding the
    whole image with the same libjpeg-turbo and cropping.

    Args:
        data: the encoded JPEG: ``bytes``, ``memoryview``, 1-D uint8 numpy array or CPU tensor.
        top, left, height, width: the window in pixels of the stored image (EXIF orientation is
            not applied).
        mode: ``"rgb"`` (C=3; grayscale is replicated, CMYK/YCCK converted as Pillow does) or
            ``"gray"`` (C=1).
        strict: raise :class:`gpupipe.JpegError` on recoverable corruption (truncated data, bad
            restart markers) instead of warning with :class:`gpupipe.JpegWarning`.
        size: optional ``(h, w)`` (or an int for a square): resize the window to exactly this
            size with antialiased bilinear filtering (Pillow's ``BILINEAR``).
        dct_scaling: with ``size``, decode a window >= 2x the size already downscaled in the DCT
            domain (much faster; a close but not identical result). ``False`` is bit-exact with
            Pillow's crop-then-resize.
        backend: ``"auto"`` (CPU core for CPU outputs; DALI, else nvJPEG, for CUDA outputs),
            ``"cpu"``, ``"dali"`` or ``"nvjpeg"``; see :func:`decode_crop_jpegs`.
        device: where the result lives (``"cpu"`` or a CUDA device).
        apply_exif_orientation: the box is in the displayed frame (EXIF orientation applied, as
            ``PIL.ImageOps.exif_transpose``) and so is the result.

    Returns:
        torch.Tensor: uint8 ``[C, height, width]`` (or ``[C, *size]``) on ``device``, values
        0-255, a channels-last view (``.contiguous()`` gives CHW memory).

    Raises:
        ValueError: the window is not inside the image (the message gives its size), bad args.
        gpupipe.JpegError: not a JPEG, corrupt, unsupported (12-bit, lossless), libjpeg's message.
        gpupipe.DecompressionBombError: the image exceeds ``gpupipe.set_limits`` limits; refused
            before any large allocation.

    Example:
        >>> import gpupipe, numpy as np
        >>> jpeg = gpupipe._C.encode_jpeg(np.full((40, 60, 3), 200, np.uint8), 40, 60, 3)
        >>> gpupipe.decode_crop_jpeg(jpeg, 8, 16, 20, 30).shape
        torch.Size([3, 20, 30])
    """
    _check_mode(mode)
    box = _box(top, left, height, width, resize=size is not None)
    out_hw = _as_size(size) if size is not None else (box[2], box[3])
    if size is None:
        check_output_size(*out_hw)
    device = torch.device(device)
    if apply_exif_orientation:
        batch = decode_crop_jpegs([data], [box], size=size, mode=mode, strict=strict, dct_scaling=dct_scaling,
                                  backend=backend, device=device, apply_exif_orientation=True)
        return batch.images[0]
    name = backends.resolve(backend, device)
    if name != "cpu" or device.type != "cpu":  # GPU backends and CUDA outputs go through the batch path
        batch = decode_crop_jpegs([data], [box], size=size, mode=mode, strict=strict, dct_scaling=dct_scaling,
                                  backend=name, device=device)
        return batch.images[0]
    if torch.compiler.is_compiling():
        if not isinstance(data, torch.Tensor):
            data = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        hwc = torch.ops.gpupipe.decode_crop_jpeg(
            data, *box, out_hw[0], out_hw[1], size is not None, cpu.MODES[mode], strict, dct_scaling
        )
    else:
        hwc = cpu.decode_one_hwc(
            data, box, out_hw, resize=size is not None, mode=mode, strict=strict,
            dct_scaling=dct_scaling,
        )
    return hwc.permute(2, 0, 1)


def decode_and_crop_jpeg(
    data: Any, crop_y: int, crop_x: int, crop_height: int, crop_width: int, **kwargs: Any
) -> torch.Tensor:
    """Alias of :func:`decode_crop_jpeg` with the argument names of the custom op in the
    "custom PyTorch operator" data-loading post (and of TF's ``decode_and_crop_jpeg`` window)."""
    return decode_crop_jpeg(data, crop_y, crop_x, crop_height, crop_width, **kwargs)


# --- torch.library registration: the op composes with torch.compile ------------------------------

@torch.library.custom_op("gpupipe::decode_crop_jpeg", mutates_args=(), device_types="cpu")
def _decode_crop_jpeg_op(
    data: torch.Tensor, top: float, left: float, height: float, width: float, out_height: int,
    out_width: int, resize: bool, mode: int, strict: bool, dct_scaling: bool,
) -> torch.Tensor:
    """uint8 [out_height, out_width, C] (HWC) crop of the JPEG in ``data`` (1-D uint8)."""
    name = {v: k for k, v in cpu.MODES.items()}[mode]
    return cpu.decode_one_hwc(
        data, (top, left, height, width), (out_height, out_width), resize=resize, mode=name,
        strict=strict, dct_scaling=dct_scaling,
    )


@_decode_crop_jpeg_op.register_fake
def _(data, top, left, height, width, out_height, out_width, resize, mode, strict, dct_scaling):
    channels = 3 if mode == cpu.MODES["rgb"] else 1
    return data.new_empty((out_height, out_width, channels))


# --- batches -----------------------------------------------------------------------------------

@dataclasses.dataclass
class DecodedBatch:
    """The result of :func:`decode_crop_jpegs`.

    Attributes:
        images: uint8 ``[N, C, H, W]`` viewed on NHWC (channels-last) memory, values 0-255.
            Failed samples' slots are zero-filled.
        ok: bool ``[N]``: True where the sample decoded.
        errors: ``{index: message}`` for every sample that failed.
        warnings: ``{index: message}`` for samples that decoded with recoverable corruption.
        fallback: ``{index: reason}`` for samples a GPU backend handed to the CPU core (non-JPEG,
            CMYK, a limit, or the GPU decoder failing the batch); empty for the CPU backend.
        backend: the backend that ran (``"cpu"``, ``"dali"``, ``"nvjpeg"``).
    """

    images: torch.Tensor
    ok: torch.Tensor
    errors: dict
    warnings: dict
    fallback: dict = dataclasses.field(default_factory=dict)
    backend: str = "cpu"

    def __len__(self) -> int:
        return self.images.shape[0]


def _boxes_array(boxes: Any, n: int) -> np.ndarray:
    """int64 [N, 4], or float64 [N, 4] for fractional boxes (resized exactly from the box)."""
    if isinstance(boxes, torch.Tensor):
        boxes = boxes.detach().cpu().numpy()
    arr = np.asarray(boxes)
    arr = np.ascontiguousarray(arr, dtype=np.float64 if arr.dtype.kind == "f" else np.int64)
    if arr.shape != (n, 4):
        raise ValueError(f"boxes must have shape [{n}, 4] (top, left, height, width), got {arr.shape}")
    return arr


def _output_buffer(out: Optional[torch.Tensor], n: int, h: int, w: int, c: int,
                   device: torch.device = torch.device("cpu"), pin: Optional[bool] = None) -> torch.Tensor:
    """The NHWC uint8 tensor to decode into: ``out`` (NHWC or channels-last NCHW), or a new one."""
    if out is None:
        if device.type == "cuda":
            return torch.empty((n, h, w, c), dtype=torch.uint8, device=device)
        pin = torch.cuda.is_available() if pin is None else pin
        return torch.empty((n, h, w, c), dtype=torch.uint8, pin_memory=pin)
    if out.dtype != torch.uint8 or out.device.type != device.type:
        raise ValueError(f"out must be a uint8 tensor on {device.type}, got {out.dtype} on {out.device}")
    if tuple(out.shape) == (n, c, h, w) and out.is_contiguous(memory_format=torch.channels_last):
        return out.permute(0, 2, 3, 1)
    if tuple(out.shape) == (n, h, w, c) and out.is_contiguous():
        return out
    raise ValueError(
        f"out must be a contiguous [N, H, W, C] = {[n, h, w, c]} tensor or a channels-last "
        f"[N, C, H, W] one, got shape {tuple(out.shape)} with strides {out.stride()}"
    )


def decode_crop_jpegs(
    datas: Sequence[Any],
    boxes: Any,
    *,
    size: Optional[Size] = None,
    out: Optional[torch.Tensor] = None,
    num_threads: Optional[int] = None,
    on_error: str = "raise",
    mode: str = "rgb",
    strict: bool = False,
    dct_scaling: bool = True,
    backend: str = "auto",
    device: Any = None,
    apply_exif_orientation: bool = False,
) -> DecodedBatch:
    """Decodes one crop per JPEG on the C++ thread pool, straight into one NHWC buffer.

    The GIL is released once for the whole batch; each worker thread reuses its own decompressor.

    Args:
        datas: N encoded JPEGs (``bytes``, ``memoryview``, 1-D uint8 arrays or CPU tensors).
        boxes: int ``[N, 4]`` (top, left, height, width) in each image's pixels.
        size: ``None``: every box must have the same height and width, which is the output size.
            ``(h, w)`` or an int: each box is resized to exactly this size (RandomResizedCrop
            semantics; see ``dct_scaling``).
        out: optional destination, uint8 ``[N, H, W, C]`` contiguous or ``[N, C, H, W]``
            channels-last (typically pinned). Written in place; ``images`` is a view of it.
        num_threads: decode threads. Default: ``GPUPIPE_NUM_THREADS``, else the CPU affinity count.
        on_error: ``"raise"``: after the whole batch, raise for the first failure, naming its index
            and libjpeg's message (the exception's ``errors`` holds them all). ``"skip"``: report
            failures in ``ok``/``errors``; drop them with ``images[ok]``. ``"replace"``: same
            report; the failed slots are zero images meant to be kept.
        mode: ``"rgb"`` (C=3) or ``"gray"`` (C=1).
        strict: recoverable corruption is a failure instead of a warning.
        dct_scaling: with ``size``, decode boxes >= 2x the size already downscaled by libjpeg.
        backend: ``"cpu"``: the C++ core (the reference). ``"dali"``: DALI's
            ``decoders.image_slice`` with absolute anchors (nvJPEG on CUDA outputs, DALI's CPU
            operators for CPU outputs) and antialiased ``fn.resize``. ``"nvjpeg"``:
            ``torchvision.io.decode_jpeg(device="cuda")``, crop and antialiased resize on the GPU.
            ``"auto"``: the CPU core for CPU outputs; DALI, else nvjpeg, for CUDA outputs. GPU
            backends hand what they cannot decode (non-JPEG, CMYK, over a limit, a failing batch)
            to the CPU core inside the same batch, reported in ``fallback``.
        device: where ``images`` live (default: ``out``'s device, else the CPU).
        apply_exif_orientation: boxes are in the displayed frame (as ``PIL.ImageOps.exif_transpose``
            shows the image; see :mod:`gpupipe.orientation`) and the crops come out in that frame.

    Returns:
        DecodedBatch: ``images`` uint8 ``[N, C, H, W]`` (channels-last, on ``device``), ``ok``,
        ``errors``, ``warnings``, ``fallback``, ``backend``.
    """
    _check_mode(mode)
    if on_error not in ON_ERROR:
        raise ValueError(f"on_error must be one of {ON_ERROR}, got {on_error!r}")
    if isinstance(datas, (bytes, bytearray, memoryview)):
        raise TypeError("datas must be a sequence of encoded images, not a single buffer")
    datas = datas if isinstance(datas, (list, tuple)) else list(datas)
    n = len(datas)
    box_arr = _boxes_array(boxes, n)
    if size is None:
        if n and not ((box_arr[:, 2] == box_arr[0, 2]).all() and (box_arr[:, 3] == box_arr[0, 3]).all()):
            raise ValueError("boxes differ in size: pass size=(h, w) to resize each to one size")
        out_hw = (int(box_arr[0, 2]), int(box_arr[0, 3])) if n else (1, 1)
        if out_hw[0] < 1 or out_hw[1] < 1:
            raise ValueError(f"box size {out_hw} is empty")
        check_output_size(*out_hw)
    else:
        out_hw = _as_size(size)
    if num_threads is not None and num_threads < 1:
        raise ValueError(f"num_threads must be >= 1, got {num_threads}")
    channels = cpu.CHANNELS[mode]
    device = torch.device(device) if device is not None else (out.device if out is not None else torch.device("cpu"))
    name = backends.resolve(backend, device)
    opts = dict(resize=size is not None, mode=mode, strict=strict, dct_scaling=dct_scaling,
                num_threads=num_threads or 0)
    if apply_exif_orientation:
        nhwc = _output_buffer(out, n, out_hw[0], out_hw[1], channels, device=device)
        failures, warns, fallback = _run_oriented(datas, box_arr, nhwc, name, device, opts)
    else:
        nhwc, failures, warns, fallback = _run_backend(datas, box_arr, out_hw, channels, out, name, device, opts)
    ok = torch.ones(n, dtype=torch.bool)
    if failures:
        ok[list(failures)] = False
        nhwc[torch.tensor(sorted(failures), device=nhwc.device)] = 0  # every backend: failed slots are zeros
    if failures and on_error == "raise":
        first = min(failures)
        cls, msg = failures[first]
        more = f" ({len(failures) - 1} more failed; see .errors)" if len(failures) > 1 else ""
        exc = cls(f"sample {first}: {msg}{more}")
        exc.errors = {i: m for i, (_, m) in failures.items()}
        raise exc
    if warns:
        first = min(warns)
        warnings.warn(
            f"{len(warns)} sample(s) decoded with corrupt data; sample {first}: {warns[first]}",
            JpegWarning, stacklevel=2,
        )
    return DecodedBatch(
        images=nhwc.permute(0, 3, 1, 2),
        ok=ok,
        errors={i: m for i, (_, m) in failures.items()},
        warnings=warns,
        fallback=fallback,
        backend=name,
    )


def _run_backend(datas, box_arr, out_hw, channels, out, name, device, opts):
    """Decodes with one backend into ``out`` (or a new buffer) on ``device``.
    Returns (nhwc, failures {i: (class, message)}, warnings {i: message}, fallback {i: reason})."""
    n = len(datas)
    opts = dict(opts)
    num_threads = opts.pop("num_threads", 0)
    if name == "cpu":
        host_out = out if device.type == "cpu" else None
        nhwc = _output_buffer(host_out, n, out_hw[0], out_hw[1], channels, pin=device.type == "cuda" or None)
        failures, warns = cpu.decode_batch_nhwc(datas, box_arr, nhwc, num_threads=num_threads, **opts)
        if device.type == "cuda":
            dev = _output_buffer(out, n, out_hw[0], out_hw[1], channels, device=device)
            dev.copy_(nhwc, non_blocking=True)
            nhwc = dev
        return nhwc, failures, warns, {}
    from gpupipe._backends import dali, nvjpeg

    module = dali if name == "dali" else nvjpeg
    nhwc = _output_buffer(out, n, out_hw[0], out_hw[1], channels, device=device, pin=False)
    buffers = [as_buffer(d, f"datas[{i}]") for i, d in enumerate(datas)]
    failures, warns, fallback = module.decode_batch_nhwc(buffers, box_arr, nhwc, num_threads=num_threads,
                                                         device=device, **opts)
    return nhwc, failures, warns, fallback


def _run_oriented(datas, box_arr, nhwc, name, device, opts):
    """Displayed-frame boxes: each EXIF orientation group is decoded in the stored frame (height and
    width swapped for the transposing ones) and turned into the displayed frame into its slots.
    Returns (failures, warnings, fallback) by original index."""
    from gpupipe import orientation
    from gpupipe._backends import hybrid

    buffers = [as_buffer(d, f"datas[{i}]") for i, d in enumerate(datas)]
    infos = hybrid.header_infos(buffers)
    orient = np.where(infos[:, 4] >= 1, infos[:, 4], 1)
    stored = orientation.stored_boxes(box_arr, orient, infos[:, 0], infos[:, 1])
    out_hw = tuple(nhwc.shape[1:3])
    failures, warns, fallback = {}, {}, {}
    transposed = np.isin(orient, orientation.TRANSPOSED)
    for swapped in (False, True):
        idx = np.flatnonzero(transposed == swapped)
        if len(idx) == 0:
            continue
        sub_hw = (out_hw[1], out_hw[0]) if swapped else out_hw
        sub, f, w, fb = _run_backend([buffers[i] for i in idx], np.ascontiguousarray(stored[idx]), sub_hw,
                                     nhwc.shape[3], None, name, device, opts)
        for o in np.unique(orient[idx]):
            sel = np.flatnonzero(orient[idx] == o)
            rows = torch.from_numpy(idx[sel]).to(nhwc.device)
            nhwc[rows] = orientation.to_display(sub[torch.from_numpy(sel).to(sub.device)], int(o)).to(nhwc.device)
        failures.update({int(idx[k]): v for k, v in f.items()})
        warns.update({int(idx[k]): v for k, v in w.items()})
        fallback.update({int(idx[k]): v for k, v in fb.items()})
    return failures, warns, fallback
