"""The Loader: a source's samples -> batches of decoded, cropped, augmented images, in threads of one
process, never pickled.

Each batch is a :class:`Batch` record passed through plain stage functions on a small engine
(:mod:`gpupipe.engine`: one thread per stage, bounded blocking queues, cancellation, timing)::

    source -> read  (bytes, on I/O threads)
           -> plan  (headers read once, crop boxes, augmentation parameters)
           -> decode (decode_into: one ring slot per batch, or the device for GPU backends)
           -> finish (error policy, transfer to the device, augment, batch_transform)

While the consumer trains on batch b, batch b+1 is decoded and b+2 read. Every pixel is a function
of (seed, epoch, sample index) only, whatever the thread count, so an epoch can be resumed
mid-way in another process (:meth:`Loader.state_dict`).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
import sys
import threading
import time
import warnings
import weakref
import zlib
from typing import Any, Callable, Optional, Sequence

import numpy as np
import torch

from gpupipe import _C, backends, keyed
from gpupipe._args import concrete_device, finite_number, is_python_int
from gpupipe._errors import JpegWarning, SkippedSamplesWarning, brief, import_extra, user_stacklevel
from gpupipe._backends import cpu, hybrid
from gpupipe._transfer import to_device
from gpupipe.decode_types import (BatchStatus, HeaderInfos, Route, as_int, check_thread_count, epoch_number,
                                  seed_number)
from gpupipe.crops import CropSampler
from gpupipe._exit import call_scope
from gpupipe._read_pool import ReadPool
from gpupipe.engine import Closed, Engine, HostClock, Many, StageTimes
from gpupipe.error_policy import apply_policy, check_on_error
from gpupipe.routing import decode_into, plan_batch, straight
from gpupipe.sources import (Arenas, MapSource, Source, TarShards, distributed_indices, indented, labels_of,
                             read_result)

STAGES = ("read", "plan", "decode", "collect", "transfer", "augment")

# Batches smaller than this many images go through the read, plan, decode and collect stages
# together, as one chunk (the consumer still gets them one by one, each with its own pixels,
# augmentation parameters and failures): each stage's per-call cost (a native call, the hybrid
# backend's routes, events and copies, Python bookkeeping) is then paid per chunk, not per batch.
# Before chunks, on an H100 node (train recipe, backend hybrid, 800x533 photos), batch 64 delivered
# 9,405 img/s with 52.6 us of host time per image, batch 256 16,290 with 14.3. With them, on 2 cores
# at batch 64 (160x120 and 400x300 files, docs/benchmarks.md) the host time fell from 9.1-13.4 to
# 5.4-5.7 us per image and the Loader ran 19-44% faster. 0: every batch alone.
CHUNK_IMAGES = 256


# which routes each of the hybrid backend's engines decoded (plain ints: an IntEnum member's lookup
# and comparison cost more than the array work they select, per chunk of the collect stage)
_ENGINE_ROUTES = {"cpu": (int(Route.CPU), int(Route.CPU_FALLBACK)), "hardware": (int(Route.GPU_HARDWARE),),
                  "cuda": (int(Route.GPU_CUDA),)}


def chunk_batches(batch_size: int) -> int:
    """Batches per chunk (:data:`CHUNK_IMAGES`): at least one."""
    return max(1, CHUNK_IMAGES // batch_size) if CHUNK_IMAGES > 0 else 1

# torch built with OpenMP (its Linux wheels) keeps the intra-op thread count per thread: the CPU
# augment stage can then run with fewer threads than the training loop without touching it.
_PER_THREAD_TORCH_THREADS = "OpenMP" in torch.__config__.parallel_info()


@dataclasses.dataclass
class Batch:
    """One batch on its way through the stages. A map-style source's batch is arrays (its dataset
    indices and labels; keys looked up only for messages), a streamed source's its Sample records."""

    number: int  #: position in the epoch (0, 1, ...)
    indices: np.ndarray  #: int64 dataset indices (a stream's: position * world_size + rank)
    labels: np.ndarray  #: int64
    samples: Optional[list] = None  #: a streamed source's :class:`Sample` records (bytes or errors)
    source: Any = None  #: a map-style source, for the keys
    datas: list = dataclasses.field(default_factory=list)  #: encoded bytes
    read_errors: dict = dataclasses.field(default_factory=dict)  #: {position: message} of failed reads
    infos: Optional[HeaderInfos] = None
    boxes: Optional[np.ndarray] = None
    augment_params: Any = None
    status: Optional[BatchStatus] = None
    failures: list = dataclasses.field(default_factory=list)  #: the policy's SampleFailures
    images: Optional[torch.Tensor] = None  #: uint8 NHWC: a ring slot, or a device tensor
    slot: Optional[int] = None
    ready: Optional[torch.cuda.Event] = None  #: recorded after a GPU decode, for the consumer's stream
    pending: Any = None  #: a started decode (the CPU core's or the hybrid backend's): collect waits for it
    parts: Optional[list] = None  #: a chunk's batches (CHUNK_IMAGES): collect splits it into them
    slot_use: Any = None  #: a chunk's ring slot, shared by its batches: freed when the last lets it go
    whole: Optional["_Whole"] = None  #: a chunk finished in one call (transfer, augment), shared by its batches
    offset: int = 0  #: the batch's first row in its chunk
    error: Optional[BaseException] = None  #: on_error="raise": this batch's failure, raised when it is reached

    def __len__(self) -> int:
        return len(self.indices)

    @property
    def keys(self) -> Sequence:
        """The samples' keys (paths, ``shard:member``), looked up when asked for."""
        return [s.key for s in self.samples] if self.samples is not None else _Keys(self.source.keys, self.indices)


class _Keys(Sequence):
    """A map-style batch's keys, by position, without building the list."""

    def __init__(self, keys: Sequence, indices: np.ndarray):
        self._keys, self._indices = keys, indices

    def __len__(self) -> int:
        return len(self._indices)

    def __getitem__(self, i):
        return self._keys[int(self._indices[i])]


class _Stats:
    """What the stages report, for :meth:`Loader.stats` (guarded by a lock)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.times = StageTimes(STAGES)
        self.batches = self.images = 0
        self.skipped: list = []
        self.replaced: list = []
        self.losses_reported = False  # _report_losses warned (or raised) for this epoch
        self.warnings: list = []
        self.fallback: list = []
        self.route_counts = np.zeros(len(Route), np.int64)  # samples delivered per Route value
        self.engine_seconds: dict = {}  # the hybrid backend's GPU engines: {engine: [decoded, given, seconds]}
        self.cpu_busy = 0.0  # thread-seconds the CPU core spent on the delivered batches' samples
        self.shares: Optional[hybrid.Shares] = None  # hybrid: the shares of the epoch iterated
        self.started: Optional[float] = None
        self.last: Optional[float] = None
        # the process's CPU decode thread-seconds when the iteration started and at its last batch: the
        # pool's utilisation while this epoch was iterated, whichever epoch's samples it decoded
        self.pool_busy_started = self.pool_busy_last = 0.0
        # the hybrid backend's re-tuning, on what the collect stage has waited for (whole chunks,
        # delivered or not yet): batches, {engine: [decoded, given, seconds]}, CPU images and seconds
        self.collected_batches = 0
        self.collected_engines: dict = {}
        self.collected_cpu = [0, 0.0]

    def collected(self, status: BatchStatus, batches: int) -> None:
        """A batch (or a chunk of ``batches``) the collect stage waited for: its engines' work."""
        cpu_route, fallback_route = _ENGINE_ROUTES["cpu"]
        cpu = int(np.count_nonzero((status.route == cpu_route) | (status.route == fallback_route)))
        with self.lock:
            self.collected_batches += batches
            self.collected_cpu[0] += cpu
            self.collected_cpu[1] += status.cpu_busy_seconds
            _add_engine_seconds(self.collected_engines, status.engine_seconds)

    def routes(self) -> dict:
        """{route label: samples delivered} (call with the lock held)."""
        return {r.label: int(self.route_counts[r]) for r in Route if r != Route.NONE}

    def record(self, batch: Batch, delivered: int, on_error: str) -> None:
        """A batch handed to the consumer: its images, failures, warnings and routes."""
        status = batch.status
        keys = batch.keys if status.warnings or status.fallback else ()
        with self.lock:
            self.batches += 1
            self.images += delivered
            self.last = time.perf_counter()
            self.pool_busy_last = _C.decode_busy_seconds()
            (self.skipped if on_error == "skip" else self.replaced).extend(batch.failures)
            self.warnings += [(keys[i], m) for i, m in sorted(status.warnings.items())]
            self.fallback += [(keys[i], m) for i, m in sorted(status.fallback.items())]
            self.route_counts += np.bincount(status.route if status.all_ok() else status.route[status.ok],
                                             minlength=len(Route))
            self.cpu_busy += status.cpu_busy_seconds
            _add_engine_seconds(self.engine_seconds, status.engine_seconds)


def _add_engine_seconds(totals: dict, measured: dict) -> None:
    """Adds a batch's ``{engine: (decoded, given, seconds)}`` to running ``[decoded, given, seconds]``."""
    for engine, values in measured.items():
        was = totals.setdefault(engine, [0, 0, 0.0])
        for k, v in enumerate(values):
            was[k] += v


_UNVERIFIED_STREAM = "0:00000000"  # what states of before 2026-11-28 recorded for a custom stream


def _report_losses(loader: "Loader", st: _Stats, epoch: int, left_after: Optional[int] = None,
                   first_batch: int = 0) -> None:
    """Once an epoch: one SkippedSamplesWarning counting what its delivered batches skipped or
    replaced, by kind, when it ends, when its last batch is delivered, or when an iteration is left
    before (``left_after`` batches: a break, an error, a closed iterator); a ValueError when the
    whole epoch was tried and none delivered (a crop larger than every image, an unreadable
    dataset), which torchvision would have raised at its first sample. An iteration resumed at
    ``first_batch`` > 0 tried only the epoch's rest: its batches before were delivered by another
    run, so it warns (a rank that raised would leave the others waiting in a collective).
    Samples delivered although their decoder warned (corrupt data; a file cut short has the rest of
    its image filled, where torchvision's decode_jpeg and Pillow raise) are counted in one
    JpegWarning, after the other report: delivered, but never unheard of."""
    with st.lock:
        if st.losses_reported:
            return
        st.losses_reported = True
        lost, delivered = list(st.skipped if loader.on_error == "skip" else st.replaced), st.images
        damaged = list(st.warnings)
    where = f"epoch {epoch}" if left_after is None else f"epoch {epoch}, left after {left_after} batches"
    if lost:
        kinds: dict = {}
        for f in lost:
            kinds[f.kind.name] = kinds.get(f.kind.name, 0) + 1
        by_kind = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items(), key=lambda kv: -kv[1]))
        first = f"first: {lost[0].key!r}: {lost[0].message}"
        if loader.on_error == "skip" and delivered == 0 and left_after is None and first_batch == 0:
            raise ValueError(f"gpupipe.Loader epoch {epoch} delivered no image: all {len(lost)} samples failed "
                             f"({by_kind}); {first}")
        done = "skipped" if loader.on_error == "skip" else "replaced by zero images"
        tried = delivered + len(lost) if loader.on_error == "skip" else delivered
        warnings.warn(f"gpupipe.Loader {where}: {len(lost)} of {tried} samples {done} (on_error="
                      f"{loader.on_error!r}): {by_kind}; {first}. Loader.stats() lists them all; on_error='raise' "
                      "stops at the first.", SkippedSamplesWarning, stacklevel=user_stacklevel())
    if damaged:
        key, message = damaged[0]
        warnings.warn(f"gpupipe.Loader {where}: {len(damaged)} of {delivered} delivered samples decoded with "
                      f"warnings of their decoder (corrupt data; where a file is cut short, the rest of its image "
                      f"is filler); first: {key!r}: {message}. Loader.stats()['warnings'] lists them all.",
                      JpegWarning, stacklevel=user_stacklevel())


