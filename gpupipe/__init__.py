"""gpupipe: batched JPEG decode-and-crop (libjpeg-turbo ROI + DCT scaling) for PyTorch."""

from gpupipe import augment, crops, data, sources
from gpupipe.backends import backends_available
from gpupipe._errors import (
    CorruptJpegError,
    DecompressionBombError,
    ErrorKind,
    JpegError,
    JpegWarning,
    MemoryLimitError,
    NotAJpegError,
    PixelLimitError,
    ScanLimitError,
    SkippedSamplesWarning,
    UnsupportedJpegError,
)
from gpupipe.decode import DecodedBatch, decode_and_crop_jpeg, decode_crop_jpeg, decode_crop_jpegs
from gpupipe.header import JpegInfo, read_header
from gpupipe.limits import (Limits, cpu_capability, cpu_share, entropy_index_stats, get_limits, set_cpu_capability,
                             set_entropy_index_size, set_limits)
from gpupipe.loader import Loader
from gpupipe.prepare import PrepareReport, prepare

__version__ = "0.1.0"

__all__ = [
    "CorruptJpegError",
    "DecodedBatch",
    "DecompressionBombError",
    "ErrorKind",
    "JpegError",
    "JpegInfo",
    "JpegWarning",
    "Limits",
    "MemoryLimitError",
    "NotAJpegError",
    "PixelLimitError",
    "ScanLimitError",
    "SkippedSamplesWarning",
    "UnsupportedJpegError",
    "Loader",
    "PrepareReport",
    "prepare",
    "augment",
    "backends_available",
    "cpu_capability",
    "cpu_share",
    "data",
    "sources",
    "crops",
    "decode_and_crop_jpeg",
    "decode_crop_jpeg",
    "decode_crop_jpegs",
    "entropy_index_stats",
    "get_limits",
    "read_header",
    "set_cpu_capability",
    "set_entropy_index_size",
    "set_limits",
]
