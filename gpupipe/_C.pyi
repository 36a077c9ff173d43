# Type stub of gpupipe._C, the compiled core (csrc/bindings/). Private: use the gpupipe API.
# Addresses are plain integers (a torch tensor's data_ptr()); buffers are any object exporting the
# buffer protocol (bytes, bytearray, memoryview, numpy arrays). tests/test_stubs.py checks that this
# file and the built module name the same functions with the same parameters.
import enum
from collections.abc import Callable, Sequence

import numpy as np
from numpy.typing import ArrayLike, NDArray
from typing_extensions import Buffer

pybind11_object = object  # the base class pybind11 gives the classes it binds

class ErrorKind(enum.IntEnum):
    """Why a sample failed; the one list of error kinds (csrc/common/errors.h)."""

    NONE = 0
    INVALID_ARGUMENT = 1
    NOT_JPEG = 2
    CORRUPT = 3
    UNSUPPORTED = 4
    PIXEL_LIMIT = 5
    SCAN_LIMIT = 6
    MEMORY_LIMIT = 7
    INTERNAL = 8
    READ = 9

class JpegError(RuntimeError): ...
class NotAJpegError(JpegError): ...
class CorruptJpegError(JpegError): ...
class UnsupportedJpegError(JpegError): ...
class DecompressionBombError(JpegError): ...
class PixelLimitError(DecompressionBombError): ...
class ScanLimitError(DecompressionBombError): ...
class MemoryLimitError(DecompressionBombError): ...

ERROR_CLASSES: dict[ErrorKind, type[Exception]]  # the exception each kind raises
COLORSPACES: tuple[str, ...]  # read_header's colorspace names, index = the C++ enum's value
SUBSAMPLINGS: tuple[str, ...]
INFO_COLUMNS: tuple[str, ...]  # the columns of read_header_infos' table
MALFORMED_LAYOUT: int  # the malformed column's bit for a marker layout libjpeg reads only with a warning or an error
FINER_CHROMA: int  # the malformed column's bit for a component sampled more finely than the first (valid)
LIBJPEG_MESSAGES: tuple[str, ...]  # libjpeg's message formats
MAX_THREADS: int
libjpeg_turbo_version: int  # LIBJPEG_TURBO_VERSION_NUMBER, e.g. 2001005 for 2.1.5
jpeg_lib_version: int  # JPEG_LIB_VERSION: 62, 70 or 80

def read_header(data: Buffer) -> tuple[int, int, int, str, str, bool, int, bool, int, int]:
    """(height, width, channels, colorspace, subsampling, progressive, orientation, arithmetic,
    restart_interval, precision) of a JPEG, from its headers only."""

def read_header_infos(datas: Sequence[Buffer], out_address: int, out_nbytes: int,
                      scans: bool = True) -> list[tuple[int, ErrorKind, str]]:
    """Writes an int64 [N, len(INFO_COLUMNS)] table at out_address (-1 and the error kind where a
    header cannot be read); returns [(index, ErrorKind, message)] for those. Without ``scans`` the
    scans column is -1 (counting reads the whole file; only the GPU decoders need it)."""

def plan_random_resized_crops(
    datas: Sequence[Buffer],
    out_address: int,
    out_nbytes: int,
    scans: bool,
    seed: int,
    epoch: int,
    indices: ArrayLike,
    scale0: float,
    scale1: float,
    log_ratio0: float,
    log_ratio1: float,
    ratio0: float,
    ratio1: float,
) -> tuple[list[tuple[int, ErrorKind, str]], NDArray[np.int64] | None]:
    """read_header_infos, then, when every header was read, RandomResizedCrop's int64 [N, 4]
    boxes from the stored sizes, in one GIL-free call."""

def gpu_refusals(table: NDArray[np.int64], boxes: Buffer, window: bool, strict: bool, colorspaces: int, max_pixels: int,
                 max_scans: int, box_height: int = 0, box_width: int = 0) -> NDArray[np.int8]:
    """int8 [N]: why each sample may not go to a GPU decoder (0: it may); ``colorspaces`` a bit mask of
    COLORSPACES indices; ``box_height``, ``box_width`` > 0: only boxes of that size (no resize)."""

def hybrid_routes(table: NDArray[np.int64], boxes: Buffer, indices: ArrayLike, seed: int, epoch: int, stream: int,
                  cpu: float, hardware: float, has_hardware: bool, has_cuda: bool, window: bool, strict: bool,
                  colorspaces: int, max_pixels: int, max_scans: int, box_height: int = 0,
                  box_width: int = 0) -> tuple[NDArray[np.int64], NDArray[np.int8]]:
    """(route int64 [N]: 0 CPU core, 1 hardware, 2 CUDA decoder; reason int8 [N]: 0 share, 1 no GPU
    decoder may take it, 2 progressive, drawn for the hardware decoder) of a hybrid batch."""

