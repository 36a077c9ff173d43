"""A library's warnings dropped on the calling thread only.

``warnings.catch_warnings`` swaps the whole process's filters and ``showwarning``. On a Loader's
stage thread it hid the warnings other threads raised meanwhile (the Loader's own
``SkippedSamplesWarning`` on the consumer's thread, while the next epoch's first batches were being
read: ``Loader(lookahead=True)``), and, left out of order, it un-did a ``catch_warnings`` the user
entered meanwhile. Instead, the library's modules get a stand-in for their ``warnings`` module whose
``warn`` drops what a thread inside :func:`quiet` raises and passes everything else on unchanged.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import warnings
from typing import Callable, Iterator

_inside = threading.local()


class _ThreadQuietWarnings:
    """The ``warnings`` module as the library's modules see it."""

    def __getattr__(self, name: str):
        return getattr(warnings, name)

    @staticmethod
    def warn(message, category=None, stacklevel=1, source=None, **kwargs) -> None:
        if getattr(_inside, "depth", 0):
            return
        warnings.warn(message, category, stacklevel + 1, source, **kwargs)  # one frame more: this one


_STAND_IN = _ThreadQuietWarnings()
_patched: dict = {}  # package -> the number of its modules when last patched
_lock = threading.Lock()


def _patch(package: str) -> None:
    """Gives every loaded module of ``package`` that imported ``warnings`` the stand-in."""
    prefix = package + "."
    modules = [m for name, m in list(sys.modules.items()) if m is not None and (name == package or name.startswith(prefix))]
    with _lock:
        if _patched.get(package) == len(modules):
            return
        for m in modules:
            if getattr(m, "warnings", None) is warnings:
                m.warnings = _STAND_IN
        _patched[package] = len(modules)


@contextlib.contextmanager
def quiet(package: str, load: Callable[[], None] = lambda: None) -> Iterator[None]:
    """Drops the warnings ``package``'s modules raise on this thread inside the block (``load``
    first imports the modules the block may use, so that they are patched before it runs)."""
    if package not in _patched:
        load()
    _patch(package)
    _inside.depth = getattr(_inside, "depth", 0) + 1
    try:
        yield
    finally:
        _inside.depth -= 1
        _patch(package)  # modules the block imported
