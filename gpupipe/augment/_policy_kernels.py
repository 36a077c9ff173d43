"""The policies' kernel as a torch op: ``gpupipe::policy_apply``, a batch's op slots in one call.

Sample ``i`` of a uint8 ``[N, 3, H, W]`` batch undergoes ``kinds[i, 0]``, then ``kinds[i, 1]``, ...
(:data:`KINDS`, from csrc/augment/policy_ops.h), each with its ``params[i, s]`` (factor, bits or threshold)
or, for ``KINDS["affine"]``, ``matrices[i, s]`` (the warp of :func:`gpupipe.augment.warp_affine`).
CPU tensors run the host kernels (csrc/augment/policy_cpu.cpp) on gpupipe's thread pool,
``torch.get_num_threads()`` threads, the GIL released once per call: per sample, consecutive table
ops fold into one pass. CUDA tensors run the CUDA kernels (cuda/policy_ops.cu) slot after slot on
torch's current stream: one ``_C_cuda.policy_apply`` call, three kernel launches (statistics, tables,
pixels) over the whole batch, per op slot, so ``S`` slots cost ``3 * S`` launches and ``S - 1``
intermediate batches. A fake kernel makes the op traceable by ``torch.compile``.
"""

from __future__ import annotations

from typing import Optional

import torch

from gpupipe import _C
from gpupipe._args import INTERPOLATIONS
from gpupipe.augment import _kernels

KINDS: dict = dict(_C.policy_kinds())


def _check(x, kinds, params, matrices):
    if x.dim() != 4 or x.shape[1] != 3 or x.dtype != torch.uint8:
        raise ValueError(f"x must be uint8 [N, 3, H, W], got {x.dtype} {tuple(x.shape)}")
    n, slots = x.shape[0], kinds.shape[-1] if kinds.dim() == 2 else -1
    for name, t, shape, dtype in (("kinds", kinds, (n, slots), torch.int64),
                                  ("params", params, (n, slots), torch.float64),
                                  ("matrices", matrices, (n, slots, 6), torch.float32)):
        if tuple(t.shape) != shape or t.dtype != dtype or t.device != x.device:
            raise ValueError(f"{name} must be {dtype} {list(shape)} on {x.device}, got {t.dtype} {tuple(t.shape)} "
                             f"on {t.device}")


def _buffers(*tensors) -> list:
    """The tensors' buffers: addresses only, so each tensor must be held (contiguous already: a
    copy made here would be freed before the kernel read it) until the call that reads it returns."""
    return [_kernels.buffer(t) for t in tensors]


@torch.library.custom_op("gpupipe::policy_apply", mutates_args=())
def _policy_apply_op(x: torch.Tensor, kinds: torch.Tensor, params: torch.Tensor, matrices: torch.Tensor,
                     interpolation: int, fill: Optional[list[float]]) -> torch.Tensor:
    raise NotImplementedError(f"gpupipe::policy_apply has no kernel for device {x.device}")


@_policy_apply_op.register_kernel("cpu")
def _policy_apply_cpu(x, kinds, params, matrices, interpolation, fill):
    _check(x, kinds, params, matrices)
    out = torch.empty_like(x)  # the input's memory format (channels-last stays channels-last)
    kinds, params, matrices = kinds.contiguous(), params.contiguous(), matrices.contiguous()
    _C.policy_apply(*_buffers(x, out, kinds, params, matrices), interpolation, fill, _kernels.num_threads())
    return out


@_policy_apply_op.register_kernel("cuda")
def _(x, kinds, params, matrices, interpolation, fill):
    cuda = _kernels.cuda_module()
    _check(x, kinds, params, matrices)
    out = x
    n = x.shape[0]
    # workspace: per-sample channel histograms and gray sums (zeroed per slot), lookup tables
    hist = torch.empty((n, 768), dtype=torch.int64, device=x.device)
    gray_sum = torch.empty((n,), dtype=torch.int64, device=x.device)
    luts = torch.empty((n, 768), dtype=torch.uint8, device=x.device)
    with torch.cuda.device(x.device):
        # One call per op slot (three launches over the whole batch each), never one per sample.
        for s in range(kinds.shape[1]):
            src, out = out if s else x, torch.empty_like(x)
            hist.zero_()
            gray_sum.zero_()
            # (the slot's copies are held until the launches are queued: freed earlier, the allocator
            # could hand their memory to another thread's work on this stream before the kernels read it)
            slot = [t[:, s : s + 1].contiguous() for t in (kinds, params, matrices)]
            cuda.policy_apply(*_buffers(src, out, *slot),
                              _kernels.buffer(hist), _kernels.buffer(gray_sum), _kernels.buffer(luts), interpolation, fill,
                              _kernels.current_stream(x.device))
    return out


@_policy_apply_op.register_fake
def _(x, kinds, params, matrices, interpolation, fill):
    return torch.empty_like(x)


def policy_apply(x: torch.Tensor, kinds: torch.Tensor, params: torch.Tensor, matrices: torch.Tensor,
                 interpolation: str = "nearest", fill: Optional[list] = None) -> torch.Tensor:
    """A batch's op slots: sample ``i`` undergoes ``op(kinds[i, s], params[i, s], matrices[i, s])`` for
    ``s = 0, 1, ...`` in order, uint8 in, uint8 out.

    Args:
        x: uint8 ``[N, 3, H, W]``, any strides, CPU or CUDA.
        kinds: int64 ``[N, S]``, values of :data:`KINDS`, on x's device.
        params: float64 ``[N, S]``: the factor (brightness, color, contrast, sharpness), the bits
            (posterize) or the threshold on the 0..255 scale (solarize); ignored otherwise.
        matrices: float32 ``[N, S, 6]``: for affine steps, the output pixel -> input coordinate map
            ``sx = m0 x + m1 y + m2, sy = m3 x + m4 y + m5`` (pixel centres at integers).
        interpolation: ``"nearest"`` or ``"bilinear"`` (affine samples).
        fill: 3 floats on the 0..255 scale, or None (torchvision's ``fill=None``: zeros).

    Returns:
        uint8 ``[N, 3, H, W]`` in x's memory format, on x's device.
    """
    if interpolation not in INTERPOLATIONS:
        raise ValueError(f"interpolation must be one of {list(INTERPOLATIONS)}, got {interpolation!r}")
    if _kernels.eager_cpu(x):
        return _policy_apply_cpu(x, kinds, params, matrices, INTERPOLATIONS[interpolation], fill)
    return torch.ops.gpupipe.policy_apply(x, kinds, params, matrices, INTERPOLATIONS[interpolation], fill)
