"""The threads that call a source's own ``read`` (the Loader's read stage for sources that are not
plain files), each call limited in time.

A read that does not return within the timeout fails its sample (``TimeoutError``, the limit named)
and is left to its thread, which stops when the read returns; a new thread takes its place, so the
reads after it go on. The threads are daemons: a read that never returns does not hold the process
at exit (a ``ThreadPoolExecutor``'s threads are joined then). Threads left in reads are bounded
(:data:`MAX_STUCK`): past that, reads fail at once, naming how many are stuck, instead of starting
more threads.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any, Callable, Optional, Sequence

MAX_STUCK = 32  # threads left in reads past the timeout, at most; then reads fail at once

_QUEUED, _RUNNING, _DONE, _ABANDONED = range(4)


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
        for _ in range(threads):
            self._start_thread()

    def map(self, fn: Callable, items: Sequence) -> list:
        """``fn(item)`` for each item on the pool's threads: each result, or the exception the call
        raised, or a ``TimeoutError`` for a call past the timeout (or refused: too many stuck)."""
        with self._lock:
            if self._closed:
                raise RuntimeError("the read pool is shut down")
            if self.stuck >= MAX_STUCK:
                return [self._refused()] * len(items)
        tasks = [_Task(fn, item) for item in items]
        for t in tasks:
            self._tasks.put(t)
        return [self._wait(t) for t in tasks]

    def shutdown(self) -> None:
        """Stops the idle threads and fails the reads not started (``RuntimeError``); returns at once."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            live = self._live
        while True:  # the queued reads: failed, so that no map() waits for them
            try:
                t = self._tasks.get_nowait()
            except queue.Empty:
                break
            if t is not None:
                with self._lock:
                    if t.state != _QUEUED:
                        continue
                    t.state, t.result = _DONE, RuntimeError("not read: the read pool was shut down")
                t.done.set()
        for _ in range(live):
            self._tasks.put(None)

    # --- threads ----------------------------------------------------------------------------------

    def _start_thread(self) -> None:  # (called with the lock held, or before any thread runs)
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
                if t.state != _QUEUED:  # (refused while queued)
                    continue
                t.state, t.started = _RUNNING, time.monotonic()
            try:
                result = t.fn(t.arg)
            except BaseException as e:  # the sample's failure, reported with it
                result = e
            with self._lock:
                if t.state == _ABANDONED:  # past the timeout, its sample failed: serve again if a place is free
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

    def _wait(self, t: _Task) -> Any:
        if self.timeout is None:
            t.done.wait()
            return t.result
        while True:
            with self._lock:
                if t.state == _DONE:
                    return t.result
                if t.state == _QUEUED and self.stuck >= MAX_STUCK:  # the stuck reads hold the threads
                    t.state = _DONE
                    return self._refused()
                if t.state == _RUNNING and time.monotonic() - t.started >= self.timeout:
                    t.state = _ABANDONED
                    self.stuck += 1
                    self._live -= 1
                    if not self._closed and self.stuck < MAX_STUCK:
                        self._start_thread()  # the stuck thread's place
                    return TimeoutError(f"read did not return within the {self.timeout:g} s timeout")
                left = self.timeout if t.state == _QUEUED else t.started + self.timeout - time.monotonic()
            t.done.wait(max(left, 0.0))
