"""The data a benchmark runs on: the user's ``--data`` (an ImageFolder tree, a flat folder of
images, a CSV file list or tar shards) as one :mod:`gpupipe.sources` source, or the embedded default
set made locally from scikit-image's bundled photos; and the same files as a ``torch`` dataset that
decodes with PIL, for ``torch.utils.data.DataLoader``.
"""

from __future__ import annotations

import io
import os
import shutil
import sys
import tarfile
import tempfile
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

import numpy as np
import torch

from gpupipe.sources import IMG_EXTENSIONS, FileList, ImageFolder, TarShards

# The default set: one class per photo, sizes and aspect ratios as photo datasets have them
# (ImageNet's median is about 500x375; phones and cameras give 4:3, 3:2 and 16:9 in both
# orientations), JPEG qualities 85-95 with a little sensor grain so the entropy is photo-like.
PHOTOS = ("astronaut", "coffee", "chelsea", "rocket", "hubble_deep_field", "immunohistochemistry", "retina")
SIZES = ((500, 375), (375, 500), (500, 333), (640, 480), (800, 533), (533, 800), (1024, 768), (1280, 720),
         (500, 500), (1600, 1067))  # (width, height)
QUALITIES = (85, 90, 95)
DEFAULT_IMAGES = 1024
_VERSION = 1  # bump when the rendering changes: cached sets of another version are remade


class DataError(ValueError):
    """The ``--data`` argument names nothing usable; the message says what was expected."""


@dataclass
class BenchData:
    """One data set, as a gpupipe source, with what the report says about it."""

    kind: str  # "default", "imagefolder", "folder", "csv", "tar"
    path: str
    source: Union[ImageFolder, FileList, TarShards]
    images: int
    classes: int  # distinct labels
    num_classes: int  # largest label + 1: what MixUp / CutMix need
    left_out: tuple = ()  # tar shards that could not be read, "path (why)": every row runs without them

    def describe(self) -> str:
        out = f"{self.kind} {self.path}: {self.images} images, {self.classes} classes"
        if self.left_out:
            out += f"; {len(self.left_out)} unreadable shard(s) left out, first: {self.left_out[0]}"
        return out


