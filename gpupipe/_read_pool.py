"""The threads that call a source's own ``read`` (the Loader's read stage for sources that are not
plain files), each call limited in time. One pool a Loader, shared by its epochs.

A read that does not return within the timeout fails its sample (``TimeoutError``, the limit named)
and is left to its thread, which stops when the read returns; a new thread takes its place, so the
reads after it go on. The threads are daemons: a read that never returns does not hold the process
at exit (a ``ThreadPoolExecutor``'s threads are joined then). Threads left in reads are bounded
for the pool's life: once :data:`MAX_STUCK` are, no thread takes their place (those running may
still be left so, up to ``threads - 1`` more), and reads not started fail at once, naming how many
are stuck. A ``map`` whose caller gives up (its ``cancel`` event set: an
epoch closed) or a pool shut down returns at once, its reads not started failed and those running
left to their threads as above.
"""

from __future__ import annotations

import atexit
import queue
import threading
import time
import weakref
from typing import Any, Callable, Optional, Sequence

MAX_STUCK = 32  # threads left in reads past the timeout before none takes their place and reads fail at once
_POLL = 0.05  # seconds between looks at a map's cancel event and the pool's shutdown while waiting

_QUEUED, _RUNNING, _DONE, _ABANDONED = range(4)
_POOLS: "weakref.WeakSet[ReadPool]" = weakref.WeakSet()


@atexit.register
def _shut_down_all() -> None:
    """At exit, before gpupipe._C's hook (registered earlier, so run later) waits up to 30 s for the
    Loader's stage calls: a read stage waiting on a read that hangs returns at once."""
    for pool in list(_POOLS):
        pool.shutdown()


class _Task:
    __slots__ = ("fn", "arg", "state", "started", "result", "done")

    def __init__(self, fn: Callable, arg: Any):
        self.fn, self.arg = fn, arg
        self.state, self.started, self.result = _QUEUED, 0.0, None
        self.done = threading.Event()


class ReadPool:
    """``threads`` daemon threads calling ``fn(item)``; ``timeout`` seconds per call (None: no limit)."""

    def __init__(self, threads: int, timeout: Optional[float], name: str = "gpupipe-io"):
        self.threads, self.timeout, self.name = threads, timeout, name
        self._tasks: "queue.SimpleQueue[Optional[_Task]]" = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._live = 0  # threads serving the queue
        self.stuck = 0  # threads left in a read past the timeout (they stop when it returns)
        self._closed = False
        with self._lock:
            for _ in range(threads):
                self._start_thread()
        _POOLS.add(self)

    def map(self, fn: Callable, items: Sequence, cancel: Optional[threading.Event] = None) -> list:
        """``fn(item)`` for each item on the pool's threads: each result, or the exception the call
        raised, or a ``TimeoutError`` for a call past the timeout (or refused: too many stuck), or a
        ``RuntimeError`` for a call not made (``cancel`` set, the pool shut down)."""
        tasks = [_Task(fn, item) for item in items]
        with self._lock:  # (enqueued under the lock: a shutdown fails them or finds them served)
            if self._closed:
                raise RuntimeError("the read pool is shut down")
            if self.timeout is not None and self.stuck >= MAX_STUCK:
                return [self._refused()] * len(items)
            for t in tasks:
                self._tasks.put(t)
        return [self._wait(t, cancel) for t in tasks]

    def shutdown(self) -> None:
        """Stops the idle threads; the reads not started fail and waiting maps return (``RuntimeError``),
        those running are left to their threads. Returns at once."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for _ in range(self._live):
                self._tasks.put(None)

    # --- threads ----------------------------------------------------------------------------------

    def _start_thread(self) -> None:  # (with the lock held)
        self._live += 1
        threading.Thread(target=self._serve, name=self.name, daemon=True).start()

    def _serve(self) -> None:
        while True:
            t = self._tasks.get()
            if t is None:
                with self._lock:
                    self._live -= 1
                return
            with self._lock:
                if t.state != _QUEUED:  # (refused or given up while queued)
                    continue
                if self._closed:  # not started after a shutdown
                    t.state, t.result = _DONE, RuntimeError("not read: the read pool was shut down")
                    t.done.set()
                    continue
                t.state, t.started = _RUNNING, time.monotonic()
            try:
                result = t.fn(t.arg)
            except BaseException as e:  # the sample's failure, reported with it
                result = e
            with self._lock:
                if t.state == _ABANDONED:  # its sample failed meanwhile: serve again if a place is free
                    self.stuck -= 1
                    if self._closed or self._live >= self.threads:
                        return
                    self._live += 1
                    continue
                t.state, t.result = _DONE, result
            t.done.set()

    def _refused(self) -> TimeoutError:
        return TimeoutError(f"not read: {self.stuck} reads of this source are still running past the "
                            f"{self.timeout:g} s timeout")

    def _abandon(self, t: _Task) -> None:
        """A running read's sample failed without it (with the lock held): its thread is left to it,
        and another takes its place while fewer than MAX_STUCK are left so."""
        t.state = _ABANDONED
        self.stuck += 1
        self._live -= 1
        if not self._closed and self.stuck < MAX_STUCK:
            self._start_thread()

    def _wait(self, t: _Task, cancel: Optional[threading.Event]) -> Any:
        while True:
            with self._lock:
                if t.state == _DONE:
                    return t.result
                if self._closed or (cancel is not None and cancel.is_set()):
                    why = "the read pool was shut down" if self._closed else "the epoch was closed"
                    if t.state == _RUNNING:
                        self._abandon(t)
                    else:
                        t.state = _DONE
                    return RuntimeError(f"not read: {why}")
                now = time.monotonic()
                if self.timeout is not None:
                    if t.state == _QUEUED and self.stuck >= MAX_STUCK:  # the stuck reads hold the threads
                        t.state = _DONE
                        return self._refused()
                    if t.state == _RUNNING and now - t.started >= self.timeout:
                        self._abandon(t)
                        return TimeoutError(f"read did not return within the {self.timeout:g} s timeout")
                left = _POLL if self.timeout is None or t.state == _QUEUED else t.started + self.timeout - now
            t.done.wait(min(max(left, 0.0), _POLL))
