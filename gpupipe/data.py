"""For users who keep ``torch.utils.data.DataLoader``: the decode inside ``__getitem__`` (the
pattern of the custom-operator data-loading post), with the Loader's box semantics, routes and
error policy, so the same folder gives the same samples."""

from __future__ import annotations

import collections.abc
import warnings

import numpy as np
import torch

from gpupipe import backends
from gpupipe._args import is_int
from gpupipe._errors import SkippedSamplesWarning
from gpupipe.crops import CropSampler
from gpupipe.decode_types import epoch_number, seed_number
from gpupipe.error_policy import apply_policy, check_on_error, warn_corrupt
from gpupipe.routing import decode_into, plan_batch
from gpupipe.sources import call_or_error, indented, read_result


class DecodeCropDataset(torch.utils.data.Dataset):
    """``dataset[i] -> (uint8 [3, H, W] crop, label)``: reads the file, reads its header, draws the
    box for (seed, epoch, i) with ``crop`` and decodes only that window (resized when the sampler
    resizes). The same boxes, routes (Pillow for files that are not JPEGs) and error kinds, so the
    same pixels, as :class:`gpupipe.Loader` with the same seed.

    Args:
        source: a map-style :mod:`gpupipe.sources` source.
        crop: a :mod:`gpupipe.crops` sampler.
        seed: the boxes' seed (as the Loader's).
        on_error: ``"skip"``: a sample that cannot be delivered is a :class:`SkippedSample` (falsy,
            naming the key and the failure, also in ``last_failure``), which :func:`collate` drops;
            ``DataLoader``'s default collate cannot drop samples and raises a ``TypeError`` saying
            so. ``"replace"``: a zero image, which the default collate takes. Either way a
            :class:`SkippedSamplesWarning` names the sample (in a ``DataLoader`` worker, on its
            stderr: ``last_failure`` stays in the worker). ``"raise"``: its error, naming the key.
        apply_exif_orientation: crop in the displayed frame.
        backend: ``"cpu"`` (the C++ core) or ``"dali"`` (DALI's CPU operators); outputs are on the CPU.
    """

    def __init__(self, source, crop: CropSampler, *, seed: int = 0, on_error: str = "skip",
                 apply_exif_orientation: bool = False, backend: str = "cpu"):
        if not all(hasattr(source, a) for a in ("keys", "labels", "read", "__len__")):
            raise TypeError(f"DecodeCropDataset needs a map-style source (keys, labels, read, len: ImageFolder, "
                            f"FileList), got {type(source).__name__}; stream TarShards with gpupipe.Loader")
        if not isinstance(crop, CropSampler):
            raise TypeError("crop must be a gpupipe.crops sampler (RandomResizedCrop, CenterCrop, ...), got "
                            f"{type(crop).__name__}")
        self.source = source
        self.crop = crop
        self.seed = seed_number(seed)  # (the Loader's rule: the same samples for the same arguments)
        self.epoch = 0
        self.on_error = check_on_error(on_error)
        self.options = crop.decode_options(apply_exif_orientation=apply_exif_orientation,
                                           backend=backends.resolve(backend, torch.device("cpu")))
        self.last_failure = None

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch_number(epoch)

    def __len__(self) -> int:
        return len(self.source)

    def _index(self, i) -> int:
        """``i`` as the sample's index in 0..len-1, a negative one counted from the end as a list
        does (the crop is keyed by it: ``ds[-1]`` is ``ds[len(ds) - 1]``, box and all)."""
        if not is_int(i):
            raise TypeError(f"DecodeCropDataset indices must be integers, got {type(i).__name__}")
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"DecodeCropDataset index {i} is out of range for {n} samples")
        return int(i) % n

    def __repr__(self) -> str:
        return (f"DecodeCropDataset(crop={self.crop!r}, seed={self.seed}, epoch={self.epoch}, "
                f"on_error={self.on_error!r}, backend={self.options.backend!r})\n{indented(repr(self.source))}")

    def __getitem__(self, i: int):
        i = self._index(i)
        key, label = self.source.keys[i], int(self.source.labels[i])
        out = torch.zeros((1, *self.crop.size, 3), dtype=torch.uint8)
        # any failure of the source (an exception, a result that is not bytes) is this sample's
        data, error = read_result(call_or_error(self.source.read, i))
        datas, errors = [data], ({} if error is None else {0: error})
        buffers, infos, boxes = plan_batch(datas, self.crop, self.options, seed=self.seed, epoch=self.epoch,
                                           indices=[i], read_errors=errors)
        status = decode_into(buffers, boxes, out, self.options, infos=infos)
        failures = apply_policy(status, self.on_error, keys=[key])
        warn_corrupt(status, keys=[key])
        self.last_failure = failures[0] if failures else None
        if failures:
            f = failures[0]
            done = "skipped" if self.on_error == "skip" else "replaced by a zero image"
            warnings.warn(f"DecodeCropDataset sample {i} ({key!r}) {done} (on_error={self.on_error!r}): "
                          f"{f.kind.name}: {f.message}", SkippedSamplesWarning, stacklevel=2)
            if self.on_error == "skip":
                return SkippedSample(key, f)
        return out[0].permute(2, 0, 1), label


