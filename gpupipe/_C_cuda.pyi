# Type stub of gpupipe._C_cuda, the CUDA kernels (cuda/bindings_cuda.cpp), built when a CUDA compiler
# was found. Private: use gpupipe.augment. tests/test_stubs.py checks it against the built module.
from collections.abc import Sequence

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
    stream: int,
) -> None:
    """Launches the fused augmentation kernel on ``stream`` (torch.cuda.current_stream().cuda_stream)."""
