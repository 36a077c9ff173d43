"""The loader: source -> read bytes (I/O threads) -> headers + crop boxes -> batch decode into a
ring of preallocated (pinned) buffers -> device -> augment, in threads of one process.

Stages overlap: while the consumer transfers and augments batch b, the producer thread decodes
batch b+1 on the C++ pool and the I/O threads read batch b+2. Batches come out in sampler order
and every pixel is a function of (seed, epoch, sample index) only, whatever ``num_threads``.
"""

from __future__ import annotations

import io
import math
import queue
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Optional

import numpy as np
import torch

from gpupipe._backends import hybrid
from gpupipe._errors import DecompressionBombError, JpegError
from gpupipe.crops import CropSampler
from gpupipe.sources import MapSource, TarShards

_END = object()


class _Done:
    """A finished batch (augmented by the CPU augment stage), ready to yield."""

    __slots__ = ("images", "labels")

    def __init__(self, images, labels):
        self.images, self.labels = images, labels
_JPEG_MAGIC = b"\xff\xd8"


class _Stats:
    """Counters shared by the pipeline's threads (guarded by a lock)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.reset()

    def reset(self):
        self.batches = self.images = self.fallback = self.replaced = 0
        self.skipped: list = []
        self.warnings: list = []
        self.fallback_keys: list = []
        self.busy = {"read": 0.0, "decode": 0.0, "transfer": 0.0, "augment": 0.0}
        self.wait = 0.0
        self.started: Optional[float] = None
        self.last: Optional[float] = None

    def add(self, stage: str, seconds: float):
        with self.lock:
            self.busy[stage] += seconds


def _dist_defaults(rank, world_size):
    if rank is not None and world_size is not None:
        return int(rank), int(world_size)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return (torch.distributed.get_rank() if rank is None else int(rank),
                torch.distributed.get_world_size() if world_size is None else int(world_size))
    return (0 if rank is None else int(rank)), (1 if world_size is None else int(world_size))


class Loader:
    """Batches of decoded, cropped (and augmented) images from a source, with threads, no pickling.

    Args:
        source: a :mod:`gpupipe.sources` source (``ImageFolder``, ``FileList``, ``TarShards``).
        batch_size: samples per batch.
        crop: a :mod:`gpupipe.crops` sampler; its ``size`` is the output size.
        augment: optional module applied to each uint8 ``[N, 3, H, W]`` batch on ``device``
            (e.g. :class:`gpupipe.augment.BatchAugment`).
        device: where batches are delivered (``"cpu"``, ``"cuda"``, ``"cuda:1"``).
        backend: ``"auto"`` (the CPU core for CPU outputs; DALI, else nvJPEG, for CUDA outputs),
            ``"cpu"``, ``"dali"`` or ``"nvjpeg"``. GPU backends decode each batch on ``device``
            (no host ring), handing what they cannot decode to the CPU core inside the batch.
        shuffle, seed: sample order per epoch (``set_epoch``), as ``DistributedSampler``.
        drop_last: drop the tail that does not split evenly across ranks and the last partial batch.
        num_threads: decode threads (default: ``GPUPIPE_NUM_THREADS`` or the CPU affinity count).
        prefetch: batches decoded ahead of the consumer (bounds memory: ``prefetch + 2`` buffers).
        on_error: ``"skip"`` drops failed samples (the batch is smaller), ``"replace"`` keeps zero
            images, ``"raise"`` raises naming the sample's key. Every failure is in ``stats()``.
        rank, world_size: default to the ``torch.distributed`` process group's.
        progress: show a tqdm bar.
        apply_exif_orientation: crop in the displayed frame (``PIL.ImageOps.exif_transpose``):
            boxes are drawn from displayed sizes and crops come out upright.

    Yields:
        ``(images, labels)``: images uint8 ``[N, 3, H, W]`` (channels-last) on ``device`` without
        ``augment``, else the module's output; labels int64 ``[N]`` on ``device``.
    """

    def __init__(self, source, *, batch_size: int, crop: CropSampler, augment: Optional[torch.nn.Module] = None,
                 device: Any = "cpu", backend: str = "auto", shuffle: bool = True, seed: int = 0,
                 drop_last: bool = False, num_threads: Optional[int] = None, prefetch: int = 2,
                 on_error: str = "skip", rank: Optional[int] = None, world_size: Optional[int] = None,
                 progress: bool = False, io_threads: int = 4, apply_exif_orientation: bool = False):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if not isinstance(crop, CropSampler):
            raise TypeError("crop must be a gpupipe.crops sampler (RandomResizedCrop, RandomCrop, ...)")
        if on_error not in ("skip", "replace", "raise"):
            raise ValueError(f"on_error must be 'skip', 'replace' or 'raise', got {on_error!r}")
        if prefetch < 1:
            raise ValueError("prefetch must be >= 1")
        if not isinstance(source, (MapSource, TarShards)):
            raise TypeError("source must be a gpupipe.sources source")
        self.source = source
        self.batch_size = int(batch_size)
        self.crop = crop
        self.augment = augment
        self.device = torch.device(device)
        from gpupipe import backends

        self.backend = backends.resolve(backend, self.device)  # clear error when it cannot run here
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
        self.apply_exif_orientation = apply_exif_orientation
        self.io_threads = max(1, int(io_threads))
        self.epoch = 0
        self._stats = _Stats()

    # --- sampling ---------------------------------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """Selects the epoch's order (and each rank's shard), as ``DistributedSampler.set_epoch``."""
        self.epoch = int(epoch)

    def indices(self) -> np.ndarray:
        """This rank's sample indices for the current epoch, in order (``DistributedSampler``)."""
        n = len(self.source)
        order = np.random.default_rng([self.seed, self.epoch]).permutation(n) if self.shuffle else np.arange(n)
        ws = self.world_size
        if self.drop_last:  # DistributedSampler: ceil((n - ws) / ws) == n // ws when n % ws
            per_rank = n // ws
        else:
            per_rank = math.ceil(n / ws)
        total = per_rank * ws
        if total > n:  # pad by repeating from the start, as DistributedSampler
            order = np.concatenate([order, np.resize(order, total - n)])
        return order[:total][self.rank::ws]

    def __len__(self) -> int:
        if isinstance(self.source, TarShards):
            raise TypeError("the number of batches of streamed TarShards is not known in advance")
        n = len(self.indices())
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def __iter__(self):
        return _LoaderIterator(self)

    # --- reporting --------------------------------------------------------------------------------

    def stats(self) -> dict:
        """Throughput and where the time went since the current epoch's iteration started.

        Keys: ``images``, ``batches``, ``images_per_s``, ``busy_s`` (per stage: read, decode,
        transfer, augment; stages overlap), ``wait_s`` (time the consumer waited for a batch:
        starvation), ``skipped`` ([(key, message)]), ``replaced``, ``fallback`` (non-JPEG files
        decoded by Pillow), ``fallback_keys``, ``warnings`` ([(key, message)]).
        """
        s = self._stats
        with s.lock:
            wall = (s.last - s.started) if s.started and s.last else 0.0
            return {
                "images": s.images, "batches": s.batches,
                "images_per_s": s.images / wall if wall > 0 else 0.0,
                "busy_s": dict(s.busy), "wait_s": s.wait, "wall_s": wall,
                "skipped": list(s.skipped), "replaced": s.replaced, "fallback": s.fallback,
                "fallback_keys": list(s.fallback_keys), "warnings": list(s.warnings),
            }


