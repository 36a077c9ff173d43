"""Where the hybrid backend's time goes, on a GPU machine (one short device call):

1. nvImageCodec's engines alone on 800x533 photos (RandomResizedCrop 224): the hardware decoder at
   sub-batches of 64..256 (a per-call cost shows as a falling rate at small calls), the CUDA decoder
   with 2 and 8 host threads; GPU time (CUDA events) beside the host's wall time of the call.
2. The Loader (backend hybrid, CUDA output, no augmentation, batch 256) with fixed
   ``decode_shares`` (cpu/hardware/cuda): the CPU alone, the hardware decoder alone, and splits of
   the two, so whether the engines add up shows directly; 0, 2 or 4 of the thread budget left to
   the hardware decoder's host side (``hybrid.ENGINE_HOST_THREADS``), a shorter GIL switch
   interval, the pool at nice 10, and the re-tuned default. Each row shows the hardware engine's
   host time per batch by part (parse, lock wait, nvImageCodec's decode call, table, crop launch)
   and writes the best ``ENGINE_HOST_THREADS`` to ``--tuned``.
3. BatchAugment's whole call on CUDA against its kernels, with torch.profiler's host-side ops.
4. ``--part costs``: what the hardware decoder's time per file follows (the ranked split's GPU
   model, hybrid.SPLIT): groups of files of one size, each size split at its median bytes, decoded
   in calls of 64, GPU time per image fitted on bytes and pixels (:func:`decoder_costs`).
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
    for kind, calls in (("hardware", (64, 128, 256)), ("cuda", (256,))):
        for native in (True, False):  # nvImageCodec's C API (one GIL-free call) and its Python API
            try:
                eng = nvimgcodec.Engine(kind, dev, native=native)
                eng.probe()
            except RuntimeError as e:
                print(f"| {kind} | {'C' if native else 'Python'} API | - | - | - | {e} |")
                continue
            for n in calls:
                measure(eng, kind, f"{eng.api} API, cpu_threads {nvimgcodec.CPU_THREADS}", min(n, len(datas)))


def _renice_pool(nice: int) -> str:
    """Sets the niceness of gpupipe's decode threads (named gpupipe-pool); '' or why it could not."""
    import os

    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                if f.read().strip() != "gpupipe-pool":
                    continue
            os.setpriority(os.PRIO_PROCESS, int(tid), nice)
        except OSError as e:
            return f"renice failed: {e}"
    return ""


def split(cpu, hw, cuda=0.0) -> dict:
    return {"cpu": cpu, "hardware": hw, "cuda": cuda}


LOADER_HEADER = ("\n| data | decode_shares | pool threads | extra | img/s (epochs 1-2) | pool busy | host us/img | routes "
                 "| hardware host ms/batch (parse, lock, decode, table, crop) | stages ms/batch (busy, all epochs) | GIL |"
                 "\n|---|---|---:|---|---:|---:|---:|---|---|---|---|")


