"""The fused single-pass kernel as a torch op: ``gpupipe::fused_color_affine``.

CUDA tensors run the CUDA kernel (cuda/fused_augment.cu) on PyTorch's current stream; CPU tensors
run its host build (the same per-pixel math, csrc/fused_augment_cpu.cpp) on gpupipe's thread pool.
A fake kernel makes the op traceable by ``torch.compile``. :func:`fused_color_affine_torch` is the
same computation in plain torch (the fallback when no kernel is built, and a reference).
"""

from __future__ import annotations

import sys

import torch

from gpupipe import _C

try:
    from gpupipe import _C_cuda
except ImportError:  # built without a CUDA compiler
    _C_cuda = None

OUT_DTYPES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
_DTYPE_CODES = {v: k for k, v in OUT_DTYPES.items()}


def cuda_kernel_available() -> bool:
    """True when the CUDA kernel was built (a CUDA compiler was found at build time)."""
    return _C_cuda is not None


def _check(x, matrices, hflip, vflip):
    if x.dim() != 4 or x.shape[1] != 3:
        raise ValueError(f"x must be [N, 3, H, W], got {tuple(x.shape)}")
    if x.dtype not in (torch.uint8, torch.float32):
        raise ValueError(f"x must be uint8 or float32, got {x.dtype}")
    n = x.shape[0]
    if matrices.shape != (n, 3, 4) or matrices.dtype != torch.float32:
        raise ValueError(f"matrices must be float32 [{n}, 3, 4], got {matrices.dtype} {tuple(matrices.shape)}")
    for name, m in (("hflip", hflip), ("vflip", vflip)):
        if m.shape != (n,) or m.dtype != torch.bool:
            raise ValueError(f"{name} must be bool [{n}], got {m.dtype} {tuple(m.shape)}")
    devices = {t.device for t in (x, matrices, hflip, vflip)}
    if len(devices) != 1:
        raise ValueError(f"all inputs must be on one device, got {devices}")


@torch.library.custom_op("gpupipe::fused_color_affine", mutates_args=())
def _fused_op(x: torch.Tensor, matrices: torch.Tensor, hflip: torch.Tensor, vflip: torch.Tensor, out_dtype: int) -> torch.Tensor:
    raise NotImplementedError  # per-device implementations below


def _launch_args(x, matrices, hflip, vflip, out):
    return (x.data_ptr(), x.dtype == torch.uint8, x.shape[0], x.shape[2], x.shape[3], list(x.stride()),
            matrices.data_ptr(), hflip.data_ptr(), vflip.data_ptr(), out.data_ptr(), OUT_DTYPES[out.dtype])


@_fused_op.register_kernel("cpu")
def _(x, matrices, hflip, vflip, out_dtype):
    _check(x, matrices, hflip, vflip)
    out = torch.empty((x.shape[0], 3, x.shape[2], x.shape[3]), dtype=_DTYPE_CODES[out_dtype])
    m, h, v = matrices.contiguous(), hflip.contiguous(), vflip.contiguous()
    _C.fused_color_affine(*_launch_args(x, m, h, v, out), torch.get_num_threads())
    return out


@_fused_op.register_kernel("cuda")
def _(x, matrices, hflip, vflip, out_dtype):
    if _C_cuda is None:
        raise RuntimeError("gpupipe was built without CUDA kernels (no CUDA compiler at build time); "
                           "rebuild with nvcc on PATH or use engine='kornia'")
    _check(x, matrices, hflip, vflip)
    out = torch.empty((x.shape[0], 3, x.shape[2], x.shape[3]), dtype=_DTYPE_CODES[out_dtype], device=x.device)
    m, h, v = matrices.contiguous(), hflip.contiguous(), vflip.contiguous()
    with torch.cuda.device(x.device):
        stream = torch.cuda.current_stream(x.device).cuda_stream
        _C_cuda.fused_color_affine(*_launch_args(x, m, h, v, out), stream)
    return out


@_fused_op.register_fake
def _(x, matrices, hflip, vflip, out_dtype):
    return x.new_empty((x.shape[0], 3, x.shape[2], x.shape[3]), dtype=_DTYPE_CODES[out_dtype])


@torch.library.custom_op("gpupipe::channel_means", mutates_args=())
def _channel_means_op(x: torch.Tensor) -> torch.Tensor:
    """float64 [N, 3]: per-image channel means of a uint8/float32 [N, 3, H, W] tensor."""
    return x.sum(dim=(2, 3), dtype=torch.float64) / (x.shape[2] * x.shape[3])  # devices without a kernel


