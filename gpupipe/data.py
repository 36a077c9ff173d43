"""For users who keep ``torch.utils.data.DataLoader``: the custom op inside ``__getitem__`` (the
pattern of the custom-operator data-loading post), with the Loader's box semantics."""

from __future__ import annotations

import numpy as np
import torch

from gpupipe.crops import CropSampler
from gpupipe.decode import decode_crop_jpeg
from gpupipe.header import read_header


class DecodeCropDataset(torch.utils.data.Dataset):
    """``dataset[i] -> (uint8 [3, H, W] crop, label)``: reads the file, reads its header, draws the
    box for (seed, epoch, i) with ``crop`` and decodes only that window (resized when the sampler
    resizes). The same boxes, so the same pixels, as :class:`gpupipe.Loader` with the same seed."""

    def __init__(self, source, crop: CropSampler, *, seed: int = 0):
        self.source = source
        self.crop = crop
        self.seed = int(seed)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, i: int):
        data = self.source.read(i)
        info = read_header(data)
        t, l, h, w = self.crop.boxes([info.height], [info.width], seed=self.seed, epoch=self.epoch, indices=[i])[0]
        size = self.crop.size if self.crop.resize else None
        img = decode_crop_jpeg(data, int(t), int(l), int(h), int(w), size=size)
        return img, int(self.source.labels[i])


def collate(batch):
    """Stacks ``(image, label)`` pairs into a channels-last uint8 ``[N, 3, H, W]`` batch and labels."""
    images, labels = zip(*batch)
    out = torch.empty((len(images), *images[0].shape), dtype=torch.uint8).contiguous(memory_format=torch.channels_last)
    for i, img in enumerate(images):
        out[i].copy_(img)
    return out, torch.as_tensor(np.asarray(labels, dtype=np.int64))


__all__ = ["DecodeCropDataset", "collate"]
