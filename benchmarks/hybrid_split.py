"""The hybrid backend's two splits on this host, its GPU decoder simulated: ``hybrid.SPLIT`` "keyed"
(a random share of each batch to the CPU pool) against "ranked" (each batch's samples ranked by
their estimated CPU-to-GPU cost ratio, the CPU pool taking the cheapest), through the real Loader:
its stages, its CPU pool decoding every CPU-routed crop for real, its engine thread and queue (merged
calls), its shares re-tuned between epochs.

The hardware decoder is a stand-in that sleeps (no CPU) for an H100's measured pace: its time per
image follows the file's bytes (the fit of ``_C.hybrid_cost_estimates``'s GPU side on three sets),
scaled per set so that it decodes ``--hardware-speed`` times as many images per second as the CPU
pool alone (on an H100 node the hardware decoder alone ran at 2.4-2.8x the 12-thread pool beside
it). It writes no pixels. So this measures what the split does with the CPU side's real costs and
the Loader's real scheduling; what a real hardware decoder does with it needs a GPU
(``benchmarks/device_check.sh split``).

    python -m benchmarks.hybrid_split [--sets default seed hd] [--batches 64 256] [--rounds 3] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
import torch

import gpupipe
from gpupipe import backends, crops
from gpupipe._backends import hybrid
from gpupipe.bench.dataset import default_set
from gpupipe.decode_types import read_infos
from gpupipe.sources import ImageFolder

GPU_MS = (0.018, 0.594)  # ms per image, ms per MB: _C.hybrid_cost_estimates's GPU side


class SimulatedHardwareDecoder:
    """Sleeps for an image's modelled time x ``scale``; declines nothing; writes no pixels."""

    def __init__(self, scale: float):
        self.scale = scale

    def _seconds(self, buffers) -> float:
        mb = sum(len(b) for b in buffers) * 1e-6
        return self.scale * 1e-3 * (GPU_MS[0] * len(buffers) + GPU_MS[1] * mb)

    def decode(self, buffers, boxes, out, slots, options, *, sizes):
        time.sleep(self._seconds(buffers))
        return {}

    def decode_jobs(self, jobs):
        time.sleep(sum(self._seconds(j[0]) for j in jobs))
        return [{} for _ in jobs]


def use_simulated_engine(engine: SimulatedHardwareDecoder) -> None:
    """backend="hybrid" on CPU outputs, its hardware decoder ``engine`` (as tests/test_hybrid.py's
    host_engines fixture does, without restoring: this is the benchmark's own process)."""
    hybrid.gpu_engines = lambda device: {"hardware": engine}
    hybrid.unavailable_reason = lambda device=None: None
    resolve = backends.resolve
    backends.resolve = lambda b, d: "hybrid" if b == "hybrid" else resolve(b, d)


def sets(names) -> dict:
    from benchmarks.loader_scale import folder

    return {n: default_set() if n == "default" else folder(n) for n in names}


def pool_rate(root: Path, threads: int) -> float:
    """Images/s of the CPU pool alone: decode_crop_jpegs of the set's RandomResizedCrop 224 boxes."""
    files = sorted(root.rglob("*.jpg"))[:512]
    datas = [f.read_bytes() for f in files]
    infos = read_infos(datas)
    boxes, _ = crops.RandomResizedCrop(224).plan(infos.column("height"), infos.column("width"), seed=0)
    out = torch.empty((len(datas), 224, 224, 3), dtype=torch.uint8)
    gpupipe.decode_crop_jpegs(datas, boxes, size=224, out=out, num_threads=threads)
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        gpupipe.decode_crop_jpegs(datas, boxes, size=224, out=out, num_threads=threads)
        best = min(best, time.perf_counter() - t)
    return len(datas) / best


WARM_EPOCHS = 3  # untimed: the shares settle (an epoch started ahead has its predecessor's predecessor's)


def loader_rate(root: Path, batch: int, threads: int, epochs: int) -> tuple:
    """(images/s over ``epochs`` consecutive epochs after WARM_EPOCHS, the last epoch's shares)."""
    ld = gpupipe.Loader(ImageFolder(root), batch_size=batch, backend="hybrid", num_threads=threads,
                        crop=crops.RandomResizedCrop(224), seed=0)
    n, t = 0, 0.0
    for e in range(WARM_EPOCHS + epochs):
        if e == WARM_EPOCHS:
            t = time.perf_counter()
        ld.set_epoch(e)
        for x, _ in ld:
            n += x.shape[0] if e >= WARM_EPOCHS else 0
    return n / (time.perf_counter() - t), ld.stats()["shares"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sets", nargs="+", default=["default", "seed", "hd"])
    ap.add_argument("--batches", nargs="+", type=int, default=[64, 256])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=3, help="timed epochs per run (back to back, after WARM_EPOCHS)")
    ap.add_argument("--hardware-speed", type=float, default=2.8)
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    rows = []
    for name, root in sets(a.sets).items():
        pool = pool_rate(root, a.threads)
        mb = np.mean([p.stat().st_size for p in root.rglob("*.jpg")]) * 1e-6
        per_image_ms = 1e3 / (a.hardware_speed * pool)
        scale = per_image_ms / (GPU_MS[0] + GPU_MS[1] * mb)
        use_simulated_engine(SimulatedHardwareDecoder(scale))
        for batch in a.batches:
            got = {"keyed": [], "ranked": []}
            shares = {}
            for _ in range(a.rounds):  # interleaved: this host's pace drifts
                for split in got:
                    hybrid.SPLIT = split
                    rate, shares[split] = loader_rate(root, batch, a.threads, a.epochs)
                    got[split].append(rate)
            keyed, ranked = float(np.median(got["keyed"])), float(np.median(got["ranked"]))
            rows.append({"set": name, "batch": batch, "pool_alone": pool, "hardware_alone": a.hardware_speed * pool,
                         "keyed": keyed, "ranked": ranked, "ratio": ranked / keyed, "runs": got,
                         "cpu_share": {k: v["cpu"] for k, v in shares.items()}})
            r = rows[-1]
            print(f"| {name} | {batch} | {pool:,.0f} | {r['hardware_alone']:,.0f} | {keyed:,.0f} | {ranked:,.0f} | "
                  f"{r['ratio']:.2f}x | {r['cpu_share']['keyed']:.2f} / {r['cpu_share']['ranked']:.2f} |", flush=True)
    if a.out:
        a.out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(a).items()}, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
