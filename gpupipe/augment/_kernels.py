"""Plumbing shared by the augmentation ops: tensors described to the C++/CUDA bindings as plain
integers (no torch ABI in C++), the element-type codes the bindings export, and the CUDA module."""

from __future__ import annotations

import torch

from gpupipe import _C

try:
    from gpupipe import _C_cuda
except ImportError:  # built without a CUDA compiler
    _C_cuda = None

# torch dtype -> the bindings' element-type code (defined once, in csrc/common/elem_type.h)
ELEM_TYPES = {getattr(torch, name): code for name, code in _C.ELEM_TYPES.items()}


def cuda_kernel_available() -> bool:
    """True when the CUDA kernels were built (a CUDA compiler was found at build time)."""
    return _C_cuda is not None


def buffer(t: torch.Tensor) -> list:
    """``[address, extent, type, ndim, *shape, *strides]`` of a tensor: ``extent`` is the bytes of
    its storage from ``data_ptr()`` on, so the binding can check every reachable element lies inside."""
    extent = t.untyped_storage().nbytes() - t.storage_offset() * t.element_size()
    return [t.data_ptr(), extent, ELEM_TYPES.get(t.dtype, -1), t.dim(), *t.shape, *t.stride()]


def eager(x: torch.Tensor) -> bool:
    """Whether an op on ``x`` may call its kernel directly, without the dispatcher: a plain CPU or
    CUDA tensor outside ``torch.compile``. That spares ~0.1 ms per call (on CUDA a third of
    BatchAugment's whole kernel for 256 images) and the ~2 s import of torch._dynamo that a custom
    op's first call costs; tensor subclasses (fake tensors of a trace, DTensor) and compiled graphs
    keep the registered op."""
    return type(x) is torch.Tensor and x.device.type in ("cpu", "cuda") and not torch.compiler.is_compiling()


def eager_cpu(x: torch.Tensor) -> bool:
    """:func:`eager` for ops whose direct path is the host kernel only."""
    return eager(x) and x.device.type == "cpu"


def cuda_module():
    if _C_cuda is None:
        raise RuntimeError("gpupipe was built without CUDA kernels (no CUDA compiler at build time); "
                           "rebuild with nvcc on PATH")
    return _C_cuda


def current_stream(device: torch.device) -> int:
    return torch.cuda.current_stream(device).cuda_stream


def untracked(t: torch.Tensor) -> bool:
    """Whether a kernel may write from ``t`` outside autograd: ``t`` needs no gradient (or grad
    mode is off). A tensor that does takes the torch ops, which autograd sees."""
    return not (t.requires_grad and torch.is_grad_enabled())


def may_self_overlap(t: torch.Tensor) -> bool:
    """Whether two elements of ``t`` may share memory (an ``expand``ed batch, strides that
    interleave): a kernel writing in place leaves such a tensor to the torch ops, which refuse it.
    No overlap is certain when, taken by stride, each dimension steps past the smaller ones' reach."""
    reach = 0  # elements spanned by the dimensions taken so far
    for stride, size in sorted((abs(d), s) for s, d in zip(t.shape, t.stride()) if s > 1):
        if stride <= reach:
            return True
        reach += stride * (size - 1)
    return False


def check_gray_fill(fill) -> None:
    """A fill (3 floats or None) for a 1-channel image: one value for all three, as torchvision
    fills a 1-channel image."""
    if fill is not None and len(set(fill)) > 1:
        raise ValueError(f"fill has 3 different values {tuple(fill)}; x has 1 channel (give one value)")


def as_three_channels(x: torch.Tensor) -> torch.Tensor:
    """A grayscale ``[N, 1, H, W]`` batch as the 3-channel kernels take it: its channel copied to
    three interleaved ones (channels-last, their fast layout: 34 ms for 64 x 256 x 256 bilinear on
    one Zen 3 thread pair, 53 ms reading a stride-0 view). The callers keep the first output
    channel (``out[:, :1].clone()``: one channel is contiguous and channels-last alike)."""
    return x.expand(-1, 3, -1, -1).contiguous(memory_format=torch.channels_last)


def num_threads() -> int:
    """Threads for a host kernel: torch's intra-op setting, so one knob governs both."""
    return torch.get_num_threads()
