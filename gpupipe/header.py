"""JPEG header probe: dimensions, color space, sampling, EXIF orientation, without decoding pixels."""

from __future__ import annotations

from typing import Any, NamedTuple

from gpupipe import _C
from gpupipe._buffers import as_buffer


class JpegInfo(NamedTuple):
    """What a JPEG's headers say, as returned by :func:`read_header`."""

    height: int
    width: int
    channels: int
    colorspace: str  #: "gray", "ycbcr", "rgb", "cmyk", "ycck" or "unknown"
    subsampling: str  #: "4:4:4", "4:2:2", "4:2:0", "4:4:0", "4:1:1", "4:1:0", "gray" or "other"
    progressive: bool
    orientation: int  #: EXIF orientation 1..8; 1 when absent
    arithmetic: bool = False
    restart_interval: int = 0  #: MCUs between restart markers; 0 when there are none
    precision: int = 8


def read_header(data: Any) -> JpegInfo:
    """Reads a JPEG's headers (markers up to the first scan), decoding no pixels.

    Args:
        data: the encoded file: ``bytes``, ``memoryview``, 1-D uint8 numpy array or CPU tensor.

    Returns:
        JpegInfo: height and width in pixels (as stored, before EXIF orientation), channels
        (components in the file), color space, chroma subsampling, progressive flag, EXIF
        orientation (1-8).

    Raises:
        gpupipe.JpegError: not a JPEG, or headers corrupt (libjpeg's message).

    Example:
        >>> import gpupipe, numpy as np
        >>> jpeg = gpupipe._C.encode_jpeg(np.zeros((20, 30, 3), np.uint8), 20, 30, 3)
        >>> info = gpupipe.read_header(jpeg)
        >>> (info.height, info.width, info.subsampling)
        (20, 30, '4:2:0')
    """
    return JpegInfo(*_C.read_header(as_buffer(data)))
