"""End to end, the seed workload: 800x533 JPEGs -> RandomCrop 256 + hflip + ColorJitter(0.4, 0.4,
0.4) + normalise -> float32 batches of 64 on the CPU, every method on the same 2 cores.

gpupipe.Loader (threads, ROI decode, fused augmentation) vs DataLoader(ImageFolder + torchvision
transforms, num_workers=2) vs a DALI CPU pipeline vs an SPDL pipeline. Each method runs two
warm-up epochs, then the timed epochs are taken round robin (one epoch of each method in turn); a
result is images/s over the timed epoch.

The pipelines are the installed bench's runners (``gpupipe.bench.run``: ``LoaderRun``,
``DataLoaderRun``, ``DaliRun``) on the seed workload's recipe, SPDL's is one more runner here, and
every epoch is timed by the bench's ``measure``: one way to time a pipeline, here and in ``python -m
gpupipe bench``.
"""

from __future__ import annotations

import gc
import os
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

from benchmarks import datasets, peers
from benchmarks.harness import Row
from gpupipe import crops
from gpupipe.augment import IMAGENET_MEAN, IMAGENET_STD, BatchAugment
from gpupipe.bench.dataset import BenchData, open_data
from gpupipe.bench.recipes import RecipeParts
from gpupipe.bench.run import DaliRun, DataLoaderRun, LoaderRun, measure, one_line

BATCH, CROP = 64, 256
CPU = torch.device("cpu")


def image_folder(n: int = 512, classes: int = 8) -> Path:
    """An ImageFolder of n seed-set images (the set's files reused under new names)."""
    files = datasets.ensure_set("seed")
    root = datasets.default_root() / f"seed-folder-{n}"
    marker = root / ".complete"
    if marker.exists():
        return root
    shutil.rmtree(root, ignore_errors=True)
    for i in range(n):
        d = root / f"class{i % classes:02d}"
        d.mkdir(parents=True, exist_ok=True)
        target = d / f"img{i:05d}.jpg"
        try:
            os.link(files[i % len(files)], target)
        except OSError:
            shutil.copy(files[i % len(files)], target)
    marker.touch()
    return root


def runner_args(threads: int, batch_size: int = BATCH, backend: str = "auto") -> SimpleNamespace:
    """What the bench's runners read of ``python -m gpupipe bench``'s arguments."""
    return SimpleNamespace(batch_size=batch_size, threads=threads, seed=0, backend=backend)


def seed_parts() -> RecipeParts:
    """The seed workload as the bench's runners take a recipe: RandomCrop 256 + flip +
    ColorJitter(0.4, 0.4, 0.4) + normalise for the Loader, torchvision's transforms (PIL) for the
    DataLoader, and DALI's operators (readers.file + image_crop + color_twist + crop_mirror_normalize)."""
    from torchvision import transforms as T

    def dali(fn, types, jpegs, decoder):
        uniform = fn.random.uniform
        images = fn.decoders.image_crop(jpegs, crop=(CROP, CROP), crop_pos_x=uniform(range=(0.0, 1.0)),
                                        crop_pos_y=uniform(range=(0.0, 1.0)), device=decoder)
        images = fn.color_twist(images, brightness=uniform(range=(0.6, 1.4)), contrast=uniform(range=(0.6, 1.4)),
                                saturation=uniform(range=(0.6, 1.4)))
        return fn.crop_mirror_normalize(images, mirror=fn.random.coin_flip(), dtype=types.FLOAT, output_layout="CHW",
                                        mean=[m * 255 for m in IMAGENET_MEAN], std=[s * 255 for s in IMAGENET_STD])

    return RecipeParts(
        crop=crops.RandomCrop(CROP),
        augment=BatchAugment(hflip=0.5, brightness=0.4, contrast=0.4, saturation=0.4, generator=0),
        torchvision=T.Compose([T.RandomCrop(CROP), T.RandomHorizontalFlip(), T.ColorJitter(0.4, 0.4, 0.4), T.ToTensor(),
                               T.Normalize(IMAGENET_MEAN, IMAGENET_STD)]),
        dali=dali)


