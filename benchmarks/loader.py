"""End to end, the seed workload: 800x533 JPEGs -> RandomCrop 256 + hflip + ColorJitter(0.4, 0.4,
0.4) + normalise -> float32 batches of 64 on the CPU, every method on the same 2 cores.

gpupipe.Loader (threads, ROI decode, fused augmentation) vs DataLoader(ImageFolder + torchvision
transforms, num_workers=2) vs a DALI CPU pipeline vs an SPDL pipeline. Each method runs two
warm-up epochs, then the timed epochs are taken round robin (one epoch of each method in turn); a
result is images/s over the timed epoch.
"""

from __future__ import annotations

import gc
import os
import shutil
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks import datasets, peers
from benchmarks.harness import Row
from gpupipe.augment import IMAGENET_MEAN, IMAGENET_STD

BATCH, CROP = 64, 256


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


def _epoch(make_iter, images: int) -> float:
    """Seconds for one epoch of ``make_iter()``, which must yield every image once."""
    t0 = time.perf_counter()
    seen = 0
    for x, _ in make_iter():
        seen += x.shape[0]
    assert seen == images, (seen, images)
    return time.perf_counter() - t0


WARMUP_ROUNDS = 2


def _epochs_round_robin(rows: list, makers: list, images: int, repeats: int) -> None:
    """Fills each live row's ``times``: two untimed warm-up rounds (one epoch of each method each),
    then ``repeats`` timed epochs taken in turn (method 1, 2, ..., 1, 2, ...), so drift on a shared
    machine hits every method alike (as benchmarks.harness.run_side_by_side). A method that fails is
    reported, not fatal.

    Two warm-up rounds: the DataLoader forks its workers in its first epoch, after which the parent
    process pays (most likely) a copy-on-write fault for each page it first writes. With one round
    that cost fell into the next method's first timed epoch (gpupipe's first timed epoch of each loader
    row took 1.6-2.2 ms per image where its others took 0.8-1.3). Every epoch starts after a full
    ``gc.collect()`` (untimed): the main process holds ~340k objects here, so a full collection
    takes 0.1-0.2 s, and without this one the garbage a method leaves (the DataLoader's unpickled
    batches) was collected in the next method's timed epoch."""
    live = [(row, make) for row, make in zip(rows, makers) if not row.skipped]
    for r in range(WARMUP_ROUNDS + repeats):
        for row, make in live:
            if row.skipped:
                continue
            gc.collect()
            try:
                seconds = _epoch(make, images)
            except Exception as e:  # a broken peer is reported, not fatal to the run
                row.skipped, row.times = f"failed: {type(e).__name__}: {e}"[:200], []
                continue
            if r >= WARMUP_ROUNDS:
                row.times.append(seconds)


def gpupipe_loader(root, threads):
    import gpupipe

    aug = gpupipe.augment.BatchAugment(hflip=0.5, brightness=0.4, contrast=0.4, saturation=0.4, generator=0)
    loader = gpupipe.Loader(gpupipe.sources.ImageFolder(root), batch_size=BATCH, crop=gpupipe.crops.RandomCrop(CROP),
                            augment=aug, num_threads=threads, seed=0)
    state = {"epoch": 0}

    def epoch():
        loader.set_epoch(state["epoch"])
        state["epoch"] += 1
        return loader

    return epoch


def torch_dataloader(root, workers):
    from torchvision import datasets as tvd
    from torchvision import transforms as T

    tf = T.Compose([T.RandomCrop(CROP), T.RandomHorizontalFlip(), T.ColorJitter(0.4, 0.4, 0.4), T.ToTensor(),
                    T.Normalize(IMAGENET_MEAN, IMAGENET_STD)])
    dl = torch.utils.data.DataLoader(tvd.ImageFolder(str(root), transform=tf), batch_size=BATCH, shuffle=True,
                                     num_workers=workers, persistent_workers=workers > 0, prefetch_factor=2 if workers else None)
    return lambda: dl


def dali_cpu(root, threads):
    import nvidia.dali.fn as fn
    import nvidia.dali.types as types
    from nvidia.dali import pipeline_def

    n = sum(1 for _ in Path(root).rglob("*.jpg"))

    @pipeline_def(batch_size=BATCH, num_threads=threads, device_id=None, exec_dynamic=True)
    def pipe():
        jpegs, labels = fn.readers.file(file_root=str(root), random_shuffle=True, name="reader")
        images = fn.decoders.image_crop(jpegs, crop=(CROP, CROP), crop_pos_x=fn.random.uniform(range=(0.0, 1.0)),
                                        crop_pos_y=fn.random.uniform(range=(0.0, 1.0)), device="cpu")
        images = fn.color_twist(images, brightness=fn.random.uniform(range=(0.6, 1.4)),
                                contrast=fn.random.uniform(range=(0.6, 1.4)), saturation=fn.random.uniform(range=(0.6, 1.4)))
        images = fn.crop_mirror_normalize(images, mirror=fn.random.coin_flip(), dtype=types.FLOAT, output_layout="CHW",
                                          mean=[m * 255 for m in IMAGENET_MEAN], std=[s * 255 for s in IMAGENET_STD])
        return images, labels

    p = pipe()
    p.build()
    batches = n // BATCH
    depth = p.prefetch_queue_depth if isinstance(p.prefetch_queue_depth, int) else 2
    state = {"first": True}

    def epoch():
        # DALI's own prefetch (depth batches in flight), but none past the epoch's last batch:
        # p.run() would leave work running into the next method's timed epoch (round robin).
        if state["first"]:  # the first schedule_run() fills the queue: depth batches
            state["first"] = False
            p.schedule_run()
            inflight = depth
        else:
            inflight = 0
            while inflight < min(depth, batches):
                p.schedule_run()
                inflight += 1
        for b in range(batches):
            images, labels = p.outputs()  # releases the previous batch's buffers
            inflight -= 1
            if batches - (b + 1) - inflight > 0:
                p.schedule_run()
                inflight += 1
            yield torch.from_numpy(np.asarray(images.as_tensor())), labels

    return epoch


