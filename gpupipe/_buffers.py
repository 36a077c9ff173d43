"""Turning user inputs into objects the C++ core reads through the buffer protocol, without copies."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


def as_buffer(data: Any, what: str = "data") -> Any:
    """Returns an object exporting a contiguous byte buffer for ``data``.

    Accepts ``bytes``, ``bytearray``, ``memoryview``, a 1-D uint8 numpy array or CPU torch tensor.
    """
    if isinstance(data, (bytes, bytearray)):
        return data
    if isinstance(data, memoryview):
        if not data.contiguous:
            raise ValueError(f"{what} must be a contiguous memoryview, got one with strides {data.strides}")
        return data
    if isinstance(data, torch.Tensor):
        if data.device.type != "cpu":
            raise ValueError(f"{what} must be a CPU tensor of encoded bytes, got device {data.device}")
        if data.dtype != torch.uint8 or data.dim() != 1:
            raise ValueError(f"{what} must be a 1-D uint8 tensor, got {data.dtype} {tuple(data.shape)}")
        return data.detach().contiguous().numpy()
    if isinstance(data, np.ndarray):
        if data.dtype != np.uint8 or data.ndim != 1:
            raise ValueError(f"{what} must be a 1-D uint8 array, got {data.dtype} {data.shape}")
        return np.ascontiguousarray(data)
    raise TypeError(
        f"{what} must be bytes, bytearray, memoryview, a 1-D uint8 numpy array or torch tensor, "
        f"got {type(data).__name__}"
    )
