# Type stub of gpupipe._C_cuda, the CUDA kernels (cuda/module_cuda.cpp), built when a CUDA compiler
# was found. Private: use gpupipe.augment and gpupipe._backends.crop_resize. tests/test_stubs.py checks it
# against the built module.
from collections.abc import Sequence

import numpy as np

pybind11_object = object  # the base class pybind11 gives the classes it binds

MEAN_BLOCKS: int

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
    workspace: Sequence[int],
    stream: int,
) -> None:
    """BatchAugment's chain on ``stream`` (torch.cuda.current_stream().cuda_stream): two launches."""

def warp_affine(
    input: Sequence[int],
    matrices: Sequence[int],
    output: Sequence[int],
    out_type: int,
    interpolation: int,
    fill: Sequence[float] | None,
    stream: int,
) -> None: ...
def policy_apply(
    input: Sequence[int],
    output: Sequence[int],
    kinds: Sequence[int],
    params: Sequence[int],
    matrices: Sequence[int],
    hist: Sequence[int],
    gray_sum: Sequence[int],
    luts: Sequence[int],
    interpolation: int,
    fill: Sequence[float] | None,
    stream: int,
) -> None: ...
def crop_resize_ragged(
    table: bytes,  # gpupipe._C.crop_resize_plan's
    out_address: int,
    out_nbytes: int,
    batch: int,
    out_height: int,
    out_width: int,
    channels: int,
    scratch_address: int,
    scratch_nbytes: int,  # at least crop_resize_plan's
    stream: int,
) -> None:
    """The planned crop-resize on ``stream``: the table copied to the scratch's head, three launches."""

# nvImageCodec's decoders through its C API (cuda/nvimgcodec_engine.cpp): built where nvImageCodec 0.9's
# header was found. Private: use gpupipe._backends.nvimgcodec.Engine.
NVIMGCODEC_HEADER_VERSION: tuple

class NvimgcodecDecoder(pybind11_object):
    """nvImageCodec's decoder of one kind ("hardware", "cuda" or "cpu") through its C API."""

    def __init__(self, directory: str, kind: str, device_id: int, cpu_threads: int, options: str) -> None: ...
    def decode(
        self,
        buffers: Sequence[bytes],
        sizes: np.ndarray,  # int64 [N, 2] (height, width), the header table's
        regions: np.ndarray | None,  # int64 [N, 4] (top, left, bottom, right), or None: whole images
        channels: int,
        out_address: int,
        out_nbytes: int,
        offsets: np.ndarray,  # int64 [N]: each sample's output, rows packed, never overlapping
        stream: int,
    ) -> np.ndarray:
        """int32 [N] statuses: 1 decoded, nvImageCodec's processing status, or < 0 (not given to it)."""
