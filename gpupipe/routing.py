"""``decode_into``: the one decode mechanism behind :func:`gpupipe.decode_crop_jpegs`,
:class:`gpupipe.data.DecodeCropDataset` and :class:`gpupipe.Loader`.

One batch, one pass::

    datas -> headers, read once (or handed in by the caller, who read them to draw the boxes)
          -> JPEG        -> the backend (cpu | dali | nvjpeg; a GPU backend hands what it cannot
                            take to the CPU core, route "cpu-fallback")
          -> not a JPEG  -> Pillow (route "pillow"), or NotAJpegError with non_jpeg="error"
          -> unreadable  -> its error kind
       EXIF orientation, when asked for, around every route; failed slots zeroed here, once.

It applies no error policy: it reports, per sample, the outcome (:class:`BatchStatus`); the
callers apply one policy function (:mod:`gpupipe.error_policy`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional, Sequence

import numpy as np
import torch

from gpupipe import _C, crops, orientation
from gpupipe._backends import hybrid, pillow
from gpupipe.backends import BACKENDS
from gpupipe.decode_types import BatchStatus, DecodeOptions, HeaderInfos, Route, read_infos
from gpupipe._buffers import as_buffer
from gpupipe._transfer import to_device
from gpupipe._errors import ErrorKind
from gpupipe.keyed import key_int



def as_buffers(datas: Sequence[Any]) -> list:
    """Buffer-protocol views of the encoded samples (no copy); TypeError/ValueError naming the sample."""
    if all(type(d) is bytes or (type(d) is memoryview and d.contiguous) for d in datas):  # the Loader's reads
        return datas if isinstance(datas, list) else list(datas)
    return [as_buffer(d, f"datas[{i}]") for i, d in enumerate(datas)]


def probe(buffers: Sequence, options: Optional[DecodeOptions] = None) -> HeaderInfos:
    """The headers of a batch: every JPEG header in one C++ call, then, for the files that are not
    JPEGs, Pillow's (unless ``options.non_jpeg == "error"``). Decodes no pixels."""
    return _with_pillow(buffers, read_infos(buffers, scans=_counts_scans(options)), options)


def _counts_scans(options: Optional[DecodeOptions]) -> bool:
    """Whether a probe counts each header's scans (reading the whole file): for the GPU decoders'
    eligibility only; the CPU core enforces ``max_scans`` as it decodes."""
    return options is None or options.backend != "cpu"


def _with_pillow(buffers: Sequence, infos: HeaderInfos, options: Optional[DecodeOptions]) -> HeaderInfos:
    """:func:`probe`'s second half: Pillow's headers for the files that are not JPEGs."""
    if options is None or options.non_jpeg == "pillow":
        others = np.flatnonzero(infos.kind == ErrorKind.NOT_JPEG)
        if len(others):
            infos.pillow, failed = pillow.probe(buffers, others, infos.messages,
                                                 options is not None and options.apply_exif_orientation)
            for i, (kind, message) in failed.items():
                infos.table[i, -1] = int(kind)
                infos.messages[i] = message
    return infos


def plan_batch(datas: Sequence[Any], crop, options: DecodeOptions, *, seed: int, epoch: int, indices,
               read_errors: Optional[dict] = None) -> tuple[list, HeaderInfos, np.ndarray]:
    """What a batch needs before decoding, from its bytes: buffers, the headers (read once; the
    samples in ``read_errors`` marked ``READ``), and the crop boxes drawn from each image's size as
    displayed (the images too small for a crop that does not resize marked ``INVALID_ARGUMENT``).

    Returns:
        (buffers, infos, boxes): to hand to :func:`decode_into`.
    """
    read_errors = read_errors or {}
    buffers = as_buffers([b"" if i in read_errors else d for i, d in enumerate(datas)] if read_errors else datas)
    if not read_errors and not options.apply_exif_orientation and type(crop) is crops.RandomResizedCrop:
        infos, boxes = _plan_random_resized_crops(buffers, crop, options, seed, epoch, indices)
        if boxes is not None:
            return buffers, infos, boxes
        infos = _with_pillow(buffers, infos, options)  # (a header that is not a JPEG's: the general path, read once)
    else:
        infos = probe(buffers, options)
    for i, message in read_errors.items():
        infos.fail(i, ErrorKind.READ, message)
    h, w = infos.sizes(displayed=options.apply_exif_orientation)
    boxes, small = crop.plan(h, w, seed=seed, epoch=epoch, indices=indices)
    for i, message in small.items():
        infos.fail(i, ErrorKind.INVALID_ARGUMENT, message)
    if crop.pads and not crop.resize:  # boxes smaller than the output: zero-padded around (CenterCrop)
        known = np.flatnonzero((h > 0) & (w > 0) & ((boxes[:, 2] != options.size[0]) | (boxes[:, 3] != options.size[1])))
        if len(known):
            where = crop.placement(h[known], w[known])
            infos.pads = {int(i): (int(t), int(l)) for i, (t, l) in zip(known, where)}
    return buffers, infos, boxes


