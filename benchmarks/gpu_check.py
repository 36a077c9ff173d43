"""One command for a machine with a CUDA GPU: checks every GPU path against the CPU core, then times
it. On a CPU-only machine it runs what it can and lists the GPU rows as skipped, with the reason.

    python -m benchmarks.gpu_check [--quick]

Checks: batch decode (dali mixed, nvjpeg, cpu->cuda) for the seed workload (800x533 -> 256 crops)
and RandomResizedCrop 224 on 1920x1280; the fused augmentation CUDA kernel against the torch path
and the float64 definition. Prints a short table last (images/s, ratio to the CPU core)."""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

import gpupipe
from benchmarks import datasets
from benchmarks.decode_crop import random_boxes


def _time(fn, repeats: int, sync: bool) -> float:
    fn()
    if sync:
        torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        if sync:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv=None) -> list:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    repeats = 3 if args.quick else 10
    cuda = torch.cuda.is_available()
    avail = gpupipe.backends_available()
    print("device:", torch.cuda.get_device_name(0) if cuda else "no CUDA device")
    for name, info in avail.items():
        print(f"  {name:12s} available={info['available']} devices={info['devices']} {info['reason']}")
    rows, checks = [], []

    seed = datasets.load_set("seed", progress=False)
    hd = datasets.load_set("hd", progress=False)
    seed64 = [seed[i % len(seed)] for i in range(64)]
    hd64 = [hd[i % len(hd)] for i in range(64)]
    crop_boxes = random_boxes(seed64, 256, seed=3)
    sizes = np.array([gpupipe.read_header(d)[:2] for d in hd64])
    rrc_boxes = gpupipe.crops.RandomResizedCrop(224).boxes(sizes[:, 0], sizes[:, 1], seed=0)
    workloads = [("seed 800x533 -> crop 256, batch 64", seed64, crop_boxes, None),
                 ("RandomResizedCrop 224 on 1920x1280, batch 64", hd64, rrc_boxes, 224)]

    for label, datas, boxes, size in workloads:
        ref = gpupipe.decode_crop_jpegs(datas, boxes, size=size, backend="cpu", dct_scaling=False)
        cpu_t = _time(lambda: gpupipe.decode_crop_jpegs(datas, boxes, size=size, backend="cpu"), repeats, False)
        rows.append((label, "cpu core", len(datas) / cpu_t, 1.0, "ok"))
        for backend, device in (("cpu", "cuda"), ("dali", "cuda"), ("nvjpeg", "cuda"), ("dali", "cpu")):
            info = avail[backend]
            name = f"{backend} -> {device}"
            if not info["available"] or device not in info["devices"]:
                rows.append((label, name, None, None, f"skipped: {info['reason'] or 'no ' + device}"))
                continue
            run = lambda: gpupipe.decode_crop_jpegs(datas, boxes, size=size, backend=backend, device=device,  # noqa: E731
                                                    dct_scaling=False)
            got = run()
            diff = (got.images.cpu().float() - ref.images.float()).abs()
            status = f"mean |diff| {diff.mean():.3f}, max {int(diff.max())}, fallback {len(got.fallback)}"
            ok = diff.mean() < (1.5 if size else 1.0)
            checks.append((f"{label}: {name}", ok, status))
            t = _time(run, repeats, device == "cuda")
            rows.append((label, name, len(datas) / t, cpu_t / t, status))

    # The fused augmentation kernel.
    from gpupipe.augment import BatchAugment
    from gpupipe.augment import fused as fused_mod

    x_cpu = torch.randint(0, 256, (64, 3, 256, 256), dtype=torch.uint8).contiguous(memory_format=torch.channels_last)
    aug = BatchAugment(hflip=0.5, brightness=0.4, contrast=0.4, saturation=0.4, hue=0.1, generator=0)
    cpu_out = aug(x_cpu)
    params = aug.last_params
    cpu_aug_t = _time(lambda: aug(x_cpu, params=params), repeats, False)
    rows.append(("augment 64x3x256x256 -> float32", "fused, cpu kernel", 64 / cpu_aug_t, 1.0, "ok"))
    if avail["cuda_kernels"]["available"]:
        x = x_cpu.cuda()
        out = aug(x, params=params)
        assert aug.last_path == "cuda-kernel"
        diff = (out.cpu() - cpu_out).abs().max().item()
        checks.append(("augment: CUDA kernel vs CPU kernel", diff < 1e-4, f"max |diff| {diff:.2e}"))
        for dtype in (torch.bfloat16, torch.float16):
            a16 = BatchAugment(hflip=0.5, brightness=0.4, contrast=0.4, saturation=0.4, hue=0.1, out_dtype=dtype)
            d = (a16(x, params=params).float().cpu() - cpu_out).abs().max().item()
            checks.append((f"augment: CUDA kernel {dtype}", d < 0.05, f"max |diff| vs float32 {d:.3f}"))
        t = _time(lambda: aug(x, params=params), repeats, True)
        rows.append(("augment 64x3x256x256 -> float32", "fused, CUDA kernel", 64 / t, cpu_aug_t / t, f"max |diff| {diff:.1e}"))
        kaug = BatchAugment(hflip=0.5, brightness=0.4, contrast=0.4, saturation=0.4, hue=0.1, engine="kornia")
        t = _time(lambda: kaug(x, params=params), repeats, True)
        rows.append(("augment 64x3x256x256 -> float32", "kornia engine, CUDA", 64 / t, cpu_aug_t / t, ""))
        m = torch.randn(64, 3, 4, device="cuda")
        flips = torch.rand(64, device="cuda") < 0.5
        k = fused_mod.fused_color_affine(x, m, flips, ~flips)
        r = fused_mod.fused_color_affine_torch(x, m, flips, ~flips)
        checks.append(("augment: kernel vs torch path (random matrices)", torch.allclose(k, r, atol=1e-3), ""))
    else:
        rows.append(("augment 64x3x256x256 -> float32", "fused, CUDA kernel", None, None,
                     f"skipped: {avail['cuda_kernels']['reason']}"))

    print("\nchecks against the CPU core:")
    for name, ok, status in checks:
        print(f"  [{'PASS' if ok else 'FAIL'}] {name}  {status}")
    print("\n| workload | path | images/s | vs CPU core | check |\n|---|---|---:|---:|---|")
    for label, name, ips, ratio, status in rows:
        print(f"| {label} | {name} | {ips:.0f} | {ratio:.2f}x | {status} |" if ips else f"| {label} | {name} | - | - | {status} |")
    if any(not ok for _, ok, _ in checks):
        raise SystemExit("some GPU paths disagree with the CPU core")
    return rows


if __name__ == "__main__":
    main()
