"""The recipes a benchmark compares, one function each, in a small registry.

A recipe function takes the data set's number of classes and returns :class:`RecipeParts`: the
gpupipe :class:`~gpupipe.Loader` pieces (crop sampler, ``augment`` module, ``batch_transform``),
the torchvision transform (PIL, per sample) that ``torch.utils.data.DataLoader`` runs for the same
recipe, and, where DALI has the operators, the same recipe as a DALI graph. ``notes`` says where the
three differ. A new recipe is one decorated function here.

Example:
    >>> from gpupipe.bench import recipes
    >>> "train" in recipes.available()
    True
    >>> parts = recipes.get("eval").build(1000)
    >>> parts.crop.size
    (224, 224)
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

import gpupipe
from gpupipe import crops
from gpupipe.augment import IMAGENET_MEAN, IMAGENET_STD, BatchAugment


@dataclass
class RecipeParts:
    """What each pipeline runs for one recipe.

    Attributes:
        crop: the Loader's crop sampler; its ``size`` is the output (height, width).
        augment: the Loader's ``augment`` module (uint8 ``[N, 3, H, W]`` in, normalised float out).
        batch_transform: the Loader's ``batch_transform`` ((images, labels) -> (images, soft labels)),
            or None.
        torchvision: the DataLoader's per-sample transform, PIL RGB image -> ``[3, H, W]`` (float;
            uint8 for recipes without augmentation, as the Loader's batches then are).
        torchvision_collate: the DataLoader's ``collate_fn`` (None: the default one).
        dali: ``dali(fn, types, jpegs, decoder_device) -> images`` builds the recipe in a DALI
            pipeline (``decoder_device`` is ``"cpu"`` or ``"mixed"``), or None when DALI lacks an op.
        notes: where the pipelines differ from the torchvision original.
        dali_notes: where the DALI pipeline differs (reported only where it ran).
    """

    crop: crops.CropSampler
    augment: Optional[torch.nn.Module]
    torchvision: Callable
    batch_transform: Optional[Callable] = None
    torchvision_collate: Optional[Callable] = None
    dali: Optional[Callable] = None
    notes: list = field(default_factory=list)
    dali_notes: list = field(default_factory=list)


@dataclass(frozen=True)
class Recipe:
    name: str
    summary: str
    build: Callable[[int], RecipeParts]  # num_classes -> parts
    missing: Callable[[], Optional[str]]  # why it cannot run with this gpupipe, None when it can


RECIPES: dict = {}


def recipe(name: str, summary: str, missing: Callable[[], Optional[str]] = lambda: None):
    """Registers ``fn(num_classes) -> RecipeParts`` under ``name``."""

    def register(fn):
        RECIPES[name] = Recipe(name, summary, fn, missing)
        return fn

    return register


def available() -> list:
    """Names of the recipes this gpupipe can run, in registration order."""
    return [name for name, r in RECIPES.items() if r.missing() is None]


def get(name: str) -> Recipe:
    if name not in RECIPES:
        raise ValueError(f"unknown recipe {name!r}; known: {', '.join(RECIPES)}")
    reason = RECIPES[name].missing()
    if reason:
        raise ValueError(f"recipe {name!r} is not available: {reason}")
    return RECIPES[name]


def _torchvision_transforms():
    try:
        import torchvision.transforms as T
    except ImportError as e:
        raise ValueError("the DataLoader side runs torchvision's transforms: pip install torchvision "
                         "(or 'torch-gpupipe[bench]')") from e
    return T


def _dali_normalize(fn, types, images, mean, std, **kwargs):
    return fn.crop_mirror_normalize(images, dtype=types.FLOAT, output_layout="CHW", mean=[m * 255 for m in mean],
                                    std=[s * 255 for s in std], **kwargs)


DALI_DECODER_ARGS: dict = {}  #: more arguments of DALI's decoder (e.g. hw_decoder_load), for experiments


def _dali_random_resized_crop(fn, types, jpegs, decoder, size: int):
    """DALI's RandomResizedCrop: torchvision's area and aspect ranges, decoded as the crop, then an
    antialiased linear resize."""
    images = fn.decoders.image_random_crop(jpegs, device=decoder, output_type=types.RGB, random_area=[0.08, 1.0],
                                           random_aspect_ratio=[3 / 4, 4 / 3], num_attempts=10,
                                           **DALI_DECODER_ARGS)
    return fn.resize(images, resize_x=size, resize_y=size, antialias=True, interp_type=types.INTERP_LINEAR)


# --- train: torchvision's classic reference recipe -------------------------------------------------


@recipe("train", "RandomResizedCrop 224 + flip + ColorJitter(0.4, 0.4, 0.4) + normalise (torchvision's reference)")
def train(num_classes: int) -> RecipeParts:
    T = _torchvision_transforms()

    def dali(fn, types, jpegs, decoder):
        images = _dali_random_resized_crop(fn, types, jpegs, decoder, 224)
        jitter = [fn.random.uniform(range=(0.6, 1.4)) for _ in range(3)]
        images = fn.color_twist(images, brightness=jitter[0], contrast=jitter[1], saturation=jitter[2])
        return _dali_normalize(fn, types, images, IMAGENET_MEAN, IMAGENET_STD, mirror=fn.random.coin_flip())

    return RecipeParts(
        crop=crops.RandomResizedCrop(224),
        augment=BatchAugment(hflip=0.5, brightness=0.4, contrast=0.4, saturation=0.4, generator=0),
        torchvision=T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ColorJitter(0.4, 0.4, 0.4),
                               T.ToTensor(), T.Normalize(IMAGENET_MEAN, IMAGENET_STD)]),
        dali=dali,
        dali_notes=["DALI applies the color jitter as one color matrix per sample, without torchvision's clamps "
                    "between the ops or its random op order; gpupipe follows torchvision's (docs/semantics.md)"],
    )


# --- crop: the decode path alone ------------------------------------------------------------------


@recipe("crop", "RandomResizedCrop 224 only, uint8 out (the decode path without augmentation)")
def crop_only(num_classes: int) -> RecipeParts:
    T = _torchvision_transforms()

    def dali(fn, types, jpegs, decoder):
        images = _dali_random_resized_crop(fn, types, jpegs, decoder, 224)
        return fn.transpose(images, perm=[2, 0, 1])  # uint8 CHW, as the Loader's batches

    return RecipeParts(crop=crops.RandomResizedCrop(224), augment=None,
                       torchvision=T.Compose([T.RandomResizedCrop(224), T.PILToTensor()]), dali=dali)


# --- eval: Resize(256) + CenterCrop(224) -----------------------------------------------------------


@recipe("eval", "Resize(256) + CenterCrop(224) + normalise (torchvision's evaluation)")
def eval_(num_classes: int) -> RecipeParts:
    T = _torchvision_transforms()
    crop = crops.ResizeCenterCrop(224, 256)  # bit-identical to torchvision's PIL path (dct_scaling=False)
    notes = []

    def dali(fn, types, jpegs, decoder):
        images = fn.decoders.image(jpegs, device=decoder, output_type=types.RGB)
        images = fn.resize(images, resize_shorter=256, antialias=True, interp_type=types.INTERP_LINEAR)
        return _dali_normalize(fn, types, images, IMAGENET_MEAN, IMAGENET_STD, crop=(224, 224))

    return RecipeParts(
        crop=crop,
        augment=BatchAugment(hflip=0.0).eval(),  # eval(): converts and normalises only
        torchvision=T.Compose([T.Resize(256), T.CenterCrop(224), T.ToTensor(), T.Normalize(IMAGENET_MEAN, IMAGENET_STD)]),
        dali=dali,
        notes=notes,
    )


# --- forum: the PyTorch-forum post's 9-op chain (docs/migrating.md) --------------------------------


@recipe("forum", "the forum post's chain: RandomRotation(25), RandomResizedCrop(1024, scale=(0.5, 1.5), "
                 "ratio=(0.8, 1.2)), Resize(512), both flips, ColorJitter(0.2, 0.1, 0.05, 0.02), Normalize(0.5, 0.5)")
def forum(num_classes: int) -> RecipeParts:
    T = _torchvision_transforms()
    half = (0.5, 0.5, 0.5)

    def dali(fn, types, jpegs, decoder):
        images = fn.decoders.image(jpegs, device=decoder, output_type=types.RGB)
        images = fn.rotate(images, angle=fn.random.uniform(range=(-25.0, 25.0)), keep_size=True, fill_value=0,
                           interp_type=types.INTERP_NN)
        images = fn.random_resized_crop(images, size=(512, 512), random_area=(0.5, 1.0), random_aspect_ratio=(0.8, 1.2),
                                        antialias=True)
        images = fn.flip(images, horizontal=fn.random.coin_flip(), vertical=fn.random.coin_flip())
        images = fn.color_twist(images, brightness=fn.random.uniform(range=(0.8, 1.2)),
                                contrast=fn.random.uniform(range=(0.9, 1.1)),
                                saturation=fn.random.uniform(range=(0.95, 1.05)),
                                hue=fn.random.uniform(range=(-7.2, 7.2)))  # degrees: 0.02 turn
        return _dali_normalize(fn, types, images, half, half)

    return RecipeParts(
        crop=crops.RandomResizedCrop(512, scale=(0.5, 1.5), ratio=(0.8, 1.2)),
        augment=BatchAugment(hflip=0.5, vflip=0.5, rotation=25, brightness=0.2, contrast=0.1, saturation=0.05,
                             hue=0.02, mean=half, std=half, generator=0),
        torchvision=T.Compose([T.RandomRotation(25), T.RandomResizedCrop(1024, scale=(0.5, 1.5), ratio=(0.8, 1.2)),
                               T.Resize(512), T.RandomHorizontalFlip(), T.RandomVerticalFlip(),
                               T.ColorJitter(0.2, 0.1, 0.05, 0.02), T.ToTensor(), T.Normalize(half, half)]),
        dali=dali,
        notes=["gpupipe decodes the crop straight to 512 (no 1024 intermediate) and rotates the 512 crop "
               "(bilinear), where the chain rotates the whole image first (nearest)"],
        dali_notes=["DALI: random_resized_crop's area is capped at 1 (the chain's scale goes to 1.5)"],
    )


# --- train-ta: torchvision's current reference recipe (once gpupipe has its ops) --------------------

TA_OPS = ("TrivialAugmentWide", "RandomErasing", "MixUp", "CutMix", "RandomChoice")


def train_ta_missing() -> Optional[str]:
    """Why ``train-ta`` cannot run with this gpupipe (None when it can)."""
    lacking = [f"gpupipe.augment.{n}" for n in TA_OPS if not hasattr(gpupipe.augment, n)]
    if "batch_transform" not in inspect.signature(gpupipe.Loader).parameters:
        lacking.append("gpupipe.Loader(batch_transform=...)")
    return f"needs {', '.join(lacking)}" if lacking else None


class MixUpCutMixCollate:
    """torchvision's reference ``collate_fn``: default collate, then MixUp or CutMix on the batch."""

    def __init__(self, num_classes: int):
        from torchvision.transforms import v2

        self.choice = v2.RandomChoice([v2.MixUp(alpha=0.2, num_classes=num_classes),
                                       v2.CutMix(alpha=1.0, num_classes=num_classes)])

    def __call__(self, batch):
        return self.choice(*torch.utils.data.default_collate(batch))