def _plan_random_resized_crops(buffers: list, crop: "crops.RandomResizedCrop", options: DecodeOptions, seed: int,
                               epoch: int, indices) -> tuple[HeaderInfos, Optional[np.ndarray]]:
    """The training sampler's batch: its JPEG headers, and when every one was read, its boxes, in
    one native call (the same table and boxes as read_infos, sizes and crop.plan: no Python per
    step). Boxes None: the general path sorts the batch out from these headers."""
    n = len(buffers)
    table = np.empty((n, len(_C.INFO_COLUMNS)), dtype=np.int64)
    failures, boxes = _C.plan_random_resized_crops(
        buffers, table.ctypes.data, table.nbytes, _counts_scans(options), key_int(seed, "seed"),
        key_int(epoch, "epoch"), crop._indices(indices, n), *crop.native_range())
    return HeaderInfos.from_native(table, failures), boxes


def decode_into(datas: Sequence[Any], boxes: np.ndarray, out: torch.Tensor, options: DecodeOptions, *,
                infos: Optional[HeaderInfos] = None, keys: Optional[hybrid.RouteKeys] = None,
                shares: Optional[hybrid.Shares] = None, engines: Optional[dict] = None,
                workers: Optional[hybrid.Workers] = None) -> BatchStatus:
    """Decodes the crop ``boxes[i]`` of ``datas[i]`` into ``out[i]`` for every sample.

    Args:
        datas: N encoded images (objects exporting the buffer protocol, 1-D uint8 arrays/tensors).
        boxes: int64 or float64 ``[N, 4]`` (top, left, height, width); displayed frame when
            ``options.apply_exif_orientation``.
        out: uint8 ``[N, H, W, C]`` contiguous on ``options.device``, ``(H, W) = options.size``.
        options: how to decode (:class:`DecodeOptions`, the backend already resolved).
        infos: the batch's headers when the caller already read them (:func:`probe`).
        keys, shares: the hybrid backend's routes: the samples' (seed, epoch, index) and the
            epoch's engine shares (default: positions in the call, the starting shares).
        engines, workers: the hybrid backend's GPU engines and their threads to run on (a Loader's,
            shared by its epochs); default: the device's engines, and threads made for the call.

    Returns:
        BatchStatus: per sample, its error kind and message, warning, and route. Failed samples'
        slots are zero.
    """
    n = len(datas)
    buffers = as_buffers(datas)
    boxes = np.asarray(boxes)
    expected = (n, *options.size, options.channels)
    if tuple(out.shape) != expected or out.dtype != torch.uint8 or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous uint8 tensor of shape {list(expected)}, got {out.dtype} "
                         f"{list(out.shape)}")
    if infos is None:
        infos = probe(buffers, options)
    backend = BACKENDS.get(options.backend)
    if backend is None:  # (DecodeOptions is public: its backend is a resolved name, "auto" is not one)
        raise ValueError(f"options.backend must be one of {list(BACKENDS)}, got {options.backend!r}")
    if options.backend == "hybrid":  # routes keyed by sample: the keys follow every sub-batch
        keys = keys or hybrid.RouteKeys(0, 0, np.arange(n, dtype=np.int64))
        backend = _Keyed(keys, shares, engines, workers)
    if straight(infos, options):
        status = backend.decode(buffers, np.ascontiguousarray(boxes), out, options, infos)
    else:
        status = _decode_mixed(buffers, boxes, out, options, infos, backend)
    failed = np.flatnonzero(status.kind != ErrorKind.NONE)
    if len(failed):
        out[to_device(failed, out.device)] = 0
    return status


class _Keyed:
    """The hybrid backend with a batch's route keys bound: ``select(rows)`` for a sub-batch."""

    def __init__(self, keys: hybrid.RouteKeys, shares: Optional[hybrid.Shares], engines: Optional[dict] = None,
                 workers: Optional[hybrid.Workers] = None):
        self.keys, self.shares, self.engines, self.workers = keys, shares, engines, workers

    def select(self, rows: np.ndarray) -> "_Keyed":
        return _Keyed(self.keys.select(rows), self.shares, self.engines, self.workers)

    def decode(self, buffers, boxes, out, options, infos) -> BatchStatus:
        return hybrid.decode(buffers, boxes, out, options, infos, keys=self.keys, shares=self.shares,
                             engines=self.engines, workers=self.workers)


def straight(infos: HeaderInfos, options: DecodeOptions) -> bool:
    """Whether a batch goes straight to its backend, every sample into its own slot: every header a
    readable JPEG's, no EXIF orientation to apply, no box to pad (else _decode_mixed sorts it out)."""
    return not options.apply_exif_orientation and not infos.kind.any() and not infos.pads


