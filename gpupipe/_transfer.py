"""Host -> device copies that never make the calling thread wait for the GPU.

CUDA may synchronize the stream before it copies from pageable host memory (its "API synchronization
behavior"): the calling thread then waits for every piece of work queued before on that stream, a
training step's included. Measured on an H200 (benchmarks/sync_probe.py, the stream holding 100 ms of
work): pageable copies of 2 KB and 24 KB returned in 0.13-0.18 ms, one of 4 MB after 95 ms; pinned
first, 0.23-0.27 ms and 0.9 ms. So small copies go as they are (staged at once, and faster than
pinning them), larger ones through pinned memory. torch's caching host allocator keeps a pinned
block until the copies queued from it are done, so the block is not reused early.
"""

from __future__ import annotations

import functools
from typing import Union

import numpy as np
import torch

STAGED_BYTES = 24 << 10  #: the largest pageable copy measured to return at once (larger ones: pinned)


def staged(host: Union[np.ndarray, torch.Tensor]) -> torch.Tensor:
    """``host`` as the source of a non-blocking copy to the GPU: as it is up to :data:`STAGED_BYTES`
    (and under ``torch.compile``), else copied into contiguous pinned memory (a contiguous pinned
    tensor as it is)."""
    if isinstance(host, np.ndarray):
        if host.nbytes <= STAGED_BYTES or torch.compiler.is_compiling():
            return _from_numpy(host)
        t = torch.empty(host.shape, dtype=_torch_dtype(host.dtype), pin_memory=True)
        t.numpy()[...] = host  # (read-only and strided arrays too)
        return t
    if torch.compiler.is_compiling() or host.numel() * host.element_size() <= STAGED_BYTES:
        return host
    if host.is_contiguous() and host.is_pinned():
        return host
    # contiguous: a strided pinned source would be copied again, through pageable memory, by .to()
    return torch.empty(host.shape, dtype=host.dtype, pin_memory=True).copy_(host)


def to_device(host: Union[np.ndarray, torch.Tensor], device: torch.device) -> torch.Tensor:
    """``host`` (a numpy array or a CPU tensor) on ``device``; to CUDA queued on the current stream
    without waiting for it (:func:`staged`)."""
    if torch.device(device).type != "cuda" or (isinstance(host, torch.Tensor) and host.device.type != "cpu"):
        return (_from_numpy(host) if isinstance(host, np.ndarray) else host).to(device)
    return staged(host).to(device, non_blocking=True)


def _from_numpy(host: np.ndarray) -> torch.Tensor:
    """A tensor of ``host``'s values (a copy of a read-only or strided array: torch warns on those)."""
    return torch.from_numpy(host if host.flags.writeable and host.flags.c_contiguous else np.array(host))


@functools.lru_cache(maxsize=None)
def _torch_dtype(dtype: np.dtype) -> torch.dtype:
    return torch.from_numpy(np.empty(0, dtype)).dtype