def loader_row(data, name: str, shares, reserve: int, extra: str, threads: int, batch: int) -> float:
    """One Loader row (backend hybrid, CUDA, RandomResizedCrop 224, no augmentation): an epoch of
    warm-up, then epochs 1-2 timed. ``shares`` None: the re-tuned default; ``reserve``:
    hybrid.ENGINE_HOST_THREADS; ``extra``: "switch 0.5 ms", "nice 10", "roi" (the hardware decoder
    decodes each box's region), "prefetch N"."""
    import sys

    from gpupipe._backends import hybrid

    default_reserve, hybrid.ENGINE_HOST_THREADS = hybrid.ENGINE_HOST_THREADS, reserve
    prefetch = int(extra.split()[1]) if extra.startswith("prefetch") else 2
    switch = sys.getswitchinterval()
    swapped = _roi_engine() if extra == "roi" else None
    try:
        loader = gpupipe.Loader(data.source, batch_size=batch, crop=gpupipe.crops.RandomResizedCrop(224),
                                device="cuda", backend="hybrid", num_threads=threads, seed=0, drop_last=True,
                                prefetch=prefetch, **({} if shares is None else {"decode_shares": shares}))
        for _ in loader:  # epoch 0: warm-up (engines, pinned buffers, the pool's threads)
            pass
        torch.cuda.synchronize()
        note = ""
        if extra.startswith("switch"):
            sys.setswitchinterval(0.0005)
        elif extra.startswith("nice"):
            note = _renice_pool(10)
        hw = loader._gpu_engines().get("hardware")
        before = dict(hw.host_seconds) if hw is not None else {}
        n, t0 = 0, time.perf_counter()
        with GilProbe() as probe:
            for epoch in (1, 2):
                loader.set_epoch(epoch)
                for images, _ in loader:
                    n += len(images)
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        st = loader.stats()  # before the reserve is put back: its pool size and utilisation are this row's
    finally:
        sys.setswitchinterval(switch)
        hybrid.ENGINE_HOST_THREADS = default_reserve
        if extra.startswith("nice"):
            _renice_pool(0)
        if swapped is not None:
            swapped()
    batches = max(st["batches"], 1)
    busy = ", ".join(f"{k} {1e3 * v / batches:.1f}" for k, v in st["busy_s"].items())
    hw_parts = ", ".join(f"{1e3 * (hw.host_seconds[k] - before[k]) / (2 * batches):.2f}" for k in before) if hw else "-"
    pool = st.get("decode_pool", {})
    label = "re-tuned (prior, then measured)" if shares is None else "/".join(f"{v:g}" for v in shares.values())
    routes = {k: v for k, v in st.get("routes", {}).items() if v}
    print(f"| {name} | {label} | {pool.get('threads')} | {extra or '-'} {note} | {n / dt:.0f} | "
          f"{pool.get('utilisation', float('nan')):.0%} | {st.get('host_us_per_image', float('nan')):.1f} | {routes} | "
          f"{hw_parts} | {busy} | {probe.summary()} |", flush=True)
    if shares is None:
        print("  shares:", st.get("shares"), "engines:", st.get("engines"))
    return n / dt


def _roi_engine():
    """Puts an ROI hardware engine in nvImageCodec's engine cache (the Loader then uses it);
    returns the function that puts the whole-image one back."""
    import os

    dev = torch.device("cuda", torch.cuda.current_device())
    key = (os.getpid(), "hardware", str(dev))
    nvimgcodec.engine("hardware", dev)
    old = nvimgcodec._engines[key]
    roi = nvimgcodec.Engine("hardware", dev, roi=True)
    roi.probe()
    nvimgcodec._engines[key] = roi

    def restore():
        nvimgcodec._engines[key] = old

    return restore


def loader_rows(path, threads: int, batch: int, tuned: str = "") -> None:
    data = open_data(str(path))
    # (shares or None for the re-tuned default, threads left to the engines' host side, extra):
    # the engines alone, splits of the two with 0/2/4 cores left to the hardware decoder's host
    # threads, then two other ways to let it have the cores it needs: a shorter GIL switch interval,
    # and the pool's threads at a lower priority (nice 10)
    variants = [(split(1, 0), 0, ""), (split(0, 1), 0, ""),
                (split(0.5, 0.5), 0, ""), (split(0.5, 0.5), 2, ""), (split(0.5, 0.5), 4, ""),
                (split(0.45, 0.55), 2, ""), (split(0.4, 0.6), 2, ""),
                (split(0.5, 0.5), 2, "switch 0.5 ms"), (split(0.5, 0.5), 0, "nice 10"), (split(0.4, 0.6), 0, "nice 10"),
                (None, 2, ""), (None, 4, "")]
    print(LOADER_HEADER)
    results = {}
    for shares, reserve, extra in variants:
        rate = loader_row(data, "800x533", shares, reserve, extra, threads, batch)
        label = "re-tuned" if shares is None else "/".join(f"{v:g}" for v in shares.values())
        results[(label, reserve, extra)] = rate
    # the threads to leave to the engines, by the even split and the re-tuned rows
    best = max((0, 2, 4), key=lambda r: max(v for (label, res, extra), v in results.items() if res == r and not extra
                                            and label in ("0.5/0.5/0", "re-tuned")))
    print(f"best ENGINE_HOST_THREADS: {best}")
    if tuned:
        with open(tuned, "w") as f:
            f.write(f"{best}\n")


