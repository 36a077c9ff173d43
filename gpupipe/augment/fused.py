"""The one-pass engine of :class:`BatchAugment` as torch ops: ``gpupipe::augment_batch`` (and
``gpupipe::augment_batch_out``, writing into a caller's buffer).

Per output pixel: inverse-map through the sample's 2x3 matrix (rotation, affine, flips), sample the
uint8 input (nearest / bilinear, per-channel fill), run the color chain, grayscale, normalise, store
float32 / bfloat16 / float16 in ``contiguous_format`` or ``channels_last``. Contrast's image mean
comes from a first pass over the same warped samples, kept for the second where they fit (the
host's per-sample planes, a CUDA cluster's shared memory) and sampled again where not.

CUDA tensors run the CUDA kernels (``cuda/augment.cu``) on PyTorch's current stream: on sm_90 and
later one launch, a cluster of blocks per sample keeping the warped pixels in shared memory while
they sum the contrast mean; elsewhere (and for samples too large for a cluster's shared memory, or
with ``GPUPIPE_CUDA_AUGMENT=two_pass``) two launches, the reduction and the output. CPU tensors run
their host build (``csrc/augment/augment_cpu.cpp``) on gpupipe's thread pool. All share the per-pixel math
(``csrc/augment/augment_pixel.h``) and round alike. Fake kernels make the ops traceable by ``torch.compile``.

``params`` is float32 ``[N, PARAM_COUNT]``, one row per sample, each parameter in the columns
:data:`PARAM_LAYOUT` names (the layout is defined once, in ``csrc/augment/augment_kernels.h``,
``namespace param``, and exported by the bindings), built on the CPU by :func:`pack_rows` (from
``BatchAugment.pack_params``) and copied to the device in one transfer.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from gpupipe import _C
from gpupipe.augment import _kernels
from gpupipe.augment._kernels import cuda_kernel_available  # noqa: F401  (re-exported)

OUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
COLOR_MODELS = dict(_C.COLOR_MODELS)  # name -> the kernels' code (defined once, in C++)
# parameter name -> (first column, columns) of a params row, and the row's width, from the C++ layout
PARAM_LAYOUT: dict = dict(_C.PARAM_LAYOUT)
PARAM_COUNT: int = _C.PARAM_COUNT


def pack_rows(columns: dict, n: int) -> torch.Tensor:
    """float32 ``[n, PARAM_COUNT]`` on the CPU: each parameter of ``columns`` (name -> ``[n, k]``
    tensor, ``k`` its width in :data:`PARAM_LAYOUT`) in its columns, rounded to float32; zeros in
    the columns no parameter names."""
    rows = torch.zeros(n, PARAM_COUNT, dtype=torch.float32)
    for name, value in columns.items():
        first, width = PARAM_LAYOUT[name]
        rows[:, first : first + width] = value
    return rows


def _empty_out(x: torch.Tensor, out_dtype: torch.dtype, channels_last: bool) -> torch.Tensor:
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    return torch.empty(x.shape, dtype=out_dtype, device=x.device, memory_format=fmt)


@torch.library.custom_op("gpupipe::augment_batch", mutates_args=())
def _augment_op(x: torch.Tensor, params: torch.Tensor, interpolation: int, fill: Optional[list[float]], color: int,
                mean: list[float], std: list[float], out_dtype: torch.dtype, channels_last: bool) -> torch.Tensor:
    raise NotImplementedError  # per-device kernels below


def _run(x, params, interpolation, fill, color, mean, std, out):
    args = (_kernels.buffer(x), _kernels.buffer(params), _kernels.buffer(out), _kernels.ELEM_TYPES[out.dtype],
            interpolation, fill, color, mean, std)
    if x.device.type == "cuda":
        cuda = _kernels.cuda_module()
        workspace = torch.empty(x.shape[0] * cuda.MEAN_BLOCKS, dtype=torch.int64, device=x.device)  # partial sums
        with torch.cuda.device(x.device):
            cuda.augment(*args, _kernels.buffer(workspace), _kernels.current_stream(x.device))
    else:
        _C.augment(*args, _kernels.num_threads())


@_augment_op.register_kernel(("cpu", "cuda"))
def _(x, params, interpolation, fill, color, mean, std, out_dtype, channels_last):
    out = _empty_out(x, out_dtype, channels_last)
    _run(x, params, interpolation, fill, color, mean, std, out)
    return out


@_augment_op.register_fake
def _(x, params, interpolation, fill, color, mean, std, out_dtype, channels_last):
    return _empty_out(x, out_dtype, channels_last)


@torch.library.custom_op("gpupipe::augment_batch_out", mutates_args=("out",))
def _augment_out_op(x: torch.Tensor, params: torch.Tensor, interpolation: int, fill: Optional[list[float]],
                    color: int, mean: list[float], std: list[float], out: torch.Tensor) -> None:
    raise NotImplementedError


@_augment_out_op.register_kernel(("cpu", "cuda"))
def _(x, params, interpolation, fill, color, mean, std, out):
    _run(x, params, interpolation, fill, color, mean, std, out)


def augment_batch(x: torch.Tensor, params: torch.Tensor, *, interpolation: int, fill: Optional[list],
                  color: int, mean: Sequence[float], std: Sequence[float], out_dtype: torch.dtype,
                  channels_last: bool, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Runs the engine on ``x`` (uint8 ``[N, 3, H, W]``, any strides) with packed ``params``
    (float32 ``[N, PARAM_COUNT]`` on x's device); the C++ bindings validate every buffer before any kernel."""
    mean, std = [float(m) for m in mean], [float(s) for s in std]
    if _kernels.eager(x):
        if out is None:
            out = _empty_out(x, out_dtype, channels_last)
        _run(x, params, interpolation, fill, color, mean, std, out)
        return out
    if out is not None:
        torch.ops.gpupipe.augment_batch_out(x, params, interpolation, fill, color, mean, std, out)
        return out
    return torch.ops.gpupipe.augment_batch(x, params, interpolation, fill, color, mean, std, out_dtype, channels_last)


