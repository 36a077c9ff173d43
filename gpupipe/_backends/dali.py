"""The DALI backend: fn.decoders.image_slice with absolute anchors (nvJPEG on ``device="mixed"``,
with the hardware JPEG decoder where present; libjpeg-turbo in DALI's CPU operators), then
fn.resize with antialiasing for resized crops. Pipelines are built once per (batch size bucket,
output size, mode, device) and reused. DALI is imported lazily: gpupipe works without it."""

from __future__ import annotations

import re
import threading
from typing import Optional, Sequence

import numpy as np
import torch

from gpupipe import _C, _stderr
from gpupipe._args import concrete_device
from gpupipe._backends import gpu_fallback
from gpupipe._transfer import to_device
from gpupipe.decode_types import BatchStatus, DecodeOptions, HeaderInfos

PACKAGE = "nvidia-dali-cuda120"
KEEP_PIPELINES = 8  # built pipelines kept, the latest used (each holds its threads: ~7 on the CPU)
KEEP_BUILD_MESSAGES = 64
_pipelines: dict = {}  # in order of use, the latest last
_lock = threading.Lock()


name = "dali"


def unavailable_reason(device: Optional[torch.device] = None) -> Optional[str]:
    try:
        import nvidia.dali  # noqa: F401
    except Exception as e:
        return f"NVIDIA DALI is not installed ({type(e).__name__}): pip install 'torch-gpupipe[dali]' (package {PACKAGE})"
    if device is not None and device.type == "cuda" and not torch.cuda.is_available():
        return "DALI's GPU decoder needs a CUDA device (torch.cuda.is_available() is False)"
    return None


def _bucket(n: int) -> int:
    b = 8
    while b < n:
        b *= 2
    return b


def _pipeline(max_batch: int, out_hw, resize: bool, mode: str, device: torch.device, num_threads: int):
    device = concrete_device(device)  # (the key names the device DALI runs on)
    key = (max_batch, tuple(out_hw), resize, mode, device.type, device.index, num_threads)
    with _lock:
        found = _pipelines.pop(key, None)
        if found is not None:
            _pipelines[key] = found  # (the latest used)
            return found
        import nvidia.dali.fn as fn
        import nvidia.dali.types as types
        from nvidia.dali import pipeline_def

        gpu = device.type == "cuda"
        device_id = device.index if gpu else None

        @pipeline_def(batch_size=max_batch, num_threads=num_threads, device_id=device_id, exec_dynamic=True,
                      prefetch_queue_depth=1)
        def build():
            data = fn.external_source(name="data", dtype=types.UINT8)
            anchor = fn.external_source(name="anchor", dtype=types.INT64)
            shape = fn.external_source(name="shape", dtype=types.INT64)
            # adjust_orientation=False: boxes are in the stored frame; gpupipe applies EXIF orientation itself
            img = fn.decoders.image_slice(data, anchor, shape, normalized_anchor=False, normalized_shape=False,
                                          adjust_orientation=False,
                                          output_type=types.RGB if mode == "rgb" else types.GRAY,
                                          device="mixed" if gpu else "cpu")
            if resize:
                img = fn.resize(img, resize_x=out_hw[1], resize_y=out_hw[0], antialias=True,
                                interp_type=types.INTERP_LINEAR)
            return img

        # what DALI's codec library prints while the pipeline starts (e.g. "[nvjpeg-ext] Failed to load
        # nvJPEG library" where no GPU's driver is: optional, unused here) is kept, not sent to stderr
        with _stderr_captured() as printed:
            pipe = build()
            pipe.build()
        BUILD_MESSAGES.extend(printed)
        del BUILD_MESSAGES[:-KEEP_BUILD_MESSAGES]
        # feed_input and run are one step: two threads on one pipeline (two Loaders, or an epoch and
        # the one started ahead of it) would otherwise take each other's batches
        _pipelines[key] = found = (pipe, threading.Lock())
        while len(_pipelines) > KEEP_PIPELINES:  # the least recently used goes (a call running it keeps it)
            del _pipelines[next(iter(_pipelines))]
        return found


def _forget(pipe) -> None:
    with _lock:
        for k, (v, _) in list(_pipelines.items()):
            if v is pipe:
                del _pipelines[k]


def _stderr_captured():
    """Descriptor 2 redirected around a DALI run: yields the lines that were DALI's or libjpeg's,
    and the pieces of DALI's lines its threads interleaved (colour codes, or a line starting with
    the rest of a component tag) once a line of the run was DALI's."""
    return _stderr.captured(_is_decoder_message, _is_dali_fragment)


def _is_decoder_message(line: str) -> bool:
    text = _ANSI.sub("", line).strip()
    return bool(text) and (_DALI_LOG.match(text) is not None or _LIBJPEG.match(text) is not None)