def hybrid_ranked_routes(datas: Sequence[Buffer], table: NDArray[np.int64], boxes: Buffer, indices: ArrayLike,
                         groups: ArrayLike, seed: int, epoch: int, stream: int, cpu: float, hardware: float,
                         has_hardware: bool, has_cuda: bool, out_height: int, out_width: int, dct_scaling: bool,
                         window: bool, strict: bool, colorspaces: int, max_pixels: int, max_scans: int,
                         box_height: int = 0, box_width: int = 0) -> tuple[NDArray[np.int64], NDArray[np.int8]]:
    """(route, reason) as hybrid_routes, by the ranked split (hybrid.assign_ranked's definition)."""

def hybrid_cost_estimates(table: NDArray[np.int64], boxes: Buffer, nbytes: ArrayLike, out_height: int,
                          out_width: int, dct_scaling: bool) -> NDArray[np.float64]:
    """float64 [N, 2]: each sample's estimated decode ms on a CPU-core thread and on a GPU decoder."""

def decode_into(
    data: Buffer,
    out_address: int,
    out_nbytes: int,
    top: float,
    left: float,
    height: float,
    width: float,
    out_height: int,
    out_width: int,
    resize: bool = False,
    mode: int = 0,
    strict: bool = False,
    dct_scaling: bool = True,
    scale_num: int = 0,
    scaled_box: bool = False,
    use_restarts: bool = True,
    window: bool = False,
) -> tuple[str | None, int, bool]:
    """Decodes one crop into out_height x out_width x C uint8; returns (warning, scale_num used,
    restart fast path used)."""

def decode_batch_into(
    datas: Sequence[Buffer],
    boxes: Buffer,  # int64 or float64 [N, 4] (top, left, height, width), C-contiguous
    out_address: int,
    out_nbytes: int,
    out_height: int,
    out_width: int,
    resize: bool,
    mode: int,
    strict: bool,
    dct_scaling: bool,
    num_threads: int,
    window: bool = False,
) -> tuple[list[tuple[int, ErrorKind, str]], list[tuple[int, str]], float]:
    """Decodes N crops on the thread pool; returns ([(index, kind, message)] errors,
    [(index, message)] warnings, thread-seconds spent decoding)."""

def crop_resize_ragged(
    images: Buffer,  # int64 [N, 4] (address, height, width, row pitch in bytes) of host HWC uint8 images
    boxes: Buffer,  # int64 or float64 [N, 4] (top, left, height, width), whole pixels
    slots: Buffer,  # int64 [N], distinct, within the batch
    out_address: int,
    out_nbytes: int,
    batch: int,
    out_height: int,
    out_width: int,
    channels: int,
    resize: bool,
    window: bool,
    num_threads: int,
) -> None:
    """Crops box i of image i, resized, into slot slots[i] of the uint8 [batch, out_height, out_width,
    channels] buffer, on the thread pool (GIL released); ValueError naming the sample."""

def crop_resize_plan(
    images: Buffer,
    boxes: Buffer,
    slots: Buffer,
    out_address: int,
    out_nbytes: int,
    batch: int,
    out_height: int,
    out_width: int,
    channels: int,
    resize: bool,
    window: bool,
) -> tuple[bytes, int]:
    """crop_resize_ragged's checks and plan for the CUDA kernels: (the table of samples, the scratch
    bytes it needs)."""

def choose_scale_num(box_height: int, box_width: int, out_height: int, out_width: int) -> int: ...
def _huffman_reader_stats() -> dict[str, int]:
    """Process-wide counts of the Huffman reader: images, rejected, skipped, decoded, handed_back, coasted (MCUs)."""
    ...
def set_entropy_index_bytes(max_bytes: int) -> int:
    """Bounds the process's entropy index (0: off, and emptied); returns the previous bound."""
    ...
def entropy_index_stats() -> dict[str, int]:
    """The entropy index: files, bytes, max_bytes, keyed, found, learned, full."""
    ...
def _pause_entropy_index(paused: bool) -> bool:
    """Later decodes go without the entropy index (its rows kept) while paused; returns the previous setting."""
    ...
def clear_entropy_index() -> None:
    """Empties the entropy index and zeroes its counts."""
    ...
def _set_huffman_reader(on: bool) -> bool:
    """Turns gpupipe's Huffman reader on or off for later decodes; returns the previous setting."""
    ...
