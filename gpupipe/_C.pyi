# Type stub of gpupipe._C, the compiled core (csrc/bindings.cpp). Private: use the gpupipe API.
# Addresses are plain integers (a torch tensor's data_ptr()); buffers are any object exporting the
# buffer protocol (bytes, bytearray, memoryview, numpy arrays). tests/test_stubs.py checks that this
# file and the built module name the same functions with the same parameters.
from collections.abc import Sequence

from typing_extensions import Buffer

class JpegError(RuntimeError): ...
class DecompressionBombError(JpegError): ...

libjpeg_turbo_version: int  # LIBJPEG_TURBO_VERSION_NUMBER, e.g. 2001005 for 2.1.5
jpeg_lib_version: int  # JPEG_LIB_VERSION: 62, 70 or 80

def read_header(data: Buffer) -> tuple[int, int, int, str, str, bool, int, bool, int, int]:
    """(height, width, channels, colorspace, subsampling, progressive, orientation, arithmetic,
    restart_interval, precision) of a JPEG, from its headers only."""

def read_header_infos(datas: Sequence[Buffer], out_address: int, out_nbytes: int) -> None:
    """Writes int64 [N, 5] (height, width, color space code, components, EXIF orientation; -1 where
    a header cannot be read) at out_address."""

def decode_into(
    data: Buffer,
    out_address: int,
    out_nbytes: int,
    top: int,
    left: int,
    height: int,
    width: int,
    out_height: int,
    out_width: int,
    resize: bool = False,
    mode: int = 0,
    strict: bool = False,
    dct_scaling: bool = True,
    scale_num: int = 0,
    scaled_box: bool = False,
    use_restarts: bool = True,
) -> tuple[str | None, int, bool]:
    """Decodes one crop into out_height x out_width x C uint8; returns (warning, scale_num used,
    restart fast path used)."""

def decode_batch_into(
    datas: Sequence[Buffer],
    boxes: Buffer,
    out_address: int,
    out_nbytes: int,
    out_height: int,
    out_width: int,
    resize: bool,
    mode: int,
    strict: bool,
    dct_scaling: bool,
    num_threads: int,
) -> tuple[list[tuple[int, int, str]], list[tuple[int, str]]]:
    """Decodes N crops on the thread pool; returns ([(index, kind, message)] errors,
    [(index, message)] warnings)."""

def choose_scale_num(box_height: int, box_width: int, out_height: int, out_width: int) -> int: ...
def transcode_with_restarts(data: Buffer, restart_rows: int = 1, restart_mcus: int = 0) -> bytes: ...
def default_num_threads() -> int: ...
def pool_threads() -> int: ...
def shutdown_pool() -> None: ...
def get_limits() -> tuple[int, int, int]:
    """(max_pixels, max_scans, max_memory)."""

def set_limits(max_pixels: int, max_scans: int, max_memory: int) -> None: ...
def encode_jpeg(
    pixels: Buffer,
    height: int,
    width: int,
    channels: int,
    quality: int = 90,
    h_samp: int = 2,
    v_samp: int = 2,
    colorspace: str = "ycbcr",
    progressive: bool = False,
    arithmetic: bool = False,
    optimize: bool = False,
    restart_rows: int = 0,
    restart_blocks: int = 0,
) -> bytes: ...
def fused_color_affine(
    input: int,
    input_is_uint8: bool,
    n: int,
    h: int,
    w: int,
    strides: Sequence[int],
    matrices: int,
    hflip: int,
    vflip: int,
    output: int,
    out_dtype: int,
    num_threads: int,
) -> None: ...
def channel_sums(
    input: int,
    input_is_uint8: bool,
    n: int,
    h: int,
    w: int,
    strides: Sequence[int],
    out: int,
    num_threads: int,
) -> None: ...
