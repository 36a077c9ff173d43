"""nvImageCodec's two GPU JPEG decoders as gpupipe engines: whole images decoded on the GPU, then
ONE kernel crops and resizes the ragged batch into its slots (``crop_resize.crop_resize_ragged``).

``Engine("hardware", device)`` is the GPU's JPEG engines (A100, H100, B200: nvJPEG's hardware
backend, nvImageCodec's ``nvjpeg_hw_decoder``, ``BackendKind.HW_GPU_ONLY``); ``Engine("cuda",
device)`` is nvJPEG's CUDA decoder on the SMs (``nvjpeg_cuda_decoder``, which nvImageCodec
registers as ``BackendKind.HYBRID_CPU_GPU``: its Huffman decoding runs on the host below a size
threshold, set here to 0 so that it runs on the GPU). Each engine is one ``nvimgcodec.Decoder``
restricted to its backend, so a sample it cannot decode comes back as ``None`` and is *declined*:
the caller hands it to the next engine or the CPU core, never loses it.

What nvImageCodec's Python API does, as used here (nvidia-nvimgcodec-cu13 0.9.0.20: its pybind
docstrings, and github.com/NVIDIA/nvImageCodec ``python/decoder.cpp``, ``python/image.cpp``,
``src/imgproc/device_buffer.cpp``, ``extensions/nvjpeg/{hw,cuda}_decoder.cpp``):

- ``Decoder.decode(code_streams, params=..., cuda_stream=...)`` decodes a batch and returns one
  ``Image`` or ``None`` per stream; an internal failure of the whole call also becomes ``None``
  everywhere (logged, not raised). The decoders run on ``cuda_stream`` (torch's current stream
  here), so the crop kernel launched after it on that stream sees the pixels.
- A decoded ``Image`` owns a device buffer taken with ``cudaMallocAsync`` on that stream and given
  back with ``cudaFreeAsync`` on it (plain ``cudaMalloc``/``cudaFree`` where the device has no
  memory pools): dropping the Images after the crop kernel is queued is stream-ordered and safe.
- ``Image.__cuda_array_interface__``: ``shape`` (H, W, C) for the interleaved outputs asked for
  here, ``strides`` None when rows are packed (else (row pitch, C, 1)), ``data`` (pointer, False),
  ``typestr`` ``|u1``. Decoding into caller memory is not offered (``images=`` only reuses Images
  nvImageCodec allocated itself).
- Logging goes to std::cerr at ``PYNVIMGCODEC_VERBOSITY`` (default 2: errors and warnings, one
  line per declined sample), read once when the module is first imported: gpupipe sets it to 0
  unless the user did, before importing it. Decoder options: ``:fancy_upsampling=1`` (libjpeg's
  triangle chroma upsampling, as the CPU core), ``nvjpeg_cuda_decoder:hybrid_huffman_threshold``,
  ``nvjpeg_hw_decoder:preallocate_batch_size``, ``:enable_roi_fancy_upsampling`` (ROI with fancy
  upsampling on nvJPEG < 13.2: declined otherwise, as the edge pixel may be wrong).

Gray output is ``ColorSpec.GRAY`` (nvJPEG's Y plane, which is what libjpeg gives for a YCbCr or
gray file: the same IDCT, no color conversion); files coded as RGB are never sent here (both decoders
convert them as YCbCr; ``gpu_fallback.gpu_eligible``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import io
import os
import sys
import threading
import time
from typing import Any, Optional, Sequence

import numpy as np
import torch

from gpupipe._args import concrete_device
from gpupipe._errors import brief
from gpupipe.decode_types import DecodeOptions, Route

KINDS = ("hardware", "cuda")
ROUTES = {"hardware": Route.GPU_HARDWARE, "cuda": Route.GPU_CUDA}
INSTALL = "pip install 'torch-gpupipe[gpu]' (nvidia-nvimgcodec-cu13 with nvJPEG)"

# Settings the GPU session measures (issue 29); each is one place to change.
CPU_THREADS = 2  #: nvImageCodec's host threads per engine (header parsing, batching); few, the CPU pool decodes too
# Pixels above which the CUDA decoder decodes Huffman on the GPU (nvImageCodec's default). On an H200,
# 800x533 photos, 2 host threads: 1,259 images/s with it, 974 with every image's Huffman on the GPU.
CUDA_HUFFMAN_ON_GPU_ABOVE = 1_000_000
HW_PREALLOCATE_BATCH = 256  #: the hardware decoder's preallocated batch (DALI passes its max batch size)
ROI_MARGIN = 8  #: pixels decoded around a box with ``roi=True`` (the edge pixel of an ROI may differ)
# Decode through nvImageCodec's C API (gpupipe._C_cuda.NvimgcodecDecoder: parse, decode into one buffer
# and statuses in ONE GIL-free call) where gpupipe was built with its header; False: its Python API
# (a CodeStream object and a __cuda_array_interface__ read per image, under the GIL).
NATIVE = True


def _library():
    """The nvidia.nvimgcodec module, imported with its logging off unless the user set it (the
    library reads the variable once, at import: it is set for the import only, so the user's
    processes and children keep their own environment) and what it prints kept in LIBRARY_MESSAGES."""
    if "PYNVIMGCODEC_VERBOSITY" in os.environ or sys.modules.get("nvidia.nvimgcodec") is not None:
        return importlib.import_module("nvidia.nvimgcodec")  # (waits for an import under way in another thread)
    from gpupipe import _stderr

    os.environ["PYNVIMGCODEC_VERBOSITY"] = "0"
    printed: list = []
    try:  # its extensions print, whatever the verbosity, that optional codecs (nvJPEG2000, nvTIFF) are absent
        with _stderr.captured(_is_library_line) as printed:
            return importlib.import_module("nvidia.nvimgcodec")
    finally:
        os.environ.pop("PYNVIMGCODEC_VERBOSITY", None)
        LIBRARY_MESSAGES.extend(printed)


# The device calls, one place each (the tests run the engine's logic on the CPU through them).
def _device_context(device: torch.device) -> contextlib.AbstractContextManager:
    return torch.cuda.device(device)


def _current_stream(device: torch.device) -> "torch.cuda.Stream":
    return torch.cuda.current_stream(device)


def _synchronize(stream: "torch.cuda.Stream") -> None:
    """Waits for the engine's own stream only (never the whole device: the training step runs there)."""
    stream.synchronize()


