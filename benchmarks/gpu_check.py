"""One command for a machine with a CUDA GPU: checks every GPU path against the CPU core, then times
it. On a CPU-only machine it runs what it can and lists the GPU rows as skipped, with the reason.

    python -m benchmarks.gpu_check [--quick]

Checks: batch decode (hybrid, dali mixed, nvjpeg, cpu->cuda) for the seed workload (800x533 -> 256 crops)
and RandomResizedCrop 224 on 1920x1280; nvImageCodec's two engines (the hardware JPEG decoder and
the CUDA decoder, whole images + the ragged crop kernel) against the CPU core at batch 256, timed
beside the CPU core and backend nvjpeg's torchvision path (max, mean |diff| and the share of
pixels more than 2 levels off; on these 4:2:0 photos, max 4 and mean < 0.1: measured on an H200, the
hardware decoder max 1, the CUDA decoder 3); BatchAugment's
CUDA kernels bit-equal to their host build (every color model, interpolation, output dtype and
layout), and the full augmentation chain's share of the device's memory bandwidth on a
256x3x224x224 batch. Prints a short table last
(images/s, ratio to the CPU core)."""

from __future__ import annotations

import argparse
import contextlib
import os
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


def _kernel_time(fn, repeats: int, names: tuple) -> float:
    """Seconds per call spent in the CUDA kernels whose names contain one of ``names`` (profiler)."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(repeats):
            fn()
        torch.cuda.synchronize()
    us = sum(getattr(e, "device_time_total", 0) or getattr(e, "cuda_time_total", 0)
             for e in prof.key_averages() if any(n in e.key for n in names))
    return us * 1e-6 / repeats


@contextlib.contextmanager
def _two_pass():
    """BatchAugment's CUDA call takes its two-pass kernels (GPUPIPE_CUDA_AUGMENT, read per launch)."""
    old = os.environ.get("GPUPIPE_CUDA_AUGMENT")
    os.environ["GPUPIPE_CUDA_AUGMENT"] = "two_pass"
    try:
        yield
    finally:
        if old is None:
            del os.environ["GPUPIPE_CUDA_AUGMENT"]
        else:
            os.environ["GPUPIPE_CUDA_AUGMENT"] = old