def _is_dali_fragment(line: str) -> bool:
    return "\x1b[" in line or line.lstrip().startswith("]")


# DALI's logger: "[ERROR] [component] message" (with colour codes, removed first), its components
# those of DALI and its codec library (jpeg_parser, nvjpeg-ext, ...: a user's "[INFO] [train] ..."
# is not one); libjpeg's message formats (those of the libjpeg gpupipe links; DALI's bundled one
# shares them): the text before the first conversion, at the start of a line. Anything else written
# meanwhile is passed on to stderr.
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_DALI_LOG = re.compile(r"\[(ERROR|WARNING|INFO|DEBUG)\] ?\[[A-Za-z0-9_:. -]*(ext|parser|decoder|encoder|codec|nvjpeg|"
                       r"nvimg|dali)[A-Za-z0-9_:. -]*[\]\[]", re.IGNORECASE)
BUILD_MESSAGES: list = []  # what DALI printed while its pipelines started
# (libjpeg-turbo 3's texts where they differ from those of the 2.1 gpupipe links: DALI's
# nvImageCodec and OpenCV bundle 3.1)
_LIBJPEG3_MESSAGES = ("Invalid progressive/lossless parameters Ss=%d Se=%d Ah=%d Al=%d",
                      "Invalid restart interval %d; must be an integer multiple of the number of MCUs in an MCU row")
_LIBJPEG = re.compile("|".join(sorted({re.escape(f.split("%")[0]) for f in (*_C.LIBJPEG_MESSAGES, *_LIBJPEG3_MESSAGES)
                                        if len(f.split("%")[0]) >= 8}, key=len, reverse=True)))


class DaliReportedProblems(RuntimeError):
    """DALI decoded the batch but its decoder printed warnings or errors (corrupt data): the batch
    is decoded by the CPU core instead, which attributes each warning or error to its sample."""


def decode(buffers: Sequence, boxes: np.ndarray, out: torch.Tensor, options: DecodeOptions,
           infos: HeaderInfos) -> BatchStatus:
    """Decodes into ``out`` (on the output device); what DALI cannot take, the CPU core decodes."""
    reason = unavailable_reason(out.device)
    if reason:
        raise RuntimeError(reason)
    threads = options.num_threads or _C.default_num_threads()

    def gpu_decode(idx: np.ndarray, datas: Sequence) -> None:
        pipe, lock = _pipeline(_bucket(len(idx)), out.shape[1:3], options.resize, options.mode, out.device, threads)
        with lock:
            try:
                pipe.feed_input("data", [np.frombuffer(datas[i], dtype=np.uint8) for i in idx])
                pipe.feed_input("anchor", [np.array([boxes[i, 1], boxes[i, 0]], dtype=np.int64) for i in idx])  # (x, y)
                pipe.feed_input("shape", [np.array([boxes[i, 3], boxes[i, 2]], dtype=np.int64) for i in idx])  # (w, h)
                with _stderr_captured() as messages:
                    (images,) = pipe.run()
            except Exception:
                _forget(pipe)  # a pipeline that failed is not reused
                raise
            if messages:
                raise DaliReportedProblems("; ".join(messages[:3]))
            _copy_out(images, out, idx)  # (the pipeline's outputs are valid until its next run)

    return gpu_fallback.decode_with_fallback("DALI", gpu_decode, buffers, boxes, out, options, infos)


def _copy_out(images, out_nhwc: torch.Tensor, idx: np.ndarray) -> None:
    dense = images.as_tensor()
    if tuple(dense.shape()) != (len(idx), *out_nhwc.shape[1:]):  # (never reshaped into place: wrong pixels)
        raise RuntimeError(f"DALI gave images of shape {tuple(dense.shape())}, not {(len(idx), *out_nhwc.shape[1:])}")
    if out_nhwc.is_cuda:
        from nvidia.dali.plugin.pytorch import feed_ndarray

        tmp = torch.empty(tuple(dense.shape()), dtype=torch.uint8, device=out_nhwc.device)
        stream = torch.cuda.current_stream(out_nhwc.device)
        feed_ndarray(dense, tmp, cuda_stream=stream)
        # the copy is queued on this stream, not DALI's: done before the pipeline's next run, which
        # may reuse the output's memory (the caller holds the pipeline's lock until this returns);
        # waited for on a blocking event (a stream's synchronize() spins a core by CUDA's default)
        done = torch.cuda.Event(blocking=True)
        done.record(stream)
        done.synchronize()
    else:
        tmp = torch.from_numpy(np.asarray(dense))
    if len(idx) == out_nhwc.shape[0]:
        out_nhwc.copy_(tmp.reshape(out_nhwc.shape))
    else:
        rows = to_device(idx, out_nhwc.device)
        out_nhwc[rows] = tmp.reshape((len(idx), *out_nhwc.shape[1:]))