def _set_vector_idcts(on: bool) -> bool:
    """Turns the AVX2 3x3 and 6x6 IDCTs (csrc/decode/scaled_idct.h) on or off for later decodes; returns the
    previous setting."""
    ...
def _vector_idct_swaps() -> int:
    """Components whose IDCT the AVX2 kernels took, so far."""
    ...
def _code_entropy_rows(rows: ArrayLike, comps: int, appends: list[int]) -> tuple[NDArray, int] | None:
    """The entropy index's compact coding: rows int64 [N, 6] (offset, skip, 4 predictions) appended in pieces
    and expanded: (rows, coded bytes), or None when refused."""
    ...
def _expand_entropy_rows(coded: bytes, count: int, comps: int) -> NDArray | None:
    """The entropy index's coded rows (any bytes) expanded, or None when they are not `count` valid rows."""
    ...
def _check_vector_idcts(size: int, blocks: int, seed: int) -> dict[str, int]:
    """Random blocks through the AVX2 IDCT of `size` (3 or 6) and libjpeg's: blocks, different, handed, overwrote."""
    ...
def transcode_with_restarts(data: Buffer, restart_rows: int = 1, restart_mcus: int = 0) -> bytes: ...
def keyed_uniforms(seed: int, epoch: int, stream: int, indices: ArrayLike, count: int) -> NDArray:
    """float64 [N, count] keyed draws in [0, 1): gpupipe.keyed.uniforms (seed, epoch, stream mod 2**64)."""

def random_resized_crop_boxes(seed: int, epoch: int, heights: ArrayLike, widths: ArrayLike, indices: ArrayLike,
                              scale0: float, scale1: float, log_ratio0: float, log_ratio1: float, ratio0: float,
                              ratio1: float) -> NDArray:
    """int64 [N, 4] RandomResizedCrop boxes (top, left, height, width) keyed by (seed, epoch, index) mod 2**64: gpupipe.crops.RandomResizedCrop.boxes."""

def default_num_threads() -> int: ...
def cpu_capability() -> tuple[str, str]: ...
def set_cpu_capability(name: str) -> str: ...
def _dispatch_level() -> str: ...
def cpu_share() -> dict[str, int]:
    """This process's share of the cores (thread_pool.h): threads, affinity, online, local_world_size."""

def pool_threads() -> int: ...
def read_files(paths: list[bytes], num_threads: int, allocate: Callable[[int], Buffer] | None = None, group: int = 0) -> tuple[list[bytes | memoryview], list[tuple[int, int, str]]]:
    """Whole regular files of at most max_file_size bytes, a batch's (each ``group`` files; 0: all)
    while they add up to max_batch_bytes (a file past it fails with EFBIG, not read): (bytes of
    each, failures)."""
class CallScope(pybind11_object):
    """``with CallScope():`` around a gpupipe call of this thread (gpupipe._exit)."""

    def __init__(self) -> None: ...
    def __enter__(self) -> None: ...
    def __exit__(self, *args) -> bool: ...

def _interpreter_exiting() -> bool: ...
def _thread_parked(native_id: int) -> bool: ...

class PendingDecode(pybind11_object):
    """A batch decode started on the pool (decode_batch_start)."""

    def wait(self) -> tuple[list[tuple[int, ErrorKind, str]], list[tuple[int, str]]]: ...
    def busy_seconds(self) -> float: ...

def decode_batch_start(
    datas: Sequence[Buffer],
    boxes: Buffer,
    out_owner: object,
    out_address: int,
    out_nbytes: int,
    out_height: int,
    out_width: int,
    resize: bool,
    mode: int,
    strict: bool,
    dct_scaling: bool,
    num_threads: int,
    window: bool = False,
) -> PendingDecode: ...
def _calls_running() -> int: ...
def _thread_native_cpu_seconds() -> float:
    """CPU seconds the calling thread has spent in gpupipe's native calls without the GIL."""

def decode_busy_seconds() -> float:
    """Thread-seconds all batch decodes of this process have spent decoding samples (pool utilisation)."""

def _pool_selftest(num_threads: int, n: int, throw_at: int) -> int:
    """Test hook: a parallel_for whose body throws at throw_at (-1: never); returns how many ran."""

def shutdown_pool() -> None: ...
def get_limits() -> tuple[int, int, int, int, int]:
    """(max_pixels, max_scans, max_memory, max_file_size, max_batch_bytes)."""