def _check_out(name: str, out: torch.Tensor, device: torch.device, channels: int) -> None:
    if not (out.is_cuda and out.device == device and out.dtype == torch.uint8 and out.dim() == 4
            and out.is_contiguous() and out.shape[-1] == channels):
        raise ValueError(f"{name}: out must be uint8 NHWC contiguous on {device} with {channels} channels, "
                         f"got {tuple(out.shape)} {out.dtype} on {out.device}")


def unavailable_reason(device: Optional[torch.device] = None) -> Optional[str]:
    """Why nvImageCodec's engines cannot run here (for outputs on ``device``), or None. Cheap: it
    imports the library and asks torch for a device; whether the decoders start is known from
    :func:`engine`."""
    try:
        _library()
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] == "nvidia":
            return f"nvImageCodec is not installed: {INSTALL}"
        return f"nvImageCodec is not importable ({type(e).__name__}: {e})"
    except Exception as e:  # a broken install: a missing CUDA runtime, a wrong wheel
        said = f"; it printed: {' | '.join(LIBRARY_MESSAGES[-3:])[:300]}" if LIBRARY_MESSAGES else ""
        return f"nvImageCodec is not importable ({brief(e, 240)}{said}): {INSTALL}"
    if device is not None and torch.device(device).type != "cuda":
        return f"nvImageCodec's engines decode into GPU memory, not {torch.device(device)}: pass device='cuda'"
    if not torch.cuda.is_available():
        return "no CUDA device (torch.cuda.is_available() is False)"
    return crop_kernel_reason()


def _decoder_options(kind: str, roi: bool, fancy_upsampling: bool = True) -> str:
    """nvImageCodec's decoder options of one engine (both APIs)."""
    if kind == "hardware":
        options = [f"nvjpeg_hw_decoder:preallocate_batch_size={HW_PREALLOCATE_BATCH}"]
    elif kind == "cuda":
        options = [f"nvjpeg_cuda_decoder:hybrid_huffman_threshold={CUDA_HUFFMAN_ON_GPU_ABOVE}"]
    else:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    options.insert(0, f":fancy_upsampling={int(fancy_upsampling)}")
    if roi and fancy_upsampling:
        options.append(":enable_roi_fancy_upsampling=1")
    return " ".join(options)


def _decoder_args(lib: Any, kind: str, cpu_threads: int, roi: bool, fancy_upsampling: bool = True) -> dict:
    """The keyword arguments of ``nvimgcodec.Decoder`` for one engine (without ``device_id``)."""
    options = _decoder_options(kind, roi, fancy_upsampling)
    if kind == "hardware":
        backends = [lib.Backend(lib.BackendKind.HW_GPU_ONLY, load_hint=1.0)]
    else:  # nvjpeg_cuda_decoder registers as HYBRID_CPU_GPU; GPU_ONLY too, in case a release moves it
        backends = [lib.Backend(lib.BackendKind.GPU_ONLY, load_hint=1.0),
                    lib.Backend(lib.BackendKind.HYBRID_CPU_GPU, load_hint=1.0)]
    return {"max_num_cpu_threads": int(cpu_threads), "backends": backends, "options": options}


