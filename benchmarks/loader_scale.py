"""The Loader against its own decode: ``gpupipe.Loader`` (read, plan, decode, collect stages; CPU
outputs, RandomResizedCrop 224, no augmentation) beside ``decode_crop_jpegs`` on the same files
already in memory, with the same boxes and threads, into one reused buffer: the Loader's ceiling.
Both are the installed bench's runners (``gpupipe.bench.run``), timed the same way.

Sets of 1024 files (a set's images reused under new names): 160x120, 400x300, 800x533 ("seed") and
1920x1280 ("hd"); batch 64 and 256; threads = the cores. Each timing is three epochs' batches
after the first, back to back; the Loader's rounds run back to back too, each epoch taking the one
its predecessor started ahead (``lookahead``, as in a training run), then the raw decode's. The
row's note carries the Loader's host CPU time per image outside the decode pool and the pool's
utilisation, over the last epoch (the process's decode thread-seconds from its first request to its
last batch).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np

from benchmarks import datasets
from benchmarks.harness import Row
from benchmarks.loader import CPU, runner_args
from gpupipe import crops
from gpupipe.bench.dataset import bundled_photos, encode_pillow, open_data, photo_crop
from gpupipe.bench.recipes import RecipeParts
from gpupipe.bench.run import LoaderRun, RawDecodeRun, measure

FILES = 1024
EPOCHS = 3  # timed in a round
SMALL = {"160x120": (160, 120), "400x300": (400, 300)}


def folder(name: str, n: int = FILES) -> Path:
    """An ImageFolder of n files: a small set rendered here (64 images), or an embedded set, reused."""
    root = datasets.default_root() / f"scale-{name}-{n}"
    if (root / ".complete").exists():
        return root
    shutil.rmtree(root, ignore_errors=True)
    if name in SMALL:
        w, h = SMALL[name]
        photos = bundled_photos()
        src = root / "_images"
        src.mkdir(parents=True)
        files = []
        for i in range(64):
            f = src / f"{i:03d}.jpg"
            f.write_bytes(encode_pillow(photo_crop(photos[i % len(photos)], w, h, np.random.default_rng(i)), 90))
            files.append(f)
    else:
        files = datasets.ensure_set(name)
    for i in range(n):
        d = root / f"class{i % 8}"
        d.mkdir(parents=True, exist_ok=True)
        try:
            os.link(files[i % len(files)], d / f"{i:05d}.jpg")
        except OSError:
            shutil.copy(files[i % len(files)], d / f"{i:05d}.jpg")
    (root / ".complete").touch()
    return root


def run(repeats: int = 3, names=("160x120", "400x300", "seed", "hd"), batches=(64, 256)) -> list[Row]:
    threads = len(os.sched_getaffinity(0))
    parts = RecipeParts(crop=crops.RandomResizedCrop(224), augment=None, batch_transform=None, torchvision=None,
                        torchvision_collate=None, dali=None, notes=[])
    rows = []
    for name in names:
        data = open_data(folder(name))
        label = f"loader vs its decode, {name}" if name in SMALL else \
            f"loader vs its decode, {name} {datasets.SETS[name].width}x{datasets.SETS[name].height}"
        for bs in batches:
            args = runner_args(threads, bs, backend="cpu")
            # EPOCHS epochs a round, back to back (a timed epoch alone would count the work its predecessor
            # did for it ahead, or the work it does for its successor): the first batch untimed
            steps = EPOCHS * FILES // bs - 1
            loader_row = Row(f"{label}, batch {bs}, {threads} threads", "gpupipe", steps * bs,
                             note="gpupipe.Loader: files read, RandomResizedCrop 224, decoded; no augment")
            raw_row = Row(loader_row.workload, "raw decode_crop_jpegs", steps * bs,
                          note="the same bytes in memory, same boxes and threads, one reused buffer")
            host, util = [], []
            # One runner of each for all the rounds, as a training run keeps one Loader: its buffers are
            # made in the first round (untimed) and reused after, as over a real run's thousands of
            # batches. The Loader's rounds run back to back, each epoch taking the one its predecessor
            # started ahead (lookahead: its steady state), then the raw decode's: none runs while the
            # other is timed.
            runners = ((loader_row, LoaderRun(data, parts, args, CPU, keep_ahead=True)),
                       (raw_row, RawDecodeRun(data, parts, args, CPU)))
            for row, runner in runners:
                if runner is runners[1][1]:  # the Loader's epoch ahead never runs while the raw decode is timed
                    runners[0][1].loader._drop_ahead()
                for rep in range(repeats + 1):
                    runner.epoch = rep * EPOCHS
                    seconds, images, _, stats = measure(runner, warmup=1, steps=steps, step_s=0.0, device=CPU,
                                                        keep_open=True)
                    if rep:
                        row.times.append(seconds * (steps * bs) / images)
                        if runner is runners[0][1]:
                            host.append(stats["host_us_per_image"])
                            util.append(stats["decode_pool"]["utilisation"])
            for _, runner in runners:
                runner.close()
            loader_row.note += (f"; host CPU outside the pool {np.median(host):.1f} us/image, decode pool busy "
                                f"{100 * np.median(util):.0f}%")
            rows += [loader_row, raw_row]
    return rows