@recipe("train-ta", "RandomResizedCrop 176 + flip + TrivialAugmentWide + normalise + RandomErasing(0.1) + "
                    "MixUp(0.2)/CutMix(1.0) (torchvision's current reference)", missing=train_ta_missing)
def train_ta(num_classes: int) -> RecipeParts:
    T = _torchvision_transforms()
    A = gpupipe.augment
    return RecipeParts(
        crop=crops.RandomResizedCrop(176),
        # Flip after TrivialAugmentWide: its geometric ops draw symmetric signs, so the order does
        # not change the distribution; BatchAugment flips and normalises in one pass.
        # keyed; erasing in place: it writes into BatchAugment's fresh output, which nothing else holds
        augment=A.Compose([A.TrivialAugmentWide(), BatchAugment(hflip=0.5), A.RandomErasing(p=0.1, inplace=True)]),
        # in place too: the batch is the augment stage's own output
        batch_transform=A.RandomChoice([A.MixUp(alpha=0.2, num_classes=num_classes, inplace=True),
                                        A.CutMix(alpha=1.0, num_classes=num_classes, inplace=True)]),
        torchvision=T.Compose([T.RandomResizedCrop(176), T.RandomHorizontalFlip(), T.TrivialAugmentWide(),
                               T.PILToTensor(), T.ConvertImageDtype(torch.float), T.Normalize(IMAGENET_MEAN, IMAGENET_STD),
                               T.RandomErasing(0.1)]),
        torchvision_collate=MixUpCutMixCollate(num_classes),
        notes=["DALI: not run (no MixUp / CutMix operators)"],
    )


__all__ = ["RECIPES", "Recipe", "RecipeParts", "available", "get", "recipe", "train_ta_missing"]