class _Pipeline:
    """The threads and buffers of one epoch's iteration. Threads reference this object, never the
    iterator, so dropping the iterator finalises the pipeline."""

    def __init__(self, loader: Loader):
        self.l = loader
        self.stop = threading.Event()
        self.ready: queue.Queue = queue.Queue(maxsize=loader.prefetch)
        h, w = loader.crop.size
        slots = loader.prefetch + 2 if loader.backend == "cpu" else 0  # GPU backends decode on the device
        pin = loader.device.type == "cuda"
        self.ring = [torch.empty((loader.batch_size, h, w, 3), dtype=torch.uint8, pin_memory=pin) for _ in range(slots)]
        self.free: queue.Queue = queue.Queue()
        for i in range(slots):
            self.free.put(i)
        self.reader = ThreadPoolExecutor(loader.io_threads, thread_name_prefix="gpupipe-read")
        # On the CPU, augmentation is real work: a stage of its own overlaps it with the decode of
        # the next batch and with the consumer's step. On CUDA it is asynchronous GPU work and runs
        # on the consumer's thread and stream.
        self.augment_stage = None
        decoded = self.ready
        if loader.augment is not None and loader.device.type == "cpu":
            decoded = queue.Queue(maxsize=loader.prefetch)
            self.augment_stage = threading.Thread(target=self._augment_loop, args=(decoded,), name="gpupipe-augment",
                                                  daemon=True)
        self.decoded = decoded
        self.producer = threading.Thread(target=self._produce, name="gpupipe-decode", daemon=True)
        self.producer.start()
        if self.augment_stage is not None:
            self.augment_stage.start()

    def _augment_loop(self, decoded: queue.Queue):
        try:
            while not self.stop.is_set():
                try:
                    item = decoded.get(timeout=0.05)
                except queue.Empty:
                    continue
                if item is _END or isinstance(item, BaseException):
                    self._put(self.ready, item)
                    return
                images, labels = self.finish(item)
                if not self._put(self.ready, _Done(images, labels)):
                    return
        except BaseException as e:  # delivered to the consumer, never lost in this thread
            self._put(self.ready, e)

    # --- producer side ----------------------------------------------------------------------------

    def _put(self, q: queue.Queue, item) -> bool:
        while not self.stop.is_set():
            try:
                q.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def _get_free_slot(self) -> Optional[int]:
        while not self.stop.is_set():
            try:
                return self.free.get(timeout=0.05)
            except queue.Empty:
                continue
        return None

    def _batches(self):
        """(sample indices or None, keys, labels, bytes futures/values) per batch, in order."""
        l = self.l
        if isinstance(l.source, TarShards):
            it = l.source.iter_samples(epoch=l.epoch, seed=l.seed, rank=l.rank, world_size=l.world_size, shuffle=l.shuffle)
            pos = 0
            while True:
                chunk = []
                for sample in it:
                    chunk.append(sample)
                    if len(chunk) == l.batch_size:
                        break
                if not chunk or (l.drop_last and len(chunk) < l.batch_size):
                    return
                keys, labels, datas = zip(*chunk)
                # Streamed samples are identified by their position in this rank's stream.
                idx = np.arange(pos, pos + len(chunk)) * l.world_size + l.rank
                pos += len(chunk)
                yield idx, list(keys), np.asarray(labels, dtype=np.int64), list(datas)
                if len(chunk) < l.batch_size:
                    return
        else:
            indices = l.indices()
            n_batches = len(indices) // l.batch_size if l.drop_last else math.ceil(len(indices) / l.batch_size)
            src = l.source

            def read(i):
                try:
                    return src.read(int(i))
                except OSError as e:
                    return e

            futures = None
            for b in range(n_batches):
                idx = indices[b * l.batch_size:(b + 1) * l.batch_size]
                if futures is None:
                    futures = [self.reader.submit(read, i) for i in idx]
                nxt = indices[(b + 1) * l.batch_size:(b + 2) * l.batch_size]
                next_futures = [self.reader.submit(read, i) for i in nxt]  # read ahead of decode
                yield idx, [src.keys[i] for i in idx], src.labels[idx], futures
                futures = next_futures

    def _produce(self):
        l = self.l
        try:
            for idx, keys, labels, datas in self._batches():
                if self.stop.is_set():
                    return
                t0 = time.perf_counter()
                datas = [d.result() if hasattr(d, "result") else d for d in datas]
                l._stats.add("read", time.perf_counter() - t0)
                slot = self._get_free_slot() if l.backend == "cpu" else None
                if slot is None and l.backend == "cpu":
                    return
                t0 = time.perf_counter()
                item = self._decode(slot, idx, keys, labels, datas)
                l._stats.add("decode", time.perf_counter() - t0)
                if not self._put(self.decoded, item):
                    return
            self._put(self.decoded, _END)
        except BaseException as e:  # delivered to the consumer, never lost in this thread
            self._put(self.decoded, e)

    def _decode(self, slot, idx, keys, labels, datas):
        l = self.l
        n = len(datas)
        th, tw = l.crop.size
        errors: dict = {}
        for i, d in enumerate(datas):
            if isinstance(d, BaseException):
                errors[i] = f"read error: {d}"
                datas[i] = b""
        infos = hybrid.header_infos(datas)
        sizes = np.ascontiguousarray(infos[:, :2])
        if l.apply_exif_orientation:
            from gpupipe.orientation import display_sizes

            dh, dw = display_sizes(sizes[:, 0], sizes[:, 1], np.where(infos[:, 4] > 0, infos[:, 4], 1))
            sizes = np.ascontiguousarray(np.where(sizes >= 0, np.stack([dh, dw], axis=1), sizes))
        fallback = {}
        for i in np.flatnonzero(sizes[:, 0] < 0):
            d = datas[i]
            if i in errors or not d or bytes(d[:2]) == _JPEG_MAGIC:
                continue  # a broken JPEG: the decoder reports libjpeg's message below
            try:
                from PIL import Image

                img = Image.open(io.BytesIO(d))
                if l.apply_exif_orientation:
                    from PIL import ImageOps

                    img = ImageOps.exif_transpose(img)
                fallback[int(i)] = img
                sizes[i] = (img.height, img.width)
            except Exception as e:  # not an image Pillow knows either
                errors[int(i)] = f"not a decodable image ({type(e).__name__}: {e})"
        usable = sizes[:, 0] > 0
        if not l.crop.resize:
            small = usable & ((sizes[:, 0] < th) | (sizes[:, 1] < tw))
            for i in np.flatnonzero(small):
                errors[int(i)] = f"image {sizes[i, 1]}x{sizes[i, 0]} is smaller than the {tw}x{th} crop"
            usable &= ~small
        safe = np.where(usable[:, None], sizes, np.array([[max(th, 1), max(tw, 1)]]))
        boxes = np.ascontiguousarray(l.crop.boxes(safe[:, 0], safe[:, 1], seed=l.seed, epoch=l.epoch, indices=idx))
        jpeg_datas = [b"" if (i in errors or i in fallback) else d for i, d in enumerate(datas)]
        opts = dict(resize=l.crop.resize, mode="rgb", strict=False, dct_scaling=True, num_threads=l.num_threads or 0)
        # The CPU core decodes into the host ring (the consumer moves it); GPU backends decode on the
        # device into a batch of their own, which then travels instead of a ring slot.
        from gpupipe.decode import _run_backend, _run_oriented

        decode_device = torch.device("cpu") if l.backend == "cpu" else l.device
        out = self.ring[slot][:n] if slot is not None else torch.empty((n, th, tw, 3), dtype=torch.uint8, device=decode_device)
        if l.apply_exif_orientation:
            failures, warns, _ = _run_oriented(jpeg_datas, boxes, out, l.backend, decode_device, opts)
        else:
            _, failures, warns, _ = _run_backend(jpeg_datas, boxes, (th, tw), 3, out, l.backend, decode_device, opts)
        if slot is None:
            slot = out
        for i, (_, msg) in failures.items():
            if i not in errors and i not in fallback:
                errors[i] = msg
        for i, img in fallback.items():
            try:
                out[i].copy_(torch.from_numpy(_pil_crop(img, boxes[i], (th, tw), l.crop.resize)).to(out.device))
            except Exception as e:
                errors[i] = f"fallback decode failed ({type(e).__name__}: {e})"
        ok = np.ones(n, dtype=bool)
        for i in errors:
            ok[i] = False
            out[i].zero_()
        with l._stats.lock:
            for i, msg in warns.items():
                l._stats.warnings.append((keys[i], msg))
            done = [i for i in fallback if i not in errors]
            l._stats.fallback += len(done)
            l._stats.fallback_keys += [keys[i] for i in done]
        return slot, n, keys, labels, ok, {i: errors[i] for i in sorted(errors)}

    # --- finishing a batch: policy, transfer, augment (consumer, or the augment stage) ----------

    def finish(self, item, it=None):
        """(images, labels) of a decoded batch: applies the error policy, moves it to the device
        and augments it; releases its ring slot. ``it`` is the iterator (CUDA stream and pending
        copies), None in the CPU augment stage."""
        l, st = self.l, self.l._stats
        slot, n, keys, labels, ok, errors = item
        on_device = isinstance(slot, torch.Tensor)  # a GPU backend's batch, already on the device
        if errors:
            if l.on_error == "raise":
                if not on_device:
                    self.free.put(slot)
                i, msg = next(iter(errors.items()))
                cls = DecompressionBombError if "max_pixels" in msg else ValueError if "smaller than" in msg else JpegError
                exc = cls(f"sample {keys[i]!r}: {msg}")
                exc.errors = {keys[j]: m for j, m in errors.items()}
                raise exc
            with st.lock:
                if l.on_error == "skip":
                    st.skipped += [(keys[i], m) for i, m in errors.items()]
                else:
                    st.replaced += len(errors)
        images = (slot if on_device else self.ring[slot][:n]).permute(0, 3, 1, 2)
        labels_t = torch.from_numpy(np.asarray(labels, dtype=np.int64))
        if on_device:
            slot = None
        if l.on_error == "skip" and errors:
            keep = torch.from_numpy(ok)
            images, labels_t = images[keep.to(images.device)], labels_t[keep]  # a copy: the slot is free again
            if slot is not None:
                self.free.put(slot)
            slot = None

        t1 = time.perf_counter()
        if on_device:
            labels_t = labels_t.to(l.device)
        elif l.device.type == "cuda":
            with torch.cuda.stream(it._cuda_stream):
                images = images.to(l.device, non_blocking=True)
                labels_t = labels_t.to(l.device, non_blocking=True)
                event = torch.cuda.Event()
                event.record(it._cuda_stream)
            torch.cuda.current_stream(l.device).wait_event(event)
            if slot is not None:
                it._pending.append((event, slot))
                slot = None
            it._release_finished()
        elif l.augment is None and slot is not None:
            images = images.clone(memory_format=torch.channels_last)  # the slot is reused
        st.add("transfer", time.perf_counter() - t1)

        if l.augment is not None:
            t2 = time.perf_counter()
            images = l.augment(images)
            st.add("augment", time.perf_counter() - t2)
        if slot is not None:
            self.free.put(slot)
        with st.lock:
            st.batches += 1
            st.images += images.shape[0]
            st.last = time.perf_counter()
        return images, labels_t

    # --- consumer side ----------------------------------------------------------------------------

    def close(self):
        self.stop.set()
        for q in (self.ready, self.decoded):
            try:
                while True:
                    q.get_nowait()
            except queue.Empty:
                pass
        self.producer.join(timeout=2.0)
        if self.augment_stage is not None:
            self.augment_stage.join(timeout=2.0)
        self.reader.shutdown(wait=False, cancel_futures=True)
        self.ring = []


