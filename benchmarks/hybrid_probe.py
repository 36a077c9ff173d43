"""Where the hybrid backend's time goes, on a GPU machine (one short device call):

1. nvImageCodec's engines alone on 800x533 photos (RandomResizedCrop 224): the hardware decoder at
   sub-batches of 32..512 (a per-call cost shows as a falling rate at small calls), the CUDA decoder
   with its Huffman stage on the GPU or on the host (threshold, threads); GPU time (CUDA events)
   beside the host's wall time of the call.
2. The Loader (backend hybrid, CUDA output, no augmentation, batch 256) with fixed
   ``decode_shares`` (cpu/hardware/cuda): the CPU alone, the hardware decoder alone, and splits of
   the two, so whether the engines add up shows directly; then with fewer CPU pool threads than
   cores (left to the hardware decoder's host side), and the re-tuned default.
3. BatchAugment's whole call on CUDA against its kernels, with torch.profiler's host-side ops.
Each row also carries a GIL probe: a Python thread that sleeps 0.5 ms in a loop and reports how late
it woke (p99, max): long holds of the GIL by the engines' Python show there.

    python -m benchmarks.hybrid_probe [--files 4096] [--threads 16]
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

import numpy as np
import torch

import gpupipe
from benchmarks import datasets, loader_scale
from gpupipe._backends import nvimgcodec
from gpupipe.bench.dataset import open_data
from gpupipe.decode_types import DecodeOptions, read_infos


class GilProbe:
    """A thread sleeping 0.5 ms at a time; its lateness on waking is the time others held the GIL."""

    def __init__(self):
        self.late, self.stop = [], threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self.stop.is_set():
            t = time.perf_counter()
            time.sleep(0.0005)
            self.late.append(time.perf_counter() - t - 0.0005)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()

    def summary(self) -> str:
        if not self.late:
            return "GIL probe: no samples"
        a = np.array(self.late) * 1e3
        return f"GIL probe late p50 {np.percentile(a, 50):.2f} p99 {np.percentile(a, 99):.2f} max {a.max():.1f} ms"


def engine_rates(datas: list, reps: int = 3) -> None:
    infos = read_infos(datas)
    sizes = np.stack([infos.column("height"), infos.column("width")], axis=1)
    boxes = gpupipe.crops.RandomResizedCrop(224).boxes(sizes[:, 0], sizes[:, 1], seed=0)
    options = DecodeOptions(size=(224, 224), resize=True, device=torch.device("cuda"))
    out = torch.zeros(len(datas), 224, 224, 3, dtype=torch.uint8, device="cuda")
    print("| engine | settings | call size | img/s (GPU events) | img/s (host wall) | GIL |\n|---|---|---:|---:|---:|---|")

    def measure(eng, label, settings, n):
        slots = np.arange(n)
        run = lambda: eng.decode(datas[:n], boxes[:n], out, slots, options, sizes=sizes[:n])  # noqa: E731
        run()
        torch.cuda.synchronize()
        gpu, wall = [], []
        with GilProbe() as probe:
            for _ in range(reps):
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                t0 = time.perf_counter()
                s.record()
                run()
                e.record()
                e.synchronize()
                wall.append(time.perf_counter() - t0)
                gpu.append(s.elapsed_time(e) / 1e3)
        print(f"| {label} | {settings} | {n} | {n / statistics.median(gpu):.0f} | {n / statistics.median(wall):.0f} "
              f"| {probe.summary()} |", flush=True)

    dev = torch.device("cuda", torch.cuda.current_device())
    try:
        hw = nvimgcodec.Engine("hardware", dev)
        for n in (32, 64, 128, 256, 512):
            measure(hw, "hardware", f"cpu_threads {nvimgcodec.CPU_THREADS}", min(n, len(datas)))
        hw8 = nvimgcodec.Engine("hardware", dev, cpu_threads=8)
        measure(hw8, "hardware", "cpu_threads 8", 256)
    except RuntimeError as e:
        print(f"| hardware | - | - | - | - | {e} |")
    default = nvimgcodec.CUDA_HUFFMAN_ON_GPU_ABOVE
    try:
        for threshold, threads in ((0, 2), (1_000_000, 2), (1_000_000, 8), (0, 8)):
            nvimgcodec.CUDA_HUFFMAN_ON_GPU_ABOVE = threshold
            eng = nvimgcodec.Engine("cuda", dev, cpu_threads=threads)
            measure(eng, "cuda", f"Huffman on GPU above {threshold} px, cpu_threads {threads}", 256)
    finally:  # the Loader rows run what ships
        nvimgcodec.CUDA_HUFFMAN_ON_GPU_ABOVE = default


def loader_rows(path, threads: int, batch: int) -> None:
    data = open_data(str(path))
    def split(cpu, hw, cuda=0.0):
        return {"cpu": cpu, "hardware": hw, "cuda": cuda}

    # (shares or None for the re-tuned default, CPU pool threads): the engines alone, then splits,
    # then the even split with cores left to the hardware decoder's host threads
    variants = [(split(1, 0), threads), (split(0, 1), threads), (split(0.5, 0.5), threads),
                (split(0.45, 0.55), threads), (split(0.55, 0.45), threads), (split(0.35, 0.65), threads),
                (split(0.5, 0.5), threads - 2), (split(0.5, 0.5), threads - 4), (split(0.45, 0.55), threads - 2),
                (None, threads), (None, threads - 2)]
    print("\n| decode_shares | pool threads | img/s (epochs 1-2) | pool busy | host us/img | stages ms/batch (busy, all epochs) | GIL |\n|---|---:|---:|---:|---:|---|---|")
    for shares, pool_threads in variants:
        loader = gpupipe.Loader(data.source, batch_size=batch, crop=gpupipe.crops.RandomResizedCrop(224),
                                device="cuda", backend="hybrid", num_threads=max(1, pool_threads), seed=0, drop_last=True,
                                **({} if shares is None else {"decode_shares": shares}))
        for _ in loader:  # epoch 0: warm-up (engines, pinned buffers)
            pass
        torch.cuda.synchronize()
        n, t0 = 0, time.perf_counter()
        with GilProbe() as probe:
            for epoch in (1, 2):
                loader.set_epoch(epoch)
                for images, _ in loader:
                    n += len(images)
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        st = loader.stats()
        busy = ", ".join(f"{k} {1e3 * v / max(st['batches'], 1):.1f}" for k, v in st["busy_s"].items())
        pool = st.get("decode_pool", {})
        label = "re-tuned (prior, then measured)" if shares is None else "/".join(f"{v:g}" for v in shares.values())
        print(f"| {label} | {max(1, pool_threads)} | {n / dt:.0f} | {pool.get('utilisation', float('nan')):.0%} | "
              f"{st.get('host_us_per_image', float('nan')):.1f} | {busy} | {probe.summary()} |", flush=True)
        if shares is None:
            print("  shares:", st.get("shares"), "engines:", st.get("engines"))


def augment_host_side(reps: int = 30) -> None:
    """BatchAugment's whole call on CUDA (256x3x224x224, the train recipe's chain with rotation and
    hue) against its kernels: the host's time until the call returns, the whole call with a sync,
    and torch.profiler's host-side ops (issue 28: whole call <= 1.3x the kernels)."""
    from gpupipe.augment import BatchAugment

    aug = BatchAugment(hflip=0.5, rotation=25, brightness=0.4, contrast=0.4, saturation=0.4, hue=0.1, generator=0)
    x = torch.randint(0, 256, (256, 3, 224, 224), dtype=torch.uint8, device="cuda")
    params = aug.sample_params(256, seed=0)
    for _ in range(5):
        aug(x, params=params)
    torch.cuda.synchronize()
    host, whole = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        aug(x, params=params)
        host.append(time.perf_counter() - t0)
        torch.cuda.synchronize()
        whole.append(time.perf_counter() - t0)
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(reps):
        aug(x, params=params)
    e.record()
    e.synchronize()
    print(f"\nBatchAugment 256x3x224x224 on CUDA: host until return {1e6 * statistics.median(host):.0f} us, whole call "
          f"(synced) {1e6 * statistics.median(whole):.0f} us, back to back {1e3 * s.elapsed_time(e) / reps:.0f} us per call")
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            aug(x, params=params)
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=14, max_name_column_width=50))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--part", choices=["all", "engines", "loader", "augment"], default="all")
    args = ap.parse_args(argv)
    print("device:", torch.cuda.get_device_name(0))
    if args.part in ("all", "engines"):
        seed = datasets.load_set("seed", progress=False)
        engine_rates([seed[i % len(seed)] for i in range(512)])
    if args.part in ("all", "augment"):
        augment_host_side()
    if args.part in ("all", "loader"):
        loader_rows(loader_scale.folder("seed", args.files), args.threads, args.batch)


if __name__ == "__main__":
    main()