def native_reason() -> Optional[str]:
    """Why nvImageCodec's C API path is not there (the engines then use its Python API), or None."""
    try:
        from gpupipe.augment._kernels import _C_cuda
    except Exception as e:  # an import error of the CUDA module itself
        return f"gpupipe's CUDA module is not importable ({type(e).__name__}: {e})"
    if _C_cuda is None or not hasattr(_C_cuda, "NvimgcodecDecoder"):
        return ("gpupipe was built without nvImageCodec's header (install nvidia-nvimgcodec-cu13 before "
                "building gpupipe)")
    return None


def _native_decoder(lib: Any, kind: str, device_index: int, cpu_threads: int, options: str) -> Any:
    """nvImageCodec's decoder through its C API, loaded from the Python package's directory."""
    from gpupipe.augment._kernels import _C_cuda

    return _C_cuda.NvimgcodecDecoder(os.path.dirname(lib.__file__), kind, int(device_index), int(cpu_threads), options)


def _scratch(nbytes: int, device: torch.device) -> torch.Tensor:
    """The C-API path's decode buffer: allocated on the current stream, where the decoder and the crop
    kernel run (dropping it after the kernel is queued is stream-ordered)."""
    return torch.empty(max(int(nbytes), 1), dtype=torch.uint8, device=device)


# What a C-API status means (nvImageCodec's nvimgcodecProcessingStatus, and gpupipe's own < 0).
_STATUSES = {
    -1: "nvImageCodec cannot parse it", -2: "nvImageCodec parses another size than its header says",
    -3: "nvImageCodec reads it as another format than JPEG", -4: "nvImageCodec cannot make its region",
    -5: "its header gives no size (an unreadable header)", -6: "its samples are not 8-bit",
    0x0: "no status", 0x2: "the decoder is saturated", 0x3: "decoding failed", 0x7: "the file is corrupt",
    0xB: "codec unsupported", 0x13: "no allowed backend takes it (a file or variant this decoder does not take)",
    0x23: "encoding unsupported", 0x43: "resolution unsupported", 0x83: "a feature of the file is unsupported",
    0x5: "color spec unsupported", 0x11: "ROI unsupported", 0x21: "chroma subsampling unsupported",
    0x41: "sample type unsupported", 0x81: "sample format unsupported", 0x9: "orientation unsupported",
    0x101: "number of images unsupported", 0x201: "number of planes unsupported", 0x401: "number of channels unsupported"}


def status_reason(code: int) -> str:
    """The decline reason of a C-API status other than 1 (decoded). nvImageCodec's statuses are bit
    masks: bit 0 not decoded; with bit 1, a failure (bits 2-7 say which), without it, a format or
    parameter it does not take (bits 2-12 say which): each reason set is named."""
    code = int(code)
    if code <= 0:
        return _STATUSES.get(code, "no status")
    base = code & 0x3
    said = [_STATUSES[code]] if code in _STATUSES else \
        [_STATUSES[(1 << b) | base] for b in range(2, 31) if code & (1 << b) and ((1 << b) | base) in _STATUSES]
    return f"nvImageCodec declined it: {', '.join(said) or 'declined'} (status {code:#x})"


def _decode_params(lib: Any, mode: str) -> Any:
    return lib.DecodeParams(color_spec=lib.ColorSpec.GRAY if mode == "gray" else lib.ColorSpec.SRGB,
                            apply_exif_orientation=False, allow_any_depth=False)


def roi_regions(boxes: np.ndarray, heights: np.ndarray, widths: np.ndarray, margin: int = ROI_MARGIN) -> np.ndarray:
    """int64 [N, 4] (top, left, bottom, right): each box grown by ``margin`` pixels and clipped to
    its image, the region decoded with ``roi=True``; the box then starts at (top - region top,
    left - region left) of the decoded region."""
    b = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    t, l = b[:, 0].astype(np.int64), b[:, 1].astype(np.int64)
    bottom, right = t + b[:, 2].astype(np.int64), l + b[:, 3].astype(np.int64)
    return np.stack([np.maximum(t - margin, 0), np.maximum(l - margin, 0),
                     np.minimum(bottom + margin, heights), np.minimum(right + margin, widths)], axis=1)


