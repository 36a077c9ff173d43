"""The policies' kernel as a torch op: ``gpupipe::policy_apply``, one op slot of a batch.

Sample ``i`` of a uint8 ``[N, 3, H, W]`` batch undergoes ``kinds[i]`` (``KINDS``, from
csrc/policy_ops.h) with ``params[i]`` (factor, bits or threshold) or, for ``KINDS["affine"]``,
``matrices[i]``. CPU tensors run the host kernels (csrc/policy_cpu.cpp) on gpupipe's thread pool,
``torch.get_num_threads()`` threads, the GIL released once per call. A fake kernel makes the op
traceable by ``torch.compile``.
"""

from __future__ import annotations

from typing import Optional

import torch

from gpupipe import _C

KINDS: dict = dict(_C.policy_kinds())
INTERPOLATIONS = {"nearest": 0, "bilinear": 1}


def _check(x, kinds, params, matrices, fill):
    n = x.shape[0]
    if x.dim() != 4 or x.shape[1] != 3 or x.dtype != torch.uint8:
        raise ValueError(f"x must be uint8 [N, 3, H, W], got {x.dtype} {tuple(x.shape)}")
    for name, t, shape, dtype in (("kinds", kinds, (n,), torch.int32), ("params", params, (n,), torch.float64),
                                  ("matrices", matrices, (n, 6), torch.float32)):
        if tuple(t.shape) != shape or t.dtype != dtype:
            raise ValueError(f"{name} must be {dtype} {list(shape)}, got {t.dtype} {tuple(t.shape)}")
    if fill is not None and (tuple(fill.shape) != (3,) or fill.dtype != torch.float32):
        raise ValueError(f"fill must be float32 [3], got {fill.dtype} {tuple(fill.shape)}")


@torch.library.custom_op("gpupipe::policy_apply", mutates_args=())
def _policy_apply_op(x: torch.Tensor, kinds: torch.Tensor, params: torch.Tensor, matrices: torch.Tensor,
                     interpolation: int, fill: Optional[torch.Tensor]) -> torch.Tensor:
    raise NotImplementedError(f"gpupipe::policy_apply has no kernel for device {x.device}")


@_policy_apply_op.register_kernel("cpu")
def _(x, kinds, params, matrices, interpolation, fill):
    _check(x, kinds, params, matrices, fill)
    out = torch.empty_like(x)  # the input's memory format (channels-last stays channels-last)
    _C.policy_apply(x.numpy(), out.numpy(), kinds.contiguous().numpy(), params.contiguous().numpy(),
                    matrices.contiguous().numpy(), interpolation,
                    None if fill is None else fill.contiguous().numpy(), torch.get_num_threads())
    return out


@_policy_apply_op.register_fake
def _(x, kinds, params, matrices, interpolation, fill):
    return torch.empty_like(x)


def policy_apply(x: torch.Tensor, kinds: torch.Tensor, params: torch.Tensor, matrices: torch.Tensor,
                 interpolation: str = "nearest", fill: Optional[torch.Tensor] = None) -> torch.Tensor:
    """One op slot: ``out[i] = op(kinds[i], params[i], matrices[i])(x[i])``, uint8 in, uint8 out.

    Args:
        x: uint8 ``[N, 3, H, W]``, any strides, on the CPU.
        kinds: int32 ``[N]``, values of :data:`KINDS`.
        params: float64 ``[N]``: the factor (brightness, color, contrast, sharpness), the bits
            (posterize) or the threshold on the 0..255 scale (solarize); ignored otherwise.
        matrices: float32 ``[N, 6]``: for affine samples, the output pixel -> input coordinate map
            ``sx = m0 x + m1 y + m2, sy = m3 x + m4 y + m5`` (pixel centres at integers).
        interpolation: ``"nearest"`` or ``"bilinear"`` (affine samples).
        fill: float32 ``[3]`` on the 0..255 scale, or None (torchvision's ``fill=None``: zeros).

    Returns:
        uint8 ``[N, 3, H, W]`` in x's memory format, on x's device.
    """
    if interpolation not in INTERPOLATIONS:
        raise ValueError(f"interpolation must be one of {list(INTERPOLATIONS)}, got {interpolation!r}")
    return torch.ops.gpupipe.policy_apply(x, kinds, params, matrices, INTERPOLATIONS[interpolation], fill)
