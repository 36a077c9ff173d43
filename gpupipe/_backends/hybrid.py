"""The hybrid backend: every decode engine of a GPU node on each batch at once.

A batch is split between the CPU pool (ROI + DCT scaling, the C++ core), the GPU's hardware JPEG
decoder and nvImageCodec's CUDA decoder, in proportion to their measured rates (:class:`Shares`).
A sample's route is a pure function of (seed, epoch, index) and the epoch's shares (:func:`assign`),
so an epoch replays exactly: same routes, same pixels. The samples a GPU decoder cannot take with
gpupipe's semantics (``gpu_fallback.gpu_eligible``), and those it declines, go to the CPU core.

The engines work concurrently: the CPU share is started on the pool first (it returns at once), the
GPU engines then decode theirs, each on its own thread and CUDA stream, and :func:`wait` collects the
three. Each GPU engine's images and seconds are reported per batch (``BatchStatus.engine_seconds``);
the Loader sums them over an epoch, with the CPU pool's busy thread-seconds, and
:meth:`Shares.retuned` makes the next epoch's shares of them.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Optional, Sequence

import numpy as np
import torch

from gpupipe import _C, keyed
from gpupipe._backends import cpu, gpu_fallback
from gpupipe.decode_types import BatchStatus, DecodeOptions, HeaderInfos, Route

name = "hybrid"

ENGINES = ("cpu", "hardware", "cuda")  #: the engines a batch is split between, in route order
ROUTES = {"cpu": Route.CPU, "hardware": Route.GPU_HARDWARE, "cuda": Route.GPU_CUDA}
ROUTE_STREAM = keyed.stream_of("gpupipe.hybrid.route")  #: the routes' own keyed stream (crops are 0)

# Starting rates (images/s at RandomResizedCrop 224 of 800x533 photos, an H100 node): the CPU core
# per decode thread, nvImageCodec's hardware and CUDA decoders (issue 29's measurements). They only
# set the first epoch's shares; the Loader re-tunes them between epochs from what it measured.
PRIOR_RATES = {"cpu_per_thread": 450.0, "hardware": 7000.0, "cuda": 4000.0}
_MIN_SHARE = 0.02  # an engine that exists keeps a little work, so its rate stays measured


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
    except ImportError as e:
        reason = f"gpupipe's nvImageCodec engine is not importable ({e})"
    return None if reason is None else f"the hybrid backend needs nvImageCodec's GPU decoders: {reason}"


def gpu_engines(device: torch.device) -> dict:
    """``{kind: engine}`` of the GPU decoders on ``device``: ``"hardware"`` where the GPU has JPEG
    engines (A100, H100, B200), and ``"cuda"``. An engine decodes whole images and crops + resizes
    them into their slots (``engine.decode(buffers, boxes, out, slots, options, sizes=) -> {k:
    reason}`` of the samples it declined; ``sizes`` the headers' (height, width))."""
    nv = _nvimgcodec()
    kinds = (["hardware"] if nv.hardware_decoder_available(device) else []) + ["cuda"]
    return {kind: nv.engine(kind, device) for kind in kinds}


@dataclasses.dataclass(frozen=True)
class Shares:
    """The fraction of a batch's samples each engine gets (they sum to 1; an engine that is not
    there gets 0), and the rates they came from (images/s)."""

    cpu: float
    hardware: float
    cuda: float

    @classmethod
    def from_rates(cls, rates: dict, available: Sequence[str]) -> "Shares":
        """Shares in proportion to the engines' rates (images/s), so that they finish a batch
        together; each available engine keeps at least a small share, so that it stays measured."""
        raw = {e: max(float(rates.get(e, 0.0)), 0.0) if e in available else 0.0 for e in ENGINES}
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
    def prior(cls, available: Sequence[str], cpu_threads: int) -> "Shares":
        """The first epoch's shares: from PRIOR_RATES and this rank's decode threads."""
        rates = {"cpu": PRIOR_RATES["cpu_per_thread"] * cpu_threads, "hardware": PRIOR_RATES["hardware"],
                 "cuda": PRIOR_RATES["cuda"]}
        return cls.from_rates(rates, available)

    @classmethod
    def from_dict(cls, d: Any) -> "Shares":
        """From :meth:`as_dict`'s form; ValueError naming what is wrong."""
        if not isinstance(d, dict) or set(d) != set(ENGINES):
            raise ValueError(f"decode shares are a dict with keys {ENGINES}, got {d!r}")
        values = {}
        for e in ENGINES:
            v = d[e]
            if isinstance(v, bool) or not isinstance(v, (int, float, np.floating, np.integer)) or not 0 <= v <= 1:
                raise ValueError(f"decode share {e!r} must be a number within [0, 1], got {v!r}")
            values[e] = float(v)
        if abs(sum(values.values()) - 1.0) > 1e-6:
            raise ValueError(f"decode shares must sum to 1, got {values}")
        return cls(**values)

    def as_dict(self) -> dict:
        return {e: getattr(self, e) for e in ENGINES}

    def retuned(self, measured: dict, available: Sequence[str], cpu_threads: int) -> "Shares":
        """The next epoch's shares from an epoch's measurements ``{engine: (images, seconds)}``
        (the CPU's seconds are its pool's busy thread-seconds, divided here by ``cpu_threads``).
        An engine that decoded nothing keeps the rate its share implied."""
        rates = {}
        for e in available:
            images, seconds = measured.get(e, (0, 0.0))
            if e == "cpu":
                seconds = seconds / max(cpu_threads, 1)
            rates[e] = images / seconds if images >= 8 and seconds > 0 else None
        known = {e: r for e, r in rates.items() if r is not None}
        if not known:
            return self
        # An engine without a measurement keeps its share relative to the measured ones.
        scale = sum(known.values()) / max(sum(getattr(self, e) for e in known), 1e-12)
        for e, r in rates.items():
            if r is None:
                rates[e] = getattr(self, e) * scale
        return Shares.from_rates(rates, available)


def assign(seed: int, epoch: int, indices: np.ndarray, shares: Shares, eligible: np.ndarray) -> np.ndarray:
    """int64 [N]: each sample's engine (an index into ENGINES), a pure function of (seed, epoch,
    index), the shares and whether a GPU decoder may take it (else the CPU core)."""
    u = keyed.uniforms(seed, epoch, indices, 1, stream=ROUTE_STREAM)[:, 0]
    bounds = np.cumsum([shares.cpu, shares.hardware])
    engine = np.searchsorted(bounds, u, side="right")  # u < cpu: 0; < cpu + hardware: 1; else 2
    engine = np.minimum(engine, len(ENGINES) - 1)
    return np.where(eligible, engine, 0).astype(np.int64)


@dataclasses.dataclass
class RouteKeys:
    """What a batch's routes are a function of: the Loader's seed and epoch and the samples' indices
    in the dataset (:func:`gpupipe.decode_crop_jpegs`: seed 0, epoch 0, positions in the call)."""

    seed: int
    epoch: int
    indices: np.ndarray

    def select(self, rows: np.ndarray) -> "RouteKeys":
        return RouteKeys(self.seed, self.epoch, np.asarray(self.indices)[rows])


class Pending:
    """A started hybrid decode: the CPU share on the pool, the GPU shares queued."""

    def __init__(self, n: int, out: torch.Tensor, options: DecodeOptions):
        self.n, self.out, self.options = n, out, options
        self.status = BatchStatus.empty(n)
        self.cpu_rows = np.zeros(0, np.int64)
        self.cpu_host: Optional[torch.Tensor] = None
        self.cpu_pending: Any = None
        self.declined: dict = {}  # {row: reason} for the CPU core, after the started share
        self.gpu: list = []  # (kind, rows, future)
        self.buffers: Sequence = ()
        self.boxes: Optional[np.ndarray] = None
        self.infos: Optional[HeaderInfos] = None


_lock = threading.Lock()
_threads: dict = {}  # (pid, device) -> a thread per GPU engine, so that their host-side waits overlap
_streams: dict = {}  # (pid, kind, device) -> the engine's CUDA stream


def _engine_threads(device: torch.device) -> ThreadPoolExecutor:
    with _lock:
        key = (os.getpid(), str(device))  # a forked child makes its own threads
        if key not in _threads:
            _threads[key] = ThreadPoolExecutor(len(ENGINES) - 1, thread_name_prefix="gpupipe-gpu-engine")
        return _threads[key]


def _engine_stream(kind: str, device: torch.device) -> "torch.cuda.Stream":
    with _lock:
        key = (os.getpid(), kind, str(device))
        if key not in _streams:
            _streams[key] = torch.cuda.Stream(device)
        return _streams[key]


@dataclasses.dataclass
class _EngineRun:
    declined: dict  #: {k: reason} of the share's samples the engine handed back
    host_s: float  #: the call's wall time
    started: Any = None  #: CUDA events around its work on its stream (None for a host engine)
    done: Any = None


def _run_engine(eng: Any, buffers: list, boxes: np.ndarray, out: torch.Tensor, slots: np.ndarray,
                options: DecodeOptions, sizes: np.ndarray, stream: Optional["torch.cuda.Stream"]) -> _EngineRun:
    """One GPU engine's share, on its own stream when ``out`` is on the GPU."""
    t0 = time.perf_counter()
    if stream is None:  # a host engine (the scheduler's tests): nothing to order
        return _EngineRun(eng.decode(buffers, boxes, out, slots, options, sizes=sizes), time.perf_counter() - t0)
    started, done = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(stream):
        started.record(stream)
        declined = eng.decode(buffers, boxes, out, slots, options, sizes=sizes)
        done.record(stream)
    return _EngineRun(declined, time.perf_counter() - t0, started, done)


def start(buffers: Sequence, boxes: np.ndarray, out: torch.Tensor, options: DecodeOptions, infos: HeaderInfos, *,
          keys: Optional[RouteKeys] = None, shares: Optional[Shares] = None,
          engines: Optional[dict] = None) -> Pending:
    """Starts a hybrid decode of every box into its slot of ``out``: returns once the CPU share is
    on the pool and the GPU shares are queued on their engines' threads; :func:`wait` collects."""
    n = len(buffers)
    engines = gpu_engines(out.device) if engines is None else engines
    available = ["cpu", *engines]
    if shares is None:
        shares = Shares.prior(available, options.num_threads or _C.default_num_threads())
    if keys is None:
        keys = RouteKeys(0, 0, np.arange(n, dtype=np.int64))
    boxes = np.ascontiguousarray(boxes)
    eligible = gpu_fallback.gpu_eligible(infos, boxes, options)
    # An engine that is not there takes nothing: its share falls to the CPU core.
    route = assign(keys.seed, keys.epoch, keys.indices, shares, eligible)
    for k, kind in enumerate(ENGINES[1:], 1):
        if kind not in engines:
            route[route == k] = 0
    p = Pending(n, out, options)
    p.buffers, p.boxes, p.infos = buffers, boxes, infos
    p.cpu_rows = np.flatnonzero(route == 0)
    if len(p.cpu_rows):
        if out.device.type == "cpu":
            p.cpu_host = torch.empty((len(p.cpu_rows), *out.shape[1:]), dtype=torch.uint8)
        else:
            p.cpu_host = torch.empty((len(p.cpu_rows), *out.shape[1:]), dtype=torch.uint8, pin_memory=True)
        p.cpu_pending = cpu.start([buffers[i] for i in p.cpu_rows], boxes[p.cpu_rows], p.cpu_host, options)
    pool = _engine_threads(out.device)
    sizes = np.stack([infos.column("height"), infos.column("width")], axis=1)  # the headers, read once
    for k, kind in enumerate(ENGINES[1:], 1):
        rows = np.flatnonzero(route == k)
        if not len(rows):
            continue
        stream = _engine_stream(kind, out.device) if out.is_cuda else None
        if stream is not None:  # the engine's stream starts after what the caller queued on out
            stream.wait_stream(torch.cuda.current_stream(out.device))
        future = pool.submit(_run_engine, engines[kind], [buffers[i] for i in rows], boxes[rows], out, rows,
                             options, sizes[rows], stream)
        p.gpu.append((kind, rows, future))
    return p


def wait(p: Pending) -> BatchStatus:
    """The started decode's outcome: every slot of ``out`` written (or its sample failed), ordered
    before later work on the caller's current stream; ``engine_seconds`` gives each engine's
    (images, seconds) for this batch."""
    status, out = p.status, p.out
    status.engine_seconds = {}
    failure: Optional[BaseException] = None
    for kind, rows, future in p.gpu:
        try:
            run = future.result()
        except BaseException as e:  # a device error: the batch fails once every engine has stopped
            failure = failure or RuntimeError(f"the hybrid backend's {kind} decoder failed the batch "
                                              f"({type(e).__name__}: {' '.join(str(e).split())[:300]})")
            continue
        seconds = run.host_s
        if run.done is not None:  # the engine's stream: the caller's later work on out waits for it
            torch.cuda.current_stream(out.device).wait_event(run.done)
            run.done.synchronize()  # this thread only (the collect stage): the seconds of its GPU work
            seconds = max(run.host_s, run.started.elapsed_time(run.done) / 1e3)
        declined = {int(k): str(v) for k, v in run.declined.items()}
        ok_rows = np.delete(rows, sorted(declined)) if declined else rows
        status.route[ok_rows] = ROUTES[kind]
        status.engine_seconds[kind] = (len(ok_rows), seconds)
        for k, reason in declined.items():
            p.declined[int(rows[k])] = f"declined by the GPU's {kind} decoder ({reason}); decoded by the CPU core"
    if p.cpu_pending is not None:
        sub = cpu.wait(p.cpu_pending, len(p.cpu_rows))
        p.cpu_pending = None
        status.merge(sub, p.cpu_rows)
        _scatter(out, p.cpu_rows, p.cpu_host)
    if failure is not None:
        raise failure
    if p.declined:  # what a GPU decoder handed back: the CPU core, now, with its exact result or error
        rows = np.array(sorted(p.declined), dtype=np.int64)
        host = torch.empty((len(rows), *out.shape[1:]), dtype=torch.uint8)
        sub = cpu.decode([p.buffers[i] for i in rows], p.boxes[rows], host, p.options, p.infos.select(rows))
        sub.route[sub.kind == 0] = Route.CPU_FALLBACK
        sub.fallback.update({k: p.declined[int(i)] for k, i in enumerate(rows) if sub.kind[k] == 0})
        status.merge(sub, rows)
        _scatter(out, rows, host)
    return status


def _scatter(out: torch.Tensor, rows: np.ndarray, host: torch.Tensor) -> None:
    """out[rows] = host (host -> device without blocking the host: pinned memory, one copy)."""
    if out.device.type == "cpu":
        out.index_copy_(0, torch.from_numpy(rows), host)
        return
    sub = host.to(out.device, non_blocking=True)
    out.index_copy_(0, torch.from_numpy(rows).to(out.device, non_blocking=True), sub)


def decode(buffers: Sequence, boxes: np.ndarray, out: torch.Tensor, options: DecodeOptions, infos: HeaderInfos, *,
           keys: Optional[RouteKeys] = None, shares: Optional[Shares] = None,
           engines: Optional[dict] = None) -> BatchStatus:
    """:func:`start`, then :func:`wait`."""
    return wait(start(buffers, boxes, out, options, infos, keys=keys, shares=shares, engines=engines))