def _no_sync_few_launches(aug, x) -> list:
    """Issue 13's contract on CUDA: a training-mode forward never syncs the host (sync debug mode
    'error' raises on any sync), launches one kernel on sm_90 (the fused one; two elsewhere) plus one
    host-to-device copy, and compiles with fullgraph=True (inductor) to the same output as eager."""
    from torch.profiler import ProfilerActivity, profile

    checks = []
    aug.train()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            aug(x)
            synced = "no host sync"
    except RuntimeError as e:
        synced = f"synced: {e}"
    finally:
        torch.cuda.set_sync_debug_mode("default")
        torch.cuda.synchronize()
    kernels = [e.key for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    fused = torch.cuda.get_device_capability(x.device)[0] >= 9  # the batch's samples fit a cluster
    ours = [k for k in kernels if "gpupipe" in k]
    copies = sum(e.count for e in prof.key_averages() if "Memcpy HtoD" in e.key)
    checks.append(("augment forward on CUDA: no host sync, 1 kernel (sm_90) or 2 + 1 copy",
                   synced == "no host sync" and len(ours) == (1 if fused else 2) and copies == 1,
                   f"{synced}; kernels {len(ours)} of gpupipe ({len(kernels)} in all), {copies} HtoD copies"))
    p = aug.sample_params(x.shape[0], seed=4)
    compiled = torch.compile(lambda t: aug(t, params=p), fullgraph=True)
    try:
        same = torch.equal(compiled(x), aug(x, params=p))
        checks.append(("augment under torch.compile(fullgraph=True), inductor, CUDA", same,
                       "equal to eager" if same else "differs from eager"))
    except Exception as e:  # a graph break or a compile failure is a failed check, not a crash
        checks.append(("augment under torch.compile(fullgraph=True), inductor, CUDA", False,
                       f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"))
    return checks


def _augment_check(checks: list, avail: dict, repeats: int) -> list:
    """BatchAugment's CUDA kernels against their host build (bit-equal: they share augment_pixel.h
    and round alike), then the full chain on a 256 x 3 x 224 x 224 batch: time per batch, effective
    bandwidth (input read once + output written once) and its share of the device's peak."""
    from benchmarks.augment import _batch
    from gpupipe.augment import BatchAugment

    label = "augment 256x3x224x224 -> float32 (rotation 25 bilinear, flips, jitter + hue, normalise)"
    chain = dict(hflip=0.5, vflip=0.5, rotation=25, interpolation="bilinear", brightness=0.4, contrast=0.4,
                 saturation=0.4, hue=0.1, grayscale=0.1)
    x_cpu = _batch(256, 224)
    aug = BatchAugment(**chain)
    params = aug.sample_params(256, seed=0)
    cpu_t = _time(lambda: aug(x_cpu, params=params), max(1, repeats // 3), False)
    rows = [(label, "cpu kernel", 256 / cpu_t, 1.0, "ok")]
    if not avail["cuda_kernels"]["available"]:
        rows.append((label, "CUDA kernels", None, None, f"skipped: {avail['cuda_kernels']['reason']}"))
        return rows
    x = x_cpu.cuda()
    small, small_gpu = x_cpu[:16], x[:16]
    for color in ("torchvision", "linear"):
        for interpolation in ("nearest", "bilinear"):
            for dtype in (torch.float32, torch.bfloat16, torch.float16):
                for fmt in (torch.contiguous_format, torch.channels_last):
                    a = BatchAugment(**dict(chain, interpolation=interpolation), color=color, out_dtype=dtype,
                                     out_memory_format=fmt)
                    p = a.sample_params(16, seed=1)
                    host = a(small, params=p)
                    bits = torch.int16 if dtype != torch.float32 else torch.int32
                    worst = []
                    for path in ("fused", "two-pass"):  # the fused kernel where it runs, and its fallback
                        with _two_pass() if path == "two-pass" else contextlib.nullcontext():
                            dev = a(small_gpu, params=p).cpu()
                        if not torch.equal(host.view(bits), dev.view(bits)):
                            worst.append(f"{path} max |diff| {(host.float() - dev.float()).abs().max().item():.3g}")
                    checks.append((f"augment {color} {interpolation} {str(dtype)[6:]} {str(fmt)[6:]}: CUDA == host build",
                                   not worst, "0 ULP, both paths" if not worst else "; ".join(worst)))
    out = aug(x, params=params)
    t = _time(lambda: aug(x, params=params), repeats, True)  # the whole call: parameter packing included
    kt = _kernel_time(lambda: aug(x, params=params), repeats, ("augment_", "mean_kernel"))
    with _two_pass():  # the fallback (GPUs before sm_90, samples too large for a cluster), for comparison
        two_pass_kt = _kernel_time(lambda: aug(x, params=params), repeats, ("augment_", "mean_kernel"))
    props = torch.cuda.get_device_properties(0)
    peak = 2 * props.memory_clock_rate * 1e3 * props.memory_bus_width / 8  # DDR: two transfers per clock
    moved = x.numel() * x.element_size() + out.numel() * out.element_size()
    copy_src = torch.empty_like(out)
    copy_t = _time(lambda: out.copy_(copy_src), repeats, True)  # what the device reaches in practice
    bw = moved / kt
    status = (f"kernels {kt * 1e6:.0f} us: {bw / 1e9:.0f} GB/s = {100 * bw / peak:.0f}% of peak {peak / 1e9:.0f} GB/s "
              f"({100 * bw / (2 * out.numel() * out.element_size() / copy_t):.0f}% of a device copy's); "
              f"whole call {t * 1e6:.0f} us; two-pass kernels {two_pass_kt * 1e6:.0f} us "
              f"({100 * moved / two_pass_kt / peak:.0f}% of peak)")
    print(f"\n{label}: {status}")
    checks.append((f"{label}: kernels >= 70% of peak bandwidth", bw >= 0.7 * peak, status))
    checks += _no_sync_few_launches(aug, x)
    rows.append((label, "CUDA kernels (whole call)", 256 / t, cpu_t / t, status))
    kaug = BatchAugment(**chain, engine="kornia")
    kt = _time(lambda: kaug(x, params=params), max(1, repeats // 3), True)
    rows.append((label, "kornia engine, CUDA", 256 / kt, cpu_t / kt, ""))
    return rows


ENGINE_MAX_DIFF, ENGINE_MEAN_DIFF = 4, 0.1  # measured on an H200 (docs/gpu.md): max 1 hardware, 3 CUDA decoder


def _diff_status(got_nchw: torch.Tensor, ref: torch.Tensor, extra: str = "") -> tuple:
    diff = (got_nchw.cpu().int() - ref.int()).abs()
    ok = int(diff.max()) <= ENGINE_MAX_DIFF and float(diff.float().mean()) < ENGINE_MEAN_DIFF
    return ok, (f"max |diff| {int(diff.max())}, mean {float(diff.float().mean()):.3f}, "
                f"> 2 levels {100 * float((diff > 2).float().mean()):.2f}%{extra}")


def _engine_check(checks: list, avail: dict, repeats: int, workloads: list) -> list:
    """nvImageCodec's engines (issue 29) at batch 256: each against the CPU core (dct_scaling=False,
    same boxes), then timed beside the CPU core, backend nvjpeg (its engines chained, CPU fallback)
    and backend nvjpeg's torchvision path."""
    from gpupipe._backends import nvimgcodec, nvjpeg
    from gpupipe.decode_types import DecodeOptions, read_infos

    rows = []
    info = avail.get("nvimgcodec", {"available": False, "reason": "not reported"})
    try:
        nvimgcodec._crop_resize()
        kernel = None
    except ImportError as e:
        kernel = f"the ragged crop kernel is not here ({e})"
    for label, datas, boxes, size in workloads:
        ref = gpupipe.decode_crop_jpegs(datas, boxes, size=size, backend="cpu", dct_scaling=False)
        cpu_t = _time(lambda: gpupipe.decode_crop_jpegs(datas, boxes, size=size, backend="cpu", dct_scaling=False),
                      repeats, False)
        rows.append((label, "cpu core (dct_scaling=False)", len(datas) / cpu_t, 1.0, "reference"))
        if not info["available"] or kernel:
            why = kernel if info["available"] else info["reason"]
            rows.append((label, "nvImageCodec engines", None, None, f"skipped: {why}"))
            continue
        n = len(datas)
        shape = tuple(ref.images.shape[2:])
        options = DecodeOptions(size=shape, resize=size is not None, device=torch.device("cuda"))
        infos = read_infos(datas)
        sizes = np.stack([infos.column("height"), infos.column("width")], axis=1)
        out = torch.zeros(n, *shape, 3, dtype=torch.uint8, device="cuda")
        slots = np.arange(n)
        for kind in nvimgcodec.KINDS:
            name = f"nvImageCodec {kind} decoder + crop kernel"
            try:
                eng = nvimgcodec.engine(kind, torch.device("cuda"))
            except RuntimeError as e:
                rows.append((label, name, None, None, f"skipped: {e}"))
                continue
            run = lambda: eng.decode(datas, boxes, out, slots, options, sizes=sizes)  # noqa: E731
            out.zero_()
            declined = run()
            torch.cuda.synchronize()
            keep = [k for k in range(n) if k not in declined]
            ok, status = _diff_status(out[keep].permute(0, 3, 1, 2), ref.images[keep], f", declined {len(declined)}")
            checks.append((f"{label}: {name}", ok and not declined, status))
            t = _time(run, repeats, True)
            rows.append((label, name, n / t, cpu_t / t, status))
        got = gpupipe.decode_crop_jpegs(datas, boxes, size=size, backend="nvjpeg", device="cuda", dct_scaling=False)
        ok, status = _diff_status(got.images, ref.images, f", routes {dict(zip(*np.unique(got.routes, return_counts=True)))}")
        checks.append((f"{label}: backend nvjpeg on the engines", ok, status))
        t = _time(lambda: gpupipe.decode_crop_jpegs(datas, boxes, size=size, backend="nvjpeg", device="cuda",
                                                    dct_scaling=False), repeats, True)
        rows.append((label, "backend nvjpeg (engines chained, CPU fallback)", n / t, cpu_t / t, status))
        try:
            import torchvision  # noqa: F401
        except ImportError as e:
            rows.append((label, "backend nvjpeg, torchvision path", None, None, f"skipped: {e}"))
            continue
        old = lambda: nvjpeg._decode_with_torchvision(datas, boxes, out, options, infos)  # noqa: E731
        old()
        torch.cuda.synchronize()
        t = _time(old, repeats, True)
        rows.append((label, "backend nvjpeg, torchvision path (before issue 29)", n / t, cpu_t / t,
                     _diff_status(out.permute(0, 3, 1, 2), ref.images)[1]))
    return rows


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
        cpu_t = _time(lambda: gpupipe.decode_crop_jpegs(datas, boxes, size=size, backend="cpu", dct_scaling=False),
                      repeats, False)
        rows.append((label, "cpu core (the rows below: same options, dct_scaling=False)", len(datas) / cpu_t, 1.0, "ok"))
        if size:
            dct_t = _time(lambda: gpupipe.decode_crop_jpegs(datas, boxes, size=size, backend="cpu"), repeats, False)
            rows.append((label, "cpu core, dct_scaling (RandomResizedCrop's default)", len(datas) / dct_t, cpu_t / dct_t, ""))
        for backend, device in (("cpu", "cuda"), ("hybrid", "cuda"), ("dali", "cuda"), ("nvjpeg", "cuda"), ("dali", "cpu")):
            info = avail[backend]
            name = f"{backend} -> {device}"
            if not info["available"] or device not in info["devices"]:
                rows.append((label, name, None, None, f"skipped: {info['reason'] or 'no ' + device}"))
                continue
            run = lambda: gpupipe.decode_crop_jpegs(datas, boxes, size=size, backend=backend, device=device,  # noqa: E731
                                                    dct_scaling=False)
            got = run()
            diff = (got.images.cpu().float() - ref.images.float()).abs()
            routes = dict(zip(*np.unique(got.routes, return_counts=True)))
            status = f"mean |diff| {diff.mean():.3f}, max {int(diff.max())}, fallback {len(got.fallback)}, routes {routes}"
            ok = diff.mean() < (1.5 if size else 1.0)
            checks.append((f"{label}: {name}", ok, status))
            t = _time(run, repeats, device == "cuda")
            rows.append((label, name, len(datas) / t, cpu_t / t, status))

    # nvImageCodec's engines at batch 256 (issue 29), beside the CPU core and the torchvision path.
    seed256 = [seed[i % len(seed)] for i in range(256)]
    hd256 = [hd[i % len(hd)] for i in range(256)]
    sizes256 = np.array([gpupipe.read_header(d)[:2] for d in hd256])
    rows += _engine_check(checks, avail, repeats, [
        ("seed 800x533 -> crop 256, batch 256", seed256, random_boxes(seed256, 256, seed=3), None),
        ("RandomResizedCrop 224 on 1920x1280, batch 256", hd256,
         gpupipe.crops.RandomResizedCrop(224).boxes(sizes256[:, 0], sizes256[:, 1], seed=0), 224)])

    # The augmentation engine: host build vs CUDA kernels (0 ULP), then the full chain's speed.
    rows += _augment_check(checks, avail, repeats)

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
