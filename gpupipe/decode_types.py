"""The decode types shared by the backends (gpupipe/_backends/, which import this module, never the
other way round) and the modules above them (routing, loader, decode, data, policy): the options of
a batch, the per-sample status a backend reports, the header table it is handed, and the protocol it
implements.

A backend decodes JPEG crops into its slots of an NHWC uint8 buffer and reports, per sample, an
:class:`gpupipe.ErrorKind`, a message, a warning, and the route that decoded it. Headers are read
once per batch (:func:`read_infos`) and passed down; nothing re-parses them.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any, Optional, Protocol, Sequence

import numpy as np
import torch

from gpupipe import _C
from gpupipe._args import as_int, flag, is_int
from gpupipe._errors import ErrorKind

MODES = {"rgb": 0, "gray": 1}
CHANNELS = {"rgb": 3, "gray": 1}


class Route(enum.IntEnum):
    """Which decoder produced a sample's pixels."""

    NONE = 0  #: none: the sample failed before any decoder ran (header, read, box)
    CPU = 1  #: the C++ libjpeg-turbo core, as the chosen backend
    GPU = 2  #: the GPU backend's decoder (nvJPEG, or DALI's operators)
    PILLOW = 3  #: not a JPEG: decoded by Pillow, with the same box semantics
    CPU_FALLBACK = 4  #: a GPU backend handed it to the CPU core (CMYK, a limit, a failing batch)
    GPU_HARDWARE = 5  #: the GPU's hardware JPEG decoder (nvImageCodec; A100, H100, B200)
    GPU_CUDA = 6  #: nvImageCodec's CUDA decoder (nvJPEG on the GPU's cores)

    @property
    def label(self) -> str:
        return self.name.lower().replace("_", "-")


def check_non_jpeg(non_jpeg: Any) -> None:
    if non_jpeg not in ("pillow", "error"):
        raise ValueError(f"non_jpeg must be 'pillow' or 'error', got {non_jpeg!r}")


def seed_number(value: Any) -> int:
    """A Loader's (or DecodeCropDataset's) seed: an int >= 0 (numpy's too)."""
    seed = as_int("seed", value)
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    return seed


def epoch_number(value: Any) -> int:
    """An epoch for ``set_epoch``: an int >= 0 (numpy's too), as the epoch's order needs it."""
    epoch = as_int("epoch", value)
    if epoch < 0:
        raise ValueError(f"epoch must be >= 0, got {epoch}")
    return epoch


def check_thread_count(name: str, value: Any, *, default_ok: bool = False) -> int:
    """``value`` as a thread count: an int within 1..MAX_THREADS (or 0, the default count, where
    ``default_ok``). TypeError / ValueError naming ``name`` otherwise."""
    value = as_int(name, value)
    if not (0 if default_ok else 1) <= value <= _C.MAX_THREADS:
        allowed = f"0..{_C.MAX_THREADS} (0: the default)" if default_ok else f"1..{_C.MAX_THREADS}"
        raise ValueError(f"{name} must be within {allowed}, got {value}")
    return value


@dataclasses.dataclass(frozen=True)
class DecodeOptions:
    """How every sample of a batch is decoded (one frozen value per call).

    Attributes:
        size: output ``(height, width)``.
        resize: resize each box to ``size`` (antialiased bilinear); else boxes have that size.
        mode: ``"rgb"`` or ``"gray"``.
        strict: recoverable corruption is an error instead of a warning.
        dct_scaling: with ``resize``, decode boxes >= 2x the size already downscaled (libjpeg).
        window: with ``resize``, each box is a window of the whole image resized (Pillow's
            ``resize(box=...)``; torchvision's ``Resize`` then ``CenterCrop``): the filter also
            reads the pixels around it. Else the box is cropped, then resized (torchvision's
            ``resized_crop``, as in ``RandomResizedCrop``).
        num_threads: decode threads (0: ``GPUPIPE_NUM_THREADS`` or the CPU affinity count).
        apply_exif_orientation: boxes are in the displayed frame and so are the crops.
        non_jpeg: ``"pillow"``: files that are not JPEGs go through Pillow when it reads them;
            ``"error"``: they fail with :class:`gpupipe.NotAJpegError`.
        backend: the backend's name (``"cpu"``, ``"dali"``, ``"nvjpeg"``), already resolved.
        device: where the output buffer lives.
    """

    size: tuple
    resize: bool = False
    mode: str = "rgb"
    strict: bool = False
    dct_scaling: bool = True
    window: bool = False
    num_threads: int = 0
    apply_exif_orientation: bool = False
    non_jpeg: str = "pillow"
    backend: str = "cpu"
    device: torch.device = torch.device("cpu")

    def __post_init__(self):
        for name in ("resize", "strict", "dct_scaling", "window", "apply_exif_orientation"):
            object.__setattr__(self, name, flag(getattr(self, name), name))
        if self.mode not in MODES:
            raise ValueError(f"mode must be 'rgb' or 'gray', got {self.mode!r}")
        check_non_jpeg(self.non_jpeg)
        check_thread_count("num_threads", self.num_threads, default_ok=True)

    @property
    def channels(self) -> int:
        return CHANNELS[self.mode]