def _dist_defaults(rank, world_size):
    if rank is not None and world_size is not None:
        return int(rank), int(world_size)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return (torch.distributed.get_rank() if rank is None else int(rank),
                torch.distributed.get_world_size() if world_size is None else int(world_size))
    return (0 if rank is None else int(rank)), (1 if world_size is None else int(world_size))


def _keyed(module: Any) -> bool:
    """Whether a module follows the keyed protocol (``sample_params(n, *, seed, epoch, indices)``)
    and is in training mode: a module in ``eval()`` is called plainly, and applies what its eval
    mode applies (BatchAugment: conversion and normalisation only)."""
    return getattr(module, "training", True) and keyed.takes_keys(module)


def _rows(params: Any, keep: torch.Tensor, n: int) -> Any:
    """The rows ``keep`` (int64 indices) of every per-sample parameter: a tensor or numpy array of
    leading dimension n, at any depth of dicts, lists and tuples (kept as such); anything else is
    the batch's and kept whole. A batch-level ``n`` entry (a 0-dim tensor: the batch size, as
    RandomChoice records it) becomes the number kept."""
    if isinstance(params, dict):
        rows = {k: _rows(v, keep, n) for k, v in params.items()}
        size = rows.get("n")
        if isinstance(size, torch.Tensor) and size.dim() == 0 and int(size) == n:
            rows["n"] = torch.tensor(len(keep), dtype=size.dtype)
        return rows
    if isinstance(params, torch.Tensor) and params.dim() > 0 and params.shape[0] == n:
        return params[keep]
    if isinstance(params, np.ndarray) and params.ndim > 0 and params.shape[0] == n:
        return params[keep.numpy()]
    if type(params) in (list, tuple):
        return type(params)(_rows(v, keep, n) for v in params)
    if isinstance(params, tuple) and hasattr(params, "_make"):  # a named tuple
        return params._make(_rows(v, keep, n) for v in params)
    return params


def _part_rows(params: Any, n: int, offset: int, rows: int) -> Any:
    """A batch's rows ``offset:offset + rows`` of its chunk's per-sample parameters (``n`` rows)."""
    return _rows(params, torch.arange(offset, offset + rows), n)


class _SlotUse:
    """A chunk's ring slot, shared by its batches (guarded by the ring's lock)."""

    __slots__ = ("users", "event")

    def __init__(self, users: int):
        self.users, self.event = users, None


class _Ring:
    """The host buffers decoded batches go into: a slot is reused once its batch is finished (and,
    on CUDA, once its copy to the device completed: waited for by the decode thread, never polled).
    One epoch's; the buffers pass to the next epoch's ring (:meth:`Loader._host_ring`)."""

    def __init__(self, buffers: list, pending: Sequence = ()):
        self.buffers = buffers
        self._pending: list = list(pending)  # (event, slot): copies still reading a slot
        self._partial: dict = {}  # {slot: _SlotUse} of chunks some of whose batches still hold the slot
        busy = {slot for _, slot in self._pending}
        self._free = [s for s in range(len(buffers)) if s not in busy]
        self._cond = threading.Condition()
        self._closed = False
        self.retired = False  # its epoch's threads have all stopped: the buffers may pass on

    def fits(self, slots: int, shape: tuple, pin: bool) -> bool:
        b = self.buffers[0]
        return len(self.buffers) == slots and tuple(b.shape) == tuple(shape) and b.is_pinned() == pin

    def pending(self) -> list:
        """(event, slot) of the copies that may still read a slot, a chunk's not yet released whole
        included (its iteration ended mid-chunk): the next epoch's ring waits for them."""
        with self._cond:
            return self._pending + [(use.event, slot) for slot, use in self._partial.items() if use.event is not None]

    def acquire(self) -> int:
        with self._cond:
            while not self._free and not self._pending and not self._closed:
                self._cond.wait()
            if self._closed:
                raise Closed
            if self._free:
                return self._free.pop(0)
            event, slot = self._pending.pop(0)
        # The oldest copy must finish before the slot is written again. A call scope: the wait
        # releases the GIL inside torch, and a daemon thread taking it back after the interpreter
        # finalized would abort the process (gpupipe._exit); exit waits for the copy instead.
        with call_scope():
            event.synchronize()
        return slot

    def release(self, slot: int, event: Optional[torch.cuda.Event] = None, use: Optional["_SlotUse"] = None) -> None:
        """The slot is free once ``event`` (its last copy) completes; a chunk's slot (``use``) once
        each of its batches let it go, after the latest of their copies (one stream: in order)."""
        with self._cond:
            if use is not None:
                use.users -= 1
                use.event = event if event is not None else use.event
                if use.users > 0:
                    self._partial[slot] = use
                    return
                self._partial.pop(slot, None)
                event = use.event
            (self._pending.append((event, slot)) if event is not None else self._free.append(slot))
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()


class _Recycled:
    """Host batch tensors for the consumer, each reused once nothing refers to it any more (the
    consumer dropped the batch and every view of it), across epochs. A new tensor per batch is a new
    mmap for a large batch (256 x 224 x 224 x 3 is 38 MB, over glibc's mmap threshold), whose page
    faults and zeroing cost ~30 us an image; a reused one costs nothing. At most ``keep`` are kept."""

    def __init__(self, shape: tuple, keep: int):
        self.shape, self.keep = shape, keep
        self._arrays: list = []
        self._lock = threading.Lock()  # an abandoned epoch's decode thread may still be taking one

    def take(self, n: int) -> torch.Tensor:
        """A tensor of ``shape`` with ``n`` rows that nothing else refers to."""
        with self._lock:
            for a in self._arrays:
                # Held only by this list, the loop and getrefcount: no tensor of a batch shares it.
                if sys.getrefcount(a) == 3:
                    return torch.from_numpy(a)[:n]
            a = np.empty(self.shape, np.uint8)
            if len(self._arrays) < self.keep:
                self._arrays.append(a)
            return torch.from_numpy(a)[:n]


MAX_PREFETCH = 64  # batches decoded ahead: each holds a whole batch buffer


