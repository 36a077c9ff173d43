"""gpupipe calls on other threads at interpreter exit (csrc/released_gil.h).

A daemon thread inside a gpupipe call when Python exits would abort the process (CPython before 3.14
ends it at its next GIL request with a forced unwind that a noexcept destructor, gpupipe's or
torch's, turns into std::terminate). An atexit hook of ``gpupipe._C`` waits for the calls running on
other threads to finish first (up to 30 s, then abandons them: their threads park instead of taking
the GIL back); their threads then park, silently, instead of returning to code that would drop the
call's tensors, and so does any thread that starts a new call meanwhile. A call is a GIL-free region
of the bindings, and what :func:`call_scope` wraps: an entry point whose native parts are separated
by torch ops, and each item of a Loader stage.
"""

from __future__ import annotations

import functools
from typing import Callable, TypeVar

from gpupipe import _C

F = TypeVar("F", bound=Callable)


def call_scope(fn: F) -> F:
    """``fn`` counted as one gpupipe call (see the module's docstring)."""

    @functools.wraps(fn)
    def counted(*args, **kwargs):
        _C._call_enter()
        try:
            return fn(*args, **kwargs)
        finally:
            _C._call_leave()

    return counted  # type: ignore[return-value]