_NONE = int(ErrorKind.NONE)  # (an IntEnum member's lookup costs more than the comparison)
_COLUMNS = {c: k for k, c in enumerate(_C.INFO_COLUMNS)}


@dataclasses.dataclass
class BatchStatus:
    """Per-sample outcome of a batch decode.

    Attributes:
        kind: int64 ``[N]``: the :class:`gpupipe.ErrorKind` of each sample (``NONE`` = decoded).
        route: int64 ``[N]``: the :class:`Route` that decoded it.
        errors: ``{index: message}`` for failed samples.
        warnings: ``{index: message}`` for samples decoded with recoverable corruption.
        fallback: ``{index: reason}`` for samples not decoded by the backend's own decoder
            (Pillow, or the CPU core standing in for a GPU decoder).
        engine_seconds: ``{engine: (decoded, given, seconds)}`` of the hybrid backend's GPU decoders.
        cpu_busy_seconds: thread-seconds the CPU pool spent on the samples of this batch it was
            started on (the hybrid backend's re-tuning: the process-wide count would take in the
            next epoch's batches, started before this epoch ends).
    """

    kind: np.ndarray
    route: np.ndarray
    errors: dict = dataclasses.field(default_factory=dict)
    warnings: dict = dataclasses.field(default_factory=dict)
    fallback: dict = dataclasses.field(default_factory=dict)
    engine_seconds: dict = dataclasses.field(default_factory=dict)
    cpu_busy_seconds: float = 0.0

    @classmethod
    def empty(cls, n: int) -> "BatchStatus":
        return cls(np.zeros(n, np.int64), np.zeros(n, np.int64))

    @property
    def ok(self) -> np.ndarray:
        return self.kind == _NONE

    def all_ok(self) -> bool:
        """Whether every sample decoded (one reduction: the common batch's whole check)."""
        return not self.kind.any()

    def rows(self, start: int, stop: int) -> "BatchStatus":
        """The outcome of samples ``start:stop`` as a batch of their own (positions from 0), without
        the engine and pool seconds (the whole batch's: :meth:`split_seconds` shares them out)."""
        def part(d: dict) -> dict:
            return {k - start: v for k, v in d.items() if start <= k < stop} if d else {}

        return BatchStatus(self.kind[start:stop], self.route[start:stop], part(self.errors), part(self.warnings),
                           part(self.fallback))

    def split_seconds(self, sizes: Sequence[int], routes: dict) -> list:
        """``(engine_seconds, cpu_busy_seconds)`` for consecutive parts of ``sizes`` samples: each
        engine's (decoded, given, seconds) and the pool's seconds shared out in proportion to the
        part's samples that engine decoded (``routes``: {engine: its Route values}); by size where
        it decoded none. The parts' sums are the whole batch's."""
        starts = np.cumsum([0, *sizes[:-1]])

        def shares(codes: Sequence[int]) -> np.ndarray:
            hit = self.route == codes[0]
            for code in codes[1:]:
                hit |= self.route == code
            counts = np.add.reduceat(hit.astype(np.int64), starts)
            whole = int(counts.sum())
            return counts / whole if whole else np.asarray(sizes) / max(len(self.route), 1)

        engines = {e: (shares(routes[e]), m) for e, m in self.engine_seconds.items() if e in routes}
        cpu = shares(routes["cpu"]) * self.cpu_busy_seconds if self.cpu_busy_seconds and "cpu" in routes \
            else np.zeros(len(sizes))
        return [({e: tuple(v * f[j] for v in m) for e, (f, m) in engines.items()}, float(cpu[j]))
                for j in range(len(sizes))]

    def fail(self, i: int, kind: int, message: str) -> None:
        self.kind[i] = int(kind)
        self.route[i] = Route.NONE
        self.errors[int(i)] = message
        self.warnings.pop(int(i), None)
        self.fallback.pop(int(i), None)

    def merge(self, sub: "BatchStatus", indices: Sequence[int]) -> None:
        """Takes the outcome of a sub-batch whose sample k is sample ``indices[k]`` of this one."""
        idx = np.asarray(indices, dtype=np.int64)
        self.kind[idx] = sub.kind
        self.route[idx] = sub.route
        for mine, theirs in ((self.errors, sub.errors), (self.warnings, sub.warnings), (self.fallback, sub.fallback)):
            mine.update({int(idx[k]): v for k, v in theirs.items()})
        self.cpu_busy_seconds += sub.cpu_busy_seconds
        for engine, measured in sub.engine_seconds.items():
            was = self.engine_seconds.get(engine)
            self.engine_seconds[engine] = measured if was is None else tuple(a + b for a, b in zip(was, measured))