def _crops_and_reference(datas: list) -> tuple:
    """(sizes, boxes, options, ref): the files' (height, width), RandomResizedCrop 224 boxes, the GPU
    engines' options and the CPU core's pixels of those boxes (dct_scaling=False, NCHW on CUDA)."""
    infos = read_infos(datas)
    sizes = np.stack([infos.column("height"), infos.column("width")], axis=1)
    boxes = gpupipe.crops.RandomResizedCrop(224).boxes(sizes[:, 0], sizes[:, 1], seed=0)
    options = DecodeOptions(size=(224, 224), resize=True, device=torch.device("cuda"))
    ref = gpupipe.decode_crop_jpegs(datas, boxes, size=(224, 224), backend="cpu", dct_scaling=False).images.cuda()
    return sizes, boxes, options, ref


def _max_mean_diff(out: torch.Tensor, ref: torch.Tensor, declined: dict) -> tuple:
    """(max, mean) |difference| of the engine's NHWC ``out`` from the CPU core's NCHW ``ref`` over
    the samples it did not decline ("-" and nan when it declined them all)."""
    keep = [k for k in range(out.shape[0]) if k not in declined]
    diff = (out[keep].permute(0, 3, 1, 2).int() - ref[keep].int()).abs()
    return (int(diff.max()), diff.float().mean().item()) if diff.numel() else ("-", float("nan"))


def roi_rates(name: str, datas: list, reps: int = 3) -> None:
    """The hardware decoder on whole images against ROI decode (each box plus ROI_MARGIN), both
    against the CPU core's pixels (dct_scaling=False): the issue's "choose by measurement"."""
    sizes, boxes, options, ref = _crops_and_reference(datas)
    out = torch.zeros(len(datas), 224, 224, 3, dtype=torch.uint8, device="cuda")
    slots = np.arange(len(datas))
    dev = torch.device("cuda", torch.cuda.current_device())
    for roi in (False, True):
        eng = nvimgcodec.Engine("hardware", dev, roi=roi)
        run = lambda: eng.decode(datas, boxes, out, slots, options, sizes=sizes)  # noqa: E731
        declined = run()
        torch.cuda.synchronize()
        worst, mean = _max_mean_diff(out, ref, declined)
        gpu = []
        for _ in range(reps):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            run()
            e.record()
            e.synchronize()
            gpu.append(s.elapsed_time(e) / 1e3)
        why = f" ({next(iter(declined.values()))[:120]})" if declined else ""
        print(f"| {name} | hardware roi={roi} | {len(datas)} | {len(datas) / statistics.median(gpu):.0f} img/s | "
              f"declined {len(declined)}{why} | max |diff| {worst}, mean {mean:.3f} |", flush=True)


def variant_rates(name: str, datas: list, calls: int = 128, reps: int = 3) -> None:
    """The hardware decoder's variants on calls of ``calls`` images: whole images or ROI, libjpeg's
    chroma upsampling (fancy) or nvJPEG's plain one (DALI's default), each against the CPU core's
    pixels (dct_scaling=False); and two engines, each on its own thread and stream, against one
    (whether the decoder idles between one thread's calls)."""
    sizes, boxes, options, ref = _crops_and_reference(datas)
    n = len(datas)
    dev = torch.device("cuda", torch.cuda.current_device())

    def wall_rate(engines: list) -> float:
        """images/s of the engines decoding all n images in calls of ``calls``, each engine on its
        own thread and stream, taking the calls in turn."""
        outs = [torch.zeros(n, 224, 224, 3, dtype=torch.uint8, device=dev) for _ in engines]
        streams = [torch.cuda.Stream(dev) for _ in engines]

        def work(k: int) -> None:
            with torch.cuda.stream(streams[k]):
                for start in range(k * calls, n, calls * len(engines)):
                    rows = np.arange(start, min(start + calls, n))
                    engines[k].decode([datas[i] for i in rows], boxes[rows], outs[k], rows, options, sizes=sizes[rows])
                streams[k].synchronize()

        rates = []
        for _ in range(reps):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            threads = [threading.Thread(target=work, args=(k,)) for k in range(len(engines))]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            rates.append(n / (time.perf_counter() - t0))
        return statistics.median(rates)

    print(f"| data | hardware decoder | calls of | img/s (host wall, all {n}) | max / mean |diff| from the CPU core |")
    print("|---|---|---:|---:|---|")
    for roi, fancy in ((False, True), (False, False), (True, True), (True, False)):
        eng = nvimgcodec.Engine("hardware", dev, roi=roi, fancy_upsampling=fancy)
        out = torch.zeros(n, 224, 224, 3, dtype=torch.uint8, device=dev)
        declined = eng.decode(datas, boxes, out, np.arange(n), options, sizes=sizes)
        torch.cuda.synchronize()
        worst, mean = _max_mean_diff(out, ref, declined)
        rate = wall_rate([eng])
        print(f"| {name} | {'ROI' if roi else 'whole'}, {'fancy' if fancy else 'plain'} chroma upsampling | {calls} | "
              f"{rate:.0f} | {worst} / {mean:.3f} (declined {len(declined)}) |", flush=True)
    for fancy in (True, False):
        engines = [nvimgcodec.Engine("hardware", dev, fancy_upsampling=fancy) for _ in range(2)]
        print(f"| {name} | two engines, two threads, whole, {'fancy' if fancy else 'plain'} | {calls} | "
              f"{wall_rate(engines):.0f} | - |", flush=True)


