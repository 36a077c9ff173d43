"""The seed post's experiment, reproduced: a training loop whose "GPU step" is a fixed-cost
consumer (it sleeps, releasing the CPU, as an asynchronous GPU step does), fed by

  (a) DataLoader: full decode (PIL) + RandomCrop + per-sample transforms  (the starting point)
  (b) DataLoader with gpupipe.decode_and_crop_jpeg inside __getitem__      (the post's fix)
  (c) gpupipe.Loader with BatchAugment (batched, threads, no pickling)

Same data (800x533 JPEGs), batch 64, RandomCrop 256 + hflip + ColorJitter(0.4, 0.4, 0.4) +
normalise, 2 cores for everything. Reported like the post: seconds per training step, images/s,
and how much of the step the "GPU" waited for data.
"""

from __future__ import annotations

import time

import torch

import gpupipe
from benchmarks.harness import Row
from benchmarks.loader import BATCH, CROP, image_folder
from gpupipe.augment import IMAGENET_MEAN, IMAGENET_STD


class _CropThenTransform(torch.utils.data.Dataset):
    """(b): the custom op decodes only the crop; the per-sample tensor transforms follow."""

    def __init__(self, root):
        from torchvision.transforms import v2

        self.inner = gpupipe.data.DecodeCropDataset(gpupipe.sources.ImageFolder(root), gpupipe.crops.RandomCrop(CROP))
        self.tf = v2.Compose([v2.RandomHorizontalFlip(), v2.ColorJitter(0.4, 0.4, 0.4), v2.ToDtype(torch.float32, scale=True),
                              v2.Normalize(IMAGENET_MEAN, IMAGENET_STD)])

    def __len__(self):
        return len(self.inner)

    def __getitem__(self, i):
        img, label = self.inner[i]
        return self.tf(img.contiguous()), label


def pipelines(root, workers: int = 2):
    from torchvision import datasets as tvd
    from torchvision import transforms as T

    tf = T.Compose([T.RandomCrop(CROP), T.RandomHorizontalFlip(), T.ColorJitter(0.4, 0.4, 0.4), T.ToTensor(),
                    T.Normalize(IMAGENET_MEAN, IMAGENET_STD)])
    yield "(a) DataLoader + full decode + per-sample transforms", torch.utils.data.DataLoader(
        tvd.ImageFolder(str(root), transform=tf), batch_size=BATCH, shuffle=True, num_workers=workers, persistent_workers=True)
    yield "(b) DataLoader + decode_and_crop_jpeg in __getitem__", torch.utils.data.DataLoader(
        _CropThenTransform(root), batch_size=BATCH, shuffle=True, num_workers=workers, persistent_workers=True)
    aug = gpupipe.augment.BatchAugment(hflip=0.5, brightness=0.4, contrast=0.4, saturation=0.4)
    yield "(c) gpupipe.Loader + BatchAugment", gpupipe.Loader(
        gpupipe.sources.ImageFolder(root), batch_size=BATCH, crop=gpupipe.crops.RandomCrop(CROP), augment=aug, num_threads=workers)


def train(loader, step_s: float, steps: int) -> dict:
    """Steps of a loop whose step costs step_s; returns seconds per step and the data wait."""
    waited, done = 0.0, 0
    it = iter(loader)
    next(it)  # warm-up: workers started, buffers allocated
    t_start = time.perf_counter()
    while done < steps:
        t0 = time.perf_counter()
        try:
            images, labels = next(it)
        except StopIteration:
            it = iter(loader)
            continue
        waited += time.perf_counter() - t0
        time.sleep(step_s)  # the GPU step: forward + backward + optimizer
        done += 1
    total = time.perf_counter() - t_start
    return {"step_s": total / steps, "wait_frac": waited / total, "images_per_s": steps * BATCH / total}


def run(step_s: float = 0.1, steps: int = 12, n: int = 1024) -> tuple[list, str]:
    root = image_folder(n)
    steps = min(steps, n // BATCH - 2)  # steady state: no epoch boundary inside the measurement
    torch.set_num_threads(2)
    rows, lines = [], [f"\n### the seed's experiment: training step with a {step_s:.2f} s GPU step, batch {BATCH}, 2 cores\n",
                       "| input pipeline | s / step | images/s | GPU waiting for data |", "|---|---:|---:|---:|"]
    for name, loader in pipelines(root):
        r = train(loader, step_s, steps)
        row = Row(f"seed experiment: {step_s:.2f} s step, batch {BATCH}", name, BATCH, times=[r["step_s"]],
                  note=f"GPU waits {100 * r['wait_frac']:.0f}%")
        rows.append(row)
        lines.append(f"| {name} | {r['step_s']:.3f} | {r['images_per_s']:.0f} | {100 * r['wait_frac']:.0f}% |")
        del loader
    return rows, "\n".join(lines)


if __name__ == "__main__":
    print(run()[1])
