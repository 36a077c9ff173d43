"""The hybrid backend: every decode engine of a GPU node on each batch at once.

A batch is split between the CPU pool (ROI + DCT scaling, the C++ core) and the GPU's hardware JPEG
decoder (nvImageCodec's CUDA decoder where there is none: beside one it only takes the hardware's
declines, :func:`sharing`), in proportion to their measured rates (:class:`Shares`).
Which samples go where (:data:`SPLIT`): by default a sample's route is a pure function of (seed,
epoch, index) and the epoch's shares (:func:`assign`); with the ranked split, a function of its batch
(its samples' headers, file sizes and boxes, each a function of (seed, epoch, index)) and the
shares (:func:`assign_ranked`). Either way an epoch replays exactly: same routes, same pixels (with
the ranked split, as long as its batches' files read as before: a sample that fails one time and
not the other moves at most one other sample of its batch). The samples a GPU decoder cannot take
with gpupipe's semantics (``gpu_fallback.gpu_eligible``), and those it declines, go to the CPU core.

The engines work concurrently: the CPU share is started on the pool first (it returns at once), the
GPU engines then decode theirs, each on its own thread and CUDA stream, and :func:`wait` collects the
three. Each GPU engine's images and seconds are reported per batch (``BatchStatus.engine_seconds``);
the Loader sums them over an epoch, with the CPU pool's busy thread-seconds, and
:meth:`Shares.retuned` makes the next epoch's shares of them.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import dataclasses
import math
import threading
import time
import weakref
from typing import Any, Optional, Sequence

import numpy as np
import torch

from gpupipe import _C, keyed
from gpupipe._backends import cpu, gpu_fallback
from gpupipe._errors import brief
from gpupipe._exit import InterpreterExiting, call_scope, wait_for
from gpupipe.decode_types import BatchStatus, DecodeOptions, HeaderInfos, Route

name = "hybrid"

ENGINES = ("cpu", "hardware", "cuda")  #: the engines a batch is split between, in route order
ROUTES = {"cpu": Route.CPU, "hardware": Route.GPU_HARDWARE, "cuda": Route.GPU_CUDA}
ROUTE_STREAM = keyed.stream_of("gpupipe.hybrid.route")  #: the routes' own keyed stream (crops are 0)

# Starting rates (images/s of the Loader at RandomResizedCrop 224 of 800x533 photos, batch 256, on a
# 16-core H200 node: the CPU core's 16 threads alone 8,710, the hardware decoder alone 11,566; split
# between the two, 50/50 gave 12,550 and 35/65 10,461, as the decoder's host work competes with the
# pool, so the prior is the even split; the CUDA decoder alone 1,259 with nvImageCodec's 2 host
# threads). They only set the first epoch's shares (and decode_crop_jpegs's), the same whatever the
# thread count, so that no pixel depends on it; the Loader re-tunes them between epochs.
PRIOR_RATES = {"cpu": 8700.0, "hardware": 8700.0, "cuda": 1250.0}
# Threads of the decode budget (``num_threads``) left to the GPU decoders' host side: nvImageCodec's
# own threads (``nvimgcodec.CPU_THREADS`` per engine) feed the engines and a Python thread per engine
# launches them. A pool as large as the budget competes with them for the cores, and the hardware
# decoder, not the pool, then sets the pace. Measured on an H100 node (16-core Xeon, 800x533 photos,
# batch 256, Loader without augmentation, even split): pool of 16 threads 13,514 img/s, 14: 16,374,
# 12: 17,135; the train recipe at 12 / 10 / 8 threads: 14,018 / 13,384 / 14,235 img/s (1920x1280:
# 5,357 / 5,258 / 4,937). Lowering the 16-thread pool's priority (nice 10) instead gave 16,983.
ENGINE_HOST_THREADS = 4
# Images a GPU engine decodes in one call at most when shares of several batches wait for it
# (:class:`_EngineQueue`): each call has a fixed cost. Measured on an H100, the hardware decoder
# alone, 800x533 photos: calls of 64 / 128 / 256 images gave 14,552 / 17,223 / 17,845 images/s; in
# the Loader at batch 64 its calls of ~27 images ran at 4,256 images/s, against 8,170 for calls of
# ~160 at batch 256. 0: one batch's share per call.
MERGE_IMAGES = 256
# How a batch is split between the engines. "keyed": each sample's keyed draw against the shares
# (:func:`assign`): the CPU core gets a random share of the samples. "ranked" (:func:`assign_ranked`):
# each batch's samples ranked by their estimated cost on the CPU core over that on a GPU decoder
# (``_C.hybrid_cost_estimates``: the CPU core decodes a crop's rows down to its last one, DCT-scaled;
# a GPU decoder the whole file), and the CPU core gets its share of them from the cheapest: small
# crops near the top of large files. Simulated on a Zen 4 core's measured per-sample CPU costs and an
# H100's hardware decoder rates (docs/gpu.md), 1.06-1.14x the keyed split's images/s; not yet
# measured on a GPU, hence not the default. Read when a Loader's epoch starts (it keeps it; its
# state_dict records it) or per call (RouteKeys.split).
SPLIT = "keyed"
# Calls of a GPU engine in flight at once, each on its own decoder instance (``engine.lane(i)``),
# thread and CUDA stream. nvImageCodec's hardware decoder waits on the host for its previous call's
# decode before it parses and submits the next one (its decodeBatch synchronizes on its own event
# first), so with one decoder the JPEG engines sit idle while the host prepares each call; with two,
# one decoder prepares its call while the other's decodes. In the Loader the hardware decoder ran at
# about 3/4 of its rate alone (docs/gpu.md). Not yet measured on a GPU, hence 1.
CALLS_IN_FLIGHT = {"hardware": 1, "cuda": 1}
_MIN_SHARE = 0.02  # an engine that shares (sharing()) keeps a little work, so its rate stays measured
MIN_MEASURED = 8  # samples an engine is given before its rate counts (Shares.retuned)
# Seconds a batch's collect waits for a GPU engine's answer (its call, or an earlier call of that
# engine timed before it) before it fails the batch: a wedged device or driver call fails its batch
# with a TimeoutError naming the engine, not the Loader for good. A share's call takes well under a
# second (the first, making the decoder and the CUDA context, a few); the wait counts from the
# collect, after the engine's earlier queued shares.
ENGINE_TIMEOUT = 120.0


def _nvimgcodec():
    from gpupipe._backends import nvimgcodec  # noqa: WPS433 (lazy: the engine module imports its library)

    return nvimgcodec


def unavailable_reason(device: Optional[torch.device] = None) -> Optional[str]:
    if device is not None and device.type != "cuda":
        return "the hybrid backend decodes into GPU memory: pass device='cuda'"
    if not torch.cuda.is_available():
        return "the hybrid backend needs a CUDA device (torch.cuda.is_available() is False)"
    try:
        reason = _nvimgcodec().unavailable_reason(device)
        if reason is None:  # the decoders start (checked once per process and device, then cached)
            gpu_engines(device if device is not None else torch.device("cuda"))
    except ImportError as e:
        reason = f"gpupipe's nvImageCodec engine is not importable ({e})"
    except RuntimeError as e:
        reason = str(e)
    return None if reason is None else f"the hybrid backend needs nvImageCodec's GPU decoders: {reason}"


def gpu_engines(device: torch.device) -> dict:
    """``{kind: engine}`` of the GPU decoders on ``device``: ``"hardware"`` where the GPU has JPEG
    engines (A100, H100, B200), and ``"cuda"``. An engine decodes whole images and crops + resizes
    them into their slots (``engine.decode(buffers, boxes, out, slots, options, sizes=) -> {k:
    reason}`` of the samples it declined; ``sizes`` the headers' (height, width)); optionally
    ``engine.decode_jobs([(buffers, boxes, out, slots, options, sizes), ...]) -> [{k: reason}, ...]``
    for several batches' shares in one call (:class:`_EngineQueue`)."""
    nv = _nvimgcodec()
    kinds = (["hardware"] if nv.hardware_decoder_available(device) else []) + ["cuda"]
    return {kind: nv.engine(kind, device) for kind in kinds}


@dataclasses.dataclass(frozen=True)
class Shares:
    """The fraction of a batch's samples each engine gets (they sum to 1; an engine that is not
    there gets 0). ValueError naming what is wrong otherwise."""

    cpu: float
    hardware: float
    cuda: float

    def __post_init__(self):
        for e in ENGINES:
            v = getattr(self, e)
            if isinstance(v, bool) or not isinstance(v, (int, float, np.floating, np.integer)) or not 0 <= v <= 1:
                raise ValueError(f"decode share {e!r} must be a number within [0, 1], got {v!r}")
            object.__setattr__(self, e, float(v))
        if abs(self.cpu + self.hardware + self.cuda - 1.0) > 1e-6:
            raise ValueError(f"decode shares must sum to 1, got {self.as_dict()}")

    @classmethod
    def from_rates(cls, rates: dict, available: Sequence[str]) -> "Shares":
        """Shares in proportion to the engines' rates (images/s), so that they finish a batch
        together; each engine that shares keeps at least a small share, so that it stays measured.
        Where the GPU has a hardware decoder the CUDA decoder gets no share (:func:`sharing`)."""
        available = sharing(available)
        raw = {e: float(rates.get(e, 0.0)) if e in available else 0.0 for e in ENGINES}
        raw = {e: v if v > 0 else 0.0 for e, v in raw.items()}  # (NaN and negatives: unmeasured, 0)
        if any(v == math.inf for v in raw.values()):  # infinitely fast: those engines share the batch
            raw = {e: 1.0 if v == math.inf else 0.0 for e, v in raw.items()}
        top = max(raw.values())
        raw = {e: v / top if top > 0 else v for e, v in raw.items()}  # (rates near 1e308 sum without overflow)
        total = sum(raw.values())
        if total <= 0:
            raw = {e: 1.0 if e in available else 0.0 for e in ENGINES}
            total = sum(raw.values())
        shares = {e: v / total for e, v in raw.items()}
        low = [e for e in available if shares[e] < _MIN_SHARE]
        if low and len(available) > 1:
            rest = 1.0 - _MIN_SHARE * len(low)
            others = sum(shares[e] for e in available if e not in low)
            shares = {e: (_MIN_SHARE if e in low else shares[e] * rest / others if e in available else 0.0)
                      for e in ENGINES}
        return cls(**shares)

    @classmethod
    def prior(cls, available: Sequence[str]) -> "Shares":
        """The first epoch's shares: from PRIOR_RATES, for the engines there are."""
        return cls.from_rates(PRIOR_RATES, available)

    @classmethod
    def from_dict(cls, d: Any) -> "Shares":
        """From :meth:`as_dict`'s form; ValueError naming what is wrong."""
        if not isinstance(d, dict) or set(d) != set(ENGINES):
            raise ValueError(f"decode shares are a dict with keys {ENGINES}, got {d!r}")
        return cls(**d)  # (each share checked as it is made)

    def as_dict(self) -> dict:
        return {e: getattr(self, e) for e in ENGINES}

    def retuned(self, measured: dict, available: Sequence[str], cpu_threads: int) -> "Shares":
        """The next epoch's shares from an epoch's measurements ``{engine: (decoded, given,
        seconds)}`` (the CPU's seconds are its pool's busy thread-seconds, divided here by
        ``cpu_threads``). A rate is what an engine decoded per second of its work, so an engine
        that declines much is given less; one given fewer than :data:`MIN_MEASURED` samples keeps its
        share (the Loader adds its samples to the next epoch's until they are enough)."""
        rates = {}
        for e in sharing(available):
            decoded, given, seconds = measured.get(e, (0, 0, 0.0))
            if e == "cpu":
                seconds = seconds / max(cpu_threads, 1)
            rates[e] = decoded / seconds if given >= MIN_MEASURED and seconds > 0 else None
        known = {e: r for e, r in rates.items() if r is not None}
        if not known:
            return self
        # An engine without a measurement keeps its share relative to the measured ones.
        scale = sum(known.values()) / max(sum(getattr(self, e) for e in known), 1e-12)
        for e, r in rates.items():
            if r is None:
                rates[e] = getattr(self, e) * scale
        return Shares.from_rates(rates, available)


def cpu_pool_threads(num_threads: int, engines: Sequence[str]) -> int:
    """The CPU pool's threads beside the GPU ``engines`` that have a share of the batches, for a
    decode budget of ``num_threads`` (0: the default, ``GPUPIPE_NUM_THREADS`` or this rank's share
    of the cores): the budget less :data:`ENGINE_HOST_THREADS`, or less a quarter of it when that
    is fewer (a small budget keeps most of its threads), at least 1; the whole budget when no GPU
    engine shares."""
    total = int(num_threads) or _C.default_num_threads()
    if not len(engines):
        return total
    return max(1, total - min(ENGINE_HOST_THREADS, total // 4))


def sharing_engines(shares: Optional["Shares"], engines: Sequence[str]) -> list:
    """The GPU engines of ``engines`` with a share of the batches under ``shares``."""
    return [] if shares is None else [e for e in engines if e in ENGINES[1:] and getattr(shares, e) > 0]


def sharing(available: Sequence[str]) -> list:
    """The engines of ``available`` that get a share of each batch. Beside a hardware decoder the
    CUDA decoder only takes what the hardware declines beyond the progressive files (those go to the
    CPU core at once, :func:`start`): measured on an H200,
    its Huffman stage runs on nvImageCodec's host threads (1,259 images/s with 2 of them, 4,447 with
    8, 974 on the GPU), so a share as small as 2% set the pace of every batch (9,237 images/s
    instead of 12,550) and more threads would take cores from the CPU pool."""
    return [e for e in available if not (e == "cuda" and "hardware" in available)]


def assign(seed: int, epoch: int, indices: np.ndarray, shares: Shares, eligible: np.ndarray) -> np.ndarray:
    """int64 [N]: each sample's engine (an index into ENGINES), a pure function of (seed, epoch,
    index), the shares and whether a GPU decoder may take it (else the CPU core)."""
    u = keyed.uniforms(seed, epoch, indices, 1, stream=ROUTE_STREAM)[:, 0]
    bounds = np.cumsum([shares.cpu, shares.hardware])
    engine = np.searchsorted(bounds, u, side="right")  # u < cpu: 0; < cpu + hardware: 1; else 2
    engine = np.minimum(engine, len(ENGINES) - 1)
    return np.where(eligible, engine, 0).astype(np.int64)


def assign_ranked(seed: int, epoch: int, indices: np.ndarray, shares: Shares, rankable: np.ndarray, ratio: np.ndarray,
                  groups: np.ndarray, engines: Sequence[str]) -> np.ndarray:
    """int64 [N]: each sample's engine under the ranked split (the definition of
    ``_C.hybrid_ranked_routes``; the hot path calls that). ``rankable``: the samples a GPU engine may
    take (eligible, and no progressive file beside a hardware decoder); ``ratio``: their estimated
    CPU-to-GPU cost ratios; ``groups``: each sample's batch (runs of equal values); ``engines``: the
    GPU engines there are (a missing one's share goes to the CPU core).

    In each group, of its m rankable samples the k = floor(f * m + v) with the lowest ratio go to the
    CPU core (f its share; v draw 1 keyed on the group's value, a Loader's batch number, as an index:
    k is f * m on average, whatever the batch size), ties broken by draw 0 then position; the others
    to the hardware decoder when their draw 2 is below its part of the GPU share, else to the CUDA
    decoder. A sample that drops out of its batch (it failed to read) moves at most one other."""
    indices = np.asarray(indices, dtype=np.int64).reshape(-1)
    n = len(indices)
    hardware = shares.hardware if "hardware" in engines else 0.0
    cuda = max(0.0, 1.0 - shares.cpu - shares.hardware) if "cuda" in engines else 0.0
    gpu = hardware + cuda
    to_cpu = min(max(1.0 - gpu, 0.0), 1.0)
    to_hardware = hardware / gpu if gpu > 0 else 0.0
    engine = np.zeros(n, np.int64)
    if gpu <= 0 or n == 0:
        return engine
    u = keyed.uniforms(seed, epoch, indices, 3, stream=ROUTE_STREAM)
    groups = np.asarray(groups, dtype=np.int64).reshape(-1)
    starts = np.flatnonzero(np.r_[True, groups[1:] != groups[:-1]])
    v = keyed.uniforms(seed, epoch, groups[starts], 2, stream=ROUTE_STREAM)[:, 1]
    for a, b, va in zip(starts, np.r_[starts[1:], n], v):
        rows = a + np.flatnonzero(rankable[a:b])
        if not len(rows):
            continue
        order = rows[np.lexsort((rows, u[rows, 0], ratio[rows]))]
        k = int(min(np.floor(to_cpu * len(rows) + va), len(rows)))
        gpu_rows = order[k:]
        engine[gpu_rows] = np.where(u[gpu_rows, 2] < to_hardware, 1, 2)
    return engine


@dataclasses.dataclass
class RouteKeys:
    """What a batch's routes are a function of: the Loader's seed and epoch and the samples' indices
    in the dataset (:func:`gpupipe.decode_crop_jpegs`: seed 0, epoch 0, positions in the call)."""

    seed: int
    epoch: int
    indices: np.ndarray
    #: int64 [N] each sample's batch number (runs of equal values: a chunk's batches), which the
    #: ranked split ranks within (None: one batch, number 0)
    groups: Optional[np.ndarray] = None
    #: the split (:data:`SPLIT` when None): a Loader's epoch keeps the one it started with
    split: Optional[str] = None

    def select(self, rows: np.ndarray) -> "RouteKeys":
        groups = None if self.groups is None else np.asarray(self.groups)[rows]
        return RouteKeys(self.seed, self.epoch, np.asarray(self.indices)[rows], groups, self.split)


class Workers:
    """A thread and a CUDA stream per GPU engine and call in flight (:data:`CALLS_IN_FLIGHT`), so
    that the engines decode at the same time and their host-side waits overlap. Owned by whoever
    starts batches: one :func:`decode` call, which closes them, or a Loader, whose epochs share them
    (each epoch calls :meth:`acquire`, and :meth:`release` when it closes; the last release closes
    them). No thread outlives its owners."""

    def __init__(self, kinds: Sequence[str], device: torch.device):
        self.device = device
        lanes = {k: max(1, int(CALLS_IN_FLIGHT.get(k, 1))) for k in kinds}
        #: {kind: [stream per call in flight]}
        self.streams = {k: [torch.cuda.Stream(device) for _ in range(lanes[k])] for k in kinds} \
            if device.type == "cuda" else {}
        self.busy = {k: _BusyClock() for k in kinds}  #: each engine's busy seconds, its overlapping calls once
        self.queues = {k: _EngineQueue(k, self.streams.get(k) or [None] * lanes[k], self.busy[k]) for k in kinds}
        self.closed = False
        self._users = 0
        self._lock = threading.Lock()

    def acquire(self) -> bool:
        """One user more; False when they are closed already (make new ones)."""
        with self._lock:
            if self.closed:
                return False
            self._users += 1
            return True

    def release(self) -> None:
        """One user less; the last one closes the threads."""
        with self._lock:
            self._users -= 1
            if self._users > 0:
                return
        self.close()

    def calls_in_flight(self) -> dict:
        """{kind: calls each GPU engine has in flight at most}: its lanes, less those found calling
        lane 0's decoder once they ran (an engine without ``lane``, or a lane whose decoder could
        not start), which take turns with it."""
        return {k: len(q.streams) - len(q.shared_lanes) for k, q in self.queues.items()}

    def lane_failures(self) -> list:
        """Why lanes call another lane's decoder (theirs could not start)."""
        out = []
        for q in self.queues.values():
            with q._cond:
                out += list(q.lane_failures.values())
        return out

    def close(self) -> None:
        """Stops the threads once their running batch is queued; batches not started are dropped."""
        with self._lock:
            self.closed = True
        for q in self.queues.values():
            q.close()


@dataclasses.dataclass
class _Job:
    """One batch's share for a GPU engine (``engine.decode``'s arguments) and its outcome."""

    buffers: list
    boxes: np.ndarray
    out: torch.Tensor
    slots: np.ndarray
    options: DecodeOptions
    sizes: np.ndarray
    future: concurrent.futures.Future = dataclasses.field(default_factory=concurrent.futures.Future)


class _EngineQueue:
    """One GPU engine's threads, one per call in flight (a lane: its own decoder instance and
    stream). They take the shares queued for the engine in order; the shares already waiting when a
    lane takes one (the engine is behind) go with it into one call of the engine, up to
    :data:`MERGE_IMAGES` images, when the engine decodes several at once (``engine.decode_jobs``)
    and they have the same options: a call's fixed cost is then paid once. Nothing waits to be
    merged: a share that finds a lane idle is decoded at once, alone."""

    def __init__(self, kind: str, streams: Sequence[Optional["torch.cuda.Stream"]], busy: _BusyClock):
        self.kind, self.streams, self.busy = kind, list(streams), busy
        self._jobs: collections.deque = collections.deque()
        self._cond = threading.Condition()
        self._closed = False
        #: {lane: why it calls lane 0's decoder} of the lanes whose own decoder could not start
        self.lane_failures: dict = {}
        self.shared_lanes: set = set()  # lanes found calling lane 0's decoder (none of their own)
        self._shared = threading.Lock()  # held by the lanes calling lane 0's decoder, one call at a time
        self._threads = [threading.Thread(target=self._loop, args=(lane,), daemon=True,
                                          name=f"gpupipe-{kind}-decoder" + (f"-{lane}" if lane else ""))
                         for lane in range(len(self.streams))]
        _open_queues.add(self)
        for t in self._threads:
            t.start()

    def submit(self, engine: Any, job: _Job) -> concurrent.futures.Future:
        with self._cond:
            if self._closed:
                raise RuntimeError("cannot schedule new futures after shutdown")
            self._jobs.append((engine, job))
            self._cond.notify()
        return job.future

    def close(self) -> None:
        """The running calls finish; the shares not taken yet are cancelled."""
        with self._cond:
            self._closed = True
            dropped, self._jobs = list(self._jobs), collections.deque()
            self._cond.notify_all()
        for _, job in dropped:
            job.future.cancel()

    def _take(self) -> tuple:
        """(engine, [jobs]) for the next call, or (None, []) once closed."""
        with self._cond:
            while not self._jobs and not self._closed:
                self._cond.wait()
            if not self._jobs:
                return None, []
            engine, job = self._jobs.popleft()
            group, images = [job], len(job.buffers)
            if hasattr(engine, "decode_jobs"):
                while (self._jobs and self._jobs[0][0] is engine and self._jobs[0][1].options == job.options
                       and images + len(self._jobs[0][1].buffers) <= MERGE_IMAGES):
                    images += len(self._jobs[0][1].buffers)
                    group.append(self._jobs.popleft()[1])
            return engine, group

    def _lane_engine(self, engine: Any, lane: int) -> Any:
        """The decoder instance of ``lane`` (``engine.lane(lane)``: its own state, so that its call
        does not wait for another lane's); ``engine`` itself for lane 0, for an engine without
        lanes, and for a lane whose decoder could not start (its reason kept in
        :attr:`lane_failures`: the calls then take turns on one decoder, as with one lane)."""
        if lane == 0 or lane in self.shared_lanes:
            return engine
        if not hasattr(engine, "lane"):
            self.shared_lanes.add(lane)
            return engine
        try:
            return engine.lane(lane)  # (created before its call is timed: see _run_engine)
        except Exception as e:
            with self._cond:
                self.lane_failures[lane] = f"{self.kind} decoder lane {lane} could not start ({brief(e, 240)})"
            self.shared_lanes.add(lane)
            return engine

    def _loop(self, lane: int) -> None:
        stream = self.streams[lane]
        while True:
            engine, group = self._take()
            if engine is None:
                return
            try:
                group = [job for job in group if job.future.set_running_or_notify_cancel()]
                if group:
                    if stream is not None:  # (a new thread's current device is 0: its decoder is made on the stream's)
                        torch.cuda.set_device(stream.device)
                    with call_scope():  # an exiting interpreter waits for the call in hand (gpupipe._exit)
                        eng = self._lane_engine(engine, lane)
                        # lanes calling one decoder instance take turns (its own lock may not exist)
                        with self._shared if eng is engine and len(self.streams) > 1 else contextlib.nullcontext():
                            _run_engine(eng, group, stream, self.busy)
            except BaseException as e:  # never a future left without an outcome: its batch would wait forever
                for job in group:
                    if not job.future.done():
                        job.future.set_exception(e)
            # the shares' output tensors may have no other reference left (their iteration closed): freed
            # in a call scope, never under a finalizing interpreter (gpupipe.engine.Engine._run says why)
            with call_scope():
                group = None


_open_queues: "weakref.WeakSet[_EngineQueue]" = weakref.WeakSet()


def _close_queues_at_exit() -> None:
    """Before gpupipe's exit hook waits for the calls in hand (gpupipe._exit): the shares not taken
    are cancelled, so no stage waits for a share whose engine thread is parked (as
    concurrent.futures drains its executors at that point)."""
    for q in list(_open_queues):
        q.close()


threading._register_atexit(_close_queues_at_exit)


class _Call:
    """One call of an engine, shared by the shares it decoded: when it ran, on the host's clock
    (perf_counter seconds) or as the CUDA events around its work on its lane's stream (None: it
    failed, or its shares were all cancelled), and its part of the engine's busy time once counted
    (:class:`_BusyClock`)."""

    __slots__ = ("start", "end", "counted", "ended")

    def __init__(self):
        self.start: Any = None
        self.end: Any = None
        self.counted: Optional[float] = None
        self.ended = threading.Event()  #: set once start and end are final


@dataclasses.dataclass
class _EngineRun:
    declined: dict  #: {k: reason} of the share's samples (positions in the share) the engine declined
    call: _Call  #: the call that decoded the share
    done: Any = None  #: a CUDA event after the share's last work on its stream (after its whole call's)
    fraction: float = 1.0  #: the share's part of a call made for several shares (by images)


def _elapsed(a: Any, b: Any) -> float:
    """Seconds from ``a`` to ``b`` (negative when ``b`` came first): host clock readings, or
    completed CUDA events recorded with timing."""
    return b - a if isinstance(a, float) else a.elapsed_time(b) / 1e3


class _BusyClock:
    """An engine's busy seconds: the union of its calls' spans, so that where calls overlap
    (:data:`CALLS_IN_FLIGHT`) its rate is still what it decoded per second of the wall. Calls are
    counted in the order they started (their decoders ready: a lane's decoder is made before its
    first call starts), whatever the order their batches are collected in (an epoch and the one
    started ahead collect at the same time); each adds the part of its span after the latest end
    counted before it, measured from its own start (CUDA's event times are float32 milliseconds:
    exact over short spans only). With one call in flight the calls follow each other on one stream
    and each counts its whole span."""

    def __init__(self):
        self._lock = threading.Lock()
        self._open: collections.deque = collections.deque()  # calls taken, not yet counted, in that order
        self._last_end: Any = None  # the end of the counted call that ended last

    def started(self) -> _Call:
        """A call starting now (its decoder ready), counted after those that started before it."""
        call = _Call()
        with self._lock:
            self._open.append(call)
        return call

    def seconds(self, call: _Call) -> float:
        """``call``'s part of the busy time, once it ended: the calls that started before it are
        counted first (one still running is waited for, outside the lock: the lanes start calls
        meanwhile; it ends, as every call started does)."""
        while True:
            with self._lock:
                if call.counted is not None:
                    return call.counted
                if not self._open:
                    return 0.0
                first = self._open[0]
            if not wait_for(first.ended.wait, ENGINE_TIMEOUT):
                raise TimeoutError(f"an earlier call of this GPU decoder has not returned within "
                                   f"hybrid.ENGINE_TIMEOUT = {ENGINE_TIMEOUT:g} s (a wedged device or driver call)")
            if first.end is not None and not isinstance(first.end, float):
                first.end.synchronize()  # (a blocking event: sleeps) its times are known once it completed
            with self._lock:
                if self._open and self._open[0] is first:  # (else another collector counted it meanwhile)
                    self._open.popleft()
                    try:
                        first.counted = self._count(first)
                    except BaseException:
                        first.counted = 0.0  # (a device error: the call's batch fails with it)
                        raise

    def _count(self, call: _Call) -> float:
        if call.start is None or call.end is None:
            return 0.0
        span = _elapsed(call.start, call.end)
        after = 0.0 if self._last_end is None else max(_elapsed(call.start, self._last_end), 0.0)
        if span > after:
            self._last_end = call.end
        return max(span - after, 0.0)


def _run_engine(eng: Any, group: list, stream: Optional["torch.cuda.Stream"], busy: _BusyClock) -> None:
    """One call of an engine for the shares ``group`` (``_Job``s), on one of its lanes' threads;
    each job's future gets its :class:`_EngineRun` or the call's error. On a CUDA ``out`` the work
    goes on the lane's stream, timed by CUDA events around it (the engine's own pace), each share
    counting its images' part of it; on a host ``out`` (the scheduler's tests) by the host's clock.
    The call is on ``busy`` from its start, its times there before any future gets its outcome."""
    call: Optional[_Call] = None
    try:
        with torch.cuda.stream(stream):  # a no-op for None (a host engine)
            t0 = time.perf_counter()
            started = _record(stream)
            call = busy.started()
            if len(group) == 1:
                j = group[0]
                declines = [eng.decode(j.buffers, j.boxes, j.out, j.slots, j.options, sizes=j.sizes)]
            else:
                declines = eng.decode_jobs([(j.buffers, j.boxes, j.out, j.slots, j.options, j.sizes) for j in group])
            done = _record(stream)
        if len(declines) != len(group):
            raise RuntimeError(f"{eng!r} answered {len(declines)} of the {len(group)} shares of one call")
        runs = [_checked_declines(eng, declined, len(j.buffers)) for j, declined in zip(group, declines)]
    except BaseException as e:  # what was queued before the error may still write out: wait() orders after it
        if call is not None:
            call.ended.set()  # (it counts nothing: its start and end are None)
        try:
            e.gpupipe_engine_done = _record(stream)
        except Exception:  # a sticky device error: the original error says more
            pass
        for j in group:
            j.future.set_exception(e)
        return
    call.start, call.end = (started, done) if started is not None else (t0, time.perf_counter())
    call.ended.set()
    images = max(sum(len(j.buffers) for j in group), 1)
    for j, declined in zip(group, runs):
        j.future.set_result(_EngineRun(declined, call, done, len(j.buffers) / images))


def _checked_declines(eng: Any, declined: Any, n: int) -> dict:
    """An engine's answer for a share of ``n`` samples, ``{position: reason}``; RuntimeError (the
    share's batch fails) for positions that are not the share's."""
    runs = {int(k): str(why) for k, why in declined.items()}
    wrong = [k for k in runs if not 0 <= k < n]
    if wrong:
        raise RuntimeError(f"{eng!r} declined positions {wrong[:8]} of a share of {n} samples")
    return runs


def _record(stream: Optional["torch.cuda.Stream"]):
    if stream is None:
        return None
    # blocking: the collect stage's synchronize() sleeps until the engine's work is done; CUDA's default
    # for a process with one context on a many-core machine is to spin, a core per wait
    event = torch.cuda.Event(enable_timing=True, blocking=True)
    event.record(stream)
    return event


class Pending:
    """A started hybrid decode: the CPU share on the pool, the GPU shares queued on their threads."""

    def __init__(self, n: int, out: torch.Tensor, options: DecodeOptions, engines: dict, workers: Workers,
                 own_workers: bool):
        self.out, self.options, self.engines, self.workers, self.own_workers = out, options, engines, workers, own_workers
        self.status = BatchStatus.empty(n)
        self.cpu_rows = np.zeros(0, np.int64)
        self.cpu_host: Optional[torch.Tensor] = None
        self.cpu_pending: Any = None
        self.ineligible: dict = {}  # {row: reason}: in the CPU share because no GPU decoder may take it
        self.gpu: list = []  # (kind, rows, future), in submission order
        self.cpu_options = options  # the options of the CPU core's work (its pool's threads): start() sets them
        self.buffers: Sequence = ()
        self.gpu_buffers: Sequence = ()  # what the GPU decoders are given (gpu_fallback.gpu_inputs)
        self.boxes: Optional[np.ndarray] = None
        self.sizes: Optional[np.ndarray] = None
        self.infos: Optional[HeaderInfos] = None

    def submit(self, kind: str, rows: np.ndarray) -> None:
        """Queues the samples ``rows`` on the engine ``kind``'s threads and streams (whichever lane
        takes them)."""
        for stream in self.workers.streams.get(kind, ()):
            stream.wait_stream(torch.cuda.current_stream(self.out.device))
            self.out.record_stream(stream)  # written there: the allocator keeps it until that work is done
        future = self.workers.queues[kind].submit(self.engines[kind], _Job(
            [self.gpu_buffers[i] for i in rows], self.boxes[rows], self.out, rows, self.options, self.sizes[rows]))
        self.gpu.append((kind, rows, future))


REASON_INELIGIBLE, REASON_HARDWARE_DECLINES = 1, 2  # _C.hybrid_routes' reasons for a sample on the CPU core
_HEIGHT_WIDTH = [_C.INFO_COLUMNS.index("height"), _C.INFO_COLUMNS.index("width")]
HARDWARE_DECLINES = ("a progressive JPEG, which the GPU's hardware decoder declines: decoded by the CPU core at once "
                     "(the CUDA decoder after the hardware's share would set the batch's pace)")


def _cpu_options(options: DecodeOptions, shares: Shares, engines: Sequence[str]) -> DecodeOptions:
    """The options of the CPU core's work in a hybrid batch: its pool's threads (the default thread
    count read now: it follows GPUPIPE_NUM_THREADS, the affinity and the local ranks)."""
    return dataclasses.replace(options, num_threads=cpu_pool_threads(options.num_threads,
                                                                     sharing_engines(shares, engines)))


def start(buffers: Sequence, boxes: np.ndarray, out: torch.Tensor, options: DecodeOptions, infos: HeaderInfos, *,
          keys: Optional[RouteKeys] = None, shares: Optional[Shares] = None, engines: Optional[dict] = None,
          workers: Optional[Workers] = None) -> Pending:
    """Starts a hybrid decode of every box into its slot of ``out``: returns once the CPU share is
    on the pool and the GPU shares are queued on their engines' threads; :func:`wait` collects.
    The GPU engines' streams start after the work queued so far on the current stream (``out``'s
    allocation or writes); ``workers`` (made for the call and closed by :func:`wait` when None)
    need a thread per engine."""
    n = len(buffers)
    engines = gpu_engines(out.device) if engines is None else engines
    shares = shares or Shares.prior(["cpu", *engines])
    keys = keys or RouteKeys(0, 0, np.arange(n, dtype=np.int64))
    boxes = gpu_fallback.native_boxes(boxes)
    infos.count_scans(buffers)  # (headers a CPU-backend probe read: their scans, which eligibility needs)
    # eligibility, the keyed draws and the hardware decoder's known declines in one native pass
    # (their numpy definitions, assign and tests/test_hybrid.py's eligible_reference, are the tests')
    route, reason = routes(buffers, boxes, options, infos, keys, shares, engines)
    own = workers is None
    workers = workers or Workers(list(engines), out.device)
    p = Pending(n, out, options, engines, workers, own)
    p.buffers, p.boxes, p.infos = buffers, boxes, infos
    p.gpu_buffers = gpu_fallback.gpu_inputs(buffers, infos)
    # the CPU core's share and every sample it decodes in the GPU decoders' stead: one pool, the
    # budget less what the sharing GPU decoders' host side needs (cpu_pool_threads)
    p.cpu_options = _cpu_options(options, shares, list(engines))
    p.sizes = infos.table[:, _HEIGHT_WIDTH]  # the headers, read once
    if reason.any():
        codes = gpu_fallback.refusals(infos, boxes, options)  # (the words of what the routes refused)
        p.ineligible = gpu_fallback.ineligible_reasons("the GPU decoders", np.where(reason == REASON_INELIGIBLE,
                                                                                    codes, 0))
        p.ineligible.update({int(i): HARDWARE_DECLINES for i in np.flatnonzero(reason == REASON_HARDWARE_DECLINES)})
    p.cpu_rows = np.flatnonzero(route == 0)
    try:
        if len(p.cpu_rows):
            p.cpu_host = torch.empty((len(p.cpu_rows), *out.shape[1:]), dtype=torch.uint8, pin_memory=out.is_cuda)
            p.cpu_pending = cpu.start([buffers[i] for i in p.cpu_rows], boxes[p.cpu_rows], p.cpu_host, p.cpu_options)
        for k, kind in enumerate(ENGINES[1:], 1):
            rows = np.flatnonzero(route == k)
            if len(rows):
                p.submit(kind, rows)
    except BaseException:
        if own:  # the call's own threads end with it (what was queued is cancelled)
            workers.close()
        raise
    return p


def routes(buffers: Sequence, boxes: np.ndarray, options: DecodeOptions, infos: HeaderInfos, keys: RouteKeys,
           shares: Shares, engines: Sequence[str]) -> tuple:
    """(route, reason) of each sample of a batch under ``keys.split`` (else :data:`SPLIT`): eligibility,
    the shares' draws (``_C.hybrid_routes``) or ranks (``_C.hybrid_ranked_routes``) and the hardware
    decoder's known declines, in one native pass."""
    seed, epoch = keyed.key_int(keys.seed, "seed"), keyed.key_int(keys.epoch, "epoch")
    common = (shares.cpu, shares.hardware, "hardware" in engines, "cuda" in engines)
    split = check_split(keys.split or SPLIT)
    if split == "keyed":
        return _C.hybrid_routes(infos.table, boxes, keys.indices, seed, epoch, ROUTE_STREAM, *common,
                                *gpu_fallback.eligibility_args(options))
    groups = np.zeros(len(buffers), np.int64) if keys.groups is None else keys.groups
    out_h, out_w = (int(options.size[0]), int(options.size[1])) if options.resize else (0, 0)
    return _C.hybrid_ranked_routes(buffers, infos.table, boxes, keys.indices, groups, seed, epoch, ROUTE_STREAM,
                                   *common, out_h, out_w, options.dct_scaling, *gpu_fallback.eligibility_args(options))


def check_split(split: Any) -> str:
    """``split`` if it names a split (:data:`SPLIT`), else ValueError."""
    if split not in ("keyed", "ranked"):
        raise ValueError(f"hybrid.SPLIT must be 'keyed' or 'ranked', got {split!r}")
    return split


def wait(p: Pending) -> BatchStatus:
    """The started decode's outcome: every slot of ``out`` written (or its sample failed), ordered
    before later work on the caller's current stream; ``engine_seconds`` gives each GPU engine's
    (samples decoded, samples given, seconds) for this batch."""
    try:
        return _collect(p)
    finally:
        if p.own_workers:
            p.workers.close()


def _collect(p: Pending) -> BatchStatus:
    status, out = p.status, p.out
    failure: Optional[BaseException] = None
    declined: dict = {}
    k = 0
    while k < len(p.gpu):  # the list grows when the hardware decoder's declines go to the CUDA decoder
        kind, rows, future = p.gpu[k]
        k += 1
        try:
            run = _answer(future)
            if run.done is not None:  # the caller's later work on out waits for the engine's stream
                torch.cuda.current_stream(out.device).wait_event(run.done)
                run.done.synchronize()  # this thread only (the Loader's collect stage): the seconds are known
            seconds = p.workers.busy[kind].seconds(run.call) * run.fraction
        except InterpreterExiting:
            raise
        except BaseException as e:  # a device error: the batch fails once every engine has stopped
            failure = failure or _engine_failure(kind, e)
            queued = getattr(e, "gpupipe_engine_done", None)
            if queued is not None:  # what it queued before failing still writes out: later work waits
                torch.cuda.current_stream(out.device).wait_event(queued)
            continue
        taken = np.ones(len(rows), bool)
        taken[list(run.declined)] = False
        status.route[rows[taken]] = ROUTES[kind]
        was = status.engine_seconds.get(kind, (0, 0, 0.0))
        status.engine_seconds[kind] = (was[0] + int(taken.sum()), was[1] + len(rows), was[2] + seconds)
        if kind == "hardware" and run.declined and "cuda" in p.engines and failure is None:
            p.submit("cuda", rows[~taken])  # progressive files: the CUDA decoder takes them, on its own thread
            continue
        declined.update({int(rows[j]): f"declined by the GPU's {kind} decoder ({why}); decoded by the CPU core"
                         for j, why in run.declined.items()})
    if p.cpu_pending is not None:
        sub = cpu.wait(p.cpu_pending, len(p.cpu_rows))
        p.cpu_pending = None
        status.merge(sub, p.cpu_rows)
        gpu_fallback.scatter(out, p.cpu_rows, p.cpu_host)
        for i, reason in p.ineligible.items():  # the CPU core as a stand-in, not by its share: say why
            if status.kind[i] == 0:
                status.route[i] = Route.CPU_FALLBACK
                status.fallback[i] = reason
    if failure is not None:
        raise failure
    if declined:  # what the GPU decoders handed back: the CPU core, now, with its exact result or error
        gpu_fallback.decode_on_cpu(status, declined, p.buffers, p.boxes, out, p.cpu_options, p.infos)
    return status


def _answer(future: concurrent.futures.Future) -> _EngineRun:
    """The engine's outcome for a share, waited for up to :data:`ENGINE_TIMEOUT` seconds."""
    answered = threading.Event()
    future.add_done_callback(lambda _: answered.set())  # (a cancelled future too, which wait() does not count)
    if wait_for(answered.wait, ENGINE_TIMEOUT):
        return future.result()
    raise TimeoutError(f"no answer within hybrid.ENGINE_TIMEOUT = {ENGINE_TIMEOUT:g} s (a wedged device or driver "
                       "call; its thread is left to it)")


def _engine_failure(kind: str, e: BaseException) -> RuntimeError:
    """The batch's error for engine ``kind``'s ``e``: a RuntimeError naming the engine, chained to
    ``e``; a ``torch.OutOfMemoryError`` (a RuntimeError) for the device's out-of-memory, so that
    ``except torch.OutOfMemoryError`` still catches it."""
    if isinstance(e, concurrent.futures.CancelledError):
        e = RuntimeError("cancelled: the GPU engine's queue was closed (the epochs of the Loader that "
                         "started the batch ended, or the process is exiting)")
    kind_of = torch.OutOfMemoryError if isinstance(e, torch.OutOfMemoryError) else RuntimeError
    failure = kind_of(f"the hybrid backend's {kind} decoder failed the batch ({brief(e, 300)})")
    failure.__cause__ = e
    return failure


def decode(buffers: Sequence, boxes: np.ndarray, out: torch.Tensor, options: DecodeOptions, infos: HeaderInfos, *,
           keys: Optional[RouteKeys] = None, shares: Optional[Shares] = None,
           engines: Optional[dict] = None, workers: Optional[Workers] = None) -> BatchStatus:
    """:func:`start`, then :func:`wait`."""
    return wait(start(buffers, boxes, out, options, infos, keys=keys, shares=shares, engines=engines,
                      workers=workers))
