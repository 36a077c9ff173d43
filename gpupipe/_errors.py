"""Exception and warning classes. The exceptions and the list of error kinds are defined once, in
the C++ module (csrc/common/errors.h, csrc/bindings/error_bindings.cpp); this module re-exports them.

| class | kind (``ErrorKind``) | when |
|---|---|---|
| ``JpegError`` | (base) | the data is not a decodable JPEG, or a limit refused it |
| ``NotAJpegError`` | ``NOT_JPEG`` | no JPEG signature, empty input (and no other decoder read it) |
| ``CorruptJpegError`` | ``CORRUPT`` | libjpeg rejects the data; with ``strict=True`` also recoverable corruption |
| ``UnsupportedJpegError`` | ``UNSUPPORTED`` | 12-bit, lossless, hierarchical, unknown color space, fractional sampling |
| ``DecompressionBombError`` | (base of the limits) | refused by :func:`gpupipe.set_limits` |
| ``PixelLimitError`` | ``PIXEL_LIMIT`` | more pixels than ``max_pixels`` |
| ``ScanLimitError`` | ``SCAN_LIMIT`` | more progressive scans than ``max_scans`` |
| ``MemoryLimitError`` | ``MEMORY_LIMIT`` | more working memory than ``max_memory`` (libjpeg's, Pillow's) |
| ``ValueError`` | ``INVALID_ARGUMENT`` | a box outside the image, a crop larger than the image, bad arguments |
| ``OSError`` | ``READ`` | the sample's bytes could not be read (loader): not a regular file, over ``max_file_size``, past the batch's ``max_batch_bytes`` |
| ``RuntimeError`` | ``INTERNAL`` | a bug of ours, never the data's fault |
"""

import os
import sys

from gpupipe._C import (
    ERROR_CLASSES,
    CorruptJpegError,
    DecompressionBombError,
    ErrorKind,
    JpegError,
    MemoryLimitError,
    NotAJpegError,
    PixelLimitError,
    ScanLimitError,
    UnsupportedJpegError,
)


class JpegWarning(UserWarning):
    """Recoverable corruption: the image decoded, but part of it may be filler (libjpeg's warning).

    Pass ``strict=True`` to get a :class:`CorruptJpegError` instead.
    """


class SkippedSamplesWarning(UserWarning):
    """Samples of an epoch a :class:`gpupipe.Loader` could not deliver (``on_error="skip"``) or
    delivered as zero images (``"replace"``): one warning per epoch (or per iteration left before
    its end), counted by kind, naming the first; ``Loader.stats()`` lists them all. A
    :class:`gpupipe.data.DecodeCropDataset` warns per sample. Silence it with ``warnings.filterwarnings``."""


DISTRIBUTION = "torch-gpupipe"  #: the name gpupipe installs under (``gpupipe`` on the index is another project)


_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
_LIBRARY_FILES = ("weakref.py", "threading.py")  # (a finalizer or a thread calls gpupipe back)


def user_stacklevel() -> int:
    """The ``stacklevel`` that makes a warning issued by the caller of this function point at the
    user's frame: the first outside gpupipe and the finalizer machinery (a Loader iterator dropped
    mid-epoch reports from a weakref finalizer; a fixed level pointed into weakref.py)."""
    frame, level = sys._getframe(1), 1
    while frame is not None and (frame.f_code.co_filename.startswith(_PACKAGE_DIR)
                                 or os.path.basename(frame.f_code.co_filename) in _LIBRARY_FILES):
        frame, level = frame.f_back, level + 1
    return level


def import_extra(module: str, extra: str, what: str):
    """``module``, imported; ModuleNotFoundError naming the extra that installs it otherwise."""
    import importlib

    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        raise ModuleNotFoundError(f"{what} needs {module.split('.')[0]}: pip install '{DISTRIBUTION}[{extra}]' "
                                  f"({e})") from e


def brief(e: BaseException, limit: int) -> str:
    """``"Type: message"`` on one line, the message's whitespace collapsed and cut at ``limit``
    characters: an exception quoted inside another message (a GPU decoder's, a library's)."""
    return f"{type(e).__name__}: {' '.join(str(e).split())[:limit]}"


def error_class(kind) -> type:
    """The exception class of an :class:`ErrorKind`."""
    return ERROR_CLASSES[ErrorKind(kind)]


__all__ = ["SkippedSamplesWarning", "JpegError", "NotAJpegError", "CorruptJpegError", "UnsupportedJpegError", "DecompressionBombError",
           "PixelLimitError", "ScanLimitError", "MemoryLimitError", "JpegWarning", "ErrorKind", "error_class"]
