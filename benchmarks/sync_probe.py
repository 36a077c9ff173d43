"""Does a host -> device copy make the calling thread wait for the GPU? (a GPU machine)

Each case runs while the current stream holds ~100 ms of queued work (``torch.cuda._sleep``), and
the calling thread's wall time is printed: a case that waits takes about as long as the queued work,
one that does not takes a fraction of a millisecond. The cases: copies from pageable memory
(``tensor.to(device, non_blocking=True)``) of several sizes, from pinned memory, and
``gpupipe._transfer.to_device`` (pageable up to ``STAGED_BYTES``, pinned above); and ``next()`` on a
CUDA Loader (train recipe, batch 256: each batch copied and augmented in its call) whose batch is
ready, with its labels copied from pageable memory or by ``to_device`` (the slowest of 5).
Measured on an H200 (2026-11-26): 2 KB and 24 KB pageable copies did not wait, 4 MB waited 95 ms.

    python -m benchmarks.sync_probe [--data FOLDER]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from gpupipe import _transfer, loader as loader_module


def _busy_cycles(device: torch.device, ms: float) -> int:
    """Clock cycles of torch.cuda._sleep that keep the stream busy for about ``ms``."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(10_000_000)
    end.record()
    end.synchronize()
    return int(10_000_000 * ms / start.elapsed_time(end))


def _timed(fn, cycles: int, repeats: int = 5) -> float:
    """Median wall ms of ``fn()`` issued behind ``cycles`` of queued work on the current stream."""
    out = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        torch.cuda._sleep(cycles)
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1e3)
        torch.cuda.synchronize()
    return statistics.median(out)


def _pageable(host, device):
    t = torch.from_numpy(np.ascontiguousarray(host)) if isinstance(host, np.ndarray) else host
    return t.to(device, non_blocking=True)


def _pinned(host, device):
    return torch.from_numpy(host).pin_memory().to(device, non_blocking=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=None, help="an ImageFolder for the Loader case (default: a small set made here)")
    ap.add_argument("--busy-ms", type=float, default=100.0)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("sync_probe measures CUDA's waits: no CUDA device here (torch.cuda.is_available() is False)")
        return 2
    dev = torch.device("cuda")
    torch.zeros(1, device=dev)
    cycles = _busy_cycles(dev, args.busy_ms)
    labels = np.arange(256, dtype=np.int64)
    held = torch.from_numpy(labels).pin_memory()  # what a ring slot's own label buffer would cost to copy
    sizes = {"24 KB": 24 << 10, "64 KB": 64 << 10, "256 KB": 256 << 10, "4 MB": 4 << 20}
    cases = [("labels, 2 KB, pageable .to(non_blocking=True)", lambda: _pageable(labels, dev)),
             ("labels, 2 KB, pinned", lambda: _pinned(labels, dev)),
             ("labels, 2 KB, gpupipe._transfer.to_device", lambda: _transfer.to_device(labels, dev)),
             ("labels, 2 KB, from a buffer pinned once (no allocation)",
              lambda: held.to(dev, non_blocking=True))]
    for name, n in sizes.items():
        host = np.zeros(n, np.uint8)
        cases += [(f"{name}, pageable", lambda h=host: _pageable(h, dev)),
                  (f"{name}, pinned", lambda h=host: _pinned(h, dev)),
                  (f"{name}, gpupipe._transfer.to_device", lambda h=host: _transfer.to_device(h, dev))]
    print(f"device: {torch.cuda.get_device_name(dev)}; the stream holds ~{args.busy_ms:.0f} ms of work before each case")
    print("| case | host wall ms (median of 5) | waited for the stream |\n|---|---:|---|")
    for name, fn in cases:
        ms = _timed(fn, cycles)
        print(f"| {name} | {ms:.3f} | {'yes' if ms > args.busy_ms / 2 else 'no'} |")
    for how, fn in (("pageable", _pageable), ("by to_device", _transfer.to_device)):
        ms = _loader_next(args.data, cycles, fn)
        print(f"| Loader next(), CPU backend, train recipe, labels {how} | {ms:.3f} | "
              f"{'yes' if ms > args.busy_ms / 2 else 'no'} |")
    return 0


def _loader_next(data, cycles: int, copy) -> float:
    """The slowest wall ms of 5 next() on a CUDA Loader whose next batch is ready, the stream busy."""
    import gpupipe
    from gpupipe.bench import recipes
    from gpupipe.bench.dataset import open_data

    if data is None:
        from benchmarks.loader_scale import folder

        data = folder("400x300", 2048)
    d = open_data(data)
    parts = recipes.get("train").build(8)
    kept, loader_module.to_device = loader_module.to_device, copy
    try:
        loader = gpupipe.Loader(d.source, batch_size=256, crop=parts.crop, augment=parts.augment.to("cuda"),
                                device="cuda", backend="cpu", seed=0, drop_last=True)
        out = []
        it = iter(loader)
        for k, _ in enumerate(it):
            if k >= 1:
                time.sleep(0.3)  # the next batches decoded and waiting
                torch.cuda.synchronize()
                torch.cuda._sleep(cycles)
                t = time.perf_counter()
                next(it, None)
                out.append((time.perf_counter() - t) * 1e3)
                torch.cuda.synchronize()
            if len(out) >= 5:
                break
        del it
        return max(out)
    finally:
        loader_module.to_device = kept


if __name__ == "__main__":
    raise SystemExit(main())