class DaliEpochRun(DaliRun):
    """``DaliRun``, one reader epoch per ``batches()``: DALI's own prefetch (its queue depth of
    batches in flight), but none past the epoch's last batch, where ``pipe.run()`` would leave work
    running into the next method's timed epoch (round robin)."""

    def __init__(self, data: BenchData, parts: RecipeParts, args, device: torch.device, epoch: int = 0):
        super().__init__(data, parts, args, device, epoch)
        self.per_epoch = data.images // args.batch_size
        depth = self.pipe.prefetch_queue_depth
        self.depth = depth if isinstance(depth, int) else 2
        self.first = True

    def batches(self):
        p, batches = self.pipe, self.per_epoch
        if self.first:  # the first schedule_run() fills the queue: depth batches
            self.first = False
            p.schedule_run()
            inflight = self.depth
        else:
            inflight = 0
            while inflight < min(self.depth, batches):
                p.schedule_run()
                inflight += 1
        for b in range(batches):
            images, labels = p.outputs()  # releases the previous batch's buffers
            inflight -= 1
            if batches - (b + 1) - inflight > 0:
                p.schedule_run()
                inflight += 1
            yield self.to_torch(images), labels


class SpdlRun:
    """An SPDL pipeline of the seed workload: FFmpeg decode + crop per sample on threads, then the
    batch's v2 transforms; a new pipeline per epoch."""

    def __init__(self, data: BenchData, parts: RecipeParts, args, device: torch.device, epoch: int = 0):
        from torchvision.transforms import v2

        self.files = sorted(data.source.keys)
        self.threads = args.threads
        self.tf = v2.Compose([v2.RandomHorizontalFlip(), v2.ColorJitter(0.4, 0.4, 0.4),
                              v2.ToDtype(torch.float32, scale=True), v2.Normalize(IMAGENET_MEAN, IMAGENET_STD)])
        self.rng = np.random.default_rng(0)

    def _decode(self, item):
        import spdl.io

        path, x, y = item
        buf = spdl.io.load_image(path, filter_desc=f"crop={CROP}:{CROP}:{x}:{y},format=pix_fmts=rgb24")
        return spdl.io.to_torch(buf)

    def _batchify(self, frames):
        x = torch.stack(frames).reshape(len(frames), CROP, CROP, 3).permute(0, 3, 1, 2)
        return self.tf(x), None

    def batches(self):
        """Epoch after epoch; an epoch's last batch comes once its pipeline has stopped, so that the
        stop (~0.1 s) is timed with the epoch, as in a loop over it."""
        from spdl.pipeline import PipelineBuilder

        while True:
            order, rng = self.rng.permutation(len(self.files)), self.rng
            items = [(self.files[i], int(rng.integers(0, 800 - CROP + 1)), int(rng.integers(0, 533 - CROP + 1)))
                     for i in order]
            pipeline = (PipelineBuilder().add_source(items).pipe(self._decode, concurrency=self.threads,
                                                                 output_order="input")
                        .aggregate(BATCH).pipe(self._batchify).add_sink(2).build(num_threads=self.threads))
            with pipeline.auto_stop():
                it = iter(pipeline)
                last = next(it)
                for batch in it:
                    yield last
                    last = batch
            yield last

    def stats(self) -> dict:
        return {}

    def close(self):
        pass


WARMUP_ROUNDS = 2


def epochs_round_robin(rows: list, runners: list, images: int, repeats: int) -> None:
    """Fills each live row's ``times`` with epochs of its runner, each timed by the bench's
    ``measure`` (``keep_open``: one runner for all the rounds, as a training run keeps its loader):
    two untimed warm-up rounds (one epoch of each method each), then ``repeats`` timed epochs taken
    in turn (method 1, 2, ..., 1, 2, ...), so drift on a shared machine hits every method alike (as
    benchmarks.harness.run_side_by_side). A method that fails is reported, not fatal. The runners
    are closed at the end.

    Two warm-up rounds: the DataLoader forks its workers in its first epoch, after which the parent
    process pays (most likely) a copy-on-write fault for each page it first writes. With one round
    that cost fell into the next method's first timed epoch (gpupipe's first timed epoch of each loader
    row took 1.6-2.2 ms per image where its others took 0.8-1.3). Every epoch starts after a full
    ``gc.collect()`` (untimed): the main process holds ~340k objects here, so a full collection
    takes 0.1-0.2 s, and without this one the garbage a method leaves (the DataLoader's unpickled
    batches) was collected in the next method's timed epoch."""
    live = [(row, run) for row, run in zip(rows, runners) if not row.skipped]
    for r in range(WARMUP_ROUNDS + repeats):
        for row, run in live:
            if row.skipped:
                continue
            gc.collect()
            if hasattr(run, "epoch"):  # the runners that key their epoch (the Loader's): this round's
                run.epoch = r
            try:
                seconds, seen, _, _ = measure(run, warmup=0, steps=images // BATCH, step_s=0.0, device=CPU,
                                              keep_open=True)
                if seen != images:
                    raise RuntimeError(f"an epoch delivered {seen} images, not {images}")
            except Exception as e:  # a broken peer is reported, not fatal to the run
                row.skipped, row.times = f"failed: {one_line(e)}", []
                continue
            if r >= WARMUP_ROUNDS:
                row.times.append(seconds)
    for _, run in live:
        run.close()


