"""Batched workloads: thread scaling of the batch engine, and RandomResizedCrop to 224 against the
peers on identical boxes with the same number of threads for everyone."""

from __future__ import annotations

import io
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

import gpupipe
from benchmarks import peers
from benchmarks.decode_crop import random_boxes
from benchmarks.harness import run_side_by_side


def _cycle(datas: list[bytes], n: int) -> list[bytes]:
    return [datas[i % len(datas)] for i in range(n)]


def thread_scaling(datas: list[bytes], batch: int = 64, crop: int = 256, repeats: int = 7, label: str = "seed") -> list:
    """Batch of `batch` crops: gpupipe on 1 and 2 threads (and DALI CPU likewise, for reference)."""
    torch.set_num_threads(1)
    datas = _cycle(datas, batch)
    boxes = random_boxes(datas, crop, seed=1)
    out = torch.empty((batch, crop, crop, 3), dtype=torch.uint8)
    methods, skipped = {}, {}
    for t in (1, 2):
        methods[f"gpupipe {t} thread{'s' if t > 1 else ''}"] = (
            lambda t=t: gpupipe.decode_crop_jpegs(datas, boxes, out=out, num_threads=t))
    reason = peers.unavailable("nvidia.dali")
    for t in (1, 2):
        name = f"DALI CPU {t} thread{'s' if t > 1 else ''}"
        if reason:
            skipped[name] = reason
        else:
            methods[name] = peers.DaliCpu(batch, t).runner(datas, [tuple(b) for b in boxes])
    w, h = gpupipe.read_header(datas[0])[1], gpupipe.read_header(datas[0])[0]
    return run_side_by_side(f"batch {batch} x crop {crop}: {label} {w}x{h}", methods, batch, repeats=repeats, skipped=skipped)


def random_resized_crop(datas: list[bytes], size: int = 224, batch: int = 32, threads: int = 2, repeats: int = 7, label: str = "hd") -> list:
    """RandomResizedCrop(size) with antialiasing, identical boxes for every method."""
    torch.set_num_threads(1)
    datas = _cycle(datas, batch)
    sizes = np.array([gpupipe.read_header(d)[:2] for d in datas])
    boxes = gpupipe.crops.RandomResizedCrop(size).boxes(sizes[:, 0], sizes[:, 1], seed=0)
    box_list = [tuple(int(v) for v in b) for b in boxes]
    out = torch.empty((batch, size, size, 3), dtype=torch.uint8)
    pool = ThreadPoolExecutor(threads)
    methods, skipped, notes = {}, {}, {}

    methods["gpupipe"] = lambda: gpupipe.decode_crop_jpegs(datas, boxes, size=size, out=out, num_threads=threads)
    notes["gpupipe"] = "ROI + DCT scaling + AA bilinear"
    methods["gpupipe exact"] = lambda: gpupipe.decode_crop_jpegs(datas, boxes, size=size, out=out, num_threads=threads, dct_scaling=False)
    notes["gpupipe exact"] = "dct_scaling=False"

    reason = peers.unavailable("nvidia.dali")
    if reason:
        skipped["DALI CPU"] = reason
    else:
        methods["DALI CPU"] = peers.DaliCpu(batch, threads, resize=(size, size)).runner(datas, box_list)
        notes["DALI CPU"] = "image_slice + resize(antialias)"

    reason = peers.unavailable("torchvision")
    if reason:
        skipped["torchvision"] = reason
    else:
        from torchvision.io import decode_jpeg
        from torchvision.transforms.v2 import functional as F

        tensors = [torch.frombuffer(bytearray(d), dtype=torch.uint8) for d in datas]

        def tv_one(i):
            t, l, h, w = box_list[i]
            return F.resized_crop(decode_jpeg(tensors[i]), t, l, h, w, [size, size], antialias=True)

        methods["torchvision"] = lambda: list(pool.map(tv_one, range(batch)))
        notes["torchvision"] = "decode_jpeg + v2 resized_crop(antialias)"

    from PIL import Image

    def pil_one(i):
        t, l, h, w = box_list[i]
        img = Image.open(io.BytesIO(datas[i])).convert("RGB")
        return img.resize((size, size), Image.BILINEAR, box=(l, t, l + w, t + h), reducing_gap=None)

    methods["PIL"] = lambda: list(pool.map(pil_one, range(batch)))
    notes["PIL"] = "open + resize(box, BILINEAR)"
    w, h = gpupipe.read_header(datas[0])[1], gpupipe.read_header(datas[0])[0]
    rows = run_side_by_side(f"RandomResizedCrop {size}: {label} {w}x{h}, {threads} threads", methods, batch,
                            repeats=repeats, skipped=skipped, notes=notes)
    pool.shutdown()
    return rows