def _image_row(image: Any) -> tuple:
    """(pointer, height, width, channels, row pitch in bytes, typestr) of one decoded Image, or
    None for a sample the decoder declined."""
    if image is None:
        return None
    cai = image.__cuda_array_interface__
    shape, strides = tuple(cai["shape"]), cai.get("strides")
    h, w, c = shape if len(shape) == 3 else (*shape, 1)
    return (int(cai["data"][0]), int(h), int(w), int(c), int(strides[0]) if strides else int(w) * int(c), cai["typestr"])


def image_table(images: Sequence, heights: np.ndarray, widths: np.ndarray, channels: int) -> tuple[np.ndarray, dict]:
    """The crop kernel's table of a decoded batch: int64 [N, 4] rows (data pointer, height, width,
    row pitch in bytes), and ``{k: reason}`` for the samples that cannot be cropped: declined
    (``None``), or decoded to another shape than the header's (height, width) with ``channels``
    uint8 channels (a mismatch is declined, never cropped as garbage). Rows of declined samples are
    zero."""
    rows = [_image_row(im) for im in images]  # the one per-sample step: an attribute read per image
    n = len(rows)
    table = np.zeros((n, 4), dtype=np.int64)
    declined = {}
    if n == 0:
        return table, declined
    present = np.array([r is not None for r in rows])
    vals = np.array([r[:5] if r is not None else (0, 0, 0, 0, 0) for r in rows], dtype=np.int64).reshape(n, 5)
    u8 = np.array([r is not None and r[5] == "|u1" for r in rows])
    ptr, h, w, c, pitch = vals.T
    ok = (present & u8 & (h == np.asarray(heights)) & (w == np.asarray(widths)) & (c == channels)
          & (pitch >= w * c) & (ptr != 0))
    table[ok] = vals[ok][:, [0, 1, 2, 4]]
    for k in np.flatnonzero(~ok):
        if not present[k]:
            declined[int(k)] = "nvImageCodec returned no image (a file or variant this decoder does not take)"
        else:
            declined[int(k)] = (f"decoded as {h[k]}x{w[k]}x{c[k]} {rows[k][5]} (pitch {pitch[k]}), the header says "
                                f"{int(np.asarray(heights)[k])}x{int(np.asarray(widths)[k])}x{channels} uint8")
    return table, declined


def _code_streams(lib: Any, buffers: Sequence) -> tuple[list, dict]:
    """A CodeStream per buffer, parsed now, and ``{k: reason}`` for those nvImageCodec's parser
    refuses (``RuntimeError: Failed to get image info``): declined, not a failed batch."""
    streams, unparsed = [], {}
    for k, b in enumerate(buffers):
        try:
            stream = lib.CodeStream(b)
            stream.height  # the parse is lazy: a file it refuses would otherwise fail the whole decode call
            streams.append(stream)
        except Exception as e:
            unparsed[k] = f"nvImageCodec cannot parse it ({brief(e, 120)})"
            streams.append(None)
    return streams, unparsed


def crop_kernel_reason() -> Optional[str]:
    """Why the ragged crop + resize kernel the engines need is not there, or None."""
    try:
        from gpupipe.augment._kernels import _C_cuda
    except Exception as e:  # an import error of the CUDA module itself
        return f"gpupipe's CUDA kernels are not importable ({type(e).__name__}: {e})"
    if _C_cuda is None or not hasattr(_C_cuda, "crop_resize_ragged"):
        return "gpupipe was built without its CUDA kernels (the crop + resize kernel): rebuild with nvcc on PATH"
    return None


def _crop_resize():
    from gpupipe._backends.crop_resize import crop_resize_ragged

    return crop_resize_ragged


