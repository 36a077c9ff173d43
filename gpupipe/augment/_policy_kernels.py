"""The policies' kernel as a torch op: ``gpupipe::policy_apply``, one op slot of a batch.

Sample ``i`` of a uint8 ``[N, 3, H, W]`` batch undergoes ``kinds[i]`` (:data:`KINDS`, from
csrc/policy_ops.h) with ``params[i]`` (factor, bits or threshold) or, for ``KINDS["affine"]``,
``matrices[i]`` (the warp of :func:`gpupipe.augment.warp_affine`). CPU tensors run the host kernels
(csrc/policy_cpu.cpp) on gpupipe's thread pool, ``torch.get_num_threads()`` threads, the GIL released
once per call; CUDA tensors the CUDA kernels (cuda/policy_ops.cu) on torch's current stream. A fake
kernel makes the op traceable by ``torch.compile``.
"""

from __future__ import annotations

from typing import Optional

import torch

from gpupipe import _C
from gpupipe.augment import _kernels

KINDS: dict = dict(_C.policy_kinds())
INTERPOLATIONS = {"nearest": 0, "bilinear": 1}


def _check(x, kinds, params, matrices):
    if x.dim() != 4 or x.shape[1] != 3 or x.dtype != torch.uint8:
        raise ValueError(f"x must be uint8 [N, 3, H, W], got {x.dtype} {tuple(x.shape)}")
    n = x.shape[0]
    for name, t, shape, dtype in (("kinds", kinds, (n,), torch.int64), ("params", params, (n,), torch.float64),
                                  ("matrices", matrices, (n, 6), torch.float32)):
        if tuple(t.shape) != shape or t.dtype != dtype or t.device != x.device:
            raise ValueError(f"{name} must be {dtype} {list(shape)} on {x.device}, got {t.dtype} {tuple(t.shape)} "
                             f"on {t.device}")


def _buffers(x, out, kinds, params, matrices) -> list:
    return [_kernels.buffer(t) for t in (x, out, kinds.contiguous(), params.contiguous(), matrices.contiguous())]


@torch.library.custom_op("gpupipe::policy_apply", mutates_args=())
def _policy_apply_op(x: torch.Tensor, kinds: torch.Tensor, params: torch.Tensor, matrices: torch.Tensor,
                     interpolation: int, fill: Optional[list[float]]) -> torch.Tensor:
    raise NotImplementedError(f"gpupipe::policy_apply has no kernel for device {x.device}")


@_policy_apply_op.register_kernel("cpu")
def _(x, kinds, params, matrices, interpolation, fill):
    _check(x, kinds, params, matrices)
    out = torch.empty_like(x)  # the input's memory format (channels-last stays channels-last)
    _C.policy_apply(*_buffers(x, out, kinds, params, matrices), interpolation, fill, _kernels.num_threads())
    return out


@_policy_apply_op.register_kernel("cuda")
def _(x, kinds, params, matrices, interpolation, fill):
    cuda = _kernels.cuda_module()
    _check(x, kinds, params, matrices)
    out = torch.empty_like(x)
    n = x.shape[0]
    # workspace: per-sample channel histograms and gray sums (zeroed), lookup tables
    hist = torch.zeros((n, 768), dtype=torch.int64, device=x.device)
    gray_sum = torch.zeros((n,), dtype=torch.int64, device=x.device)
    luts = torch.empty((n, 768), dtype=torch.uint8, device=x.device)
    with torch.cuda.device(x.device):
        cuda.policy_apply(*_buffers(x, out, kinds, params, matrices), _kernels.buffer(hist), _kernels.buffer(gray_sum),
                          _kernels.buffer(luts), interpolation, fill, _kernels.current_stream(x.device))
    return out


@_policy_apply_op.register_fake
def _(x, kinds, params, matrices, interpolation, fill):
    return torch.empty_like(x)


def policy_apply(x: torch.Tensor, kinds: torch.Tensor, params: torch.Tensor, matrices: torch.Tensor,
                 interpolation: str = "nearest", fill: Optional[list] = None) -> torch.Tensor:
    """One op slot: ``out[i] = op(kinds[i], params[i], matrices[i])(x[i])``, uint8 in, uint8 out.

    Args:
        x: uint8 ``[N, 3, H, W]``, any strides, CPU or CUDA.
        kinds: int64 ``[N]``, values of :data:`KINDS`, on x's device.
        params: float64 ``[N]``: the factor (brightness, color, contrast, sharpness), the bits
            (posterize) or the threshold on the 0..255 scale (solarize); ignored otherwise.
        matrices: float32 ``[N, 6]``: for affine samples, the output pixel -> input coordinate map
            ``sx = m0 x + m1 y + m2, sy = m3 x + m4 y + m5`` (pixel centres at integers).
        interpolation: ``"nearest"`` or ``"bilinear"`` (affine samples).
        fill: 3 floats on the 0..255 scale, or None (torchvision's ``fill=None``: zeros).

    Returns:
        uint8 ``[N, 3, H, W]`` in x's memory format, on x's device.
    """
    if interpolation not in INTERPOLATIONS:
        raise ValueError(f"interpolation must be one of {list(INTERPOLATIONS)}, got {interpolation!r}")
    return torch.ops.gpupipe.policy_apply(x, kinds, params, matrices, INTERPOLATIONS[interpolation], fill)
