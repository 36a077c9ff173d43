"""Augmentation benchmarks, side by side with the peers, on the CPU (1 and 2 threads):

1. a decoded batch (64 x 3 x 256 x 256 uint8 photos, channels-last as gpupipe decodes them):
   rotation 25 (bilinear) + both flips + ColorJitter(0.4, 0.4, 0.4, 0.1) + normalise to float32;
2. the same without rotation;
3. (2 threads) the forum post's 9-op chain on 2048 x 2048 photo tiles to 512, batch 32: decode +
   RandomResizedCrop + the chain, against the same chain through PIL per sample.

The bare ``x.float().div(255).sub(mean).div(std)`` row is the floor the targets are stated against.
"""

from __future__ import annotations

import numpy as np
import torch

from benchmarks import peers
from benchmarks.harness import at_cpu_capability, run_side_by_side, wider_than_avx2
import gpupipe
from gpupipe.augment import IMAGENET_MEAN, IMAGENET_STD, BatchAugment

JITTER = (0.4, 0.4, 0.4, 0.1)


def _batch(n: int, size: int) -> torch.Tensor:
    import skimage.data
    from PIL import Image

    photo = Image.fromarray(skimage.data.astronaut())
    rng = np.random.default_rng(0)
    imgs = []
    for _ in range(n):
        s = int(rng.integers(300, 512))
        t, l = (int(v) for v in rng.integers(0, 512 - s + 1, 2))
        imgs.append(np.asarray(photo.crop((l, t, l + s, t + s)).resize((size, size))))
    return torch.from_numpy(np.stack(imgs)).permute(0, 3, 1, 2)  # channels-last memory


def _chain_methods(x: torch.Tensor, rotation: bool) -> tuple[dict, dict, dict]:
    """The chain in every implementation, on the same batch x."""
    methods, skipped, notes = {}, {}, {}
    b, c, s, h = JITTER
    geo = dict(rotation=25, interpolation="bilinear") if rotation else {}
    common = dict(hflip=0.5, vflip=0.5, brightness=b, contrast=c, saturation=s, hue=h, **geo)
    fused = BatchAugment(**common)
    linear = BatchAugment(**common, color="linear")
    methods["gpupipe fused"] = lambda: fused(x)
    notes["gpupipe fused"] = f"BatchAugment, color='torchvision', one pass per pixel, {gpupipe.cpu_capability()['active']}"
    if wider_than_avx2():
        methods["gpupipe fused, AVX2 path"] = at_cpu_capability("avx2", lambda: fused(x))
        notes["gpupipe fused, AVX2 path"] = "GPUPIPE_CPU_CAPABILITY=avx2: the kernels an AVX2-only CPU runs"
    methods["gpupipe color='linear'"] = lambda: linear(x)
    notes["gpupipe color='linear'"] = "one 3x4 matrix per sample, DALI-like"
    mean, std = torch.tensor(IMAGENET_MEAN)[None, :, None, None], torch.tensor(IMAGENET_STD)[None, :, None, None]
    methods["bare normalise"] = lambda: x.float().div(255).sub(mean).div(std)
    notes["bare normalise"] = "x.float().div(255).sub(mean).div(std), no augmentation"

    reason = peers.unavailable("kornia")
    if reason:
        skipped["Kornia"] = reason
    else:
        import kornia.augmentation as K

        ops = [K.RandomHorizontalFlip(), K.RandomVerticalFlip()]
        if rotation:
            ops.append(K.RandomRotation(25.0, resample="bilinear"))
        seq = K.AugmentationSequential(*ops, K.ColorJitter(b, c, s, h, p=1.0), K.Normalize(mean[0, :, 0, 0], std[0, :, 0, 0]))
        methods["Kornia"] = lambda: seq(x.float() / 255)
        notes["Kornia"] = "AugmentationSequential, the same ops"

    from torchvision.transforms import InterpolationMode, v2

    rot = [v2.RandomRotation(25, interpolation=InterpolationMode.BILINEAR)] if rotation else []
    tv = v2.Compose(rot + [v2.RandomHorizontalFlip(), v2.RandomVerticalFlip(), v2.ColorJitter(b, c, s, h),
                           v2.ToDtype(torch.float32, scale=True), v2.Normalize(IMAGENET_MEAN, IMAGENET_STD)])
    # per-sample tensors as a Dataset hands them over: contiguous CHW (x[i] of the channels-last batch
    # is a strided view, on which torchvision's per-sample chain without rotation ran 22% slower)
    planar = x.contiguous()
    methods["torchvision v2 per sample"] = lambda: torch.stack([tv(img) for img in planar])
    notes["torchvision v2 per sample"] = "contiguous uint8 CHW tensors, Compose per image"

    from torchvision import transforms as T

    rot1 = [T.RandomRotation(25, interpolation=InterpolationMode.BILINEAR)] if rotation else []
    pil = T.Compose([T.ToPILImage()] + rot1 + [T.RandomHorizontalFlip(), T.RandomVerticalFlip(), T.ColorJitter(b, c, s, h),
                                               T.ToTensor(), T.Normalize(IMAGENET_MEAN, IMAGENET_STD)])
    methods["PIL chain (per sample)"] = lambda: torch.stack([pil(img) for img in x])
    notes["PIL chain (per sample)"] = "ToPILImage..Normalize"
    return methods, skipped, notes


def run(threads: int, n: int = 64, size: int = 256, repeats: int = 7) -> list:
    torch.set_num_threads(threads)
    x = _batch(n, size)
    t = f"{threads} thread{'s' if threads > 1 else ''}"
    rows = []
    for rotation, label in ((True, "rotation 25 bilinear + flips + jitter(hue 0.1)"), (False, "flips + jitter(hue 0.1), no rotation")):
        methods, skipped, notes = _chain_methods(x, rotation)
        rows += run_side_by_side(f"augment {n}x3x{size}x{size} uint8 -> float32: {label}, {t}", methods, n,
                                 repeats=repeats, skipped=skipped, notes=notes)
    if threads == 2:
        from benchmarks import forum_chain

        rows += forum_chain.run(threads=2, repeats=max(3, repeats // 2))
    return rows
