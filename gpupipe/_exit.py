"""gpupipe calls on other threads at interpreter exit (csrc/bindings/released_gil.h).

A daemon thread inside a gpupipe call when Python exits would abort the process (CPython before 3.14
ends it at its next GIL request with a forced unwind that a noexcept destructor, gpupipe's or
torch's, turns into std::terminate). An atexit hook of ``gpupipe._C`` waits for the calls running on
other threads to finish first (up to 30 s, then abandons them: their threads park instead of taking
the GIL back); the threads that were alive when the hook ran then park, silently, instead of
returning to code that would drop the call's tensors, and so does any of them that starts a new call
meanwhile. A call is a GIL-free region of the bindings, a batch decode started on the pool, and what
``with call_scope():`` wraps: an entry point whose native parts are separated by torch ops, and each
item of a Loader stage. ``call_scope`` is a C++ context manager: a KeyboardInterrupt cannot leave a
call counted, and warnings keep pointing at the caller's line.

A call that waits for another thread's call must use :func:`wait_for`: once the hook has run, that
thread parks as its call ends and never signals, and a plain wait would hold the hook for its 30 s.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Optional

from gpupipe._C import CallScope as call_scope
from gpupipe._C import _interpreter_exiting as interpreter_exiting
from gpupipe._C import _thread_parked as thread_parked

__all__ = ["InterpreterExiting", "call_scope", "interpreter_exiting", "thread_parked", "wait_for"]

_POLL = 0.05  # seconds between looks at the interpreter's exit while waiting


class InterpreterExiting(RuntimeError):
    """A wait given up because the interpreter is exiting (its thread then parks, see above)."""


def wait_for(ready: Callable[[float], bool], timeout: Optional[float],
             thread: Optional[threading.Thread] = None) -> bool:
    """``ready(seconds)`` (``Event.wait``'s contract) waited for up to ``timeout`` seconds (None: no
    limit): True once it is, False at the timeout. Raises :class:`InterpreterExiting` once the exit
    hook has run and ``thread``, the one that makes it ready, has parked for good (None: a thread
    unknown here, which may have: from the hook on). Call it in a call scope: the raise then parks
    the caller instead of unwinding it."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        left = _POLL if deadline is None else min(_POLL, deadline - time.monotonic())
        if ready(max(left, 0.0)):
            return True
        if interpreter_exiting() and (thread is None or thread_parked(thread.native_id)):
            raise InterpreterExiting("the interpreter is exiting")
        if deadline is not None and time.monotonic() >= deadline:
            return False