class OutputCache:
    """CPU output buffers handed out again once nothing references them any more.

    A fresh 50 MB float batch costs ~20 ms of page faults on every call (large allocations come
    straight from mmap); a buffer the caller has dropped is refilled instead. A buffer is reused
    only when no Python reference, no view (storage use count), no DLPack/ATen reference (tensor
    use count) and no Python object of its storage beyond the cache's own remains, so a batch the
    user keeps is never touched. One moved to shared memory (sent to another process: a DataLoader
    worker's collate_fn) is another process's: the cache lets go of it.
    """

    def __init__(self, capacity: int = 8):
        self.capacity = capacity
        self.buffers: list = []
        self.pointers: list = []  # each buffer's data pointer when made: share_memory_() moves it

    def get(self, shape, dtype, memory_format=torch.contiguous_format) -> torch.Tensor:
        if _BASELINE is not None:
            if any(self._moved(i) for i in range(len(self.buffers))):  # sent away: let go of its shared memory
                kept = [i for i in range(len(self.buffers)) if not self._moved(i)]
                self.buffers = [self.buffers[i] for i in kept]
                self.pointers = [self.pointers[i] for i in kept]
            for i in range(len(self.buffers)):  # (no local name for a buffer: it would count as a reference)
                if self._unreferenced(i) and self._fits(i, shape, dtype, memory_format):
                    return self.buffers[i]
        t = torch.empty(shape, dtype=dtype, memory_format=memory_format)
        if _BASELINE is not None:
            if len(self.buffers) < self.capacity:
                self.buffers.append(t)
                self.pointers.append(t.data_ptr())
            else:
                free = [i for i in range(len(self.buffers)) if self._unreferenced(i)]
                if free:
                    self.buffers[free[0]], self.pointers[free[0]] = t, t.data_ptr()
        return t

    def __reduce__(self):  # a copy (pickle, deepcopy, torch.save) starts empty: buffers are no state
        return (OutputCache, (self.capacity,))

    def _fits(self, i: int, shape, dtype, memory_format) -> bool:
        return (self.buffers[i].shape == shape and self.buffers[i].dtype == dtype
                and self.buffers[i].is_contiguous(memory_format=memory_format))

    def _moved(self, i: int) -> bool:
        # (a storage sent to another process was moved to shared memory: its pointer changed; cheaper
        # than is_shared(), 1.7 us a buffer)
        return self.buffers[i].data_ptr() != self.pointers[i]

    def _unreferenced(self, i: int) -> bool:
        return _counts(self.buffers, i) == _BASELINE


def _counts(buffers: list, i: int):
    import sys

    t = buffers[i]
    storage = t.untyped_storage()  # (its Python object, when the caller keeps one, is that object)
    return (sys.getrefcount(buffers[i]), t._use_count(), torch._C._storage_Use_Count(storage._cdata),
            sys.getrefcount(storage))


try:  # the reference counts of a buffer held by the cache alone (private torch APIs: probed)
    _BASELINE = _counts([torch.empty(1)], 0)
except Exception:  # pragma: no cover - a torch without them: always allocate
    _BASELINE = None