def side_by_side(workload: str, candidates: list, data: BenchData, parts, args, repeats: int) -> list:
    """One row per ``(method, why it cannot run or None, runner class, note)``, timed by
    :func:`epochs_round_robin` over the whole data set."""
    rows, runners = [], []
    for name, reason, cls, note in candidates:
        row, run = Row(workload, name, data.images, note=note), None
        if reason:
            row.skipped = reason
        else:
            try:
                run = cls(data, parts, args, CPU)
            except Exception as e:  # a broken peer is reported, not fatal to the run
                row.skipped = f"failed: {one_line(e)}"
        rows.append(row)
        runners.append(run)
    epochs_round_robin(rows, runners, data.images, repeats)
    return rows


def run(repeats: int = 3, n: int = 512, threads: int = 2) -> list:
    data = open_data(image_folder(n))
    torch.set_num_threads(threads)
    workload = f"end-to-end loader: {n} x 800x533 -> RandomCrop {CROP} + flip + jitter + normalise, batch {BATCH}, {threads} cores"
    candidates = [
        ("gpupipe Loader", None, LoaderRun, "threads, ROI decode, fused augment"),
        (f"DataLoader ({threads} workers)", None, DataLoaderRun, "ImageFolder + torchvision transforms (PIL)"),
        ("DALI CPU", peers.unavailable("nvidia.dali"), DaliEpochRun, "readers.file + image_crop + color_twist + crop_mirror_normalize"),
        ("SPDL", peers.unavailable("spdl.io") or _spdl_ffmpeg_missing(), SpdlRun, "FFmpeg decode+crop, batch v2 transforms"),
    ]
    return side_by_side(workload, candidates, data, seed_parts(), runner_args(threads), repeats)


def recipe(repeats: int = 3, n: int = 512, threads: int = 2, name: str = "train-ta") -> list:
    """torchvision's classification reference recipe end to end (issue 14): decode + RRC 176 + flip +
    TrivialAugmentWide + normalise + RandomErasing(0.1) + MixUp(0.2)/CutMix(1.0), the gpupipe Loader
    against DataLoader(num_workers=threads) with the torchvision transforms, on the same files."""
    from gpupipe.bench import recipes

    data = open_data(image_folder(n))
    torch.set_num_threads(threads)
    workload = f"train recipe ({name}): {n} x 800x533 -> RRC 176 + flip + TrivialAugmentWide + normalise + erasing + MixUp/CutMix, batch {BATCH}, {threads} cores"
    missing = recipes.train_ta_missing()
    parts = None if missing else recipes.get(name).build(data.num_classes)
    candidates = [
        ("gpupipe Loader", missing, LoaderRun, "keyed Compose + RandomChoice(MixUp, CutMix)"),
        (f"DataLoader ({threads} workers)", missing, DataLoaderRun,
         "ImageFolder + torchvision transforms (PIL) + collate MixUp/CutMix"),
    ]
    return side_by_side(workload, candidates, data, parts, runner_args(threads), repeats)


def _spdl_ffmpeg_missing():
    try:
        import spdl.io

        spdl.io.load_image  # noqa: B018
        from spdl.io.lib import _import_libspdl  # noqa: F401

        _import_libspdl()
        return None
    except Exception as e:
        return f"SPDL's FFmpeg libraries not loadable ({type(e).__name__})"
