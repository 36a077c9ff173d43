"""A small engine for the Loader's stages: one thread per stage, bounded blocking queues between
them, cancellation, and per-stage timing.

No polling: every wait is a blocking call that :meth:`Engine.close` wakes up. A stage that raises
hands the exception downstream in its place, so the consumer raises it in order, after the items
before it; the stage then stops, and so does everything behind it.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence

import torch

from gpupipe import _C
from gpupipe._exit import InterpreterExiting, call_scope, wait_for

_END = object()


class Closed(Exception):
    """The queue (or the engine) was closed: the waiting thread should stop."""


class Many:
    """What a stage returns for several items (the Loader's chunk as its batches): each is put on
    the next queue on its own, in order, each waiting for room."""

    __slots__ = ("items",)

    def __init__(self, items: Sequence):
        self.items = items


class BoundedQueue:
    """A FIFO of at most ``capacity`` items. ``put`` blocks while full, ``get`` while empty;
    ``close()`` wakes every waiter, which then raises :class:`Closed`."""

    def __init__(self, capacity: int):
        self.capacity = max(1, int(capacity))
        self._items: collections.deque = collections.deque()
        self._cond = threading.Condition()
        self._closed = False

    def put(self, item: Any) -> None:
        with self._cond:
            while len(self._items) >= self.capacity and not self._closed:
                self._cond.wait()
            if self._closed:
                raise Closed
            self._items.append(item)
            self._cond.notify_all()

    def get(self) -> Any:
        with self._cond:
            while not self._items and not self._closed:
                self._cond.wait()
            if self._closed:
                raise Closed
            item = self._items.popleft()
            self._cond.notify_all()
            return item

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._items.clear()
            self._cond.notify_all()


class _Raised:
    """An exception travelling downstream in place of the item that raised it."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException):
        self.error = error


class StageTimes:
    """Seconds each stage spent working, the CPU seconds its thread spent outside gpupipe's native
    calls (its host time: Python, torch ops, bookkeeping; the pools' work is not in it), and the
    seconds the consumer spent waiting (thread-safe)."""

    def __init__(self, names: Iterable[str]):
        self._lock = threading.Lock()
        self.busy = {name: 0.0 for name in names}
        self.host_cpu = {name: 0.0 for name in names}
        self.wait = 0.0

    def add(self, name: str, seconds: float, host_cpu: float = 0.0) -> None:
        with self._lock:
            self.busy[name] = self.busy.get(name, 0.0) + seconds
            self.host_cpu[name] = self.host_cpu.get(name, 0.0) + max(0.0, host_cpu)

    def host(self) -> dict:
        with self._lock:
            return dict(self.host_cpu)

    def add_wait(self, seconds: float) -> None:
        with self._lock:
            self.wait += seconds

    def snapshot(self) -> tuple[dict, float]:
        with self._lock:
            return dict(self.busy), self.wait


class HostClock:
    """The calling thread's wall time, and its CPU time outside gpupipe's native calls, since start."""

    __slots__ = ("wall", "cpu")

    def __init__(self):
        self.wall, self.cpu = time.perf_counter(), time.thread_time() - _C._thread_native_cpu_seconds()

    def read(self) -> tuple[float, float]:
        """(wall seconds, host CPU seconds) since this clock started."""
        return time.perf_counter() - self.wall, time.thread_time() - _C._thread_native_cpu_seconds() - self.cpu


class Engine:
    """Runs ``source`` through ``stages`` (``(name, fn)``: ``fn(item) -> item``), each on its own
    thread, with at most ``capacity`` items waiting between two stages. Iterating the engine yields
    the last stage's outputs in source order.

    Args:
        source: an iterable of items (consumed on the first stage's thread).
        stages: ``(name, fn)`` pairs, or ``(name, fn, False)`` for a stage that times its own
            parts, or ``(name, fn, timed, gate)``: ``gate(item) -> item`` runs before ``fn``,
            outside the item's call scope, for what may wait for others (a free buffer, an
            iteration): an exiting interpreter does not wait for it; it may raise :class:`Closed`.
            ``fn`` runs once per item.
        capacity: items queued between stages (bounds memory and read-ahead).
        times: where the stages' busy time and the consumer's wait go.
        closables: objects whose ``close()`` must also wake waiters on shutdown (e.g. a buffer ring).
        name: thread name prefix.
        device: a CUDA device the stage threads make their current device (a new thread's is device
            0: what it allocates, pins or launches without naming a device would go there).
    """

    def __init__(self, source: Iterable, stages: Sequence[tuple[str, Callable]], *, capacity: int, times: StageTimes,
                 closables: Sequence = (), name: str = "gpupipe", device: Optional[torch.device] = None):
        self.times = times
        self._device = device if device is not None and device.type == "cuda" else None
        self._queues = [BoundedQueue(capacity) for _ in stages]
        self._closables = list(closables)
        self._stop = threading.Event()
        self._threads = []
        inputs: list[Optional[BoundedQueue]] = [None] + self._queues[:-1]
        for stage, inbox, outbox in zip(stages, inputs, self._queues):
            stage_name, fn, *rest = stage
            timed, gate = (rest[0] if rest else True), (rest[1] if len(rest) > 1 else None)
            items = source if inbox is None else None
            t = threading.Thread(target=self._run, args=(stage_name, fn, timed, gate, items, inbox, outbox),
                                 name=f"{name}-{stage_name}", daemon=True)
            self._threads.append(t)
        try:
            for t in self._threads:
                t.start()
        except BaseException:  # (a KeyboardInterrupt, no thread to be had): the started ones stop
            self._threads = [t for t in self._threads if t.ident is not None]
            self.close()
            raise

    def _run(self, stage_name: str, fn: Callable, timed: bool, gate: Optional[Callable], items: Optional[Iterable],
             inbox: Optional[BoundedQueue], outbox: BoundedQueue) -> None:
        # A batch's last references may drop in this thread while it runs on (its consumer done with
        # it), and torch releases the GIL while it frees a tensor: a daemon thread doing so as the
        # interpreter finalizes aborts the process ("terminate called without an active exception").
        # So they drop in call scopes, which an exiting interpreter waits for (or in which it parks
        # the thread for good: gpupipe._exit). A thread that stops (Closed) is joined by its closer.
        item = result = None
        try:
            if self._device is not None:
                torch.cuda.set_device(self._device)  # (this thread's own setting)
            iterator = iter(items) if items is not None else None
            while not self._stop.is_set():
                try:
                    item = next(iterator) if iterator is not None else inbox.get()
                except StopIteration:
                    item = _END
                if item is _END or isinstance(item, _Raised):
                    outbox.put(item)
                    return
                if gate is not None:
                    item = gate(item)
                clock = HostClock()
                with call_scope():  # an exiting interpreter waits for the item in hand (gpupipe._exit)
                    result = fn(item)
                    item = None
                if timed:
                    self.times.add(stage_name, *clock.read())
                if type(result) is Many:
                    for one in result.items:
                        outbox.put(one)
                else:
                    outbox.put(result)
                with call_scope():
                    result = None
        except Closed:
            return
        except BaseException as e:  # delivered to the consumer in order, never lost in this thread
            try:
                outbox.put(_Raised(e))
            except Closed:
                pass

    def __iter__(self) -> Iterator:
        return self

    def __next__(self):
        t0 = time.perf_counter()
        try:
            item = self._queues[-1].get()
        except Closed:
            raise StopIteration from None
        finally:
            self.times.add_wait(time.perf_counter() - t0)
        if item is _END:
            self.close()
            raise StopIteration
        if isinstance(item, _Raised):
            self.close()
            raise item.error
        return item

    def close(self, timeout: float = 5.0) -> None:
        """Stops every stage: wakes blocked threads and joins them (a stage busy in ``fn`` finishes
        its item first)."""
        self._stop.set()
        for q in self._queues:
            q.close()
        for c in self._closables:
            c.close()
        current = threading.current_thread()
        for t in self._threads:
            if t is not current:
                _join_unless_parked(t, timeout)

    @property
    def alive(self) -> bool:
        return any(t.is_alive() for t in self._threads)


def _join_unless_parked(thread: threading.Thread, timeout: float) -> None:
    """Joins ``thread`` for up to ``timeout`` seconds unless it parks for good at exit
    (gpupipe._exit), which it may do after this join began (a thread alive when the exit hook ran
    parks at its next call). The others end at once, and must before the interpreter finalizes:
    they drop their batches' tensors as they return."""
    if not thread.is_alive():
        return
    try:
        wait_for(lambda seconds: not (thread.join(seconds) or thread.is_alive()), timeout, thread)
    except InterpreterExiting:  # (it parked)
        pass