def backends(seed: list[bytes], hd: list[bytes], threads: int = 2, batch: int = 64, repeats: int = 7) -> list:
    """The same decode_crop_jpegs calls through backend="cpu" and backend="dali" (DALI's CPU
    operators), same thread count: crop 256 on the seed set and RandomResizedCrop 224 on hd."""
    torch.set_num_threads(1)
    rows = []
    reason = peers.unavailable("nvidia.dali")
    for label, datas, size in (("seed 800x533 crop 256", _cycle(seed, batch), None), ("hd 1920x1280 RandomResizedCrop 224", _cycle(hd, batch), 224)):
        if size is None:
            boxes = random_boxes(datas, 256, seed=2)
        else:
            sizes = np.array([gpupipe.read_header(d)[:2] for d in datas])
            boxes = gpupipe.crops.RandomResizedCrop(size).boxes(sizes[:, 0], sizes[:, 1], seed=1)
        methods = {"gpupipe backend=cpu": lambda d=datas, b=boxes, s=size: gpupipe.decode_crop_jpegs(d, b, size=s, backend="cpu", num_threads=threads)}
        skipped = {}
        if reason:
            skipped["gpupipe backend=dali (CPU operators)"] = reason
        else:
            methods["gpupipe backend=dali (CPU operators)"] = lambda d=datas, b=boxes, s=size: gpupipe.decode_crop_jpegs(
                d, b, size=s, backend="dali", num_threads=threads)
        rows += run_side_by_side(f"backends, {label}, batch {batch}, {threads} threads", methods, batch, repeats=repeats, skipped=skipped)
    return rows


def toggled(setter, value, fn):
    """``fn`` run with ``setter(value)`` in force (``setter`` returns the previous value, restored after)."""
    def call():
        before = setter(value)
        try:
            return fn()
        finally:
            setter(before)
    return call


def huffman_reader(sets: dict, size: int = 224, repeats: int = 7) -> list:
    """gpupipe's Huffman reader (csrc/decode/huffman_reader.h) against libjpeg-turbo's own Huffman
    decoder (the reader turned off) in the same process, 1 thread, same files and boxes:
    RandomResizedCrop(size) with DCT scaling (the training default) and whole images."""
    from gpupipe import _C

    torch.set_num_threads(1)
    sampler = gpupipe.crops.RandomResizedCrop(size)
    rows = []

    def with_reader(on: bool, fn):  # the reader alone: the entropy index paused (no row start from an earlier run)
        return toggled(_C._set_huffman_reader, on, toggled(_C._pause_entropy_index, True, fn))

    for name, datas in sets.items():
        sizes = np.array([gpupipe.read_header(d)[:2] for d in datas])
        boxes = sampler.boxes(sizes[:, 0], sizes[:, 1], seed=0)
        whole = np.stack([np.zeros(len(datas), np.int64), np.zeros(len(datas), np.int64), sizes[:, 0], sizes[:, 1]], 1)
        out = torch.empty((len(datas), size, size, 3), dtype=torch.uint8)
        w, h = int(sizes[0, 1]), int(sizes[0, 0])
        rrc = lambda: gpupipe.decode_crop_jpegs(datas, boxes, size=size, out=out, num_threads=1)  # noqa: E731
        full = lambda: [gpupipe.decode_crop_jpeg(d, *map(int, b)) for d, b in zip(datas, whole)]  # noqa: E731
        for label, fn in ((f"RandomResizedCrop {size}", rrc), ("whole image", full)):
            rows += run_side_by_side(f"Huffman reader, {label}: {name} {w}x{h}, 1 thread",
                                     {"gpupipe": with_reader(True, fn), "libjpeg's Huffman decoder": with_reader(False, fn)},
                                     len(datas), repeats=repeats,
                                     notes={"libjpeg's Huffman decoder": "gpupipe with GPUPIPE_HUFFMAN_READER=0"})
    return rows


def entropy_index(sets: dict, size: int = 224, threads: int = 1, repeats: int = 7) -> list:
    """The entropy index (csrc/decode/entropy_index.h): RandomResizedCrop(size) of a later epoch (new
    crops each call, the rows of three earlier epochs known) against the same decode without the
    index, and a first epoch (the index emptied before each call: every file hashed and its rows
    learned) against none, in the same process, same files and boxes."""
    from gpupipe import _C

    torch.set_num_threads(1)
    sampler = gpupipe.crops.RandomResizedCrop(size)
    rows = []

    def paused(value: bool, fn):
        return toggled(_C._pause_entropy_index, value, fn)

    for name, datas in sets.items():
        sizes = np.array([gpupipe.read_header(d)[:2] for d in datas])
        out = torch.empty((len(datas), size, size, 3), dtype=torch.uint8)
        w, h = int(sizes[0, 1]), int(sizes[0, 0])
        epochs = iter(range(1, 1 << 30))

        def epoch(seed=None):  # the next epoch's crops (both methods of a round get their own)
            boxes = sampler.boxes(sizes[:, 0], sizes[:, 1], seed=next(epochs) if seed is None else seed)
            gpupipe.decode_crop_jpegs(datas, boxes, size=size, out=out, num_threads=threads)

        def first_epoch():
            _C.clear_entropy_index()
            epoch(0)

        _C.clear_entropy_index()
        for _ in range(3):  # three epochs learned
            paused(False, epoch)()
        label = f"{name} {w}x{h}, {threads} thread{'s' if threads > 1 else ''}"
        rows += run_side_by_side(f"entropy index, later epochs, RandomResizedCrop {size}: {label}",
                                 {"gpupipe": paused(False, epoch), "without the index": paused(True, epoch)}, len(datas),
                                 repeats=repeats, notes={"without the index": "gpupipe, the index paused"})
        rows += run_side_by_side(f"entropy index, first epoch (hash and learn), RandomResizedCrop {size}: {label}",
                                 {"gpupipe": paused(False, first_epoch), "without the index": paused(True, lambda: epoch(0))},
                                 len(datas), repeats=repeats, notes={"without the index": "gpupipe, the index paused"})
        _C.clear_entropy_index()
    return rows