class SkippedSample(collections.abc.Sequence):
    """What ``DecodeCropDataset[i]`` gives for a sample skipped under ``on_error="skip"``: falsy,
    with the sample's ``key`` and ``failure`` (a :class:`gpupipe.error_policy.SampleFailure`).

    It is a ``Sequence`` only so that ``DataLoader``'s default collate (which asks every sample of a
    batch of pairs for its length) and default convert (``batch_size=None``, which iterates it) stop
    with a message naming the sample and the ways out (:func:`collate` drops skipped samples)
    instead of ``'NoneType' has no len()``. (A skipped sample used to be ``None``: test it with
    ``not sample``, which holds for both.)"""

    def __init__(self, key, failure):
        self.key, self.failure = key, failure

    def __bool__(self) -> bool:
        return False

    def _refuse(self):
        raise TypeError(f"sample {self.key!r} was skipped ({self.failure.kind.name}: {self.failure.message}); "
                        "DataLoader's default collate cannot drop a sample: pass collate_fn=gpupipe.data.collate "
                        "(batches), drop falsy samples yourself (batch_size=None), or build the dataset with "
                        "on_error='replace' (a zero image) or 'raise'")

    def __len__(self) -> int:
        self._refuse()

    def __getitem__(self, i):
        self._refuse()

    def __repr__(self) -> str:
        return f"SkippedSample(key={self.key!r}, kind={self.failure.kind.name})"


def collate(batch):
    """Stacks ``(image, label)`` pairs into a channels-last uint8 ``[N, 3, H, W]`` batch and labels;
    samples a dataset skipped (:class:`SkippedSample`, or ``None``) are dropped."""
    batch = [b for b in batch if b is not None and not isinstance(b, SkippedSample)]
    if not batch:
        return torch.empty((0, 3, 0, 0), dtype=torch.uint8), torch.empty(0, dtype=torch.int64)
    images, labels = zip(*batch)
    shape = tuple(images[0].shape) if isinstance(images[0], torch.Tensor) else None
    for i, img in enumerate(images):  # (copy_ would cast a float image to uint8 or broadcast a smaller one)
        if not isinstance(img, torch.Tensor) or img.dtype != torch.uint8 or img.dim() != 3 or tuple(img.shape) != shape:
            got = f"{img.dtype} {list(img.shape)}" if isinstance(img, torch.Tensor) else type(img).__name__
            raise ValueError(f"collate stacks uint8 [C, H, W] images of one shape ({list(shape or [])} first); "
                             f"sample {i} is {got}")
    label_array = np.asarray(labels)
    if label_array.dtype.kind not in "iu" or label_array.shape != (len(labels),):
        raise ValueError(f"collate takes one integer label per sample, got {label_array.dtype} "
                         f"{list(label_array.shape)}")
    out = torch.empty((len(images), *shape), dtype=torch.uint8).contiguous(memory_format=torch.channels_last)
    for i, img in enumerate(images):
        out[i].copy_(img)
    return out, torch.from_numpy(label_array.astype(np.int64))


__all__ = ["DecodeCropDataset", "SkippedSample", "collate"]