def cache_root() -> Path:
    """``$GPUPIPE_CACHE``, else ``$XDG_CACHE_HOME/gpupipe``, else ``~/.cache/gpupipe``."""
    if os.environ.get("GPUPIPE_CACHE"):
        return Path(os.environ["GPUPIPE_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "gpupipe"


def photo_crop(photo: np.ndarray, width: int, height: int, rng: np.random.Generator) -> np.ndarray:
    """uint8 ``[height, width, 3]``: a random crop of ``photo`` (60-100% of the side that limits
    the target aspect), mirrored half of the time, resized with Lanczos."""
    from PIL import Image

    ph, pw = photo.shape[:2]
    aspect = width / height
    frac = rng.uniform(0.6, 1.0)
    cw = min(pw, int(frac * min(pw, ph * aspect)))
    ch = min(ph, int(cw / aspect))
    top = rng.integers(0, ph - ch + 1)
    left = rng.integers(0, pw - cw + 1)
    crop = photo[top : top + ch, left : left + cw]
    if rng.random() < 0.5:
        crop = crop[:, ::-1]
    return np.asarray(Image.fromarray(np.ascontiguousarray(crop)).resize((width, height), Image.LANCZOS))


def encode_pillow(img: np.ndarray, quality: int) -> bytes:
    """Pillow's JPEG (4:2:0), as most photo datasets were written."""
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(img).save(buf, "JPEG", quality=quality, subsampling=2)
    return buf.getvalue()


def _grain_tile(sigma: float) -> np.ndarray:
    """A 512x512 tile of sensor-like grain (a luma part and a weaker part per channel), float32.
    Tiling it with a random offset per image costs far less than fresh noise per pixel, and JPEG
    codes each 8x8 block on its own, so the entropy it adds is the same."""
    rng = np.random.default_rng(0x6A41)
    shape = (512, 512)
    luma = rng.standard_normal(shape + (1,), dtype=np.float32) * sigma
    return luma + rng.standard_normal(shape + (3,), dtype=np.float32) * (sigma / 2)


def _with_grain(img: np.ndarray, tile: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    h, w = img.shape[:2]
    th, tw = tile.shape[:2]
    dy, dx = (int(v) for v in rng.integers(0, 512, 2))
    big = np.tile(tile, (-(-(h + dy) // th), -(-(w + dx) // tw), 1))[dy : dy + h, dx : dx + w]
    return np.clip(img.astype(np.float32) + big, 0, 255).astype(np.uint8)


def bundled_photos() -> list:
    """scikit-image's bundled photos named in ``PHOTOS`` (uint8 ``[H, W, 3]``), read from its package."""
    try:
        import skimage.data
    except ImportError as e:
        raise DataError("the default data set is made from scikit-image's bundled photos: pip install scikit-image "
                        "(or 'torch-gpupipe[bench]'), or pass --data DIR") from e
    return [np.asarray(getattr(skimage.data, name)()) for name in PHOTOS]


def default_set(images: int = DEFAULT_IMAGES, root: Optional[Path] = None, progress: bool = False) -> Path:
    """Makes (once) and returns the default ImageFolder tree: ``images`` JPEGs, one class per
    scikit-image photo, at the sizes of ``SIZES`` in turn. Nothing is downloaded.

    The tree is written to a temporary folder and renamed into the cache when complete, so an
    interrupted run never leaves a partial set behind.
    """
    if images < 1:
        raise DataError(f"--images must be >= 1, got {images}")
    folder = (root or cache_root()) / "bench-default" / f"v{_VERSION}-{images}"
    if (folder / ".complete").exists():
        return folder
    photos = bundled_photos()
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    for name in PHOTOS[:images]:
        (tmp / name).mkdir()
    tile = _grain_tile(3.0)

    def make(i: int) -> None:
        rng = np.random.default_rng([zlib.crc32(b"gpupipe-bench-default"), i])
        label = i % len(PHOTOS)
        width, height = SIZES[(i // len(PHOTOS)) % len(SIZES)]
        img = _with_grain(photo_crop(photos[label], width, height, rng), tile, rng)
        data = encode_pillow(img, QUALITIES[i % len(QUALITIES)])
        (tmp / PHOTOS[label] / f"{i:05d}.jpg").write_bytes(data)

    bar = None
    if progress:
        try:
            from tqdm import tqdm

            bar = tqdm(total=images, desc=f"making the default data set ({folder})", unit="img", file=sys.stderr)
        except ImportError:
            pass
    with ThreadPoolExecutor(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None) as pool:
        for _ in pool.map(make, range(images)):  # Pillow releases the GIL while resizing and encoding
            if bar is not None:
                bar.update(1)
    if bar is not None:
        bar.close()
    (tmp / ".complete").touch()
    try:
        os.replace(tmp, folder)
    except OSError:  # another process finished the same set first
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def _is_image(name: str) -> bool:
    return name.lower().endswith(IMG_EXTENSIONS)


def _labels(values) -> tuple[int, int]:
    """(distinct labels, largest label + 1)."""
    values = set(int(v) for v in values)
    return max(1, len(values)), max(1, max(values, default=0) + 1)


def _tar_images(paths: list) -> tuple[int, set, list, list]:
    """(samples with an image, their labels, the shards read, "path (why)" of those that could not
    be) of tar shards, from member headers and labels. A label that is not an integer is not
    counted (the Loader fails its sample, named); an unreadable shard is left out, as the Loader
    would skip it, and said: one bad shard of many does not stop the benchmark."""
    n, labels, readable, left_out = 0, set(), [], []
    for p in paths:
        count, found = 0, set()
        try:
            with tarfile.open(p) as tar:
                for m in tar:
                    if m.isfile() and _is_image(m.name):
                        count += 1
                    elif m.isfile() and m.name.endswith(".cls"):
                        try:
                            found.add(int(tar.extractfile(m).read().decode().strip()))
                        except (ValueError, UnicodeDecodeError):
                            pass
        except (tarfile.TarError, OSError, EOFError) as e:
            left_out.append(f"{p} ({type(e).__name__}: {e})")
            continue
        n, labels = n + count, labels | found
        readable.append(p)
    return n, labels, readable, left_out


def open_data(path: Union[str, os.PathLike, None], *, images: int = DEFAULT_IMAGES, progress: bool = False) -> BenchData:
    """The data set for ``--data path`` (``None``: the default set).

    Accepted: an ImageFolder tree (``root/<class>/<image>``), a folder of images (one class), a
    ``.csv`` file list (``path,label`` rows, :meth:`FileList.from_csv`), a ``.tar`` shard or a folder
    of them (WebDataset convention). Raises :class:`DataError` naming the path otherwise.

    Example:
        >>> from gpupipe.bench.dataset import DataError, open_data
        >>> try:
        ...     open_data("/no/such/folder")
        ... except DataError as e:
        ...     print(e)
        --data /no/such/folder: no such file or folder
    """
    if path is None:
        root = default_set(images, progress=progress)
        src = ImageFolder(root)
        return BenchData("default", str(root), src, len(src), *_labels(src.labels))
    p = Path(path)
    if not p.exists():
        raise DataError(f"--data {p}: no such file or folder")
    expected = "expected class folders of images (ImageFolder), images, a .csv file list or .tar shards"
    if p.is_file():
        if p.suffix.lower() == ".csv":
            try:
                src = FileList.from_csv(p)
            except (KeyError, ValueError) as e:
                raise DataError(f"--data {p}: a CSV file list needs 'path' and 'label' columns ({type(e).__name__}: {e})") from e
            if len(src) == 0:
                raise DataError(f"--data {p}: the file list has no rows")
            missing = [k for k in src.keys[:100] if not os.path.isfile(k)]
            if missing:
                raise DataError(f"--data {p}: listed file {missing[0]} does not exist")
            return BenchData("csv", str(p), src, len(src), *_labels(src.labels))
        if p.suffix.lower() == ".tar":
            n, labels, _, left_out = _tar_images([str(p)])
            if left_out:
                raise DataError(f"--data {left_out[0]}: not a readable tar shard")
            if n == 0:
                raise DataError(f"--data {p}: the shard holds no images")
            return BenchData("tar", str(p), TarShards([str(p)]), n, *_labels(labels))
        raise DataError(f"--data {p}: a file must be a .csv file list or a .tar shard")
    entries = sorted(os.scandir(p), key=lambda e: e.name)
    subdirs = [e for e in entries if e.is_dir() and not e.name.startswith(".")]
    tars = [e.path for e in entries if e.is_file() and e.name.lower().endswith(".tar")]
    if subdirs:
        try:
            src = ImageFolder(p)
        except FileNotFoundError as e:
            raise DataError(f"--data {p}: holds no images ({expected})") from e
        return BenchData("imagefolder", str(p), src, len(src), *_labels(src.labels))
    if tars:
        n, labels, readable, left_out = _tar_images(tars)
        if not readable:
            raise DataError(f"--data {p}: none of its {len(tars)} tar shards could be read; first: {left_out[0]}")
        if n == 0:
            raise DataError(f"--data {p}: its tar shards hold no images")
        return BenchData("tar", str(p), TarShards(readable), n, *_labels(labels), left_out=tuple(left_out))
    files = [e.path for e in entries if e.is_file() and _is_image(e.name)]
    if not files:
        raise DataError(f"--data {p}: holds no images ({expected})")
    return BenchData("folder", str(p), FileList(files, [0] * len(files)), len(files), 1, 1)


# --- the same files for torch.utils.data.DataLoader, decoded with PIL ----------------------------


def _pil_rgb(data: bytes):
    from PIL import Image

    img = Image.open(io.BytesIO(data))
    return img.convert("RGB")  # torchvision.datasets.folder.pil_loader


class PilDataset(torch.utils.data.Dataset):
    """``dataset[i] -> (transform(PIL RGB image), label)`` over a map-style gpupipe source: what
    ``torchvision.datasets.ImageFolder`` does with its ``pil_loader``, on the same files."""

    def __init__(self, source: Union[ImageFolder, FileList], transform):
        self.source, self.transform = source, transform

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, i: int):
        return self.transform(_pil_rgb(self.source.read(i))), int(self.source.labels[i])


class PilTarDataset(torch.utils.data.IterableDataset):
    """Tar shards streamed as ``(transform(PIL RGB image), label)``; DataLoader worker ``k`` of
    ``K`` decodes every K-th sample (all workers busy whatever the number of shards)."""

    def __init__(self, source: TarShards, transform, seed: int = 0):
        self.source, self.transform, self.seed = source, transform, seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        samples = self.source.iter_samples(epoch=self.epoch, seed=self.seed, rank=0, world_size=1, shuffle=True)
        for k, (_, label, data, error) in enumerate(samples):
            if k % workers == worker and error is None:
                yield self.transform(_pil_rgb(data)), int(label)


__all__ = ["BenchData", "DataError", "PilDataset", "PilTarDataset", "cache_root", "default_set", "open_data",
           "bundled_photos", "encode_pillow", "photo_crop"]