@_channel_means_op.register_kernel("cpu")
def _(x):
    # torch's strided uint8 -> float64 reduction over (H, W) of a channels-last tensor is ~10x slower
    # than the pixel pass itself; the C++ pass sums exactly in integers.
    if x.dtype not in (torch.uint8, torch.float32):
        x = x.float()
    out = torch.empty((x.shape[0], 3), dtype=torch.float64)
    _C.channel_sums(x.data_ptr(), x.dtype == torch.uint8, x.shape[0], x.shape[2], x.shape[3], list(x.stride()),
                    out.data_ptr(), torch.get_num_threads())
    return out / (x.shape[2] * x.shape[3])


@_channel_means_op.register_fake
def _(x):
    return x.new_empty((x.shape[0], 3), dtype=torch.float64)


def channel_means(x: torch.Tensor) -> torch.Tensor:
    """float64 ``[N, 3]`` per-image channel means (on x's own value scale)."""
    return torch.ops.gpupipe.channel_means(x)


@torch.library.custom_op("gpupipe::fused_color_affine_out", mutates_args=("out",))
def _fused_out_op(x: torch.Tensor, matrices: torch.Tensor, hflip: torch.Tensor, vflip: torch.Tensor, out: torch.Tensor) -> None:
    raise NotImplementedError


@_fused_out_op.register_kernel("cpu")
def _(x, matrices, hflip, vflip, out):
    _check(x, matrices, hflip, vflip)
    if out.shape != (x.shape[0], 3, x.shape[2], x.shape[3]) or not out.is_contiguous() or out.dtype not in OUT_DTYPES:
        raise ValueError(f"out must be a contiguous float32/bfloat16/float16 [N, 3, H, W], got {out.dtype} {tuple(out.shape)}")
    m, h, v = matrices.contiguous(), hflip.contiguous(), vflip.contiguous()
    _C.fused_color_affine(*_launch_args(x, m, h, v, out), torch.get_num_threads())


class OutputCache:
    """CPU output buffers handed out again once nothing references them any more.

    A fresh 50 MB float batch costs ~20 ms of page faults on every call (large allocations come
    straight from mmap); a buffer the caller has dropped is refilled instead. A buffer is reused
    only when no Python reference, no view (storage use count) and no DLPack/ATen reference
    (tensor use count) beyond the cache's own remains, so a batch the user keeps is never touched.
    """

    def __init__(self, capacity: int = 8):
        self.capacity = capacity
        self.buffers: list = []

    def get(self, shape, dtype) -> torch.Tensor:
        if _BASELINE is not None:
            for i in range(len(self.buffers)):
                if self._unreferenced(i) and self.buffers[i].shape == shape and self.buffers[i].dtype == dtype:
                    return self.buffers[i]
        t = torch.empty(shape, dtype=dtype)
        if _BASELINE is not None:
            if len(self.buffers) < self.capacity:
                self.buffers.append(t)
            else:
                free = [i for i in range(len(self.buffers)) if self._unreferenced(i)]
                if free:
                    self.buffers[free[0]] = t
        return t

    def _unreferenced(self, i: int) -> bool:
        return _counts(self.buffers, i) == _BASELINE


def _counts(buffers: list, i: int):
    t = buffers[i]
    return (sys.getrefcount(buffers[i]), t._use_count(), torch._C._storage_Use_Count(t.untyped_storage()._cdata))


try:  # the reference counts of a buffer held by the cache alone (private torch APIs: probed)
    _BASELINE = _counts([torch.empty(1)], 0)
except Exception:  # pragma: no cover - a torch without them: always allocate
    _BASELINE = None


def fused_color_affine(x: torch.Tensor, matrices: torch.Tensor, hflip: torch.Tensor, vflip: torch.Tensor,
                       out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``out[n, :, y, x] = matrices[n, :, :3] @ in[n, :, sy, sx] + matrices[n, :, 3]`` in one pass.

    Args:
        x: uint8 or float32 ``[N, 3, H, W]``, any strides (channels-last is the decode output).
        matrices: float32 ``[N, 3, 4]``; hflip, vflip: bool ``[N]`` (``sx = W-1-x`` where flipped).
        out_dtype: float32, bfloat16 or float16.

    Returns:
        ``[N, 3, H, W]`` contiguous, ``out_dtype``, on x's device.
    """
    if out_dtype not in OUT_DTYPES:
        raise ValueError(f"out_dtype must be one of {list(OUT_DTYPES)}, got {out_dtype}")
    return torch.ops.gpupipe.fused_color_affine(x, matrices, hflip, vflip, OUT_DTYPES[out_dtype])


def fused_color_affine_torch(x, matrices, hflip, vflip, out_dtype=torch.float32):
    """The same computation in plain torch (a few passes), for devices without a kernel."""
    xf = x.to(torch.float32)
    xf = torch.where(hflip[:, None, None, None], xf.flip(-1), xf)
    xf = torch.where(vflip[:, None, None, None], xf.flip(-2), xf)
    out = torch.einsum("nck,nkhw->nchw", matrices[:, :, :3], xf) + matrices[:, :, 3, None, None]
    return out.to(out_dtype).contiguous()