class Loader:
    """Batches of decoded, cropped (and augmented) images from a source, with threads, no pickling.

    Args:
        source: a :mod:`gpupipe.sources` source (``ImageFolder``, ``FileList``, ``TarShards``, or
            anything with ``epoch_samples``).
        batch_size: samples per batch.
        crop: a :mod:`gpupipe.crops` sampler; its ``size`` is the output size.
        augment: optional module applied to each uint8 ``[N, 3, H, W]`` batch on ``device`` (e.g.
            :class:`gpupipe.augment.BatchAugment`). A keyed module (``sample_params(n, *, seed,
            epoch, indices)``) gets parameters drawn from (seed, epoch, sample index) and is called
            as ``augment(images, params=...)``; any other module as ``augment(images)``.
        batch_transform: optional callable on ``(images, labels)`` after ``augment`` (e.g.
            ``gpupipe.augment.MixUp``), keyed the same way (``batch_transform(images, labels,
            params=...)``).
        device: where batches are delivered (``"cpu"``, ``"cuda"``, ``"cuda:1"``).
        backend: ``"auto"`` (the CPU core for CPU outputs; for CUDA outputs ``"hybrid"`` where
            nvImageCodec's GPU decoders are installed, else DALI, else nvJPEG), ``"cpu"``,
            ``"hybrid"``, ``"dali"`` or ``"nvjpeg"``. GPU backends decode each batch on ``device``
            (no host ring), handing what they cannot decode to the CPU core inside the batch.
            ``"hybrid"`` splits every batch between the CPU pool and the GPU's hardware JPEG
            decoder (or, on a GPU without one, its CUDA decoder) in proportion to their rates, the
            CUDA decoder taking what the hardware declines, re-tuned after each complete epoch
            (``stats()["shares"]``; kept in ``state_dict()``, so an epoch replays exactly).
        decode_shares: with ``backend="hybrid"``, fixed shares ``{"cpu": a, "hardware": b, "cuda":
            c}`` (summing to 1) for every epoch instead of shares re-tuned from measured rates: the
            same routes, so the same pixels, on every machine with these engines.
        shuffle, seed: sample order per epoch (``set_epoch``), as ``DistributedSampler``; the seed
            also keys the crops and the augmentations.
        drop_last: drop the tail that does not split evenly across ranks and the last partial batch.
        num_threads: decode threads (default: ``GPUPIPE_NUM_THREADS``, else this rank's share of the
            cores: the CPU affinity count, divided by ``LOCAL_WORLD_SIZE`` when the node's ranks share
            the same cores, as under ``torchrun``; :func:`gpupipe.cpu_share`). With
            ``backend="hybrid"`` the CPU pool leaves ``hybrid.ENGINE_HOST_THREADS`` (4; a quarter of a
            smaller budget) to the host side of the GPU decoders that share the batches
            (``stats()["decode_pool"]["threads"]``).
        prefetch: chunks decoded ahead of the consumer (bounds memory: ``prefetch + 3`` buffers,
            and the files of up to ``3 * prefetch + 5`` chunks read ahead, in buffers the Loader
            keeps across epochs). A chunk is one batch, or consecutive batches of fewer than
            :data:`CHUNK_IMAGES` (256) images together: the read, plan, decode and collect stages
            take a chunk at a time and the consumer still gets each batch alone, its pixels,
            augmentation and failures those of the batch alone (its images are then views of the
            chunk's buffer, on every device; an ``augment`` whose samples are independent,
            :func:`gpupipe.keyed.samples_independent`, is called once a chunk). An error of a whole
            chunk (a GPU device error, a crop sampler that raises) is raised at its first batch; a
            batch's own failures at that batch.
        on_error: ``"skip"`` drops failed samples (the batch is smaller), ``"replace"`` keeps zero
            images, ``"raise"`` raises naming the sample's key. Every failure is in ``stats()`` with
            its kind (:mod:`gpupipe.error_policy`).
        rank, world_size: default to the ``torch.distributed`` process group's.
        progress: show a tqdm bar.
        io_threads: threads reading a batch's files (one native call per batch for ``ImageFolder`` and
            ``FileList``, the GIL released; a thread pool calling ``source.read`` otherwise); default
            4, at most the rank's share of the cores.
        read_timeout: seconds a source's own ``read`` may take (default 60; None: no limit). A read
            past it fails its sample (kind ``READ``, the timeout named) and is left to its thread,
            which stops when it returns, while a new one reads on; past 32 such reads still running,
            reads fail at once (:mod:`gpupipe._read_pool`). A read that raises, or returns something
            that is not encoded bytes, fails its sample too. Files read natively (``ImageFolder``,
            ``FileList``) are held to it too: when a batch's reads stall (a hung NFS or FUSE mount),
            its files are read again one by one, each with this deadline, and the ones that stall
            fail, named (a ``TimeoutError``).
        augment_threads: torch's intra-op threads in the augment stage when ``device`` is the CPU (its
            ops and gpupipe's host kernels run beside the decode threads): default ``share -
            num_threads``, or half the share when the decode takes it all (on 2 cores: 1;
            oversubscribing costs ~20% on the recipe benchmark, measured). Set on the stage's own
            thread, so the training loop keeps its setting (torch's OpenMP builds).
        apply_exif_orientation: crop in the displayed frame (``PIL.ImageOps.exif_transpose``):
            boxes are drawn from displayed sizes and crops come out upright.
        lookahead: once an epoch's last batch is read (a few batches, the stages' queues, before
            the epoch ends), start reading and decoding the next epoch's first batches (as many as
            the stages hold), so that the pipeline does not drain and fill again between epochs, as
            DALI's reader runs on. The next epoch is the one after (``set_epoch(epoch + 1)``), or
            the same one again when the last two iterations were of the same epoch. An iteration
            of another epoch or from a resumed position, ``load_state_dict``, an error, an
            iteration closed or dropped before its end, and the Loader's own end drop that work
            (a map-style epoch's end is its last batch delivered: a loop of ``len(loader)`` steps
            that never asks for one more keeps it).
            The batches are those the epoch started afresh gives: the same samples, order, crop
            boxes and keyed augmentation, drawn with the crop sampler and ``augment`` as they are
            when it starts (``lookahead=False`` where a schedule changes them between epochs); on
            CPU outputs ``augment`` and ``batch_transform`` run only once an iteration takes the
            epoch (a keyed module's ``sample_params`` draws ahead). With ``backend="hybrid"`` the
            epoch's shares (its routes) are re-tuned on the batches delivered when it starts if
            they are half the epoch or more (map-style sources), else they are the last complete
            epoch's re-tuning; ``state_dict()`` records them. Between epochs the
            Loader holds up to ``3 * prefetch + 5`` decoded chunks of the next one (on ``device``
            for the GPU backends): ``lookahead=False`` for a Loader iterated once or rarely.

    Yields:
        ``(images, labels)``: images uint8 ``[N, 3, H, W]`` (channels-last) on ``device`` without
        ``augment``, else the module's output; labels int64 ``[N]`` on ``device`` (or what
        ``batch_transform`` makes of them).

    Example:
        >>> import gpupipe, numpy as np, tempfile, pathlib
        >>> root = pathlib.Path(tempfile.mkdtemp())
        >>> (root / "cat").mkdir()
        >>> for i in range(5):
        ...     _ = (root / "cat" / f"{i}.jpg").write_bytes(gpupipe._C.encode_jpeg(np.zeros((40, 50, 3), np.uint8), 40, 50, 3))
        >>> loader = gpupipe.Loader(gpupipe.sources.ImageFolder(root), batch_size=2,
        ...                         crop=gpupipe.crops.RandomResizedCrop(16), num_threads=1)
        >>> [tuple(x.shape) for x, _ in loader]
        [(2, 3, 16, 16), (2, 3, 16, 16), (1, 3, 16, 16)]
        >>> state = loader.state_dict()  # after a whole epoch: resumes at the next one
    """

    def __init__(self, source, *, batch_size: int, crop: CropSampler, augment: Optional[torch.nn.Module] = None,
                 batch_transform: Optional[Callable] = None, device: Any = "cpu", backend: str = "auto",
                 shuffle: bool = True, seed: int = 0, drop_last: bool = False, num_threads: Optional[int] = None,
                 prefetch: int = 2, on_error: str = "skip", rank: Optional[int] = None,
                 world_size: Optional[int] = None, progress: bool = False, io_threads: Optional[int] = None,
                 augment_threads: Optional[int] = None, apply_exif_orientation: bool = False,
                 decode_shares: Optional[dict] = None, lookahead: bool = True,
                 read_timeout: Optional[float] = 60.0):
        batch_size, seed = as_int("batch_size", batch_size), seed_number(seed)
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if num_threads is not None:
            check_thread_count("num_threads", num_threads)
        if not isinstance(crop, CropSampler):
            raise TypeError("crop must be a gpupipe.crops sampler (RandomResizedCrop, RandomCrop, ...)")
        check_on_error(on_error)
        if not is_python_int(prefetch) or not 1 <= prefetch <= MAX_PREFETCH:
            raise ValueError(f"prefetch must be an int within 1..{MAX_PREFETCH} (each costs a chunk's buffer), got {prefetch!r}")
        if not isinstance(source, Source):
            raise TypeError("source must be a gpupipe.sources source (with epoch_samples)")
        if isinstance(source, MapSource):
            labels_of(source)  # (checked again per epoch: now, rather than at the first batch)
        if augment is not None and not callable(augment):
            raise TypeError(f"augment must be callable on a batch of images (an nn.Module), got {type(augment).__name__}")
        if batch_transform is not None and not callable(batch_transform):
            raise TypeError("batch_transform must be callable on (images, labels)")
        self.source = source
        self.batch_size = int(batch_size)
        self.crop = crop
        self.augment = augment
        self.batch_transform = batch_transform
        self.backend = backends.resolve(backend, torch.device(device))  # a clear error when it cannot run here
        self.device = concrete_device(torch.device(device))  # ("cuda": the caller's current device)
        self._bare_cuda = torch.device(device).type == "cuda" and torch.device(device).index is None
        if decode_shares is not None and self.backend != "hybrid":
            raise ValueError(f"decode_shares splits the hybrid backend's batches; this Loader's backend is "
                             f"{self.backend!r}")
        self.decode_shares = None if decode_shares is None else hybrid.Shares.from_dict(decode_shares)
        self.lookahead = bool(lookahead)
        self.shuffle = shuffle
        self.seed = int(seed)
        self.drop_last = drop_last
        self.num_threads = num_threads
        self.prefetch = int(prefetch)
        self.on_error = on_error
        self.rank, self.world_size = _dist_defaults(rank, world_size)
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} is not in [0, {self.world_size})")
        self.progress = progress
        if progress:
            import_extra("tqdm", "progress", "Loader(progress=True)")  # now, not at the first epoch
        self.cpu_share = cores = _C.cpu_share()["threads"]  # this rank's share of the node (LOCAL_WORLD_SIZE)
        self.io_threads = min(4, cores) if io_threads is None else check_thread_count("io_threads", io_threads)
        self.read_timeout = None if read_timeout is None else finite_number(read_timeout, "read_timeout")
        if self.read_timeout is not None and self.read_timeout <= 0:
            raise ValueError(f"read_timeout must be a positive number of seconds or None, got {read_timeout!r}")
        if augment_threads is not None:
            check_thread_count("augment_threads", augment_threads)
        decode = num_threads or _C.default_num_threads()
        self.augment_threads = augment_threads or (cores - decode if decode < cores else max(1, cores // 2))
        self.options = crop.decode_options(num_threads=num_threads or 0, apply_exif_orientation=apply_exif_orientation,
                                           backend=self.backend,
                                           device=torch.device("cpu") if self.backend == "cpu" else self.device)
        self.epoch = 0
        self._stats = _Stats()
        self._resume: Optional[tuple[int, int]] = None  # (epoch, first batch) of a restored run
        self._fingerprint: Optional[tuple] = None  # (what it was made from, the keys, the text)
        self._done = (0, 0)  # (epoch, batches yielded) of the latest iteration
        self._position_owner: Any = None  # weakref to the iterator whose batches _done counts (None after a load)
        self._rings: list = []  # host buffers, passed from epoch to epoch (two: an epoch and the one ahead)
        self._recycled: Optional[_Recycled] = None
        self._arenas: Optional[Arenas] = None  # read buffers, kept across epochs
        self._reads: Optional[ReadPool] = None  # the threads calling a source's own read, across epochs
        self._reads_lock = threading.Lock()
        self._engines: Optional[dict] = None  # hybrid: the GPU engines, made at the first epoch
        self._workers: Optional[hybrid.Workers] = None  # hybrid: a thread and stream per engine, shared by epochs
        self._workers_finalizer: Optional[weakref.finalize] = None
        self._shares: dict = {}  # hybrid: {epoch: Shares} of every epoch started
        self._splits: dict = {}  # hybrid: {epoch: hybrid.SPLIT when it started}: an epoch run again keeps it
        self._next_shares: Optional[hybrid.Shares] = None  # hybrid: re-tuned after a complete epoch
        # hybrid: the measurements of engines given too few samples to re-tune on (hybrid.MIN_MEASURED),
        # added to the next complete epoch's, so that an engine at the smallest share stays measured
        self._unmeasured: dict = {}
        self._ahead: Optional[_Ahead] = None  # the next epoch, started while this one drains (lookahead)
        self._iterated: tuple = (None, None)  # the epochs of the last two iterations (which one comes next)

    def __repr__(self) -> str:
        augment = "" if self.augment is None else f"\n    augment={self.augment!r}"
        return (f"Loader(batch_size={self.batch_size}, crop={self.crop!r}, device={str(self.device)!r}, "
                f"backend={self.backend!r}, shuffle={self.shuffle}, seed={self.seed}, drop_last={self.drop_last}, "
                f"num_threads={self.num_threads or _C.default_num_threads()}, prefetch={self.prefetch}, "
                f"on_error={self.on_error!r}, rank={self.rank}, world_size={self.world_size}){augment}\n"
                f"{indented(repr(self.source))}")

    # --- host buffers, kept across epochs (an epoch of 4 batches would otherwise pay for them 4 times) --

    def _host_ring(self, slots: int, shape: tuple, pin: bool) -> _Ring:
        """A ring over an earlier epoch's host buffers when they fit and its threads have stopped
        (CUDA copies still reading a slot carried over), else over new ones (pinned: cudaHostAlloc).
        Two rings are kept: the epoch iterated and the one started ahead of it."""
        for k, old in enumerate(self._rings):
            if old.retired and old.fits(slots, shape, pin):
                self._rings[k] = ring = _Ring(old.buffers, old.pending())
                return ring
        ring = _Ring([torch.empty(shape, dtype=torch.uint8, pin_memory=pin) for _ in range(slots)])
        self._rings = [*self._rings[-1:], ring]
        return ring

    def _read_arenas(self) -> Arenas:
        """The buffers files are read into, kept across epochs like the host ring."""
        if self._arenas is None:
            # the batches read and not yet decoded: three queues of `prefetch`, the stages', an epoch closing
            self._arenas = Arenas(keep=3 * self.prefetch + 5)
        return self._arenas

    def _read_pool(self) -> ReadPool:
        """The threads calling the source's own ``read``: one pool for the Loader's epochs, so that
        reads left running past the timeout are bounded for its life; shut down with the Loader."""
        with self._reads_lock:
            if self._reads is None:
                self._reads = ReadPool(self.io_threads, self.read_timeout)
                weakref.finalize(self, self._reads.shutdown)
            return self._reads

    def _host_batches(self, shape: tuple) -> _Recycled:
        if self._recycled is None or self._recycled.shape != shape:
            # a batch being decoded, collected and finished, three queues of `prefetch`, the consumer's
            self._recycled = _Recycled(shape, keep=3 * self.prefetch + 5)
        return self._recycled

    # --- the hybrid backend's engine shares ---------------------------------------------------------

    def _gpu_engines(self) -> dict:
        if self._engines is None:
            self._engines = hybrid.gpu_engines(self.device)
        return self._engines

    def _hybrid_workers(self) -> "hybrid.Workers":
        """The GPU engines' threads and streams, acquired by an epoch (released when it closes):
        one set for the epoch iterated and the one started ahead, so that an engine's batches of
        both queue in order on its one thread, and the CUDA events around each time the engine's
        own work (two threads timed each other's batches as waits for the engine: measured on an
        H100, the hardware decoder's rate fell from 4,455 to 1,288 images/s, and the shares with
        it). The last epoch to release them closes them; so does the Loader's end."""
        if self._workers is None or not self._workers.acquire():
            if self._workers_finalizer is not None:
                self._workers_finalizer.detach()  # (closed already: one finalizer per Loader, not per epoch)
            self._workers = hybrid.Workers(list(self._gpu_engines()), self.device)
            self._workers_finalizer = weakref.finalize(self, self._workers.close)
            self._workers.acquire()
        return self._workers

    def _decode_threads(self) -> int:
        """The CPU pool's threads (beside the GPU decoders, :func:`hybrid.cpu_pool_threads`)."""
        if self.backend == "hybrid":
            sharing = hybrid.sharing_engines(self._stats.shares, list(self._engines or ()))
            return hybrid.cpu_pool_threads(self.options.num_threads, sharing)
        return self.options.num_threads or _C.default_num_threads()

    def _epoch_shares(self, epoch: int) -> "hybrid.Shares":
        """The shares of ``epoch``: the fixed ``decode_shares``; else those it started with when it
        runs again (resume, or an epoch iterated twice), else the latest re-tuned ones, else the
        starting ones (the same whatever the thread count)."""
        if self.decode_shares is not None:
            return self.decode_shares
        shares = self._shares.get(epoch)
        if shares is None:
            shares = self._next_shares or hybrid.Shares.prior(["cpu", *self._gpu_engines()])
            self._shares[epoch] = shares
        return shares

    def _retune(self, st: "_Stats") -> None:
        """After a complete epoch: the next epoch's shares from that epoch's engine rates (and the
        earlier epochs' of an engine given too few samples to be measured on one)."""
        if self.decode_shares is None:
            measured = self._measured(st)
            self._next_shares = self._retuned(st, measured)
            self._unmeasured = {e: m for e, m in measured.items() if m[1] < hybrid.MIN_MEASURED}

    def _retuned(self, st: "_Stats", measured: Optional[dict] = None) -> "hybrid.Shares":
        """Shares from the engine rates of the batches ``st`` collected (the epoch's own: the next
        epoch's first batches may be decoding already, lookahead), or from ``measured``."""
        measured = self._measured(st) if measured is None else measured
        return st.shares.retuned(measured, ["cpu", *self._gpu_engines()], self._decode_threads())

    def _measured(self, st: "_Stats") -> dict:
        """``{engine: (decoded, given, seconds)}`` of the batches ``st`` collected, with what earlier
        epochs left unmeasured added."""
        with st.lock:
            measured = {e: tuple(v) for e, v in st.collected_engines.items()}
            measured["cpu"] = (st.collected_cpu[0], st.collected_cpu[0], st.collected_cpu[1])
        for e, before in self._unmeasured.items():
            measured[e] = tuple(a + b for a, b in zip(measured.get(e, (0, 0, 0.0)), before))
        return measured

    # --- lookahead: the next epoch started while this one drains ------------------------------------

    def _look_ahead(self, parent: "_Epoch", shares: Optional["hybrid.Shares"] = None) -> None:
        """Starts the epoch the next iteration most likely asks for (``lookahead``), with
        ``shares`` (hybrid; else the latest re-tuned ones) unless it has its own already. Its
        threads hold the Loader weakly, so a Loader dropped between epochs stops them. A failure
        to start it (pinned memory, threads) turns lookahead off for this Loader, with a warning."""
        if not self.lookahead or self._ahead is not None:
            return
        previous, current = self._iterated
        number = current if previous == current else current + 1
        new_shares = self.backend == "hybrid" and self.decode_shares is None and number not in self._shares
        if new_shares and shares is not None:
            self._shares[number] = shares
        stats = _Stats()
        try:
            epoch = _Epoch(weakref.proxy(self), 0, number, stats, ahead=True)
        except Exception as e:
            if new_shares:
                self._shares.pop(number, None)
            self.lookahead = False
            warnings.warn(f"gpupipe.Loader: the next epoch could not be started ahead ({brief(e, 300)}); "
                          "lookahead is off for this Loader", RuntimeWarning, stacklevel=4)
            return
        self._ahead = _Ahead(epoch, parent, new_shares, weakref.finalize(self, epoch.close))

    def _take_ahead(self, first_batch: int) -> Optional["_Ahead"]:
        """The epoch started ahead when it is the one now asked for from its start, else None (and
        it is dropped)."""
        ahead = self._ahead
        if ahead is None:
            return None
        if first_batch == 0 and ahead.epoch.epoch_number == self.epoch:
            self._ahead = None
            ahead.finalizer.detach()
            ahead.epoch.l = self  # the iteration holds the Loader from now on
            ahead.epoch.adopted.set()
            return ahead
        self._drop_ahead()
        return None

    def _drop_ahead(self, parent: Optional["_Epoch"] = None) -> None:
        """Stops the epoch started ahead (only the one ``parent`` started, when given)."""
        ahead = self._ahead
        if ahead is None or (parent is not None and ahead.parent() is not parent):
            return
        self._ahead = None
        ahead.finalizer()
        if ahead.new_shares:  # never iterated: the epoch gets the shares of when it really starts
            self._shares.pop(ahead.epoch.epoch_number, None)
        if ahead.epoch.new_split and not ahead.epoch.adopted.is_set():  # and the split
            self._splits.pop(ahead.epoch.epoch_number, None)

    # --- sampling ---------------------------------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """Selects the epoch's order (and each rank's shard), as ``DistributedSampler.set_epoch``:
        an int >= 0 (a float would be truncated to another epoch's samples and draws). Another
        epoch than the position's moves state_dict() to its start, where the next iteration begins."""
        self.epoch = epoch_number(epoch)
        if self._done[0] != self.epoch:  # the next iteration is this epoch's start: an older one no
            self._done, self._resume, self._position_owner = (self.epoch, 0), None, None  # longer moves it

    def indices(self) -> np.ndarray:
        """This rank's sample indices for the current epoch, in order (``DistributedSampler``)."""
        if not isinstance(self.source, MapSource):
            raise TypeError("a streamed source's indices are not known in advance")
        return distributed_indices(len(self.source), epoch=self.epoch, seed=self.seed, shuffle=self.shuffle,
                                   rank=self.rank, world_size=self.world_size, drop_last=self.drop_last)

    def __len__(self) -> int:
        if not isinstance(self.source, MapSource):
            raise TypeError("the number of batches of a streamed source (TarShards) is not known in advance")
        n = len(self.indices())
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def __iter__(self):
        if self._bare_cuda and torch.cuda.current_device() != self.device.index:
            self._bare_cuda = False  # (said once)
            warnings.warn(f"this Loader was made with device='cuda' while {self.device} was the current device; "
                          f"cuda:{torch.cuda.current_device()} is current now. It decodes on {self.device}: made "
                          f"before torch.cuda.set_device(local_rank)? Pass device=torch.device('cuda', local_rank).",
                          UserWarning, stacklevel=user_stacklevel())
        first = 0
        if self._resume is not None and self._resume[0] == self.epoch:
            first = self._resume[1]
        self._resume = None
        return _LoaderIterator(self, first)

    # --- resume: the torchdata StatefulDataLoader contract ----------------------------------------

    def state_dict(self) -> dict:
        """Where the latest iteration stands: restored with :meth:`load_state_dict` (in this or a
        new process), the next iteration yields exactly the batches an uninterrupted run would have
        yielded after these, pixels and augmentation included, for any ``num_threads``."""
        epoch, done = self._done
        state = {"version": 1, "epoch": epoch, "batches": done, "seed": self.seed, "shuffle": self.shuffle,
                 "batch_size": self.batch_size, "drop_last": self.drop_last, "rank": self.rank,
                 "world_size": self.world_size, "crop": repr(self.crop), "source": self._source_fingerprint(),
                 "apply_exif_orientation": self.options.apply_exif_orientation}
        if isinstance(self.source, MapSource):  # (the same files with other labels are another dataset)
            state["labels"] = f"{zlib.crc32(np.ascontiguousarray(labels_of(self.source)).tobytes()):08x}"
        if self.backend == "hybrid" and self.decode_shares is None:
            # every epoch's shares (its routes, when it runs again), and the next epoch's tuning
            state["decode_shares"] = {"epochs": {e: v.as_dict() for e, v in sorted(self._shares.items())},
                                      "next": self._next_shares.as_dict() if self._next_shares else None}
        if self.backend == "hybrid":  # the epoch's split: its routes (hybrid.SPLIT)
            state["hybrid_split"] = self._splits.get(epoch, hybrid.SPLIT)
        if isinstance(self.source, TarShards):  # what orders a stream's samples besides its shards
            state["stream"] = f"shuffle_buffer={self.source.shuffle_buffer}, samples_per_rank={self.source.samples_per_rank}"
        return state

    def _source_fingerprint(self) -> str:
        """What identifies the dataset: its length and a hash of its keys (map-style), its shards; a
        custom stream: its class and what its ``fingerprint()`` returns, when it has one. Made again
        when the keys change (a KeyList counts changes in place)."""
        source = self.source
        keys = source.keys if isinstance(source, MapSource) else getattr(source, "paths", None)
        if keys is None:  # (asked each time: what it says may change)
            own = getattr(source, "fingerprint", None)
            return f"{type(source).__qualname__}:{own() if callable(own) else ''}"
        changes = getattr(keys, "changes", None)  # a KeyList counts its changes: cached until one; else made each time
        made_from = (id(keys), changes, len(keys))
        if changes is None or self._fingerprint is None or self._fingerprint[0] != made_from:
            text = _keys_fingerprint(keys, below_common_folder=True)
            self._fingerprint = (made_from, keys, text)  # (keys held: their id is not reused meanwhile)
        return self._fingerprint[2]

    def _source_fingerprint_before_moves(self) -> Optional[str]:
        """The fingerprint states of before 2026-11-28 recorded: of the whole keys (a dataset moved
        to another folder did not resume); None for a source without keys."""
        source = self.source
        keys = source.keys if isinstance(source, MapSource) else getattr(source, "paths", None)
        return None if keys is None else _keys_fingerprint(keys, below_common_folder=False)

    def load_state_dict(self, state: dict) -> None:
        """Resumes at the batch after those ``state`` counted, in ``state["epoch"]`` (which
        ``set_epoch`` is set to; calling ``set_epoch`` with the same epoch keeps the position). A
        state taken after a whole epoch resumes at that epoch's first batch, as an uninterrupted
        run's next iteration would. A state of another configuration (seed, batch size, sampler,
        ranks, dataset) is refused, and so is any field of the wrong type or range (``ValueError``
        naming it): nothing of a damaged state is taken."""
        if not isinstance(state, dict):
            raise ValueError(f"a Loader state is the dict state_dict() returns, got {type(state).__name__}")
        mine = self.state_dict()
        # (a state of before the hybrid backend, or of before its split: the keyed split)
        # (a state of before the stream's settings were recorded: taken as this Loader's)
        # (a state of before the labels and the orientation were recorded: taken as this Loader's)
        optional = ("decode_shares", "hybrid_split", "stream", "labels", "apply_exif_orientation")
        missing = [k for k in mine if k not in state and k not in optional]
        if missing:
            raise ValueError(f"the Loader state lacks {', '.join(missing)}")
        for k in mine:
            if k in state and not _same_kind(state[k], mine[k]):
                raise ValueError(f"the Loader state's {k}={state[k]!r} is not a {type(mine[k]).__name__}")
        if state["version"] != 1:
            raise ValueError(f"unknown Loader state version {state['version']!r}")
        if state["source"] == _UNVERIFIED_STREAM and not hasattr(self.source, "paths") and not isinstance(
                self.source, MapSource):
            state = {**state, "source": mine["source"]}  # a custom stream's state of before its class was recorded
        if state["source"] != mine["source"] and state["source"] == self._source_fingerprint_before_moves():
            state = {**state, "source": mine["source"]}  # a state of before the keys were hashed below their folder
        for k in ("seed", "shuffle", "batch_size", "drop_last", "rank", "world_size", "crop", "source", "stream",
                  "labels", "apply_exif_orientation"):
            if k in mine and state.get(k, mine[k]) != mine[k]:
                raise ValueError(f"the state was taken with {k}={state[k]!r}, this Loader has {k}={mine[k]!r}")
        epoch, batches = int(state["epoch"]), int(state["batches"])
        if epoch < 0:
            raise ValueError(f"the Loader state's epoch={epoch} is negative")
        if batches < 0:
            raise ValueError(f"the Loader state's batches={batches} is negative")
        if isinstance(self.source, MapSource):  # the count of an epoch's batches is the same for every epoch
            total = len(self)
            if batches > total:
                raise ValueError(f"the Loader state's batches={batches} is more than the {total} batches of epoch {epoch}")
        if "decode_shares" in mine:
            shares = state.get("decode_shares", {"epochs": {}, "next": None})
            if set(shares) != {"epochs", "next"} or not isinstance(shares["epochs"], dict):
                raise ValueError(f"the Loader state's decode_shares={shares!r} is not "
                                 "{'epochs': {...}, 'next': ...}")
            history = {}
            for e, v in shares["epochs"].items():
                if isinstance(e, str) and e.isdecimal() and e.isascii():  # a state stored as JSON: keys are text
                    e = int(e)
                if not _same_kind(e, 0) or e < 0:
                    raise ValueError(f"the Loader state's decode_shares has an epoch {e!r}")
                history[int(e)] = hybrid.Shares.from_dict(v)
            after = None if shares["next"] is None else hybrid.Shares.from_dict(shares["next"])
        if "hybrid_split" in mine:
            split = state.get("hybrid_split", "keyed")
            try:
                hybrid.check_split(split)
            except ValueError:
                raise ValueError(f"the Loader state's hybrid_split={split!r} is not 'keyed' or 'ranked'") from None
        self._drop_ahead()  # every check is passed: this state is taken
        if "decode_shares" in mine:
            self._shares, self._next_shares, self._unmeasured = history, after, {}
        if "hybrid_split" in mine:
            self._splits = {epoch: split}  # the resumed epoch routes as it did; later ones follow hybrid.SPLIT
        self.epoch = epoch
        self._resume = (epoch, batches)
        self._done = (epoch, batches)
        self._position_owner = None  # an iteration still running does not move the loaded position

    # --- reporting --------------------------------------------------------------------------------

    def stats(self) -> dict:
        """Throughput and where the time went since the current epoch's iteration started.

        Keys: ``images``, ``batches``, ``images_per_s``, ``wall_s``, ``busy_s`` (per stage: read,
        plan, decode, transfer, augment; stages overlap), ``wait_s`` (time the consumer waited for
        a batch: starvation), ``skipped`` / ``replaced`` (:class:`gpupipe.error_policy.SampleFailure`:
        key, kind, message), ``failures`` ({kind name: count}), ``routes`` ({route: samples}:
        ``cpu``, ``gpu``, ``pillow``, ``cpu-fallback``, ``gpu-hardware``, ``gpu-cuda``), ``fallback``
        ([(key, reason)] for samples not decoded by the backend's own decoder), ``warnings``
        ([(key, message)]). With ``backend="hybrid"``: ``shares`` (the epoch's fraction per engine)
        and ``engines`` (per GPU engine: ``images`` decoded, ``given``, ``seconds`` of its work,
        its overlapping calls counted once, ``images_per_s``), ``calls_in_flight`` (per GPU engine,
        ``hybrid.CALLS_IN_FLIGHT``) and ``lane_failures`` (why a lane shares another's decoder).

        Where the host's time goes: ``host_s`` (per stage, the CPU time its thread spent outside
        gpupipe's native calls: Python, torch ops, bookkeeping; the pools' work is not in it) and
        ``host_us_per_image`` (their sum per delivered image); ``decode_pool`` (``threads``,
        ``busy_s``: thread-seconds the CPU core spent decoding the delivered batches' samples,
        ``utilisation``: the thread-seconds the process's CPU decodes took from the iteration's start
        (its first request, for an epoch started ahead) to its last batch, over threads x that wall
        time, whichever epoch's samples they were (with ``lookahead`` the next epoch's too); at most
        1); ``threads`` (this rank's ``share`` of the cores, see :func:`gpupipe.cpu_share`, and the
        ``decode``, ``io`` and ``augment`` threads taken from it); ``entropy_index`` (the process's,
        :func:`gpupipe.entropy_index_stats`: its ``full`` count says when files no longer fit).
        """
        s = self._stats
        busy, wait = s.times.snapshot()
        host = s.times.host()
        decode_threads = self._decode_threads()
        with s.lock:
            pool_busy = s.cpu_busy
            wall = (s.last - s.started) if s.started and s.last else 0.0
            pool_busy_all = s.pool_busy_last - s.pool_busy_started
            failures: dict = {}
            for f in s.skipped + s.replaced:
                failures[f.kind.name.lower()] = failures.get(f.kind.name.lower(), 0) + 1
            return {
                "images": s.images, "batches": s.batches, "images_per_s": s.images / wall if wall > 0 else 0.0,
                "busy_s": busy, "wait_s": wait, "wall_s": wall, "skipped": list(s.skipped),
                "replaced": list(s.replaced), "failures": failures, "routes": s.routes(),
                "fallback": list(s.fallback), "warnings": list(s.warnings),
                "host_s": host, "host_us_per_image": 1e6 * sum(host.values()) / s.images if s.images else 0.0,
                "decode_pool": {"threads": decode_threads, "busy_s": pool_busy,
                                "utilisation": min(pool_busy_all / (decode_threads * wall), 1.0) if wall > 0 else 0.0},
                "threads": {"share": self.cpu_share, "decode": decode_threads, "io": self.io_threads,
                            "augment": self.augment_threads},
                "entropy_index": _C.entropy_index_stats(),
                **self._hybrid_stats(s),
            }

    def _hybrid_stats(self, s: "_Stats") -> dict:
        if self.backend != "hybrid":
            return {}
        workers = self._workers
        return {"shares": s.shares.as_dict() if s.shares else None,  # (a chunk's counts are shared out: rounded)
                "engines": {e: {"images": round(n), "given": round(g), "seconds": t, "images_per_s": n / t if t > 0 else 0.0}
                            for e, (n, g, t) in s.engine_seconds.items()},
                # each GPU engine's calls in flight, and why a lane shares another's decoder
                "calls_in_flight": workers.calls_in_flight() if workers is not None else {},
                "lane_failures": workers.lane_failures() if workers is not None else []}


def _overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether the memory of ``a``'s storage and ``b``'s overlap (a view through DLPack or numpy
    has a storage of its own over the same bytes)."""
    if a.device != b.device:
        return False
    sa, sb = a.untyped_storage(), b.untyped_storage()
    return sa.data_ptr() < sb.data_ptr() + sb.nbytes() and sb.data_ptr() < sa.data_ptr() + sa.nbytes()


def _same_kind(value, reference) -> bool:
    """A state field of the type state_dict() gives it: bool for bool, an integer (not a bool) for int."""
    if isinstance(reference, bool):
        return isinstance(value, (bool, np.bool_))
    if isinstance(reference, int):
        return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))
    return isinstance(value, type(reference))


class _Epoch:
    """The stage functions and resources of one epoch's iteration. Threads reference this object,
    never the iterator, so dropping the iterator finalises the iteration."""

    def __init__(self, loader: Loader, first_batch: int, epoch_number: int, stats: _Stats, ahead: bool = False):
        self.l = loader
        self.first_batch = first_batch
        self.stats = stats
        self.read_all = False  # the epoch's last batch went into the pipeline (lookahead starts the next)
        self.adopted = threading.Event()  # an epoch started ahead: set when an iteration takes it
        self.closing = False
        self._close_lock = threading.Lock()
        if not ahead:
            self.adopted.set()
        self.native_reads = isinstance(loader.source, MapSource) and loader.source.reads_files()
        # a source's own read() runs on a Python thread pool; files are read natively (read_many)
        self.reader = None if self.native_reads else loader._read_pool()
        self.reads_cancelled = threading.Event()  # set at close: a read stage waiting on reads returns
        # the batches' bytes in reused buffers, one per batch in flight (queues of `prefetch`, the stages)
        self.arenas = loader._read_arenas() if self.native_reads else None
        h, w = loader.crop.size
        # chunks where a decode call's outcome is each sample's own (the CPU core, the hybrid backend);
        # DALI's and torchvision's decoders fail a whole call for one bad file: their batches stay alone
        self.chunk_batches = chunk_batches(loader.batch_size) if loader.backend in ("cpu", "hybrid") else 1
        rows = self.chunk_batches * loader.batch_size  # a chunk's images at most
        self.ring = None
        # Reused host buffers where the decoded batch is read once more: copied to the GPU, or augmented
        # into new tensors. A CPU batch handed out as decoded gets a new tensor of its own (GPU backends
        # decode on the device): a ring would cost a copy of every batch.
        if loader.backend == "cpu" and (loader.device.type == "cuda" or loader.augment is not None):
            # a slot per chunk queued for the consumer, one in the finish stage, one being collected
            # and one started: prefetch + 3
            self.ring = loader._host_ring(loader.prefetch + 3, (rows, h, w, 3), pin=loader.device.type == "cuda")
        self.recycled = loader._host_batches((rows, h, w, 3)) \
            if self.ring is None and loader.device.type == "cpu" else None
        self.epoch_number = epoch_number  # a set_epoch() during the iteration changes nothing of it
        self.shares = self.workers = self.decode_stream = self.split = None
        self.new_split = False
        if loader.backend == "hybrid":
            self.new_split = epoch_number not in loader._splits
            self.split = loader._splits.setdefault(epoch_number, hybrid.check_split(hybrid.SPLIT))
            self.shares = loader._epoch_shares(epoch_number)
            stats.shares = self.shares
            self.workers = loader._hybrid_workers()
        try:
            if loader.backend in ("hybrid", "nvjpeg", "dali") and loader.device.type == "cuda":
                # GPU decoders' work and waits on a stream of their own, never the training step's (a stage
                # thread's current stream is the legacy default one, which the decoders' device checks
                # synchronised and the training step's work queued on)
                self.decode_stream = torch.cuda.Stream(loader.device)
            self.augment_keyed = _keyed(loader.augment)
            self.transform_keyed = _keyed(loader.batch_transform)
            # A chunk's batches transferred and augmented in one call, when each sample's output is its
            # own (the augmentation's per-call host cost, a copy and its event, paid per chunk); the
            # batch transform (MixUp, CutMix: one draw per batch) stays per batch.
            self.finish_whole = self.chunk_batches > 1 and (
                (loader.augment is None and loader.device.type == "cuda")
                or (loader.augment is not None and keyed.samples_independent(loader.augment)
                    and (self.augment_keyed or not getattr(loader.augment, "training", True))))
            self.stream = torch.cuda.Stream(loader.device) if loader.device.type == "cuda" else None
            # (a ring slot is waited for before the decode's call scope: a process exiting meanwhile does not wait)
            stages = [("read", self.read), ("plan", self.plan), ("decode", self.decode, True, self._take_slot),
                      ("collect", self.collect)]
            if loader.device.type == "cpu":  # real work on the CPU: overlapped; on CUDA, queued GPU work
                # times its transfer and augment parts; an epoch started ahead runs them once it is taken
                stages.append(("finish", self.finish, False, self._wait_until_adopted))
            self.engine = Engine(self.batches(), stages, capacity=loader.prefetch, times=stats.times,
                                 closables=[self.ring] if self.ring else [], name="gpupipe", device=loader.device)
        except BaseException:  # nothing started: what was taken is given back
            self._release_workers()
            if self.ring is not None:
                self.ring.retired = True
            raise

    def close(self) -> None:
        self.closing = True
        self.reads_cancelled.set()  # (a read stage waiting on its source's reads then stops)
        self.adopted.set()  # (a finish stage waiting for it then stops)
        self.engine.close()
        self._release_workers()

    def _release_workers(self) -> None:
        """The GPU engines' workers given back (once): shared with the epoch ahead or behind, the
        last one closes them."""
        with self._close_lock:
            workers, self.workers = self.workers, None
        if workers is not None:
            workers.release()
        engine = getattr(self, "engine", None)  # (none when the epoch failed to start its threads)
        if self.ring is not None and (engine is None or not engine.alive):  # nothing of it writes a slot any more
            self.ring.retired = True

    # --- the stages -------------------------------------------------------------------------------

    def batches(self):
        """The epoch's batches, in chunks of :func:`chunk_batches` (the last one shorter)."""
        group: list = []
        try:
            for batch in self._batches():
                group.append(batch)
                if len(group) == self.chunk_batches:
                    yield _chunk(group)
                    group = []
        except Exception:  # a source's iteration failed: the batches it gave first are delivered first
            if group:
                yield _chunk(group)
            raise
        if group:
            yield _chunk(group)
        self.read_all = True

    def _batches(self):
        l = self.l
        start = self.first_batch * l.batch_size
        if isinstance(l.source, MapSource):  # arrays: no Python per sample
            order = distributed_indices(len(l.source), epoch=self.epoch_number, seed=l.seed, shuffle=l.shuffle,
                                        rank=l.rank, world_size=l.world_size, drop_last=l.drop_last)[start:]
            labels = labels_of(l.source)
            for number, first in enumerate(range(0, len(order), l.batch_size), self.first_batch):
                chunk = order[first:first + l.batch_size]
                if l.drop_last and len(chunk) < l.batch_size:
                    return
                yield Batch(number, chunk, labels[chunk], source=l.source)
            return
        samples = l.source.epoch_samples(epoch=self.epoch_number, seed=l.seed, shuffle=l.shuffle, rank=l.rank,
                                         world_size=l.world_size, drop_last=l.drop_last, start=start)
        for number in itertools.count(self.first_batch):
            chunk = list(itertools.islice(samples, l.batch_size))
            if not chunk or (l.drop_last and len(chunk) < l.batch_size):
                return
            yield Batch(number, np.array([s.index for s in chunk], dtype=np.int64),
                        np.array([s.label for s in chunk], dtype=np.int64), samples=chunk)

    def read(self, batch: Batch) -> Batch:
        """The batch's bytes: carried by the samples, or read by the source, failures per sample
        (kind READ, in ``read_errors``), never the epoch's."""
        source = self.l.source
        if batch.samples is not None:  # a stream: the bytes came with the records
            got = [(b"", s.error) if s.error is not None else read_result(s.data) for s in batch.samples]
        elif self.native_reads:  # one native call per batch, no Python per file
            batch.datas, failed = source.read_batch(batch.indices, self.l.io_threads, self.arenas, self.l.read_timeout,
                                                    self.l.batch_size)  # (a chunk of batches: each within max_batch_bytes)
            batch.read_errors = {k: f"read error: {type(e).__name__}: {e}" for k, e in failed.items()}
            return batch
        else:  # the source's own read, on the read pool: what raises, hangs or gives no bytes fails alone
            reads = self.reader.map(source.read, batch.indices.tolist(), self.reads_cancelled)
            got = [read_result(d) for d in reads]
        batch.datas = [d for d, _ in got]
        batch.read_errors = {k: e for k, (_, e) in enumerate(got) if e is not None}
        return batch

    def plan(self, batch: Batch) -> Batch:
        l = self.l
        batch.datas, batch.infos, batch.boxes = plan_batch(batch.datas, l.crop, l.options, seed=l.seed,
                                                           epoch=self.epoch_number, indices=batch.indices,
                                                           read_errors=batch.read_errors)
        if self.augment_keyed and (batch.parts is None or self.finish_whole):
            # (a chunk finished whole: one draw, each sample's parameters its own whatever its batch)
            try:
                batch.augment_params = l.augment.sample_params(len(batch), seed=l.seed, epoch=self.epoch_number,
                                                               indices=torch.from_numpy(batch.indices))
            except Exception:
                if batch.parts is None:
                    raise
                batch.augment_params = None  # drawn per batch below: the batches before the failing one go on
        if self.augment_keyed and batch.parts is not None and batch.augment_params is None:
            # a chunk's batches each draw their own (a module may draw per batch)
            for part in batch.parts:
                try:
                    part.augment_params = l.augment.sample_params(len(part), seed=l.seed, epoch=self.epoch_number,
                                                                  indices=torch.from_numpy(part.indices))
                except Exception as e:  # raised when this batch is reached, after those before it
                    part.error = e
        return batch

    def decode(self, batch: Batch) -> Batch:
        if self.decode_stream is None:  # (torch.cuda.stream(None) asks for CUDA devices: 60 us on a host without)
            return self._decode(batch)
        with torch.cuda.stream(self.decode_stream):  # a GPU decoder: out's allocation and waits here
            return self._decode(batch)

    def _decode(self, batch: Batch) -> Batch:
        l = self.l
        n = len(batch)
        if self.ring is not None:  # (its slot taken by _take_slot)
            batch.images = self.ring.buffers[batch.slot][:n]
        elif self.recycled is not None:
            batch.images = self.recycled.take(n)
        else:
            batch.images = torch.empty((n, *l.crop.size, 3), dtype=torch.uint8, device=l.device)
        try:
            if l.backend == "cpu" and straight(batch.infos, l.options):
                # started: the pool takes this batch's samples as soon as the previous batch's are taken
                started = cpu.start(batch.datas, np.ascontiguousarray(batch.boxes), batch.images, l.options)
                batch.pending = lambda: cpu.wait(started, n)
            elif l.backend == "hybrid" and straight(batch.infos, l.options):
                # the CPU share started on the pool, the GPU shares queued on their engines
                started = hybrid.start(batch.datas, batch.boxes, batch.images, l.options, batch.infos,
                                       keys=self.route_keys(batch), shares=self.shares, engines=l._gpu_engines(),
                                       workers=self.workers)
                batch.pending = lambda: hybrid.wait(started)
            else:
                # (the epoch's engines and threads: threads made per batch would vie with them for the decoders)
                keyed_routes = {"keys": self.route_keys(batch), "shares": self.shares, "engines": l._gpu_engines(),
                                "workers": self.workers} if l.backend == "hybrid" else {}
                batch.status = decode_into(batch.datas, batch.boxes, batch.images, l.options, infos=batch.infos,
                                           **keyed_routes)
        except BaseException:
            self.release(batch)
            raise
        if batch.pending is None:
            _mark_ready(batch)
        return batch

    def route_keys(self, batch: Batch) -> "hybrid.RouteKeys":
        # the batch numbers: the ranked split ranks each batch of a chunk alone
        if batch.parts is None:
            groups = np.full(len(batch), batch.number, dtype=np.int64)
        else:
            groups = np.repeat(np.array([p.number for p in batch.parts], dtype=np.int64), [len(p) for p in batch.parts])
        return hybrid.RouteKeys(self.l.seed, self.epoch_number, batch.indices, groups, self.split)

    def collect(self, batch: Batch) -> Batch:
        """The batch's decode, waited for (when it was started), and the error policy applied."""
        if self.decode_stream is None:
            return self._collect(batch)
        with torch.cuda.stream(self.decode_stream):
            return self._collect(batch)

    def _collect(self, batch: Batch):
        l = self.l
        try:
            if batch.pending is not None:
                batch.status = batch.pending()
                batch.pending = None
                _mark_ready(batch)  # a started hybrid decode's last work was queued by this thread
            self.stats.collected(batch.status, len(batch.parts) if batch.parts is not None else 1)
            if batch.parts is not None:  # the chunk's batches go on one by one
                return Many(self._split(batch))
            batch.failures = apply_policy(batch.status, l.on_error, batch.keys)
        except BaseException:
            self.release(batch)
            raise
        return batch

    def _split(self, chunk: Batch) -> list:
        """A collected chunk as its batches: views of its images and slot, their own statuses and
        failures (the policy's error, with on_error="raise", kept for when the batch is reached:
        the batches before it are delivered first). The chunk's engine and pool seconds are shared
        out by the samples each engine decoded in each batch (``stats()`` counts delivered batches)."""
        parts = chunk.parts
        use = _SlotUse(len(parts)) if chunk.slot is not None else None
        measured = chunk.status.split_seconds([len(p) for p in parts], _ENGINE_ROUTES)
        start = 0
        for part, (engine_seconds, cpu_busy) in zip(parts, measured):
            n = len(part)
            part.images, part.slot, part.slot_use, part.ready = chunk.images[start:start + n], chunk.slot, use, chunk.ready
            part.offset = start
            part.status = chunk.status.rows(start, start + n)
            part.status.engine_seconds, part.status.cpu_busy_seconds = engine_seconds, cpu_busy
            if part.error is None:  # (a keyed augment that failed to draw this batch's parameters)
                try:
                    part.failures = apply_policy(part.status, self.l.on_error, part.keys)
                except Exception as e:
                    part.error = e
            start += n
        if self.finish_whole and (not self.augment_keyed or chunk.augment_params is not None) and \
                all(p.error is None for p in parts) and (self.l.on_error != "skip" or chunk.status.all_ok()):
            whole = _Whole(chunk)  # the chunk keeps its slot: the first batch reached finishes it whole
            for part in parts:
                part.whole, part.slot, part.slot_use = whole, None, None
        elif chunk.augment_params is not None:  # finished batch by batch after all: each its rows
            for part in parts:
                if part.error is None:
                    part.augment_params = _part_rows(chunk.augment_params, len(chunk), part.offset, len(part))
        return parts

    def _wait_until_adopted(self, batch: Batch) -> Batch:
        """The finish stage's gate (CPU outputs): an epoch started ahead applies ``augment`` and
        ``batch_transform`` only once an iteration took it, never for an epoch then dropped."""
        if not self.adopted.is_set() and (self.l.augment is not None or self.l.batch_transform is not None):
            self.adopted.wait()
            if self.closing:
                raise Closed
        return batch

    def _take_slot(self, batch: Batch) -> Batch:
        """The decode stage's gate: a free slot of the host ring, waited for (a later stage frees it)."""
        if self.ring is not None:
            batch.slot = self.ring.acquire()
        return batch

    def finish(self, batch: Batch):
        """(images, labels) of a decoded batch, on the consumer's side of the queue."""
        l = self.l
        if batch.error is not None:  # on_error="raise": this batch's failure, now that it is reached
            self.release(batch)
            raise batch.error
        if batch.whole is not None:
            return self._finish_part(batch)
        images, labels, indices, params = self._kept(batch)
        clock = HostClock()
        images = self._to_device(batch, images)
        labels = to_device(labels, l.device)
        self.stats.times.add("transfer", *clock.read())
        clock = HostClock()
        if l.device.type == "cpu" and _PER_THREAD_TORCH_THREADS:  # this is the augment stage's own thread
            torch.set_num_threads(l.augment_threads)  # torch's ops and gpupipe's kernels both follow it
        images, labels = self._augment(batch, images, labels, indices, params)
        if l.augment is not None or l.batch_transform is not None:
            self.stats.times.add("augment", *clock.read())
        return _Finished(images, labels, batch)

    def _finish_part(self, batch: Batch) -> "_Finished":
        """A batch of a chunk finished whole: the chunk's transfer and augmentation done once, when
        its first batch is reached (on the consumer's stream, as a batch alone), then the batch's
        rows of them and its own batch transform."""
        l, whole = self.l, batch.whole
        if whole.images is None and whole.source is None:
            chunk = whole.chunk
            clock = HostClock()
            images = self._to_device(chunk, chunk.images.permute(0, 3, 1, 2))
            whole.labels = to_device(chunk.labels, l.device)
            whole.seconds["transfer"] = clock.read()
            if l.augment is not None:
                clock = HostClock()
                if l.device.type == "cpu" and _PER_THREAD_TORCH_THREADS:
                    torch.set_num_threads(l.augment_threads)
                try:
                    images = self._augment_only(chunk, images, chunk.augment_params)
                except Exception:
                    # The chunk's call failed (a sample the module refuses, no memory for four batches'
                    # output): each batch is then augmented alone, as without chunks, so the batches
                    # before a failing one are delivered and its error comes at its own batch.
                    whole.source = images
                    self._mark_finished(whole, images)
                    return self._finish_alone(batch)
                whole.seconds["augment"] = clock.read()
            whole.images, whole.chunk = images, None
            self._mark_finished(whole, images)
        else:
            self._follow_consumer(whole)
            if whole.source is not None:
                return self._finish_alone(batch)
        self._add_share(whole, len(batch))
        rows = slice(batch.offset, batch.offset + len(batch))
        images, labels = whole.images[rows], whole.labels[rows]
        if l.batch_transform is not None:
            clock = HostClock()
            images, labels = self._batch_transform(images, labels, torch.from_numpy(batch.indices))
            self.stats.times.add("augment", *clock.read())
        return _Finished(images, labels, batch)

    def _mark_finished(self, whole: "_Whole", images: torch.Tensor) -> None:
        """On CUDA: the consumer's stream that holds the chunk's work, and an event after it."""
        if images.is_cuda:
            whole.stream = torch.cuda.current_stream(self.l.device)
            whole.done = torch.cuda.Event()
            whole.done.record(whole.stream)

    def _follow_consumer(self, whole: "_Whole") -> None:
        """A later batch of the chunk taken on another stream: that stream waits for the chunk's work,
        and the allocator keeps its memory for it."""
        if whole.stream is not None and torch.cuda.current_stream(self.l.device) != whole.stream:
            consumer = torch.cuda.current_stream(self.l.device)
            consumer.wait_event(whole.done)
            for t in (whole.images, whole.source, whole.labels):
                if t is not None:
                    t.record_stream(consumer)

    def _add_share(self, whole: "_Whole", rows: int) -> None:
        """stats() counts delivered batches: the chunk's seconds, a batch's rows' share at a time."""
        for stage, (wall, cpu_s) in whole.seconds.items():
            self.stats.times.add(stage, wall * rows / whole.rows, cpu_s * rows / whole.rows)

    def _finish_alone(self, batch: Batch) -> "_Finished":
        """A batch of a chunk whose one augment call failed: its rows of the chunk's transferred
        images augmented alone, with its rows of the chunk's parameters (the chunk's slot released
        after its last batch's call)."""
        l, whole = self.l, batch.whole
        self._add_share(whole, len(batch))
        rows = slice(batch.offset, batch.offset + len(batch))
        images, labels = whole.source[rows], whole.labels[rows]
        params = _part_rows(whole.chunk.augment_params, whole.rows, batch.offset, len(batch)) \
            if self.augment_keyed else None
        clock = HostClock()
        try:
            images = self._call_augment(whole.chunk, images, params)
        finally:
            whole.pending_rows -= len(batch)
            if whole.pending_rows == 0:  # (its last batch: nothing reads the slot any more)
                self.release(whole.chunk)
        if l.batch_transform is not None:
            images, labels = self._batch_transform(images, labels, torch.from_numpy(batch.indices))
        self.stats.times.add("augment", *clock.read())
        return _Finished(images, labels, batch)

    def _call_augment(self, batch: Batch, images, params):
        """augment (keyed when it follows the protocol) of ``batch``'s images (or rows of them)."""
        l = self.l
        out = l.augment(images, params=params) if self.augment_keyed else l.augment(images)
        if batch.slot is not None and _overlaps(out, batch.images):
            out = out.clone()  # the module handed back (part of) the ring slot, maybe through another storage
        return out

    def _augment_only(self, batch: Batch, images, params):
        """augment; the batch's ring slot released after it."""
        images = self._call_augment(batch, images, params)
        self.release(batch)
        return images

    def _augment(self, batch: Batch, images, labels, indices, params):
        """augment, then batch_transform, each keyed when it follows the protocol."""
        l = self.l
        if l.augment is not None:
            images = self._augment_only(batch, images, params)
        self.release(batch)
        return self._batch_transform(images, labels, indices) if l.batch_transform is not None else (images, labels)

    def _batch_transform(self, images, labels, indices):
        """batch_transform (MixUp, CutMix: one draw per batch), keyed when it follows the protocol."""
        l = self.l
        if self.transform_keyed:
            p = l.batch_transform.sample_params(images.shape[0], seed=l.seed, epoch=self.epoch_number, indices=indices)
            return l.batch_transform(images, labels, params=p)
        return l.batch_transform(images, labels)

    def _kept(self, batch: Batch):
        """The batch's images (NCHW view of the NHWC slot), labels, indices and augmentation
        parameters, without the failed samples when the policy skips them (a copy: the slot is
        released at once)."""
        images = batch.images.permute(0, 3, 1, 2)
        labels = torch.from_numpy(batch.labels)
        indices = torch.from_numpy(batch.indices)
        params = batch.augment_params
        if self.l.on_error == "skip" and not batch.status.all_ok():
            keep = torch.from_numpy(np.flatnonzero(batch.status.ok))  # (not a mask: that waits for the GPU)
            if batch.ready is not None:
                torch.cuda.current_stream(self.l.device).wait_event(batch.ready)
            images, labels, indices = images[to_device(keep, images.device)], labels[keep], indices[keep]
            params = _rows(params, keep, len(batch))
            self.release(batch)
        return images, labels, indices, params

    def _to_device(self, batch: Batch, images: torch.Tensor) -> torch.Tensor:
        """The images on the Loader's device, ordered after the work that produced them; a ring slot
        is released once nothing reads it any more (its CUDA copy done, or a CPU copy made)."""
        l = self.l
        if l.device.type != "cuda":
            if batch.slot is not None and l.augment is None:
                images = images.clone(memory_format=torch.channels_last)  # the slot is reused
                self.release(batch)
            return images
        consumer = torch.cuda.current_stream(l.device)
        if images.device.type != "cuda":  # host ring -> device, on a side stream
            with torch.cuda.stream(self.stream):
                images = images.to(l.device, non_blocking=True)
                event = torch.cuda.Event(blocking=True)  # (the ring's synchronize() sleeps on it, never spins)
                event.record(self.stream)
            consumer.wait_event(event)
            self.release(batch, event)
        elif batch.ready is not None:  # decoded on the GPU by the decode thread
            consumer.wait_event(batch.ready)
        # Allocated on another stream and read on the consumer's: the caching allocator must not
        # hand the memory out again before the consumer's work on it is done.
        for t in {id(images): images, id(batch.images): batch.images}.values():
            if t.is_cuda:
                t.record_stream(consumer)
        return images

    def release(self, batch: Batch, event=None) -> None:
        if batch.slot is not None:
            self.ring.release(batch.slot, event, batch.slot_use)
            batch.slot = None


def _chunk(group: list) -> Batch:
    """Consecutive batches as one (:data:`CHUNK_IMAGES`): their samples in order, the batches kept
    in ``parts``. A single batch is itself."""
    if len(group) == 1:
        return group[0]
    first = group[0]
    samples = None if first.samples is None else [s for b in group for s in b.samples]
    return Batch(first.number, np.concatenate([b.indices for b in group]), np.concatenate([b.labels for b in group]),
                 samples=samples, source=first.source, parts=group)


_NEWLINE = b"\n"


def _keys_fingerprint(keys: Sequence, below_common_folder: bool) -> str:
    """``"<count>:<crc32>"`` of the keys (file paths, shard paths), each from the folder they all
    share, its name included, when ``below_common_folder``: the same files resume after the dataset
    moved (a job's local scratch copy, another mount point) under the same folder name; other
    files, the same ones in other classes, or another folder's (``train/`` and ``val/``, ``coco/``
    and ``voc/`` with the same file names) do not."""
    # (os.fsencode: a file name that is not UTF-8 is bytes escaped in a str; UTF-8 names hash as before)
    names = [os.fsencode(str(k)) for k in keys]
    cut = 0
    if below_common_folder and names:
        shared = os.path.commonprefix([min(names), max(names)])  # (the common prefix of all: of the extremes)
        folder = shared[:shared.rfind(b"/")]  # (b"" when the keys share no folder: cut stays 0)
        cut = folder.rfind(b"/") + 1  # where the shared folder's own name starts
    joined = _NEWLINE.join(names)
    if cut:  # every name starts with names[0][:cut]: dropped in one pass (a name with a newline may lose more: still one hash)
        joined = joined.replace(_NEWLINE + names[0][:cut], _NEWLINE)[cut:]
    return f"{len(names)}:{zlib.crc32(joined):08x}"


def _mark_ready(batch: Batch) -> None:
    """Records, after the work this thread queued on a CUDA batch, the event the consumer's stream
    waits for."""
    if batch.images.is_cuda:
        batch.ready = torch.cuda.Event()
        batch.ready.record(torch.cuda.current_stream(batch.images.device))


class _Whole:
    """A chunk whose batches are finished in one call (:meth:`_Epoch._finish_part`): the chunk until
    then; its images and labels (on the Loader's device, augmented) after, on CUDA the stream
    that finished them with its event, and the call's seconds (each batch adds its rows' share)."""

    __slots__ = ("chunk", "images", "labels", "stream", "done", "rows", "seconds", "source", "pending_rows")

    def __init__(self, chunk: Batch):
        self.chunk = chunk
        self.images = self.labels = self.stream = self.done = None
        self.rows = self.pending_rows = len(chunk)  #: its images; those not yet augmented per batch (then)
        self.seconds: dict = {}  #: {stage: (wall, host CPU)} of the chunk's transfer and augment
        self.source = None  #: the chunk's transferred images when its augment call failed: augmented per batch


class _Finished:
    """A batch ready for the consumer."""

    __slots__ = ("images", "labels", "batch")

    def __init__(self, images, labels, batch):
        self.images, self.labels, self.batch = images, labels, batch


class _Ahead:
    """An epoch started ahead (:meth:`Loader._look_ahead`), the epoch whose iteration started it,
    whether its shares were made for it, and what closes it."""

    __slots__ = ("epoch", "parent", "new_shares", "finalizer")

    def __init__(self, epoch: "_Epoch", parent: "_Epoch", new_shares: bool, finalizer):
        self.epoch, self.new_shares, self.finalizer = epoch, new_shares, finalizer
        self.parent = weakref.ref(parent)  # (a strong one would hold the Loader: the parent's stages do)


def _end_iteration(loader: Loader, epoch: _Epoch, outcome: dict) -> None:
    """Stops an iteration's threads; unless it delivered its whole epoch, the next epoch it
    started ahead too (an error, a break: the next iteration may well be another epoch's), and
    what its delivered batches skipped or replaced is reported as it stands."""
    epoch.close()
    if not (outcome["complete"] or outcome["delivered"]):
        loader._drop_ahead(parent=epoch)
        _report_losses(loader, epoch.stats, epoch.epoch_number, left_after=epoch.stats.batches)


class _LoaderIterator:
    def __init__(self, loader: Loader, first_batch: int):
        self.l = loader
        self.done = first_batch
        loader._iterated = (loader._iterated[1], loader.epoch)
        ahead = loader._take_ahead(first_batch)
        if ahead is not None:  # started while the previous epoch drained
            loader._stats, self.epoch = ahead.epoch.stats, ahead.epoch
        else:
            loader._stats = _Stats()
            # the iteration's start: its pool time counts from before its epoch's threads start (a
            # small epoch may be decoded whole before the first request)
            loader._stats.started = time.perf_counter()
            loader._stats.pool_busy_started = _C.decode_busy_seconds()
            self.epoch = _Epoch(loader, first_batch, loader.epoch, loader._stats)
        loader._done = (loader.epoch, first_batch)
        # (an older iterator still running no longer moves the position; weak: a dropped iterator stops)
        loader._position_owner = weakref.ref(self)
        self._outcome = {"complete": False, "delivered": False}
        self._held: Optional[_Finished] = None  # a last batch whose report raised (__next__)
        self._finalizer = weakref.finalize(self, _end_iteration, loader, self.epoch, self._outcome)
        self._looked_ahead = False
        # a map-style epoch has ended once its last batch is delivered, whether or not the caller asks
        # for one more (zip(range(len(loader)), loader) and islice never do): its epoch ahead is kept
        self._epoch_batches = len(loader) if isinstance(loader.source, MapSource) else None
        self._bar = None
        if loader.progress:
            tqdm = import_extra("tqdm", "progress", "Loader(progress=True)").tqdm
            total = len(loader) if isinstance(loader.source, MapSource) else None
            self._bar = tqdm(total=total, initial=first_batch, unit="batch", desc=f"epoch {loader.epoch}")

    def __iter__(self):
        return self

    def close(self) -> None:
        self._finalizer()
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __next__(self):
        st = self.l._stats
        if self._held is not None:  # the last batch, held back by a report that raised: delivered now
            done, self._held = self._held, None
            return self._deliver(done)
        if not self._finalizer.alive:
            raise StopIteration
        with st.lock:
            if st.started is None:
                st.started = time.perf_counter()
                st.pool_busy_started = _C.decode_busy_seconds()
        try:
            item = next(self.epoch.engine)
            done = item if isinstance(item, _Finished) else self.epoch.finish(item)
        except StopIteration:
            self._set_position(0)  # the epoch is complete: a restored run starts it over
            self._outcome["complete"] = True
            self.close()
            if self.l.backend == "hybrid":
                self.l._retune(st)
            # (raises when none of a whole epoch was delivered: no epoch ahead)
            _report_losses(self.l, st, self.epoch.epoch_number, first_batch=self.epoch.first_batch)
            self._look_ahead()
            raise
        except BaseException:
            self.close()
            raise
        st.record(done.batch, done.images.shape[0], self.l.on_error)  # counted when delivered
        if self._epoch_batches is not None and self.done + 1 >= self._epoch_batches:
            # the epoch's last batch: reported now (the caller may never ask for one more: zip,
            # islice), before the position moves. A report that raises (no image in the epoch, a
            # warning the caller made an error) holds the batch back: the next call delivers it,
            # and a state taken meanwhile resumes with it, not after it.
            try:
                _report_losses(self.l, st, self.epoch.epoch_number, first_batch=self.epoch.first_batch)
            except BaseException:
                self._held = done
                raise
        return self._deliver(done)

    def _deliver(self, done: "_Finished"):
        self.done += 1
        if self._epoch_batches is not None and self.done >= self._epoch_batches:
            self._outcome["delivered"] = True  # (not "complete": the epoch ahead is still re-tuned on it)
        # (after an epoch's last batch the state says so, batches = its length: a restored iteration
        # yields what this one would, nothing; a checkpoint taken in the loop's last step resumes there)
        self._set_position(self.done)
        if self._bar is not None:
            self._bar.update(1)
        if self.epoch.read_all:
            self._look_ahead()
        return done.images, done.labels

    def _set_position(self, batches: int) -> None:
        """Where state_dict() says the Loader stands, while this is its latest iteration (a state
        loaded since, or a newer iteration, owns the position)."""
        owner = self.l._position_owner
        if owner is not None and owner() is self:
            self.l._done = (self.epoch.epoch_number, batches)

    def _look_ahead(self) -> None:
        if self._looked_ahead or not self.l.lookahead:
            return
        self._looked_ahead = True
        shares = None
        l, st = self.l, self.l._stats
        # hybrid: the next epoch's shares from this one's batches decoded so far (collected), when they
        # are at least half of it; else it starts with the latest complete epoch's tuning (a short
        # epoch is read whole before its first batch is collected). _next_shares stays that of
        # complete epochs.
        if (l.backend == "hybrid" and l.decode_shares is None and not self._outcome["complete"]
                and isinstance(l.source, MapSource) and 2 * st.collected_batches >= len(l)):
            shares = l._retuned(st)
        l._look_ahead(self.epoch, shares)


__all__ = ["Loader", "Batch"]