def spdl_pipeline(root, threads):
    import spdl.io
    from spdl.pipeline import PipelineBuilder
    from torchvision.transforms import v2

    files = sorted(str(p) for p in Path(root).rglob("*.jpg"))
    tf = v2.Compose([v2.RandomHorizontalFlip(), v2.ColorJitter(0.4, 0.4, 0.4), v2.ToDtype(torch.float32, scale=True),
                     v2.Normalize(IMAGENET_MEAN, IMAGENET_STD)])
    rng = np.random.default_rng(0)

    def decode(item):
        path, x, y = item
        buf = spdl.io.load_image(path, filter_desc=f"crop={CROP}:{CROP}:{x}:{y},format=pix_fmts=rgb24")
        return spdl.io.to_torch(buf)

    def batchify(frames):
        x = torch.stack(frames).reshape(len(frames), CROP, CROP, 3).permute(0, 3, 1, 2)
        return tf(x), None

    def epoch():
        order = rng.permutation(len(files))
        items = [(files[i], int(rng.integers(0, 800 - CROP + 1)), int(rng.integers(0, 533 - CROP + 1))) for i in order]
        pipeline = (PipelineBuilder().add_source(items).pipe(decode, concurrency=threads, output_order="input")
                    .aggregate(BATCH).pipe(batchify).add_sink(2).build(num_threads=threads))
        with pipeline.auto_stop():
            yield from pipeline

    return epoch


def run(repeats: int = 3, n: int = 512, threads: int = 2) -> list:
    root = image_folder(n)
    torch.set_num_threads(threads)
    workload = f"end-to-end loader: {n} x 800x533 -> RandomCrop {CROP} + flip + jitter + normalise, batch {BATCH}, {threads} cores"
    rows = []
    candidates = [
        ("gpupipe Loader", None, lambda: gpupipe_loader(root, threads), "threads, ROI decode, fused augment"),
        (f"DataLoader ({threads} workers)", None, lambda: torch_dataloader(root, threads), "ImageFolder + torchvision transforms (PIL)"),
        ("DALI CPU", peers.unavailable("nvidia.dali"), lambda: dali_cpu(root, threads), "readers.file + image_crop + color_twist + crop_mirror_normalize"),
        ("SPDL", peers.unavailable("spdl.io") or _spdl_ffmpeg_missing(), lambda: spdl_pipeline(root, threads), "FFmpeg decode+crop, batch v2 transforms"),
    ]
    epochs = []
    for name, reason, make, note in candidates:
        row = Row(workload, name, n, note=note)
        epoch = None
        if reason:
            row.skipped = reason
        else:
            try:
                epoch = make()
            except Exception as e:  # a broken peer is reported, not fatal to the run
                row.skipped = f"failed: {type(e).__name__}: {e}"[:200]
        rows.append(row)
        epochs.append(epoch)
    _epochs_round_robin(rows, epochs, n, repeats)
    return rows


def recipe(repeats: int = 3, n: int = 512, threads: int = 2, name: str = "train-ta") -> list:
    """torchvision's classification reference recipe end to end (issue 14): decode + RRC 176 + flip +
    TrivialAugmentWide + normalise + RandomErasing(0.1) + MixUp(0.2)/CutMix(1.0), the gpupipe Loader
    against DataLoader(num_workers=threads) with the torchvision transforms, on the same files."""
    from gpupipe.bench import recipes

    root = image_folder(n)
    torch.set_num_threads(threads)
    workload = f"train recipe ({name}): {n} x 800x533 -> RRC 176 + flip + TrivialAugmentWide + normalise + erasing + MixUp/CutMix, batch {BATCH}, {threads} cores"
    rows = [Row(workload, "gpupipe Loader", n, note="keyed Compose + RandomChoice(MixUp, CutMix)"),
            Row(workload, f"DataLoader ({threads} workers)", n, note="ImageFolder + torchvision transforms (PIL) + collate MixUp/CutMix")]
    missing = recipes.train_ta_missing()
    if missing:
        for row in rows:
            row.skipped = missing
        return rows
    import gpupipe
    from torchvision import datasets as tvd

    classes = len([d for d in Path(root).iterdir() if d.is_dir()])
    parts = recipes.get(name).build(classes)
    loader = gpupipe.Loader(gpupipe.sources.ImageFolder(root), batch_size=BATCH, crop=parts.crop, augment=parts.augment,
                            batch_transform=parts.batch_transform, num_threads=threads, seed=0)
    state = {"epoch": 0}

    def gpupipe_epoch():
        loader.set_epoch(state["epoch"])
        state["epoch"] += 1
        return loader

    dl = torch.utils.data.DataLoader(tvd.ImageFolder(str(root), transform=parts.torchvision), batch_size=BATCH, shuffle=True,
                                     num_workers=threads, persistent_workers=True, prefetch_factor=2,
                                     collate_fn=parts.torchvision_collate)
    _epochs_round_robin(rows, [gpupipe_epoch, lambda: dl], n, repeats)
    return rows


def _spdl_ffmpeg_missing():
    try:
        import spdl.io

        spdl.io.load_image  # noqa: B018
        from spdl.io.lib import _import_libspdl  # noqa: F401

        _import_libspdl()
        return None
    except Exception as e:
        return f"SPDL's FFmpeg libraries not loadable ({type(e).__name__})"
