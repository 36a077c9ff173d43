"""The error policy: one function, applied by every entry point to a batch's :class:`BatchStatus`.

| ``on_error`` | a failed sample | the batch |
|---|---|---|
| ``"raise"`` | raises its error class (:class:`gpupipe.ErrorKind` -> class), naming the sample | none |
| ``"skip"`` | dropped; reported (key, kind, message) | smaller |
| ``"replace"`` | kept as a zero image; reported | full size |

Recoverable corruption (libjpeg warnings) is not a failure: the sample is kept and reported as a
warning, or is a ``CorruptJpegError`` failure with ``strict=True``.
"""

from __future__ import annotations

import warnings
from typing import Any, NamedTuple, Optional, Sequence

import numpy as np

from gpupipe.decode_types import BatchStatus
from gpupipe._errors import ErrorKind, JpegWarning, error_class

ON_ERROR = ("raise", "skip", "replace")


class SampleFailure(NamedTuple):
    """A sample that could not be delivered."""

    key: Any  #: the sample's key (a path, a shard member) or its index in the batch
    kind: ErrorKind  #: why, as a kind (its class: ``gpupipe._errors.error_class(kind)``)
    message: str  #: the decoder's message


def check_on_error(on_error: str) -> str:
    if on_error not in ON_ERROR:
        raise ValueError(f"on_error must be one of {ON_ERROR}, got {on_error!r}")
    return on_error


def _label(keys: Optional[Sequence], i: int) -> str:
    return f"sample {i}" if keys is None else f"sample {keys[i]!r}"


def apply_policy(status: BatchStatus, on_error: str, keys: Optional[Sequence] = None) -> list:
    """Applies ``on_error`` to a batch: with ``"raise"`` raises for the first failure (the
    exception's ``failures`` lists them all); otherwise returns the failures, in sample order.

    Args:
        status: the batch's outcome (from :func:`gpupipe.routing.decode_into`).
        on_error: ``"raise"``, ``"skip"`` or ``"replace"``.
        keys: the samples' keys for messages (default: their index in the batch).
    """
    if status.all_ok():
        return []
    failed = np.flatnonzero(~status.ok)
    failures = [SampleFailure(i if keys is None else keys[i], ErrorKind(int(status.kind[i])), status.errors.get(int(i), ""))
                for i in failed]
    if failures and on_error == "raise":
        first = int(failed[0])
        more = f" ({len(failures) - 1} more failed; see .failures)" if len(failures) > 1 else ""
        exc = error_class(status.kind[first])(f"{_label(keys, first)}: {status.errors.get(first, '')}{more}")
        exc.failures = failures
        exc.errors = {f.key: f.message for f in failures}
        raise exc
    return failures


def warn_corrupt(status: BatchStatus, keys: Optional[Sequence] = None, stacklevel: int = 3) -> None:
    """One :class:`gpupipe.JpegWarning` for the samples of a batch decoded with corrupt data."""
    if status.warnings:
        first = min(status.warnings)
        warnings.warn(f"{len(status.warnings)} sample(s) decoded with corrupt data; {_label(keys, first)}: "
                      f"{status.warnings[first]}", JpegWarning, stacklevel=stacklevel)


__all__ = ["ON_ERROR", "SampleFailure", "apply_policy", "check_on_error", "warn_corrupt"]
