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

The stand-in sleeps for the same GPU model the ranked split ranks by, so this measures how the Loader
realises the split on the CPU side; if a real decoder's time follows something else, its gain differs.
``--fit`` instead times each sample's CPU decode alone (1 thread), fits the CPU model of
``_C.hybrid_cost_estimates`` to it (and reports the shipped model's error), then simulates both
splits with those measured costs: each batch alone (the slower engine sets each batch's pace) and
pooled over the set (the engines' work adds up over an epoch).
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
from gpupipe import _C, backends, crops
from gpupipe._backends import hybrid
from gpupipe.bench.dataset import default_set
from gpupipe.decode_types import read_infos
from gpupipe.sources import ImageFolder

GPU_MS = (0.018, 0.594)  # ms per image, ms per MB: _C.hybrid_cost_estimates's GPU side


# ms per image, ms per Mpx: the H100's three hardware decoder rates fitted on pixels alone (a worse
# fit than bytes), for a stand-in whose time is not what the ranked split ranks by
PIXELS_MS = (0.0576, 0.0534)


class SimulatedHardwareDecoder:
    """Sleeps for an image's modelled time x ``scale``; declines nothing; writes no pixels. ``model``
    "bytes": GPU_MS on the file's size (what the ranked split ranks by); "pixels": PIXELS_MS on its
    height x width."""

    def __init__(self, scale: float, model: str = "bytes"):
        self.scale, self.model = scale, model

    def _seconds(self, buffers, sizes=None) -> float:
        if self.model == "pixels":
            mpx = float(np.prod(np.asarray(sizes, dtype=np.float64), axis=1).sum()) * 1e-6
            return self.scale * 1e-3 * (PIXELS_MS[0] * len(buffers) + PIXELS_MS[1] * mpx)
        mb = sum(len(b) for b in buffers) * 1e-6
        return self.scale * 1e-3 * (GPU_MS[0] * len(buffers) + GPU_MS[1] * mb)

    def decode(self, buffers, boxes, out, slots, options, *, sizes):
        time.sleep(self._seconds(buffers, sizes))
        return {}

    def decode_jobs(self, jobs):
        time.sleep(sum(self._seconds(j[0], j[5]) for j in jobs))
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


def files_and_boxes(root: Path, files: int = 512) -> tuple:
    """(datas, header infos, int64 RandomResizedCrop 224 boxes) of the set's first ``files`` files."""
    datas = [f.read_bytes() for f in sorted(root.rglob("*.jpg"))[:files]]
    infos = read_infos(datas)
    boxes, _ = crops.RandomResizedCrop(224).plan(infos.column("height"), infos.column("width"), seed=0)
    return datas, infos, np.ascontiguousarray(boxes, dtype=np.int64)


def pool_rate(root: Path, threads: int) -> float:
    """Images/s of the CPU pool alone: decode_crop_jpegs of the set's RandomResizedCrop 224 boxes."""
    datas, _, boxes = files_and_boxes(root)
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


def sample_costs(root: Path, files: int = 512) -> dict:
    """Each of the set's first ``files`` files decoded alone at its RandomResizedCrop 224 box, 1
    thread, the best of 3: {"seconds", "table", "boxes", "nbytes"}."""
    datas, infos, boxes = files_and_boxes(root, files)
    out = torch.empty((1, 224, 224, 3), dtype=torch.uint8)
    seconds = np.full(len(datas), np.inf)
    for _ in range(3):
        for i, d in enumerate(datas):
            t = time.perf_counter()
            gpupipe.decode_crop_jpegs([d], boxes[i:i + 1], size=224, out=out, num_threads=1)
            seconds[i] = min(seconds[i], time.perf_counter() - t)
    return {"seconds": seconds, "table": infos.table, "boxes": boxes,
            "nbytes": np.array([len(d) for d in datas], np.int64)}


def cpu_features(c: dict) -> np.ndarray:
    """[N, 4]: 1, above * MB, above * Mpx, the DCT-scaled crop's Mpx (the CPU model's terms)."""
    h = c["table"][:, _C.INFO_COLUMNS.index("height")].astype(np.float64)
    w = c["table"][:, _C.INFO_COLUMNS.index("width")].astype(np.float64)
    top, _, bh, bw = c["boxes"].T.astype(np.float64)
    above = (top + bh) / h
    m = np.array([_C.choose_scale_num(int(a), int(b), 224, 224) for a, b in zip(bh, bw)]) / 8.0
    return np.stack([np.ones_like(h), above * c["nbytes"] * 1e-6, above * h * w * 1e-6, bh * bw * m * m * 1e-6], 1)


def simulate(cpu_s: np.ndarray, gpu_s: np.ndarray, ratio: np.ndarray, batch: int, rng) -> tuple:
    """(keyed, ranked) images/s of a CPU pool and a GPU decoder sharing batches, each split at its
    best share: per batch (each batch's slower engine sets its pace; 300 random batches) or, with
    batch 0, pooled over the whole set."""
    n = len(cpu_s)
    picks = [np.arange(n)] if batch == 0 else [rng.choice(n, batch, replace=False) for _ in range(300)]
    coins = [rng.random(len(p)) for p in picks]
    best = {"keyed": 0.0, "ranked": 0.0}
    for f in np.linspace(0.02, 0.8, 79):
        keyed = ranked = 0.0
        for p, coin in zip(picks, coins):
            c, g = cpu_s[p], gpu_s[p]
            if batch == 0:  # pooled: the expected split, no per-batch chance
                keyed += len(p) / max(f * c.sum(), (1 - f) * g.sum())
            else:
                mine = coin < f
                keyed += len(p) / max(c[mine].sum(), g[~mine].sum())
            order = np.argsort(ratio[p], kind="stable")
            k = int(round(f * len(p)))
            ranked += len(p) / max(c[order[:k]].sum(), g[order[k:]].sum())
        best = {"keyed": max(best["keyed"], keyed / len(picks)), "ranked": max(best["ranked"], ranked / len(picks))}
    return best["keyed"], best["ranked"]


def fit(names, hardware_speed: float, pool_threads: int = 12, slowdown: float = 3.0) -> None:
    """The CPU model fitted to measured costs, and both splits simulated with them (see the module)."""
    costs = {n: sample_costs(r) for n, r in sets(names).items()}
    X = np.concatenate([cpu_features(c) for c in costs.values()])
    y = np.concatenate([c["seconds"] for c in costs.values()]) * 1e3
    coef = np.linalg.lstsq(X, y, rcond=None)[0]
    for name, pred in (("fitted here", X @ coef),
                       ("shipped", np.concatenate([_C.hybrid_cost_estimates(c["table"], c["boxes"], c["nbytes"], 224, 224,
                                                                            True)[:, 0] for c in costs.values()]))):
        rel = np.abs(pred - y) / y
        r2 = 1 - ((pred - y) ** 2).sum() / ((y - y.mean()) ** 2).sum()
        print(f"CPU model, {name}: median error {np.median(rel):.3f}, 90th percentile {np.quantile(rel, 0.9):.3f}, R^2 {r2:.3f}")
    print("coefficients fitted here (ms): 1, above * MB, above * Mpx, scaled Mpx:", np.round(coef, 3))
    print(f"\n| set | batch | keyed img/s | ranked img/s | ranked / keyed |  (simulated: {pool_threads} pool threads "
          f"{slowdown}x slower than this core, the GPU decoder {hardware_speed}x the pool)")
    rng = np.random.default_rng(0)
    for name, c in costs.items():
        est = _C.hybrid_cost_estimates(c["table"], c["boxes"], c["nbytes"], 224, 224, True)
        cpu_s = c["seconds"] * slowdown / pool_threads
        gpu_s = est[:, 1] / est[:, 1].mean() / (hardware_speed * len(cpu_s) / cpu_s.sum())
        for batch in (64, 256, 0):
            keyed, ranked = simulate(cpu_s, gpu_s, est[:, 0] / est[:, 1], batch, rng)
            print(f"| {name} | {batch or 'pooled'} | {keyed:,.0f} | {ranked:,.0f} | {ranked / keyed:.3f}x |")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sets", nargs="+", default=["default", "seed", "hd"])
    ap.add_argument("--batches", nargs="+", type=int, default=[64, 256])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=3, help="timed epochs per run (back to back, after WARM_EPOCHS)")
    ap.add_argument("--hardware-speed", type=float, default=2.8)
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--out", type=Path)
    ap.add_argument("--fit", action="store_true", help="fit the CPU model and simulate both splits instead")
    ap.add_argument("--stand-in", choices=["bytes", "pixels"], default="bytes",
                    help="what the stand-in decoder's time follows: the files' bytes (the split's own GPU model) "
                         "or their pixels (another fit of the same H100 rates)")
    a = ap.parse_args(argv)
    if a.fit:
        fit(a.sets, a.hardware_speed)
        return 0
    rows = []
    for name, root in sets(a.sets).items():
        pool = pool_rate(root, a.threads)
        per_image_ms = 1e3 / (a.hardware_speed * pool)
        if a.stand_in == "pixels":
            infos = read_infos([p.read_bytes() for p in root.rglob("*.jpg")])
            mpx = float(np.mean(infos.column("height") * infos.column("width").astype(np.float64))) * 1e-6
            scale = per_image_ms / (PIXELS_MS[0] + PIXELS_MS[1] * mpx)
        else:
            mb = np.mean([p.stat().st_size for p in root.rglob("*.jpg")]) * 1e-6
            scale = per_image_ms / (GPU_MS[0] + GPU_MS[1] * mb)
        use_simulated_engine(SimulatedHardwareDecoder(scale, a.stand_in))
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
