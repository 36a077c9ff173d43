"""Public decode ops: one crop (:func:`decode_crop_jpeg`) and a batch (:func:`decode_crop_jpegs`)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from typing import Any, Optional, Sequence, Union

import numpy as np
import torch

from gpupipe import backends
from gpupipe._args import flag, is_number, size_pair
from gpupipe._backends import cpu
from gpupipe.decode_types import MODES, DecodeOptions, Route, check_non_jpeg, check_thread_count
from gpupipe._errors import ErrorKind, NotAJpegError
from gpupipe._exit import call_scope
from gpupipe.limits import check_output_size
from gpupipe.error_policy import apply_policy, check_on_error, warn_corrupt
from gpupipe.routing import decode_into

Size = Union[int, Sequence[int]]


def _check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"mode must be 'rgb' or 'gray', got {mode!r}")


def _flags(strict: Any, dct_scaling: Any, window: Any, apply_exif_orientation: Any) -> tuple:
    return (flag(strict, "strict"), flag(dct_scaling, "dct_scaling"), flag(window, "window"),
            flag(apply_exif_orientation, "apply_exif_orientation"))


def _output_size(size: Size) -> tuple[int, int]:
    """(height, width): positive ints (:func:`gpupipe._args.size_pair`, the crop samplers' rule:
    ``2.7`` is an error, not 2) within the output limit."""
    h, w = size_pair(size)
    check_output_size(h, w)
    return h, w


def _box(top, left, height, width, resize: bool) -> tuple:
    """The box as whole pixels, or as floats when it is resized (a fractional box is resampled
    exactly); a fractional crop without a resize is an error, so is a value that is no number."""
    if not resize and type(top) is type(left) is type(height) is type(width) is int:
        return top, left, height, width  # the common case, checked by the decoder
    for name, v in (("top", top), ("left", left), ("height", height), ("width", width)):
        if not is_number(v):  # (float("3") and float(True) would decode a box nobody meant)
            raise TypeError(f"{name} must be a number, got {v!r}")
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
    window: bool = False,
    non_jpeg: str = "pillow",
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
        backend: ``"auto"`` (CPU core for CPU outputs; for CUDA outputs hybrid where
            nvImageCodec's decoders start, else DALI, else nvJPEG),
            ``"cpu"``, ``"hybrid"``, ``"dali"`` or ``"nvjpeg"``; see :func:`decode_crop_jpegs`.
        device: where the result lives (``"cpu"`` or a CUDA device).
        apply_exif_orientation: the box is in the displayed frame (EXIF orientation applied, as
            ``PIL.ImageOps.exif_transpose``) and so is the result.
        window: with ``size``: the box is a window of the whole image resized (torchvision's
            ``Resize`` then ``CenterCrop``; Pillow's ``resize(box=...)``), so the filter also reads
            the pixels around it; the box may be fractional. Default: the box is cropped, then
            resized (torchvision's ``resized_crop``).
        non_jpeg: ``"pillow"``: a file that is not a JPEG but an image Pillow reads (PNG, WebP,
            ...) is decoded by Pillow with the same semantics; ``"error"``: NotAJpegError.

    Returns:
        torch.Tensor: uint8 ``[C, height, width]`` (or ``[C, *size]``) on ``device``, values
        0-255, a channels-last view (``.contiguous()`` gives CHW memory).

    Raises:
        ValueError: the window is not inside the image (the message gives its size), bad args.
        gpupipe.JpegError: its subclass says why: ``NotAJpegError``, ``CorruptJpegError`` (libjpeg's
            message), ``UnsupportedJpegError`` (12-bit, lossless).
        gpupipe.DecompressionBombError: ``PixelLimitError``, ``ScanLimitError`` or
            ``MemoryLimitError``: over a limit of ``gpupipe.set_limits``, refused before any large
            allocation.

    Example:
        >>> import gpupipe, numpy as np
        >>> jpeg = gpupipe._C.encode_jpeg(np.full((40, 60, 3), 200, np.uint8), 40, 60, 3)
        >>> gpupipe.decode_crop_jpeg(jpeg, 8, 16, 20, 30).shape
        torch.Size([3, 20, 30])
    """
    _check_mode(mode)
    strict, dct_scaling, window, apply_exif_orientation = _flags(strict, dct_scaling, window, apply_exif_orientation)
    check_non_jpeg(non_jpeg)
    if window and size is None:
        raise ValueError("window=True resamples a box to an output size: pass size=(h, w)")
    box = _box(top, left, height, width, resize=size is not None)
    out_hw = _output_size(size) if size is not None else (box[2], box[3])  # (a crop's is checked when decoded)
    device = torch.device("cpu" if device is None else device)
    name = backends.resolve(backend, device)

    def batch_path():
        return decode_crop_jpegs([data], [box], size=size, mode=mode, strict=strict, dct_scaling=dct_scaling,
                                 backend=name, device=device, apply_exif_orientation=apply_exif_orientation,
                                 window=window, non_jpeg=non_jpeg).images[0]

    if name != "cpu" or device.type != "cpu" or apply_exif_orientation:  # the batch path: one sample
        return batch_path()
    if torch.compiler.is_compiling():
        if not isinstance(data, torch.Tensor):
            data = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        hwc = torch.ops.gpupipe.decode_crop_jpeg(
            data, *box, out_hw[0], out_hw[1], size is not None, MODES[mode], strict, dct_scaling, window
        )
        return hwc.permute(2, 0, 1)
    with call_scope():  # an exiting interpreter waits for this call (gpupipe._exit)
        try:
            hwc = cpu.decode_one_hwc(data, box, out_hw, resize=size is not None, mode=mode, strict=strict,
                                     dct_scaling=dct_scaling, window=window)
        except NotAJpegError:
            if non_jpeg != "pillow":
                raise
            return batch_path()  # Pillow's route, if it reads the file
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
    out_width: int, resize: bool, mode: int, strict: bool, dct_scaling: bool, window: bool,
) -> torch.Tensor:
    """uint8 [out_height, out_width, C] (HWC) crop of the JPEG in ``data`` (1-D uint8)."""
    name = {v: k for k, v in MODES.items()}[mode]
    return cpu.decode_one_hwc(
        data, (top, left, height, width), (out_height, out_width), resize=resize, mode=name,
        strict=strict, dct_scaling=dct_scaling, window=window,
    )


