"""torchvision's recipe augmentations on a decoded batch (64 x 3 x 224 x 224 uint8 photos,
channels-last as gpupipe decodes them), 1 thread: TrivialAugmentWide, RandAugment(2, 9),
AutoAugment(imagenet) through gpupipe vs torchvision v2 per sample (the loop a user writes today),
torchvision v2 on the whole batch (one parameter set per batch, for reference) and Kornia's
``augmentation.auto`` equivalents; then RandomErasing on the normalised float batch and MixUp /
CutMix vs torchvision v2."""

from __future__ import annotations

import torch

from benchmarks import peers
from benchmarks.augment import _batch
from benchmarks.harness import at_cpu_capability, run_side_by_side, wider_than_avx2
import gpupipe
from gpupipe import augment


def _policy_rows(name: str, ours, tv, kornia_module, x: torch.Tensor, repeats: int) -> list:
    methods, skipped, notes = {}, {}, {}
    methods["gpupipe"] = lambda: ours(x)
    notes["gpupipe"] = f"per-sample ops and magnitudes, one kernel call, {gpupipe.cpu_capability()['active']}"
    if wider_than_avx2():
        methods["gpupipe, AVX2 path"] = at_cpu_capability("avx2", lambda: ours(x))
        notes["gpupipe, AVX2 path"] = "GPUPIPE_CPU_CAPABILITY=avx2: the kernels an AVX2-only CPU runs"
    planar = x.contiguous()  # per-sample tensors as a Dataset hands them over: contiguous CHW
    methods["torchvision v2 (per sample)"] = lambda: torch.stack([tv(img) for img in planar])
    methods["torchvision v2 (batch)"] = lambda: tv(x)
    notes["torchvision v2 (batch)"] = "one op and magnitude for the whole batch"
    if kornia_module is None:
        skipped["Kornia"] = peers.unavailable("kornia") or "no equivalent"
    else:
        methods["Kornia"] = lambda: kornia_module(x.float().div_(255))
        notes["Kornia"] = "augmentation.auto on float [0, 1], per-sample ops"
    n, _, h, w = x.shape
    return run_side_by_side(f"{name} {n}x3x{h}x{w} uint8, 1 thread", methods, n, repeats=repeats, skipped=skipped,
                            notes=notes)


def _kornia(kind: str):
    if peers.unavailable("kornia"):
        return None
    from kornia.augmentation import auto

    return {"trivial": lambda: auto.TrivialAugment(), "rand": lambda: auto.RandAugment(n=2, m=9),
            "auto": lambda: auto.AutoAugment("imagenet")}[kind]()


def run(n: int = 64, size: int = 224, repeats: int = 7) -> list:
    from torchvision.transforms import v2

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        x = _batch(n, size)
        rows = []
        rows += _policy_rows("TrivialAugmentWide", augment.TrivialAugmentWide(generator=0), v2.TrivialAugmentWide(),
                             _kornia("trivial"), x, repeats)
        rows += _policy_rows("RandAugment(2, 9)", augment.RandAugment(generator=0), v2.RandAugment(), _kornia("rand"),
                             x, repeats)
        rows += _policy_rows("AutoAugment(imagenet)", augment.AutoAugment(generator=0), v2.AutoAugment(),
                             _kornia("auto"), x, repeats)
        rows += _erasing_rows(x, repeats)
        rows += _mix_rows(x, repeats)
        return rows
    finally:
        torch.set_num_threads(threads)


def _normalised(x: torch.Tensor) -> torch.Tensor:
    mean = torch.tensor(augment.IMAGENET_MEAN)[None, :, None, None] * 255
    std = torch.tensor(augment.IMAGENET_STD)[None, :, None, None] * 255
    return x.float().sub_(mean).div_(std).contiguous()


def _erasing_rows(x: torch.Tensor, repeats: int) -> list:
    from torchvision.transforms import v2

    f = _normalised(x)
    n, _, h, w = f.shape
    ours = augment.RandomErasing(p=0.5, generator=0)
    tv = v2.RandomErasing(p=0.5)
    methods = {"gpupipe": lambda: ours(f), "torchvision v2 (per sample)": lambda: torch.stack([tv(img) for img in f]),
               "torchvision v2 (batch)": lambda: tv(f)}
    notes = {"gpupipe": "a box per sample, one kernel call", "torchvision v2 (batch)": "one box for the whole batch"}
    rows = run_side_by_side(f"RandomErasing(0.5) {n}x3x{h}x{w} float32, 1 thread", methods, n, repeats=repeats,
                            notes=notes)
    ours_inplace = augment.RandomErasing(p=0.5, inplace=True, generator=0)
    tv_inplace = v2.RandomErasing(p=0.5, inplace=True)
    methods = {"gpupipe": lambda: ours_inplace(f), "torchvision v2 (per sample)": lambda: [tv_inplace(img) for img in f]}
    return rows + run_side_by_side(f"RandomErasing(0.5, inplace=True) {n}x3x{h}x{w} float32, 1 thread", methods, n,
                                   repeats=repeats)


def _mix_rows(x: torch.Tensor, repeats: int) -> list:
    from torchvision.transforms import v2

    f = _normalised(x)
    n, _, h, w = f.shape
    labels = torch.arange(n) % 1000
    rows = []
    for name, ours, tv in (("MixUp(0.2)", augment.MixUp(0.2, num_classes=1000, generator=0),
                            v2.MixUp(alpha=0.2, num_classes=1000)),
                           ("CutMix(1.0)", augment.CutMix(1.0, num_classes=1000, generator=0),
                            v2.CutMix(alpha=1.0, num_classes=1000))):
        methods = {"gpupipe": lambda ours=ours: ours(f, labels), "torchvision v2": lambda tv=tv: tv(f, labels)}
        rows += run_side_by_side(f"{name} {n}x3x{h}x{w} float32 + 1000 classes, 1 thread", methods, n,
                                 repeats=repeats)
    return rows


if __name__ == "__main__":
    from benchmarks.harness import table

    print(table(run(repeats=3), "gpupipe"))
