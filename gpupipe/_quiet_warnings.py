"""A library's warnings dropped on the calling thread only.

``warnings.catch_warnings`` swaps the whole process's filters and ``showwarning``. On a Loader's
stage thread it hid the warnings other threads raised meanwhile (the Loader's own
``SkippedSamplesWarning`` on the consumer's thread, while the next epoch's first batches were being
read: ``Loader(lookahead=True)``), and, left out of order, it un-did a ``catch_warnings`` the user
entered meanwhile. Instead, the library's modules get a stand-in for their ``warnings`` module whose
``warn`` drops what a thread inside :func:`quiet` raises (of the categories it names) and passes
everything else on unchanged.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import warnings
from typing import Callable, Iterator


class _ThreadQuietWarnings:
    """The ``warnings`` module as one package's modules see it."""

    def __init__(self):
        self.inside = threading.local()  # .categories: a list, a tuple of categories per quiet() entered

    def __getattr__(self, name: str):
        return getattr(warnings, name)

    def warn(self, message, category=None, stacklevel=1, source=None, **kwargs) -> None:
        kind = type(message) if isinstance(message, Warning) else (category or UserWarning)
        if any(issubclass(kind, c) for c in getattr(self.inside, "categories", ())):
            return
        warnings.warn(message, category, stacklevel + 1, source, **kwargs)  # one frame more: this one


_stand_ins: dict = {}  # package -> its _ThreadQuietWarnings
_patched: dict = {}  # package -> len(sys.modules) when its modules were last patched
_lock = threading.Lock()


def _patch(package: str) -> None:
    """Gives every loaded module of ``package`` that imported ``warnings`` the stand-in (again only
    when modules were imported since: a scan of sys.modules costs ~300 us)."""
    if _patched.get(package) == len(sys.modules):
        return
    with _lock:
        count = len(sys.modules)
        stand_in = _stand_ins.setdefault(package, _ThreadQuietWarnings())
        prefix = package + "."
        for name, m in list(sys.modules.items()):
            if (name == package or name.startswith(prefix)) and getattr(m, "warnings", None) is warnings:
                m.warnings = stand_in
        _patched[package] = count


@contextlib.contextmanager
def quiet(package: str, *categories: type, load: Callable[[], None] = lambda: None) -> Iterator[None]:
    """Drops the warnings of ``categories`` (default: every warning) that ``package``'s modules
    raise on this thread inside the block; ``load`` first imports the modules the block may use,
    so that they have the stand-in before it runs."""
    if package not in _patched:
        load()
    _patch(package)
    inside = _stand_ins[package].inside
    entered = getattr(inside, "categories", [])
    inside.categories = entered + [categories or (Warning,)]
    try:
        yield
    finally:
        inside.categories = entered
        _patch(package)  # modules the block imported
