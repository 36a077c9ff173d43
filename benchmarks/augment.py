"""Augmentation of a decoded batch (64 x 3 x 256 x 256 uint8, channels-last as gpupipe decodes it),
flip + ColorJitter(0.4, 0.4, 0.4, hue) + normalise to float32, on the CPU with 1 and 2 threads."""

from __future__ import annotations

import numpy as np
import torch

from benchmarks import peers
from benchmarks.harness import run_side_by_side
from gpupipe.augment import IMAGENET_MEAN, IMAGENET_STD, BatchAugment


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


def run(threads: int, n: int = 64, size: int = 256, repeats: int = 7) -> list:
    torch.set_num_threads(threads)
    x = _batch(n, size)
    methods, skipped, notes = {}, {}, {}
    jitter = dict(brightness=0.4, contrast=0.4, saturation=0.4)

    fused = BatchAugment(hflip=0.5, hue=0.1, **jitter, generator=0)
    methods["gpupipe fused"] = lambda: fused(x)
    notes["gpupipe fused"] = "hue 0.1, one pass"
    kengine = BatchAugment(hflip=0.5, hue=0.1, **jitter, engine="kornia", generator=0)
    methods["gpupipe kornia engine"] = lambda: kengine(x)

    m = torch.tensor(IMAGENET_MEAN)[None, :, None, None] * 255
    s = 1 / (torch.tensor(IMAGENET_STD)[None, :, None, None] * 255)
    methods["bare uint8->float normalise"] = lambda: x.float().sub_(m).mul_(s)
    notes["bare uint8->float normalise"] = "x.float().sub_(mean).mul_(1/std), no augmentation"

    reason = peers.unavailable("kornia")
    if reason:
        skipped["Kornia"] = skipped["Kornia no hue"] = reason
    else:
        import kornia.augmentation as K

        mean, std = torch.tensor(IMAGENET_MEAN), torch.tensor(IMAGENET_STD)
        with_hue = K.AugmentationSequential(K.RandomHorizontalFlip(), K.ColorJitter(0.4, 0.4, 0.4, 0.1, p=1.0), K.Normalize(mean, std))
        no_hue = K.AugmentationSequential(K.RandomHorizontalFlip(), K.ColorJitter(0.4, 0.4, 0.4, 0.0, p=1.0), K.Normalize(mean, std))
        methods["Kornia"] = lambda: with_hue(x.float() / 255)
        notes["Kornia"] = "AugmentationSequential, hue 0.1"
        methods["Kornia no hue"] = lambda: no_hue(x.float() / 255)

    from torchvision.transforms import v2

    tv = v2.Compose([v2.RandomHorizontalFlip(), v2.ColorJitter(0.4, 0.4, 0.4, 0.1), v2.ToDtype(torch.float32, scale=True),
                     v2.Normalize(IMAGENET_MEAN, IMAGENET_STD)])
    methods["torchvision v2 (batch)"] = lambda: tv(x)
    notes["torchvision v2 (batch)"] = "one parameter set per batch"

    from torchvision import transforms as T

    pil_chain = T.Compose([T.ToPILImage(), T.RandomHorizontalFlip(), T.ColorJitter(0.4, 0.4, 0.4, 0.1), T.ToTensor(),
                           T.Normalize(IMAGENET_MEAN, IMAGENET_STD)])
    methods["PIL chain (per sample)"] = lambda: torch.stack([pil_chain(img) for img in x])
    notes["PIL chain (per sample)"] = "ToPILImage..Normalize, the seed's"
    return run_side_by_side(f"augment {n}x3x{size}x{size} uint8 -> float32, {threads} thread{'s' if threads > 1 else ''}",
                            methods, n, repeats=repeats, skipped=skipped, notes=notes)