class Engine:
    """One of nvImageCodec's GPU decoders: kind "hardware" (the GPU's JPEG engines: A100, H100,
    B200) or "cuda" (nvJPEG's CUDA decoder on the SMs).

    Args:
        kind: ``"hardware"`` or ``"cuda"``.
        device: the CUDA device it decodes on (outputs must live there).
        roi: decode only each box plus :data:`ROI_MARGIN` pixels (nvImageCodec's regions) instead
            of whole images. Off, by measurement: on an H100 with nvJPEG 13.2.3 the hardware
            decoder takes ROI requests with the same pixels (max 1 level from the CPU core) but
            is slower (RandomResizedCrop 224, batch 256: 15,633 against 17,190 img/s on 800x533
            photos, 4,470 against 4,582 on 1920x1280; in the hybrid Loader 12,257 against 14,504),
            and nvJPEG < 13.2 declines ROI with fancy upsampling.
        cpu_threads: nvImageCodec's host threads for this engine.
        native: call nvImageCodec's C API (``True``: or raise why not), its Python API (``False``),
            or the C API where it is built and starts (``None``, with :data:`NATIVE`). ``api`` says
            which it calls, ``native_reason`` why not the C API.
        fancy_upsampling: libjpeg's chroma upsampling (the CPU core's pixels, within the tolerance
            docs/gpu.md states); False: nvJPEG's plain one (DALI's default,
            ``jpeg_fancy_upsampling=False``), for measurements (``benchmarks.hybrid_probe --part
            variants``).

    Use :func:`engine` (cached, checked by a first decode) rather than constructing one.
    """

    route: Route

    def __init__(self, kind: str, device: torch.device, *, roi: bool = False, cpu_threads: int = CPU_THREADS,
                 native: Optional[bool] = None, fancy_upsampling: bool = True):
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        device = torch.device(device)
        if device.type != "cuda":
            raise ValueError(f"an nvImageCodec engine decodes on a CUDA device, got {device}")
        self.kind, self.roi, self.route = kind, bool(roi), ROUTES[kind]
        self.fancy_upsampling = bool(fancy_upsampling)
        self.device = concrete_device(device)
        self.name = f"nvImageCodec's {kind} decoder on {self.device}"
        self._lib = _library()
        self._params = {mode: _decode_params(self._lib, mode) for mode in ("rgb", "gray")}
        self._lock = threading.Lock()  # one batch at a time per decoder
        # Host seconds of each part of decode() summed over calls (diagnostics: benchmarks.hybrid_probe)
        self.host_seconds = dict.fromkeys(("parse", "lock", "decode", "table", "crop"), 0.0)
        self._native, self._decoder = None, None
        wanted = NATIVE if native is None else bool(native)
        #: why the C API is not used (None where it is, or where it was not asked for)
        self.native_reason = native_reason() if wanted else None
        if wanted and self.native_reason is None:
            try:
                with _device_context(self.device):
                    self._native = _native_decoder(self._lib, kind, self.device.index, cpu_threads,
                                                   _decoder_options(kind, self.roi, self.fancy_upsampling))
            except Exception as e:
                self.native_reason = f"nvImageCodec's C API could not start ({brief(e, 240)})"
        if native and self._native is None:
            raise RuntimeError(f"{self.name} could not start: {self.native_reason}")
        self.api = "C" if self._native is not None else "Python"  #: nvImageCodec's API this engine calls
        if self._native is None:
            try:
                with _device_context(self.device):
                    self._decoder = self._lib.Decoder(device_id=self.device.index,
                                                      **_decoder_args(self._lib, kind, cpu_threads, self.roi,
                                                                      self.fancy_upsampling))
            except Exception as e:
                raise RuntimeError(f"{self.name} could not start ({brief(e, 240)})") from e

    def __repr__(self) -> str:
        return f"Engine({self.kind!r}, {str(self.device)!r}, roi={self.roi}, api={self.api!r})"

    def lane(self, lane: int) -> "Engine":
        """Another decoder of this kind on this device, for calls in flight beside this one's
        (``hybrid.CALLS_IN_FLIGHT``): its own nvImageCodec decoder and state, so that its call does
        not wait for this one's decode. Cached per lane (:func:`engine`); lane 0 is the engine itself."""
        return self if lane == 0 else engine(self.kind, self.device, lane=lane)

    def _fail(self, what: str, e: BaseException) -> RuntimeError:
        # (an out-of-memory stays one: `except torch.OutOfMemoryError` catches it, as docs/gpu.md says)
        kind = torch.OutOfMemoryError if isinstance(e, torch.OutOfMemoryError) else RuntimeError
        return kind(f"{self.name}: {what} failed ({brief(e, 400)})")

    def decode(self, buffers: Sequence, boxes: np.ndarray, out: torch.Tensor, slots: np.ndarray, options: DecodeOptions,
               *, sizes: Optional[np.ndarray] = None) -> dict:
        """Decodes sample k (the whole image, or its box's region with ``roi``; ``buffers`` are
        bytes-like JPEGs) on the GPU and crops + resizes ``boxes[k]`` (top, left, height, width,
        whole numbers inside the image) into ``out[slots[k]]``.

        Args:
            out: uint8 NHWC contiguous on this engine's device, ``options.channels`` channels;
                ``options.resize`` resizes each box to ``out.shape[1:3]`` (else boxes have that
                size), ``options.window`` as in :class:`DecodeOptions`.
            slots: int64 [N], distinct slots of ``out``.
            sizes: int64 [N, 2] (height, width) of each stored image as its header says (the
                batch's header table); read here, once, when not given.

        Returns:
            ``{k: reason}`` for the samples this decoder declined or could not decode (hand them
            to another decoder or the CPU core). Their slots are untouched.

        Raises:
            RuntimeError naming the engine for a device error (a CUDA error, out of memory): the
            batch fails with it, nothing waits forever.
        """
        return self.decode_jobs([(buffers, boxes, out, slots, options, sizes)])[0]

    def decode_jobs(self, jobs: Sequence[tuple]) -> list:
        """:meth:`decode` for several shares in ONE call of the decoder (a call's fixed cost paid
        once): ``jobs`` are ``(buffers, boxes, out, slots, options, sizes)`` with the same
        ``options.mode``; returns each job's ``{k: reason}`` of declined samples."""
        clock = _PartClock(self.host_seconds)
        parts = [self._prepare(*job) for job in jobs]
        clock.lap("parse")
        streams = [s for p in parts for s in p.streams]
        results = [dict(p.unparsed) for p in parts]
        if not streams:
            return results
        mode = jobs[0][4].mode
        if any(job[4].mode != mode for job in jobs):
            raise ValueError(f"{self.name}: the shares of one call must have the same mode")
        if self._native is not None:
            self._decode_native(parts, jobs, results, clock)
            return results
        stream = _current_stream(self.device)
        with self._lock, _device_context(self.device):
            clock.lap("lock")
            try:
                images = self._decoder.decode(streams, params=self._params[mode], cuda_stream=stream.cuda_stream)
            except Exception as e:
                raise self._fail("decode", e) from e
            if all(im is None for im in images):
                self._check_device(stream)  # nvImageCodec turns its own failures into None: is the device sane?
            clock.lap("decode")
            start = 0
            for p, job, declines in zip(parts, jobs, results):
                mine = images[start:start + len(p.streams)]
                start += len(p.streams)
                if not len(mine):
                    continue
                table, declined = image_table(mine, p.heights, p.widths, job[4].channels)
                ok = np.ones(len(mine), dtype=bool)
                ok[list(declined)] = False
                self._crop_share(p, job, table, ok, declined, declines, clock)
            del images, mine  # freed on `stream` (cudaFreeAsync), after the kernels that read them
        return results

    def _crop_share(self, p: "_Share", job: tuple, table: np.ndarray, ok: np.ndarray, declined: dict,
                    declines: dict, clock: "_PartClock") -> None:
        """One share's crop kernel over its decoded samples (``ok``; ``table`` the kernel's rows), and
        its declined samples' reasons added to ``declines`` by their positions in the share."""
        _, _, out, _, options, _ = job
        clock.lap("table")
        if ok.any():
            try:
                _crop_resize()(table[ok], np.ascontiguousarray(p.boxes[ok]), out, p.slots[ok],
                               resize=options.resize, window=options.window)
            except Exception as e:
                raise self._fail("crop and resize", e) from e
        declines.update({int(p.rows[k]): why for k, why in declined.items()})
        clock.lap("crop")

    def _decode_native(self, parts: list, jobs: Sequence[tuple], results: list, clock: "_PartClock") -> None:
        """decode_jobs through the C API: every share's samples decoded in ONE GIL-free call into one
        buffer (rows packed, each sample at a 256-byte aligned offset), then a crop kernel per share."""
        channels = jobs[0][4].channels
        heights = np.concatenate([p.heights for p in parts]).astype(np.int64)
        widths = np.concatenate([p.widths for p in parts]).astype(np.int64)
        # (a negative side, a region outside its image, is declined by the C API: it takes no room)
        steps = (np.maximum(heights, 0) * np.maximum(widths, 0) * channels + 255) // 256 * 256
        offsets = np.ascontiguousarray(np.cumsum(steps) - steps, dtype=np.int64)
        sizes = np.ascontiguousarray(np.concatenate([p.sizes for p in parts]), dtype=np.int64)
        regions = np.ascontiguousarray(np.concatenate([p.regions for p in parts])) if self.roi else None
        buffers = [b for p in parts for b in p.streams]
        clock.lap("parse")
        stream = _current_stream(self.device)
        with self._lock, _device_context(self.device):
            clock.lap("lock")
            try:
                scratch = _scratch(int(steps.sum()), self.device)
            except torch.cuda.OutOfMemoryError:  # as the Python API's allocation failures: the CPU core takes them
                why = f"no GPU memory for the decode buffer ({int(steps.sum()) >> 20} MiB): decoded by the CPU core"
                for p, declines in zip(parts, results):
                    declines.update({int(r): why for r in p.rows})
                return
            try:
                statuses = self._native.decode(buffers, sizes, regions, channels, scratch.data_ptr(), scratch.numel(),
                                               offsets, stream.cuda_stream)
            except Exception as e:
                raise self._fail("decode", e) from e
            if not (statuses == 1).any():
                self._check_device(stream)  # nvImageCodec turns its own failures into statuses: is the device sane?
            clock.lap("decode")
            table = np.stack([scratch.data_ptr() + offsets, heights, widths, widths * channels], axis=1)
            start = 0
            for p, job, declines in zip(parts, jobs, results):
                n = len(p.streams)
                mine = statuses[start:start + n]
                ok = mine == 1
                declined = {int(k): status_reason(mine[k]) for k in np.flatnonzero(~ok)}
                self._crop_share(p, job, table[start:start + n], ok, declined, declines, clock)
                start += n
            del scratch  # stream-ordered: the kernels that read it were queued on this stream

    def _prepare(self, buffers: Sequence, boxes: np.ndarray, out: torch.Tensor, slots: np.ndarray,
                 options: DecodeOptions, sizes: Optional[np.ndarray]) -> "_Share":
        """One share's code streams (parsed now: those nvImageCodec refuses are declined, the rest
        decode), boxes, slots and sizes, in the frame of what is decoded (the region with ``roi``)."""
        n = len(buffers)
        if n == 0:
            return _Share([], np.zeros((0, 4)), np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64),
                          np.zeros(0, np.int64), {}, np.zeros((0, 2), np.int64), np.zeros((0, 4), np.int64))
        _check_out(self.name, out, self.device, options.channels)
        boxes = np.ascontiguousarray(boxes, dtype=np.float64).reshape(n, 4)
        slots = np.ascontiguousarray(slots, dtype=np.int64).reshape(n)
        if sizes is None:
            from gpupipe.decode_types import read_infos

            infos = read_infos(buffers)
            sizes = np.stack([infos.column("height"), infos.column("width")], axis=1)
        sizes = np.asarray(sizes, dtype=np.int64).reshape(n, 2)
        if self._native is not None:  # the C API parses inside its call: the buffers go as they are
            streams, unparsed = list(buffers), {}
        else:
            streams, unparsed = _code_streams(self._lib, buffers)
        if unparsed:
            rows = np.array([k for k in range(n) if k not in unparsed], dtype=np.int64)
            streams = [streams[k] for k in rows]
            boxes, slots, sizes = boxes[rows], slots[rows], sizes[rows]
        else:  # (always with the C API: no Python per sample)
            rows = np.arange(n, dtype=np.int64)
        heights, widths, regions = sizes[:, 0], sizes[:, 1], np.zeros((len(rows), 4), np.int64)
        if self.roi and len(rows):
            regions = roi_regions(boxes, heights, widths)
            if self._native is None:
                lib = self._lib
                streams = [s.get_sub_code_stream(region=lib.Region(int(t), int(l), int(b), int(r)))
                           for s, (t, l, b, r) in zip(streams, regions)]
            boxes = boxes - np.concatenate([regions[:, :2], np.zeros((len(rows), 2), np.int64)], axis=1)
            heights, widths = regions[:, 2] - regions[:, 0], regions[:, 3] - regions[:, 1]
        return _Share(streams, boxes, slots, heights, widths, rows, unparsed, sizes, regions)

    def _check_device(self, stream: "torch.cuda.Stream") -> None:
        try:
            _synchronize(stream)
        except Exception as e:
            raise self._fail("decode (the device reported an error)", e) from e

    def probe(self) -> None:
        """Decodes a small baseline 4:2:0 JPEG; RuntimeError when the decoder gives nothing back
        (no JPEG engines on this GPU, nvJPEG's library missing)."""
        data, h, w = _probe_jpeg()
        hint = ("this GPU has no JPEG engines (A100, H100, B200 have)" if self.kind == "hardware" else
                "is nvJPEG's library installed? pip install nvidia-nvjpeg")
        if self._native is not None:
            out = _scratch(h * w * 3, self.device).view(1, h, w, 3)
            declined = self.decode([data], np.array([[0, 0, h, w]], dtype=np.float64), out, np.array([0]),
                                   DecodeOptions(size=(h, w)), sizes=np.array([[h, w]]))
            self._check_device(_current_stream(self.device))
            if declined:
                raise RuntimeError(f"{self.name} is not available: {declined[0]} ({hint})")
            return
        stream = _current_stream(self.device)
        with self._lock, _device_context(self.device):
            try:
                image = self._decoder.decode([self._lib.CodeStream(data)], params=self._params["rgb"],
                                             cuda_stream=stream.cuda_stream)[0]
                stream.synchronize()
            except Exception as e:
                raise self._fail("its first decode", e) from e
        table, declined = image_table([image], np.array([h]), np.array([w]), 3)
        if declined:
            raise RuntimeError(f"{self.name} is not available: {declined[0]} ({hint})")