@dataclasses.dataclass
class HeaderInfos:
    """The headers of a batch, read once (``_C.read_header_infos``, one C++ call).

    Attributes:
        table: int64 ``[N, len(_C.INFO_COLUMNS)]``: height, width, colorspace, channels,
            orientation, progressive, scans, trailing (the bytes after the EOI marker that ends the
            JPEG, which libjpeg never reads: 0 for most files, -1 without one), malformed (bits,
            0 for most files: ``_C.MALFORMED_LAYOUT``, a marker layout libjpeg reads only with a
            warning or an error; ``_C.FINER_CHROMA``, a valid file with a component sampled more
            finely than the first, which DALI's crop decode gets wrong), error (``-1`` fields
            where unreadable; scans, trailing and malformed where not counted).
        messages: ``{index: message}`` for unreadable headers.
        pillow: ``{index: (height, width, orientation)}`` of non-JPEG files Pillow reads.
        pads: ``{index: (top, left)}``: where a box smaller than the output (``CenterCrop`` of a
            smaller image) sits in its zero-padded slot.
    """

    table: np.ndarray
    messages: dict
    pillow: dict = dataclasses.field(default_factory=dict)
    pads: dict = dataclasses.field(default_factory=dict)

    @classmethod
    def from_native(cls, table: np.ndarray, failures: list) -> "HeaderInfos":
        """From a header table a native call filled and its [(index, ErrorKind, message)] failures."""
        return cls(table, {int(i): message for i, _, message in failures})

    def column(self, name: str) -> np.ndarray:
        return self.table[:, _COLUMNS[name]]

    @property
    def kind(self) -> np.ndarray:
        return self.table[:, _COLUMNS["error"]]

    def sizes(self, displayed: bool) -> tuple[np.ndarray, np.ndarray]:
        """(heights, widths) of the stored images, or as displayed (EXIF orientation applied);
        Pillow-read files included, -1 where unreadable."""
        from gpupipe.orientation import display_sizes

        h, w, o = self.column("height").copy(), self.column("width").copy(), self.column("orientation").copy()
        for i, (ph, pw, po) in self.pillow.items():
            h[i], w[i], o[i] = ph, pw, po
        if displayed:
            dh, dw = display_sizes(h, w, np.where(o > 0, o, 1))
            h, w = np.where(h >= 0, dh, h), np.where(w >= 0, dw, w)
        return h, w

    def count_scans(self, buffers: Sequence) -> None:
        """Fills in the scans, trailing bytes and layout of the readable JPEG headers a CPU-backend
        probe left uncounted (-1): GPU decoders need them (``gpu_eligible``), the CPU core does not."""
        rows = np.flatnonzero((self.table[:, _COLUMNS["scans"]] < 0) & (self.table[:, _COLUMNS["error"]] == _NONE))
        if len(rows):
            counted = read_infos([buffers[i] for i in rows]).table
            for name in ("scans", "trailing", "malformed"):
                self.table[rows, _COLUMNS[name]] = counted[:, _COLUMNS[name]]

    def fail(self, i: int, kind: int, message: str) -> None:
        """Marks sample i as failed before decoding (a read error, a box that cannot be drawn)."""
        self.table[i, _COLUMNS["error"]] = int(kind)
        self.messages[int(i)] = message
        self.pillow.pop(int(i), None)
        self.pads.pop(int(i), None)

    def select(self, indices) -> "HeaderInfos":
        idx = np.asarray(indices, dtype=np.int64)
        where = {int(i): k for k, i in enumerate(idx)}
        return HeaderInfos(self.table[idx], {where[i]: m for i, m in self.messages.items() if i in where},
                           {where[i]: v for i, v in self.pillow.items() if i in where},
                           {where[i]: v for i, v in self.pads.items() if i in where})


def read_infos(buffers: Sequence, scans: bool = True) -> HeaderInfos:
    """Reads every JPEG header of a batch once, in C++ with the GIL released. ``scans=False``
    leaves the scans, trailing and malformed columns -1 (counting them reads each whole file; the
    GPU decoders' eligibility needs them, the CPU core enforces ``max_scans`` itself)."""
    table = np.empty((len(buffers), len(_C.INFO_COLUMNS)), dtype=np.int64)
    failures = _C.read_header_infos(buffers, table.ctypes.data, table.nbytes, scans) if len(buffers) else []
    return HeaderInfos.from_native(table, failures)


class Backend(Protocol):
    """A decode backend: one small protocol, one module per backend."""

    name: str

    def unavailable_reason(self, device: torch.device) -> Optional[str]:
        """Why the backend cannot run for outputs on ``device`` here, or None."""

    def decode(self, buffers: Sequence, boxes: np.ndarray, out: torch.Tensor, options: DecodeOptions,
               infos: HeaderInfos) -> BatchStatus:
        """Decodes the JPEG crop ``boxes[i]`` of ``buffers[i]`` into ``out[i]`` (uint8 NHWC,
        contiguous, on ``options.device``) for every i; ``infos`` are their headers."""