def _pil_crop(img, box, size, resize: bool) -> np.ndarray:
    """The same box semantics for files the JPEG core cannot read (PNG, WebP, ...), via Pillow."""
    from PIL import Image

    t, l, h, w = (int(v) for v in box)
    img = img.convert("RGB")
    if resize:
        img = img.resize((size[1], size[0]), Image.BILINEAR, box=(l, t, l + w, t + h), reducing_gap=None)
    else:
        img = img.crop((l, t, l + w, t + h))
    return np.array(img)  # writable: torch.from_numpy warns on read-only arrays


class _LoaderIterator:
    def __init__(self, loader: Loader):
        self.l = loader
        loader._stats.reset()
        self.p = _Pipeline(loader)
        self._finalizer = weakref.finalize(self, self.p.close)
        self._bar = None
        if loader.progress:
            from tqdm import tqdm

            total = None if isinstance(loader.source, TarShards) else len(loader)
            self._bar = tqdm(total=total, unit="batch", desc=f"epoch {loader.epoch}")
        self._cuda_stream = torch.cuda.Stream(loader.device) if loader.device.type == "cuda" else None
        self._pending: list = []  # (event, slot) released once the copy finished

    def __iter__(self):
        return self

    def close(self):
        self._finalizer()
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def _release_finished(self, wait: bool = False):
        keep = []
        for event, slot in self._pending:
            if wait or event.query():
                if wait:
                    event.synchronize()
                self.p.free.put(slot)
            else:
                keep.append((event, slot))
        self._pending = keep

    def __next__(self):
        st = self.l._stats
        if not self._finalizer.alive:
            raise StopIteration
        t0 = time.perf_counter()
        with st.lock:
            if st.started is None:
                st.started = t0
        while True:
            try:
                item = self.p.ready.get(timeout=0.1)
                break
            except queue.Empty:
                stage = self.p.augment_stage
                threads_done = not self.p.producer.is_alive() and (stage is None or not stage.is_alive())
                if threads_done and self.p.ready.empty():
                    self.close()
                    raise RuntimeError("gpupipe loader: the decode thread ended without a result")
        with st.lock:
            st.wait += time.perf_counter() - t0
        if item is _END:
            self.close()
            raise StopIteration
        if isinstance(item, BaseException):
            self.close()
            raise item
        if isinstance(item, _Done):
            images, labels_t = item.images, item.labels
        else:
            try:
                images, labels_t = self.p.finish(item, self)
            except BaseException:
                self.close()
                raise
        with st.lock:
            st.last = time.perf_counter()
        if self._bar is not None:
            self._bar.update(1)
        return images, labels_t


__all__ = ["Loader"]