@dataclasses.dataclass
class _Share:
    """One share of :meth:`Engine.decode_jobs`: what is decoded, and where it goes."""

    streams: list  #: nvImageCodec code streams of the samples it parsed (the C API: their buffers)
    boxes: np.ndarray  #: their boxes, in the frame of what is decoded
    slots: np.ndarray  #: their slots of out
    heights: np.ndarray  #: of what is decoded (the whole image, or its region with roi)
    widths: np.ndarray
    rows: np.ndarray  #: their positions in the share
    unparsed: dict  #: {position: reason} of those nvImageCodec's parser refused
    sizes: np.ndarray  #: int64 [n, 2] (height, width) of the whole images, as their headers say
    regions: np.ndarray  #: int64 [n, 4] (top, left, bottom, right) decoded with roi (else zeros)


class _PartClock:
    """Adds the host seconds since the previous lap to ``parts[name]`` (a dict of floats)."""

    __slots__ = ("parts", "t")

    def __init__(self, parts: dict):
        self.parts, self.t = parts, time.perf_counter()

    def lap(self, name: str) -> None:
        t = time.perf_counter()
        self.parts[name] += t - self.t
        self.t = t


def _probe_jpeg() -> tuple[bytes, int, int]:
    from PIL import Image

    h, w = 96, 128
    y, x = np.mgrid[0:h, 0:w]
    pixels = np.stack([x * 2, y * 2, (x + y) % 256], axis=-1).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "JPEG", quality=90, subsampling=2)
    return buf.getvalue(), h, w