def cost_groups(datas: list) -> list:
    """The files by size (height, width), each size's files split at their median bytes: [(label,
    files)], so that the fit tells bytes from pixels."""
    infos = read_infos(datas)
    sizes = list(zip(infos.column("height").tolist(), infos.column("width").tolist()))
    groups = []
    for h, w in sorted(set(sizes)):
        mine = sorted((d for d, x in zip(datas, sizes) if x == (h, w)), key=len)
        half = len(mine) // 2
        for part, files in (("smaller", mine[:half]), ("larger", mine[half:])):
            if files:
                groups.append((f"{w}x{h} {part} files", files))
    return groups


def decoder_costs(groups: list, time_call, call: int = 64, reps: int = 3) -> tuple:
    """Each group's time per image: ``time_call(files)`` (seconds of one call) on calls of ``call``
    files cycled from the group, the median of ``reps``. Returns (rows, fit): rows of (label, files,
    mean MB, mean Mpx, ms per image); fit: (ms per image, ms per MB, ms per Mpx, R^2) by least
    squares over the groups."""
    rows = []
    for label, files in groups:
        batch = [files[i % len(files)] for i in range(call)]
        infos = read_infos(batch)
        mpx = float(np.mean(infos.column("height").astype(np.float64) * infos.column("width"))) * 1e-6
        mb = float(np.mean([len(d) for d in batch])) * 1e-6
        time_call(batch)  # warm
        seconds = statistics.median(time_call(batch) for _ in range(reps))
        rows.append((label, len(files), mb, mpx, 1e3 * seconds / call))
    x = np.array([[1.0, r[2], r[3]] for r in rows])
    y = np.array([r[4] for r in rows])
    coef = np.linalg.lstsq(x, y, rcond=None)[0]
    r2 = 1 - ((x @ coef - y) ** 2).sum() / max(((y - y.mean()) ** 2).sum(), 1e-30)
    return rows, (*coef.tolist(), float(r2))


