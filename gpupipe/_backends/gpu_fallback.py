"""What GPU backends share: the samples a GPU decoder cannot take with gpupipe's semantics go to
the CPU core inside the same batch, and so does the whole batch when the GPU decoder fails it."""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional, Sequence

import numpy as np
import torch

from gpupipe import _C
from gpupipe._backends import cpu
from gpupipe._errors import brief
from gpupipe._transfer import to_device
from gpupipe.decode_types import BatchStatus, DecodeOptions, HeaderInfos, Route
from gpupipe.limits import get_limits

# Files coded as RGB (Adobe transform 0, or component ids 'R','G','B') stay on the CPU for GPU outputs:
# measured on an H200 with nvImageCodec 0.9 / nvJPEG 13.2, both GPU decoders treat them as YCbCr (245
# levels off). DALI's CPU operators (libjpeg-turbo) decode them right, in RGB mode.
GPU_COLORSPACES = tuple(_C.COLORSPACES.index(c) for c in ("gray", "ycbcr"))
HOST_COLORSPACES = GPU_COLORSPACES + (_C.COLORSPACES.index("rgb"),)
GPU_COLORSPACE_MASK = sum(1 << c for c in GPU_COLORSPACES)
HOST_COLORSPACE_MASK = sum(1 << c for c in HOST_COLORSPACES)


class GpuOutcome(NamedTuple):
    """What a ``gpu_decode`` that can hand samples back reports: ``routes`` int64 [len(indices)],
    the :class:`Route` of each sample it decoded (ignored for the declined ones), and ``declined``
    ``{sample index: reason}`` of those it handed back for the CPU core."""

    routes: np.ndarray
    declined: dict


def gpu_eligible(infos: HeaderInfos, boxes: np.ndarray, options: DecodeOptions) -> np.ndarray:
    """bool [N]: samples a GPU decoder can take with our semantics. The rest (unreadable headers,
    CMYK/YCCK, images over max_pixels or with more scans than max_scans (or scans not counted),
    boxes outside the image or fractional, boxes not of the output's size without a resize (the
    CPU core reports each), files without an EOI marker ending the JPEG (nvJPEG
    decodes a truncated file without a word), files whose marker layout libjpeg reads only with a
    warning or an error (nvImageCodec's parser crashed a process on one) go to the CPU core, which gives each its exact result
    or its exact error: gpupipe's limits hold whatever the backend. So does every sample of a
    ``window`` resize (the GPU resizers crop first) and of a ``strict`` decode (nvJPEG does not
    report recoverable corruption). Files coded as RGB (not YCbCr) stay on the CPU core too for GPU
    outputs (the GPU decoders convert them as YCbCr) and in gray mode (libjpeg computes their luma
    from R, G and B). One native pass over the header table (:func:`refusals`); rows whose
    scans were not counted (a CPU-backend probe: :meth:`HeaderInfos.count_scans`) are refused."""
    return refusals(infos, boxes, options) == 0


def refusals(infos: HeaderInfos, boxes: np.ndarray, options: DecodeOptions) -> np.ndarray:
    """int8 [N]: why each sample may not go to a GPU decoder (:data:`REFUSALS`), 0 where it may."""
    return _C.gpu_refusals(infos.table, native_boxes(boxes), *eligibility_args(options))


def eligibility_args(options: DecodeOptions) -> tuple:
    """(window, strict, colour-space mask, max_pixels, max_scans, box height, box width): what
    ``_C.gpu_refusals`` and ``_C.hybrid_routes`` take of the options and the limits."""
    limits = get_limits()
    mask = HOST_COLORSPACE_MASK if options.mode == "rgb" and options.device.type == "cpu" else GPU_COLORSPACE_MASK
    box = (0, 0) if options.resize or options.size is None else (int(options.size[0]), int(options.size[1]))
    return options.window, options.strict, mask, limits.max_pixels, limits.max_scans, *box


def gpu_inputs(buffers: Sequence, infos: HeaderInfos) -> Sequence:
    """The files as a GPU decoder is given them: each up to the EOI marker that ends its JPEG
    (``infos``' trailing column, counted). libjpeg never reads what follows (an appended image, a
    vendor's trailer); a GPU decoder is not asked to agree. ``buffers`` (``routing.as_buffers``)
    itself where no file has such bytes; the others are memoryviews of theirs, never copies."""
    trailing = infos.column("trailing")
    rows = np.flatnonzero(trailing > 0)
    if not len(rows):
        return buffers
    trimmed = list(buffers)
    for i, extra in zip(rows.tolist(), trailing[rows].tolist()):
        view = memoryview(buffers[i]).cast("B")
        trimmed[i] = view[:len(view) - extra]
    return trimmed


def native_boxes(boxes: Any) -> np.ndarray:
    """Boxes as the native calls read them: C-contiguous int64 or float64 [N, 4]."""
    boxes = np.ascontiguousarray(boxes)
    return boxes if boxes.dtype in (np.int64, np.float64) else np.ascontiguousarray(boxes, dtype=np.float64)