LIBRARY_MESSAGES: list = []  # what nvImageCodec printed at import, e.g. "Failed to load nvjpeg2k library!"


def _is_library_line(line: str) -> bool:
    low = line.lower()
    return any(word in low for word in ("nvimgcodec", "nvjpeg", "nvtiff", "libcuda", "cuda"))


_engines: dict = {}  # (pid, kind, device, lane) -> Engine, or the RuntimeError that creating it raised
_engines_lock = threading.Lock()


def engine(kind: str, device: torch.device, *, lane: int = 0) -> Engine:
    """The engine of ``kind`` on ``device``, created and checked once per process (a first decode),
    then cached. RuntimeError with the reason where it is not available (e.g. no hardware decoder
    on this GPU). ``lane`` > 0: another decoder of the same kind (:meth:`Engine.lane`)."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    device = concrete_device(torch.device(device))
    key = (os.getpid(), kind, str(device), int(lane))
    with _engines_lock:
        if key not in _engines:
            reason = unavailable_reason(device)
            if reason:
                raise RuntimeError(reason)
            from gpupipe import _stderr

            try:
                with _stderr.captured(_is_library_line) as printed:  # nvImageCodec's start-up lines
                    eng = _started(kind, device)
                _engines[key] = eng
            except torch.OutOfMemoryError:  # the device's state now, not the engine's: not cached
                raise
            except RuntimeError as e:
                said = f" (it printed: {' | '.join(printed)[:300]})" if printed else ""
                _engines[key] = RuntimeError(f"{e}{said}")
        found = _engines[key]
    if isinstance(found, Exception):
        raise RuntimeError(str(found))
    return found


def _started(kind: str, device: torch.device) -> Engine:
    """An engine that decoded its probe: through the C API where there is one, else (or where the C
    API's probe fails) through the Python API, the C API's failure kept in ``native_reason``."""
    eng = Engine(kind, device)
    try:
        eng.probe()
        return eng
    except RuntimeError as e:
        if eng.api != "C" or isinstance(e, torch.OutOfMemoryError):
            raise
        failed = f"its C API failed the probe ({brief(e, 240)})"
    eng = Engine(kind, device, native=False)
    eng.probe()
    eng.native_reason = failed
    return eng


def started_engines() -> list:
    """The engines this process started (for reports: which API each calls, and why not the C API)."""
    with _engines_lock:
        return [e for (pid, _, _, lane), e in _engines.items()
                if pid == os.getpid() and lane == 0 and isinstance(e, Engine)]  # (a lane's decoder: the same kind)


def hardware_decoder_available(device: Optional[torch.device] = None) -> bool:
    """Whether ``device`` (the current CUDA device when None) has JPEG engines nvImageCodec can
    use (checked once per process by decoding a small JPEG on them)."""
    device = torch.device("cuda") if device is None else torch.device(device)
    try:  # engine() raises unavailable_reason's reason first
        engine("hardware", device)
    except RuntimeError:
        return False
    return True