@_decode_crop_jpeg_op.register_fake
def _(data, top, left, height, width, out_height, out_width, resize, mode, strict, dct_scaling, window):
    channels = 3 if mode == MODES["rgb"] else 1
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
        fallback: ``{index: reason}`` for samples not decoded by the backend's own decoder: files
            that are not JPEGs (Pillow), and what a GPU backend handed to the CPU core (CMYK, a
            limit, or the GPU decoder failing the batch).
        backend: the backend that ran (``"cpu"``, ``"hybrid"``, ``"dali"``, ``"nvjpeg"``).
        kinds: ``{index: ErrorKind}`` for every sample that failed.
        routes: per sample, the route that decoded it: ``"cpu"``, ``"gpu"`` (DALI, torchvision's
            nvJPEG), ``"gpu-hardware"`` / ``"gpu-cuda"`` (nvImageCodec's hardware and CUDA
            decoders), ``"pillow"``, ``"cpu-fallback"`` (``"none"`` where it failed).
    """

    images: torch.Tensor
    ok: torch.Tensor
    errors: dict
    warnings: dict
    fallback: dict = dataclasses.field(default_factory=dict)
    backend: str = "cpu"
    kinds: dict = dataclasses.field(default_factory=dict)
    routes: list = dataclasses.field(default_factory=list)

    def __len__(self) -> int:
        return self.images.shape[0]

    def __repr__(self) -> str:  # the tensor's shape, not its values
        failed = int((~self.ok).sum()) if self.ok.numel() else 0
        return (f"DecodedBatch(images={self.images.dtype} {list(self.images.shape)} on {self.images.device}, "
                f"backend={self.backend!r}, failed={failed}, warnings={len(self.warnings)}, "
                f"fallback={len(self.fallback)})")


def _boxes_array(boxes: Any, n: int, resize: bool) -> np.ndarray:
    """int64 [N, 4], or float64 [N, 4] for fractional boxes (resized exactly from the box). A box
    that is no box whatever the image (not finite, a negative corner, an empty side, fractional
    without a resize) is the caller's mistake: a ValueError naming it, before anything is decoded."""
    if isinstance(boxes, torch.Tensor):
        boxes = boxes.detach().cpu().numpy()
    arr = np.asarray(boxes)
    if n == 0 and arr.size == 0:
        return np.zeros((0, 4), np.int64)
    if arr.dtype.kind not in "iuf":  # bools, text, objects (None, ints past 64 bits)
        raise TypeError(f"boxes must be numbers (top, left, height, width), got an array of {arr.dtype}")
    if arr.shape != (n, 4):
        raise ValueError(f"boxes must have shape [{n}, 4] (top, left, height, width), got {arr.shape}")
    if arr.dtype.kind == "f":
        arr = np.ascontiguousarray(arr, dtype=np.float64)
        _refuse_boxes(arr, ~np.isfinite(arr).all(axis=1), "is not finite")
        if not resize:
            _refuse_boxes(arr, (arr != np.floor(arr)).any(axis=1), "is fractional: only a resized box (size=...) may be")
            _refuse_boxes(arr, (np.abs(arr) >= 2.0**63).any(axis=1), "is past int64")
            arr = arr.astype(np.int64)  # (whole floats are whole pixels)
    elif arr.dtype.kind == "u":
        _refuse_boxes(arr, (arr > np.iinfo(np.int64).max).any(axis=1), "is past int64")
    arr = np.ascontiguousarray(arr, dtype=arr.dtype if arr.dtype == np.float64 else np.int64)
    _refuse_boxes(arr, (arr[:, :2] < 0).any(axis=1) | (arr[:, 2:] <= 0).any(axis=1),
                  "has a negative corner or an empty side")
    return arr