def hardware_costs(files: int = 512) -> None:
    """--part costs: decoder_costs of the hardware decoder (GPU time, CUDA events) on the default
    set, 800x533 and 1920x1280 photos; the ranked split's model (hybrid_cost_estimates) is
    0.018 ms + 0.594 ms per MB."""
    from gpupipe.bench.dataset import default_set

    datas = [p.read_bytes() for p in sorted(default_set().rglob("*.jpg"))[:files]]
    for name in ("seed", "hd"):
        one = datasets.load_set(name, progress=False)
        datas += [one[i % len(one)] for i in range(64)]
    dev = torch.device("cuda", torch.cuda.current_device())
    eng = nvimgcodec.Engine("hardware", dev)
    out = torch.zeros(64, 224, 224, 3, dtype=torch.uint8, device=dev)
    options = DecodeOptions(size=(224, 224), resize=True, device=dev)

    def time_call(batch: list) -> float:
        infos = read_infos(batch)
        sizes = np.stack([infos.column("height"), infos.column("width")], axis=1)
        boxes = np.concatenate([np.zeros((len(batch), 2), np.int64), sizes], axis=1)  # whole images
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        declined = eng.decode(batch, boxes, out, np.arange(len(batch)), options, sizes=sizes)
        e.record()
        e.synchronize()
        if declined:
            raise RuntimeError(f"the hardware decoder declined {len(declined)} files: {next(iter(declined.values()))}")
        return s.elapsed_time(e) / 1e3

    rows, (a, per_mb, per_mpx, r2) = decoder_costs(cost_groups(datas), time_call)
    print("| files (calls of 64) | files | mean MB | mean Mpx | GPU ms per image |")
    print("|---|---:|---:|---:|---:|")
    for label, n, mb, mpx, ms in rows:
        print(f"| {label} | {n} | {mb:.3f} | {mpx:.3f} | {ms:.4f} |", flush=True)
    print(f"fit: {a:.4f} ms + {per_mb:.4f} ms per MB + {per_mpx:.4f} ms per Mpx (R^2 {r2:.3f}); "
          "the ranked split assumes 0.018 + 0.594 ms per MB")


def final_rows(threads: int, batch: int, files: int) -> None:
    """The last GPU call's checks: ROI against whole images on the hardware decoder, then the
    shipped default (re-tuned, ENGINE_HOST_THREADS) beside the CPU pool alone in the same run,
    with the ROI engine and a deeper prefetch as variants, on 800x533 and 1920x1280 photos."""
    augment_host_side(profile=False)
    print("| set | engine | images | rate | declined | pixels vs CPU core |\n|---|---|---:|---:|---|---|")
    for name in ("seed", "hd"):
        got = datasets.load_set(name, progress=False)
        roi_rates(name, [got[i % len(got)] for i in range(256)])
    from gpupipe._backends import hybrid

    reserve = hybrid.ENGINE_HOST_THREADS
    print(LOADER_HEADER)
    seed = open_data(str(loader_scale.folder("seed", files)))
    for shares, res, extra in ((split(1, 0), 0, ""), (None, reserve, ""), (None, reserve, "roi"),
                               (None, reserve, "prefetch 4")):
        loader_row(seed, "800x533", shares, res, extra, threads, batch)
    hd = open_data(str(loader_scale.folder("hd", 1024)))
    for shares, res, extra in ((split(1, 0), 0, ""), (None, reserve, ""), (None, reserve, "roi")):
        loader_row(hd, "1920x1280", shares, res, extra, threads, batch)


def augment_host_side(reps: int = 30, profile: bool = True) -> None:
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
    if not profile:
        return
    from torch.profiler import ProfilerActivity, profile as profiler

    with profiler(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            aug(x, params=params)
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=14, max_name_column_width=50))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--part", choices=["all", "engines", "loader", "augment", "final", "variants", "costs"],
                    default="all")
    ap.add_argument("--tuned", default="", help="file to write the best ENGINE_HOST_THREADS measured into")
    args = ap.parse_args(argv)
    print("device:", torch.cuda.get_device_name(0))
    if args.part == "final":
        final_rows(args.threads, args.batch, args.files)
        return
    if args.part == "costs":
        hardware_costs()
        return
    if args.part == "variants":  # the hardware decoder: ROI, chroma upsampling, two calls at once
        from gpupipe.bench.dataset import default_set

        for name in ("seed", "hd", "default"):
            if name == "default":
                files = sorted(p for p in default_set().rglob("*.jpg"))[:512]
                datas = [p.read_bytes() for p in files]
            else:
                one = datasets.load_set(name, progress=False)
                datas = [one[i % len(one)] for i in range(512 if name == "seed" else 256)]
            variant_rates(name, datas)
        return
    if args.part in ("all", "engines"):
        seed = datasets.load_set("seed", progress=False)
        engine_rates([seed[i % len(seed)] for i in range(512)])
    if args.part in ("all", "augment"):
        augment_host_side()
    if args.part in ("all", "loader"):
        loader_rows(loader_scale.folder("seed", args.files), args.threads, args.batch, args.tuned)


if __name__ == "__main__":
    main()