def set_limits(max_pixels: int, max_scans: int, max_memory: int, max_file_size: int, max_batch_bytes: int) -> None: ...
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
    sampling: list[tuple[int, int]] = [],
) -> bytes: ...
# The augmentation kernels' host builds. A buffer argument is a sequence of ints describing a
# tensor (address, dtype code of ELEM_TYPES, shape, strides, ...): gpupipe.augment builds them and
# the bindings check every one (csrc/common/strided_buffer.h) before the GIL is released.
ELEM_TYPES: dict
# BatchAugment's per-sample parameter rows, float32 [N, PARAM_COUNT]: name -> (first column, columns),
# the one layout (csrc/augment/augment_kernels.h, namespace param); torchvision's color model uses
# matrix, factors, order, grayscale; the linear one matrix, linear_a, linear_t, linear_u, linear_mean.
PARAM_LAYOUT: dict[str, tuple[int, int]]
PARAM_COUNT: int
AUGMENT_DRAW_COLUMNS: dict[str, int]  # BatchAugment's draw columns
AUGMENT_DRAWS: int

def augment_params_from_uniforms(
    u: ArrayLike,
    hflip: float,
    vflip: float,
    grayscale: float,
    rotation: tuple[float, float],
    translate: tuple[float, float],
    scale: tuple[float, float],
    shear: tuple[float, float, float, float],
    brightness: tuple[float, float],
    contrast: tuple[float, float],
    saturation: tuple[float, float],
    hue: tuple[float, float],
) -> tuple[NDArray, ...]:
    """BatchAugment's parameters (PARAM_KEYS order) from its draws u (float64 [N, AUGMENT_DRAWS]); the
    float and flag ones are views of two blocks (their ``base``), which pack_drawn_augment_params reads."""
# the codes the augmentation kernels take: interpolation and color model names -> int
INTERPOLATIONS: dict[str, int]
COLOR_MODELS: dict[str, int]

# BatchAugment's parameters as numpy rows (csrc/augment/augment_params.h): float64, bool and int64 arrays
# of n, 2n or 4n values, converted when another dtype is given.
def inverse_affine(
    angle: ArrayLike,
    translate: ArrayLike,
    scale: ArrayLike,
    shear: ArrayLike,
    center: ArrayLike,
    hflip: ArrayLike,
    vflip: ArrayLike,
    height: int,
    width: int,
) -> NDArray:
    """float64 [N, 2, 3] inverse maps of torchvision's affine, followed by the flips."""

def pack_augment_params(
    hflip: ArrayLike,
    vflip: ArrayLike,
    angle: ArrayLike,
    translate: ArrayLike,
    scale: ArrayLike,
    shear: ArrayLike,
    brightness: ArrayLike,
    contrast: ArrayLike,
    saturation: ArrayLike,
    hue: ArrayLike,
    order: ArrayLike,
    grayscale: ArrayLike,
    height: int,
    width: int,
) -> NDArray:
    """BatchAugment's float32 [N, 24] engine rows (color='torchvision'), values checked."""

def pack_drawn_augment_params(floats: NDArray, flags: NDArray, order: NDArray, height: int, width: int) -> NDArray:
    """pack_augment_params over the blocks augment_params_from_uniforms' parameters are views of (floats
    [10N], flags [3N], order [N, 4]: csrc/augment/augment_params.h), in one call."""

def augment(
    input: Sequence[int],
    params: Sequence[int],
    output: Sequence[int],
    out_type: int,
    interpolation: int,
    fill: Sequence[float] | None,
    color: int,
    mean: Sequence[float],
    std: Sequence[float],
    num_threads: int,
) -> None:
    """BatchAugment's one-pass chain (warp, flips, color ops, grayscale, normalise) on the host."""

def warp_affine(
    input: Sequence[int],
    matrices: Sequence[int],
    output: Sequence[int],
    out_type: int,
    interpolation: int,
    fill: Sequence[float] | None,
    num_threads: int,
) -> None:
    """Per-sample inverse affine resampling of a uint8 batch on the host."""

def policy_apply(
    input: Sequence[int],
    output: Sequence[int],
    kinds: Sequence[int],
    params: Sequence[int],
    matrices: Sequence[int],
    interpolation: int,
    fill: Sequence[float] | None,
    num_threads: int,
) -> None:
    """The auto-augment policies' per-sample ops (one call per batch) on the host."""

def policy_kinds() -> dict: ...
def erase_boxes(x: Sequence[int], boxes: Sequence[int], values: Sequence[int], num_threads: int) -> None: ...
def mixup_rolled(images: Sequence[int], out: Sequence[int], lam: float, num_threads: int) -> None:
    """MixUp's one-pass blend of a contiguous float32 batch with itself rolled by one."""
def mixup_rolled_inplace(images: Sequence[int], lam: float, num_threads: int) -> None:
    """mixup_rolled written over images (MixUp(inplace=True))."""
