"""The forum post's 9-op chain on 2048 x 2048 photo tiles, batch 32, to 512 x 512 float tensors:

    RandomRotation(25), RandomResizedCrop(1024, scale=(0.5, 1.5), ratio=(0.8, 1.2)), Resize(512),
    RandomHorizontalFlip, RandomVerticalFlip, ColorJitter(0.2, 0.1, 0.05, 0.02), ToTensor,
    Normalize(0.5, 0.5)

- PIL, per sample (decode, the chain as written), on 1 thread and on a pool of 2 threads;
- gpupipe: ``decode_crop_jpegs`` with ``crops.RandomResizedCrop(512, scale=(0.5, 1.5), ratio=(0.8,
  1.2))`` (ROI + DCT-scaled decode straight to 512) + ``BatchAugment`` (rotation, flips, jitter,
  normalise in one pass).

gpupipe's order differs: it crops, then rotates the 512 crop about its centre, where the chain
rotates the whole tile and crops the rotated tile (docs/semantics.md says what that changes).
Tiles: scikit-image's photos upscaled to 2048 x 2048 with film grain (real-photo entropy), encoded
locally once (q90, 4:2:0) and cached next to the other benchmark sets.
"""

from __future__ import annotations

import io
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from benchmarks import datasets
from benchmarks.harness import run_side_by_side

SPEC = datasets.SetSpec("tiles2048", 2048, 2048, 90, 4.0, 32)
JITTER = (0.2, 0.1, 0.05, 0.02)
HALF = (0.5, 0.5, 0.5)


def tiles() -> list:
    """The 32 tiles as JPEG bytes, made once and cached under the benchmark data root."""
    folder = datasets.default_root() / SPEC.name
    files = [folder / f"{i:05d}.jpg" for i in range(SPEC.count)]
    if not all(f.exists() for f in files):
        folder.mkdir(parents=True, exist_ok=True)
        photos = datasets.bundled_photos()
        for i, f in enumerate(files):
            f.write_bytes(datasets.render(SPEC, i, photos))
    return [f.read_bytes() for f in files]


def pil_chain():
    from torchvision import transforms as T

    return T.Compose([T.RandomRotation(25), T.RandomResizedCrop(1024, scale=(0.5, 1.5), ratio=(0.8, 1.2)), T.Resize(512),
                      T.RandomHorizontalFlip(), T.RandomVerticalFlip(), T.ColorJitter(*JITTER), T.ToTensor(),
                      T.Normalize(HALF, HALF)])


def gpupipe_chain(datas: list, threads: int):
    """A callable producing one augmented batch per call (a new epoch of crop boxes each call)."""
    import gpupipe
    from gpupipe import crops
    from gpupipe.augment import BatchAugment

    sampler = crops.RandomResizedCrop(512, scale=(0.5, 1.5), ratio=(0.8, 1.2))
    aug = BatchAugment(hflip=0.5, vflip=0.5, rotation=25, brightness=JITTER[0], contrast=JITTER[1],
                       saturation=JITTER[2], hue=JITTER[3], mean=HALF, std=HALF)
    sizes = np.array([gpupipe.read_header(d)[:2] for d in datas])
    epoch = iter(range(1 << 30))

    def run():
        e = next(epoch)
        boxes = sampler.boxes(sizes[:, 0], sizes[:, 1], seed=0, epoch=e)
        batch = gpupipe.decode_crop_jpegs(datas, boxes, size=512, num_threads=threads)
        return aug(batch.images, params=aug.sample_params(len(datas), seed=0, epoch=e))

    return run


def run(threads: int = 2, repeats: int = 3) -> list:
    from PIL import Image

    torch.set_num_threads(threads)
    datas = tiles()
    chain = pil_chain()

    def pil_one(data):
        return chain(Image.open(io.BytesIO(data)).convert("RGB"))

    pool = ThreadPoolExecutor(threads)
    methods = {
        "gpupipe": gpupipe_chain(datas, threads),
        f"PIL chain per sample, {threads} threads": lambda: torch.stack(list(pool.map(pil_one, datas))),
        "PIL chain per sample, 1 thread": lambda: torch.stack([pil_one(d) for d in datas]),
    }
    notes = {"gpupipe": "decode_crop_jpegs(RandomResizedCrop 512) + BatchAugment, crop then rotate",
             f"PIL chain per sample, {threads} threads": "the forum's Compose, a thread pool over samples"}
    try:
        return run_side_by_side(f"forum 9-op chain: {len(datas)} tiles 2048x2048 -> 512, {threads} threads", methods,
                                len(datas), repeats=repeats, notes=notes)
    finally:
        pool.shutdown()