def _decode_mixed(buffers: list, boxes: np.ndarray, out: torch.Tensor, options: DecodeOptions, infos: HeaderInfos,
                  backend) -> BatchStatus:
    """decode_into for a batch with failed headers, Pillow's files, EXIF orientation to apply or
    boxes to pad."""
    n = len(buffers)
    status = BatchStatus.empty(n)
    padded = np.array(sorted(infos.pads), dtype=np.int64)
    if len(padded):
        _decode_padded(padded, buffers, boxes, out, options, infos, backend, status)
    jpeg = np.setdiff1d(np.flatnonzero(infos.kind == ErrorKind.NONE), padded)
    images = np.array(sorted(infos.pillow), dtype=np.int64) if options.non_jpeg == "pillow" else np.zeros(0, np.int64)
    images = np.setdiff1d(images, padded)
    for i in np.setdiff1d(np.flatnonzero(infos.kind != ErrorKind.NONE), np.union1d(images, padded)):
        status.fail(int(i), int(infos.kind[i]), infos.messages.get(int(i), "unreadable header"))

    if len(jpeg) == n and not options.apply_exif_orientation:
        status.merge(backend.decode(buffers, np.ascontiguousarray(boxes), out, options, infos), np.arange(n))
    else:
        for rows, stored, turns, transposed in _frames(jpeg, boxes, infos, options):
            size = options.size[::-1] if transposed else options.size
            sub_options = dataclasses.replace(options, size=tuple(size))
            sub_out = torch.empty((len(rows), *size, options.channels), dtype=torch.uint8, device=out.device)
            sub_backend = backend.select(rows) if isinstance(backend, _Keyed) else backend
            status.merge(sub_backend.decode([buffers[i] for i in rows], stored, sub_out, sub_options,
                                            infos.select(rows)), rows)
            slots = to_device(rows, out.device)
            for turn in np.unique(turns):  # into the displayed frame, one orientation at a time
                sel = to_device(np.flatnonzero(turns == turn), out.device)
                out[slots[sel]] = orientation.to_display(sub_out[sel], int(turn))
    if len(images):
        sub_out = torch.empty((len(images), *out.shape[1:]), dtype=torch.uint8, device=out.device)
        h, w = infos.sizes(displayed=options.apply_exif_orientation)
        status.merge(pillow.decode([buffers[i] for i in images], boxes[images], sub_out, options,
                                   [(h[i], w[i]) for i in images]), images)
        out[to_device(images, out.device)] = sub_out
    return status


def _decode_padded(rows: np.ndarray, buffers: list, boxes: np.ndarray, out: torch.Tensor, options: DecodeOptions,
                   infos: HeaderInfos, backend, status: BatchStatus) -> None:
    """The samples whose box is smaller than the output: decoded at the box's size (each group of
    one size and place together, as any batch), then written at their place in zeroed slots, as
    torchvision's CenterCrop pads."""
    where = np.array([infos.pads[int(i)] for i in rows], dtype=np.int64).reshape(-1, 2)
    groups = np.concatenate([boxes[rows][:, 2:].astype(np.int64), where], axis=1)
    for key in np.unique(groups, axis=0):
        sel = rows[(groups == key).all(axis=1)]
        h, w, top, left = (int(v) for v in key)
        sub_options = dataclasses.replace(options, size=(h, w))
        sub_infos = infos.select(sel)
        sub_infos.pads = {}
        sub_out = torch.zeros((len(sel), h, w, options.channels), dtype=torch.uint8, device=out.device)
        sub_backend = backend.select(sel) if isinstance(backend, _Keyed) else backend
        status.merge(_decode_mixed([buffers[i] for i in sel], np.ascontiguousarray(boxes[sel]), sub_out,
                                   sub_options, sub_infos, sub_backend), sel)
        slots = to_device(sel, out.device)
        padded = torch.zeros((len(sel), *out.shape[1:]), dtype=torch.uint8, device=out.device)
        padded[:, top:top + h, left:left + w] = sub_out
        out[slots] = padded


def _frames(rows: np.ndarray, boxes: np.ndarray, infos: HeaderInfos, options: DecodeOptions):
    """(rows, boxes in the stored frame, EXIF orientations, transposed) groups to decode together:
    the orientations that keep the frame's height and width, then those that swap them."""
    if not len(rows):
        return
    if not options.apply_exif_orientation:
        yield rows, np.ascontiguousarray(boxes[rows]), np.ones(len(rows), np.int64), False
        return
    o = infos.column("orientation")[rows]
    o = np.where(o >= 1, o, 1)
    stored = orientation.stored_boxes(boxes[rows], o, infos.column("height")[rows], infos.column("width")[rows])
    swap = np.isin(o, orientation.TRANSPOSED)
    for transposed in (False, True):
        sel = np.flatnonzero(swap == transposed)
        if len(sel):
            yield rows[sel], np.ascontiguousarray(stored[sel]), o[sel], transposed


__all__ = ["decode_into", "plan_batch", "probe", "DecodeOptions", "BatchStatus", "HeaderInfos", "Route", "BACKENDS"]