# _C.gpu_refusals' codes (csrc/decode/gpu_routes.h GpuRefusal), in words
REFUSALS = {1: "a window resize or a strict decode", 2: "no readable JPEG header",
            3: "its color space (CMYK, YCCK, or coded as RGB)", 4: "over max_pixels",
            5: "its scans (over max_scans, or not counted)",
            6: "no EOI marker ends the JPEG (a truncated file)",
            7: "the box (outside the image, fractional, or not the output's size without a resize)",
            8: "its marker layout (bytes or markers between segments that libjpeg skips with a warning, a second "
               "frame header, an unknown marker, scans or tables libjpeg refuses)",
            9: "its sampling (a component sampled more finely than the first: DALI's crop decode differs)"}


def ineligible_reasons(name: str, codes: np.ndarray) -> dict:
    """``{row: why}`` of the samples :func:`refusals` (``codes``) keeps from the GPU decoder
    ``name``: each one's first refusal, in words."""
    rows = np.flatnonzero(codes)
    return {int(i): f"not decodable by {name} with gpupipe's semantics: {REFUSALS.get(c, c)}"
            for i, c in zip(rows.tolist(), codes[rows].tolist())}


def decode_on_cpu(status: BatchStatus, reasons: dict, buffers: Sequence, boxes: np.ndarray, out: torch.Tensor,
                  options: DecodeOptions, infos: HeaderInfos) -> None:
    """The samples ``reasons`` names (``{index: why a GPU decoder did not take it}``), decoded by
    the CPU core into their slots of ``out`` (on a CUDA ``out``: from pinned memory, one copy),
    each with its exact result (route ``cpu-fallback``, the reason in ``fallback``) or its exact
    error, merged into ``status``."""
    idx = np.array(sorted(reasons), dtype=np.int64)
    host = torch.empty((len(idx), *out.shape[1:]), dtype=torch.uint8, pin_memory=out.is_cuda)
    sub = cpu.decode([buffers[i] for i in idx], np.ascontiguousarray(boxes[idx]), host, options, infos.select(idx))
    sub.route[sub.kind == 0] = Route.CPU_FALLBACK
    sub.fallback.update({k: reasons[int(i)] for k, i in enumerate(idx) if sub.kind[k] == 0})
    status.merge(sub, idx)
    scatter(out, idx, host)


def scatter(out: torch.Tensor, rows: np.ndarray, host: torch.Tensor) -> None:
    """out[rows] = host (host -> device without blocking the host: pinned memory, one copy)."""
    if out.device.type == "cpu":
        out.index_copy_(0, torch.from_numpy(rows), host)
        return
    sub = host.to(out.device, non_blocking=True)
    out.index_copy_(0, to_device(rows, out.device), sub)


def decode_with_fallback(name: str, gpu_decode: Callable[[np.ndarray, Sequence], Optional[GpuOutcome]],
                         buffers: Sequence, boxes: np.ndarray, out: torch.Tensor, options: DecodeOptions,
                         infos: HeaderInfos, *, device_errors: str = "fallback") -> BatchStatus:
    """The frame every GPU backend shares: ``gpu_decode(indices, datas)`` decodes the eligible
    samples into ``out[indices]`` from ``datas`` (the buffers as :func:`gpu_inputs` gives them);
    the others are decoded by the CPU core. ``gpu_decode`` returns None (all decoded, route
    ``Route.GPU``) or a :class:`GpuOutcome` (routes, and samples it declined: to
    the CPU core too). When it raises, ``device_errors="fallback"`` (torchvision's decoder, which
    fails a batch for one bad sample) decodes the whole batch with the CPU core instead;
    ``"raise"`` (nvImageCodec's engines, which decline bad samples and raise only for a device
    error) lets the error fail the batch."""
    n = len(buffers)
    status = BatchStatus.empty(n)
    infos.count_scans(buffers)
    codes = refusals(infos, boxes, options)  # (once: the reasons are worded from the same codes)
    eligible = codes == 0
    reasons = ineligible_reasons(name, codes)
    gpu_idx = np.flatnonzero(eligible)
    if len(gpu_idx):
        try:
            outcome = gpu_decode(gpu_idx, gpu_inputs(buffers, infos))
        except Exception as e:  # GPU decoders fail a whole batch for one bad sample
            if device_errors == "raise":
                raise
            message = f"{name} failed on the batch ({brief(e, 240)}); decoded by the CPU core"
            reasons.update({int(i): message for i in gpu_idx})
        else:
            if outcome is None:
                status.route[gpu_idx] = Route.GPU
            else:
                status.route[gpu_idx] = outcome.routes
                reasons.update({int(i): f"declined by {reason}; decoded by the CPU core"
                                for i, reason in outcome.declined.items()})
    if reasons:
        decode_on_cpu(status, reasons, buffers, boxes, out, options, infos)
    return status
