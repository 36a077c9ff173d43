"""Exception and warning classes (the exceptions are defined once, in the C++ module)."""

from gpupipe._C import DecompressionBombError, JpegError


class JpegWarning(UserWarning):
    """Recoverable corruption: the image decoded, but part of it may be filler (libjpeg's warning).

    Pass ``strict=True`` to get a :class:`JpegError` instead.
    """


__all__ = ["JpegError", "DecompressionBombError", "JpegWarning"]
