"""The seed post's experiment, reproduced: a training loop whose "GPU step" is a fixed-cost
consumer (it sleeps, releasing the CPU, as an asynchronous GPU step does), fed by

  (a) DataLoader: full decode (PIL) + RandomCrop + per-sample transforms  (the starting point)
  (b) DataLoader with gpupipe.decode_and_crop_jpeg inside __getitem__      (the post's fix)
  (c) gpupipe.Loader with BatchAugment (batched, threads, no pickling)

Same data (800x533 JPEGs), batch 64, RandomCrop 256 + hflip + ColorJitter(0.4, 0.4, 0.4) +
normalise, 2 cores for everything. Reported like the post: seconds per training step, images/s,
and how much of the step the "GPU" waited for data. Each pipeline is one of the installed bench's
runners (``gpupipe.bench.run``), timed by its ``measure`` with the step as its ``step_s``.
"""

from __future__ import annotations

import torch

import gpupipe
from benchmarks.harness import Row
from benchmarks.loader import BATCH, CPU, CROP, image_folder, runner_args, seed_parts
from gpupipe.augment import IMAGENET_MEAN, IMAGENET_STD
from gpupipe.bench.dataset import open_data
from gpupipe.bench.run import DataLoaderRun, LoaderRun, measure


class _CropThenTransform(torch.utils.data.Dataset):
    """(b): the custom op decodes only the crop; the per-sample tensor transforms follow."""

    def __init__(self, source):
        from torchvision.transforms import v2

        self.inner = gpupipe.data.DecodeCropDataset(source, gpupipe.crops.RandomCrop(CROP))
        self.tf = v2.Compose([v2.RandomHorizontalFlip(), v2.ColorJitter(0.4, 0.4, 0.4), v2.ToDtype(torch.float32, scale=True),
                              v2.Normalize(IMAGENET_MEAN, IMAGENET_STD)])

    def __len__(self):
        return len(self.inner)

    def __getitem__(self, i):
        img, label = self.inner[i]
        return self.tf(img.contiguous()), label


class CropInGetItemRun(DataLoaderRun):
    """(b): the bench's DataLoader runner over :class:`_CropThenTransform`."""

    @staticmethod
    def dataset(data, parts, args):
        return _CropThenTransform(data.source)


PIPELINES = (("(a) DataLoader + full decode + per-sample transforms", DataLoaderRun),
             ("(b) DataLoader + decode_and_crop_jpeg in __getitem__", CropInGetItemRun),
             ("(c) gpupipe.Loader + BatchAugment", LoaderRun))


def train(run, step_s: float, steps: int) -> dict:
    """Steps of a loop whose step costs step_s, after one warm-up batch (workers started, buffers
    allocated); returns seconds per step and the data wait."""
    seconds, images, waited, _ = measure(run, warmup=1, steps=steps, step_s=step_s, device=CPU)
    return {"step_s": seconds / steps, "wait_frac": waited / seconds, "images_per_s": images / seconds}


def run(step_s: float = 0.1, steps: int = 12, n: int = 1024) -> tuple[list, str]:
    data = open_data(image_folder(n))
    steps = min(steps, n // BATCH - 2)  # steady state: no epoch boundary inside the measurement
    torch.set_num_threads(2)
    parts, args = seed_parts(), runner_args(threads=2)
    rows, lines = [], [f"\n### the seed's experiment: training step with a {step_s:.2f} s GPU step, batch {BATCH}, 2 cores\n",
                       "| input pipeline | s / step | images/s | GPU waiting for data |", "|---|---:|---:|---:|"]
    for name, cls in PIPELINES:
        r = train(cls(data, parts, args, CPU), step_s, steps)
        row = Row(f"seed experiment: {step_s:.2f} s step, batch {BATCH}", name, BATCH, times=[r["step_s"]],
                  note=f"GPU waits {100 * r['wait_frac']:.0f}%")
        rows.append(row)
        lines.append(f"| {name} | {r['step_s']:.3f} | {r['images_per_s']:.0f} | {100 * r['wait_frac']:.0f}% |")
    return rows, "\n".join(lines)


if __name__ == "__main__":
    print(run()[1])