def _refuse_boxes(boxes: np.ndarray, bad: np.ndarray, why: str) -> None:
    rows = np.flatnonzero(bad)
    if len(rows):
        i = int(rows[0])
        raise ValueError(f"boxes[{i}] = {boxes[i].tolist()} (top, left, height, width) {why}"
                         + (f"; {len(rows)} such boxes" if len(rows) > 1 else ""))


def _output_buffer(out: Optional[torch.Tensor], n: int, h: int, w: int, c: int, device: torch.device) -> torch.Tensor:
    """The NHWC uint8 tensor to decode into: ``out`` (NHWC or channels-last NCHW), or a new one
    (pinned on a CUDA machine, so that a transfer can overlap)."""
    if out is None:
        if device.type == "cuda":
            return torch.empty((n, h, w, c), dtype=torch.uint8, device=device)
        return torch.empty((n, h, w, c), dtype=torch.uint8, pin_memory=torch.cuda.is_available())
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
    window: bool = False,
    non_jpeg: str = "pillow",
) -> DecodedBatch:
    """Decodes one crop per image on the C++ thread pool, straight into one NHWC buffer.

    The GIL is released once for the whole batch; each worker thread decodes with its own
    decompressor. Files that are not JPEGs are decoded by Pillow with the same semantics (see
    ``non_jpeg``), so a mixed folder gives the same samples here, in
    :class:`gpupipe.data.DecodeCropDataset` and in :class:`gpupipe.Loader`.

    Args:
        datas: N encoded images (``bytes``, ``memoryview``, 1-D uint8 arrays or CPU tensors).
        boxes: int ``[N, 4]`` (top, left, height, width) in each image's pixels; float boxes
            (fractional windows) are allowed with ``size``.
        size: ``None``: every box must have the same height and width, which is the output size.
            ``(h, w)`` or an int: each box is resized to exactly this size (RandomResizedCrop
            semantics; see ``dct_scaling`` and ``window``).
        out: optional destination, uint8 ``[N, H, W, C]`` contiguous or ``[N, C, H, W]``
            channels-last (typically pinned). Written in place; ``images`` is a view of it.
        num_threads: decode threads (1..1024). Default: ``GPUPIPE_NUM_THREADS``, else the CPU
            affinity count. With ``backend="hybrid"`` the CPU's share runs on that budget less the
            GPU decoders' host threads (``hybrid.cpu_pool_threads``).
        on_error: ``"raise"``: after the whole batch, raise for the first failure, naming its index
            and the decoder's message (its class says the kind; the exception's ``failures`` holds
            them all). ``"skip"``: report failures in ``ok``/``errors``/``kinds``; drop them with
            ``images[ok]``. ``"replace"``: same report; the failed slots are zero images meant to be
            kept. See :mod:`gpupipe.error_policy`.
        mode: ``"rgb"`` (C=3) or ``"gray"`` (C=1).
        strict: recoverable corruption is a failure instead of a warning.
        dct_scaling: with ``size``, decode boxes >= 2x the size already downscaled by libjpeg.
        backend: ``"cpu"``: the C++ core (the reference). ``"dali"``: DALI's
            ``decoders.image_slice`` with absolute anchors (nvJPEG on CUDA outputs, DALI's CPU
            operators for CPU outputs) and antialiased ``fn.resize``. ``"nvjpeg"``:
            ``torchvision.io.decode_jpeg(device="cuda")``, crop and antialiased resize on the GPU.
            ``"hybrid"``: each batch split between the CPU core and the GPU's hardware JPEG decoder
            (nvImageCodec's CUDA decoder where there is none, else only for what the hardware
            declines; routes keyed by position in the call, the starting shares; the Loader
            re-tunes them per epoch). ``"auto"``: the CPU core for CPU
            outputs; hybrid where nvImageCodec is installed, else DALI, else nvjpeg, for CUDA outputs. GPU
            backends hand what they cannot decode (CMYK, over a limit, a failing batch) to the CPU
            core inside the same batch, reported in ``fallback``.
        device: where ``images`` live (default: ``out``'s device, else the CPU).
        apply_exif_orientation: boxes are in the displayed frame (as ``PIL.ImageOps.exif_transpose``
            shows the image; see :mod:`gpupipe.orientation`) and the crops come out in that frame.
        window: with ``size``, each box is a window of the whole image resized (torchvision's
            ``Resize`` + ``CenterCrop``): the filter also reads the pixels around the box.
        non_jpeg: ``"pillow"`` (default): files that are not JPEGs but images Pillow reads are
            decoded by Pillow (route ``"pillow"``); ``"error"``: they fail with NotAJpegError.

    Returns:
        DecodedBatch: ``images`` uint8 ``[N, C, H, W]`` (channels-last, on ``device``), ``ok``,
        ``errors``, ``kinds``, ``warnings``, ``fallback``, ``routes``, ``backend``.

    Example:
        >>> import gpupipe, numpy as np
        >>> jpeg = gpupipe._C.encode_jpeg(np.full((40, 60, 3), 200, np.uint8), 40, 60, 3)
        >>> batch = gpupipe.decode_crop_jpegs([jpeg, b"not an image"], [[0, 0, 40, 60]] * 2, size=16,
        ...                                   on_error="skip")
        >>> batch.images.shape, batch.ok.tolist(), batch.kinds
        (torch.Size([2, 3, 16, 16]), [True, False], {1: <ErrorKind.NOT_JPEG: 2>})
    """
    with call_scope():  # an exiting interpreter waits for this call (gpupipe._exit)
        _check_mode(mode)
        check_on_error(on_error)
        strict, dct_scaling, window, apply_exif_orientation = _flags(strict, dct_scaling, window,
                                                                     apply_exif_orientation)
        if window and size is None:
            raise ValueError("window=True resamples a box to an output size: pass size=(h, w)")
        # (a 1-D object array holds files: an h5py slice, pandas' .values)
        single = isinstance(datas, np.ndarray) and (datas.dtype != object or datas.ndim != 1)
        if single or isinstance(datas, (bytes, bytearray, memoryview, torch.Tensor)):
            raise TypeError("datas must be a sequence of encoded images, not a single buffer")
        if not isinstance(datas, (list, tuple)):
            if not isinstance(datas, Iterable):
                raise TypeError(f"datas must be a sequence of encoded images, got {type(datas).__name__}")
            datas = list(datas)
        n = len(datas)
        box_arr = _boxes_array(boxes, n, resize=size is not None)
        if out is not None and not isinstance(out, torch.Tensor):
            raise TypeError(f"out must be a torch.Tensor (or None), got {type(out).__name__}")
        if size is None:
            if n and not ((box_arr[:, 2] == box_arr[0, 2]).all() and (box_arr[:, 3] == box_arr[0, 3]).all()):
                raise ValueError("boxes differ in size: pass size=(h, w) to resize each to one size")
            out_hw = (int(box_arr[0, 2]), int(box_arr[0, 3])) if n else (1, 1)
            if out_hw[0] < 1 or out_hw[1] < 1:
                raise ValueError(f"box size {out_hw} is empty")
            check_output_size(*out_hw)
        else:
            out_hw = _output_size(size)
        if num_threads is not None:
            check_thread_count("num_threads", num_threads)
        device = torch.device(device) if device is not None else (out.device if out is not None else torch.device("cpu"))
        options = DecodeOptions(size=out_hw, resize=size is not None, mode=mode, strict=strict, dct_scaling=dct_scaling,
                                window=window, num_threads=num_threads or 0, apply_exif_orientation=apply_exif_orientation,
                                non_jpeg=non_jpeg, backend=backends.resolve(backend, device), device=device)
        nhwc = _output_buffer(out, n, out_hw[0], out_hw[1], options.channels, device)
        status = decode_into(datas, box_arr, nhwc, options)
        apply_policy(status, on_error)
        warn_corrupt(status)
        return DecodedBatch(
            images=nhwc.permute(0, 3, 1, 2),
            ok=torch.from_numpy(status.ok.copy()),
            errors=dict(status.errors),
            warnings=dict(status.warnings),
            fallback=dict(status.fallback),
            backend=options.backend,
            kinds={i: ErrorKind(int(status.kind[i])) for i in sorted(status.errors)},
            routes=[Route(int(r)).label for r in status.route],
        )
