"""Host -> device copies that never make the calling thread wait for the GPU (gpupipe._transfer): the
values arrive as they are, small sources go as they are and large ones through pinned memory, and on
CUDA neither a copy nor the Loader's next() waits for the work queued before it on the stream (a
training step's)."""

from __future__ import annotations

import time
import warnings

import numpy as np
import pytest
import torch

import gpupipe
from gpupipe import _transfer, crops, sources
from gpupipe.augment import BatchAugment
from helpers import DEVICES
from loader_data import make_image_folder

cuda_only = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: the copies' waits are CUDA's")


def _read_only(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


LARGE = 2 * _transfer.STAGED_BYTES  # through pinned memory on CUDA


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("host", [
    np.arange(7, dtype=np.int64), np.array([True, False, True]),
    np.arange(24, dtype=np.float32).reshape(2, 3, 4)[:, ::2], torch.arange(5, dtype=torch.int32),
    np.arange(LARGE) % 3 == 0, np.arange(LARGE, dtype=np.float32).reshape(-1, 64)[:, ::2],
    _read_only(np.arange(LARGE // 8 + 3, dtype=np.int64)), torch.arange(LARGE // 4).reshape(64, -1).t(),
    torch.arange(LARGE // 2, dtype=torch.int16).expand(2, -1)],
    ids=["int64", "bool", "strided", "tensor", "large-bool", "large-strided-float32", "large-read-only-int64",
         "large-transposed-tensor", "large-expanded-tensor"])
def test_to_device_keeps_the_values(device, host):
    out = _transfer.to_device(host, torch.device(device))
    want = torch.from_numpy(np.array(host)) if isinstance(host, np.ndarray) else host
    assert out.device.type == device and out.dtype == want.dtype
    assert torch.equal(out.cpu(), want)


def test_to_device_takes_a_read_only_array_quietly():
    ro = np.arange(4, dtype=np.int64)
    ro.flags.writeable = False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        device = "cuda" if torch.cuda.is_available() else "cpu"
        assert _transfer.to_device(ro, torch.device(device)).cpu().tolist() == [0, 1, 2, 3]


def test_a_small_source_goes_as_it_is():
    small = np.arange(_transfer.STAGED_BYTES // 8, dtype=np.int64)
    t = _transfer.staged(small)
    assert torch.equal(t, torch.from_numpy(small)) and t.data_ptr() == small.ctypes.data  # no copy
    tensor = torch.arange(3)
    assert _transfer.staged(tensor) is tensor


@cuda_only
def test_a_large_source_goes_through_pinned_memory():
    large = np.arange(_transfer.STAGED_BYTES // 8 + 1, dtype=np.int64)
    assert _transfer.staged(large).is_pinned() and _transfer.staged(torch.from_numpy(large)).is_pinned()
    assert torch.equal(_transfer.staged(large), torch.from_numpy(large))


def _busy(ms: float = 400.0) -> None:
    """Queues about ``ms`` of work on the current stream."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(1_000_000)
    end.record()
    end.synchronize()
    torch.cuda._sleep(int(1_000_000 * ms / start.elapsed_time(end)))


@cuda_only
@pytest.mark.parametrize("host", [np.arange(256, dtype=np.int64), np.zeros(1 << 22, np.uint8)], ids=["2KB", "4MB"])
def test_a_copy_does_not_wait_for_the_stream(host):
    torch.cuda.synchronize()
    _busy()
    t = time.perf_counter()
    out = _transfer.to_device(host, torch.device("cuda"))
    waited = time.perf_counter() - t
    assert waited < 0.1, f"the copy waited {waited * 1e3:.0f} ms for the stream's queued work"
    assert torch.equal(out.cpu(), torch.from_numpy(host))  # ordered after the queued work, then done


@cuda_only
def test_a_pinned_block_is_not_reused_before_its_copy_is_done():
    """Two large copies queued behind busy work, the first source dropped at once: each arrives with
    its own values (the caching host allocator holds a block until its copy is done)."""
    first, second = np.full(LARGE, 7, np.uint8), np.full(LARGE, 9, np.uint8)
    torch.cuda.synchronize()
    _busy(200.0)
    a = _transfer.to_device(first, torch.device("cuda"))
    del first
    b = _transfer.to_device(second, torch.device("cuda"))
    assert (a.cpu() == 7).all() and (b.cpu() == 9).all()


@cuda_only
def test_loader_next_does_not_wait_for_the_training_step(tmp_path):
    """A CUDA Loader's next(), its batch ready: the labels' and images' copies and the augment call
    are queued behind the training step's work, never waited for."""
    make_image_folder(tmp_path, per_class=48)
    ld = gpupipe.Loader(sources.ImageFolder(tmp_path), batch_size=16, crop=crops.RandomResizedCrop(32),
                        augment=BatchAugment(hflip=0.5, brightness=0.4).cuda(), device="cuda", backend="cpu",
                        num_threads=2, seed=1, drop_last=True)
    waits = []
    it = iter(ld)
    next(it)
    for _ in range(4):
        time.sleep(0.5)  # the next batches decoded and waiting
        torch.cuda.synchronize()
        _busy()
        t = time.perf_counter()
        x, y = next(it)
        waits.append(time.perf_counter() - t)
        torch.cuda.synchronize()
        assert x.is_cuda and y.is_cuda and x.shape[0] == y.shape[0] == 16
    del it
    assert max(waits) < 0.1, f"next() waited {max(waits) * 1e3:.0f} ms for the stream's queued work"
