"""The embedded benchmark datasets, made locally from scikit-image's bundled photos (no download).

Each set is re-encoded from random crops/flips of the photos and cached under
``.cache/gpupipe-bench/<set>/`` (made once, reused by later runs).

| set      | size (w x h) | encoding                          | stands for                      |
|----------|--------------|-----------------------------------|---------------------------------|
| seed     | 800 x 533    | q90, 4:2:0, ~1.7 bpp              | the forum post's workload       |
| hd       | 1920 x 1280  | q90, 4:2:0, ~1 bpp                | large photos, RandomResizedCrop |
| imagenet | 800 x 533    | q95, 4:2:0, film grain, ~4.2 bpp  | ImageNet-like entropy           |
"""

from __future__ import annotations

import json
import zlib
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gpupipe.bench.dataset import bundled_photos, encode_pillow, photo_crop


@dataclass(frozen=True)
class SetSpec:
    name: str
    width: int
    height: int
    quality: int
    grain: float
    count: int


SETS = {
    "seed": SetSpec("seed", 800, 533, 90, 0.0, 48),
    "hd": SetSpec("hd", 1920, 1280, 90, 0.0, 24),
    "imagenet": SetSpec("imagenet", 800, 533, 95, 6.0, 48),
}


def default_root() -> Path:
    return Path(os.environ.get("GPUPIPE_BENCH_DATA", Path(__file__).resolve().parent.parent / ".cache" / "gpupipe-bench"))


def render(spec: SetSpec, index: int, photos: list[np.ndarray]) -> bytes:
    """The index-th JPEG of a set: a random crop (60-100% of the side, target aspect) of one photo,
    maybe flipped, resized with Lanczos, optionally with film grain, encoded by Pillow 4:2:0."""
    rng = np.random.default_rng([zlib.crc32(spec.name.encode()), index])
    img = photo_crop(photos[index % len(photos)], spec.width, spec.height, rng)
    if spec.grain:
        noise = rng.normal(0, spec.grain, img.shape[:2] + (1,)) + rng.normal(0, spec.grain / 2, img.shape)
        img = np.clip(img.astype(np.float32) + noise, 0, 255).astype(np.uint8)
    return encode_pillow(img, spec.quality)


def ensure_set(name: str, root: Path | None = None, progress: bool = True) -> list[Path]:
    """Makes (or reuses) a set on disk and returns its files in order."""
    spec = SETS[name]
    folder = (root or default_root()) / name
    manifest = folder / "manifest.json"
    expected = {"width": spec.width, "height": spec.height, "quality": spec.quality, "grain": spec.grain, "count": spec.count}
    if manifest.exists() and json.loads(manifest.read_text()) == expected:
        files = sorted(folder.glob("*.jpg"))
        if len(files) == spec.count:
            return files
    folder.mkdir(parents=True, exist_ok=True)
    photos = bundled_photos()
    indices = range(spec.count)
    if progress:
        try:
            from tqdm import tqdm

            indices = tqdm(indices, desc=f"making '{name}' set", unit="img")
        except ImportError:
            pass
    files = []
    for i in indices:
        path = folder / f"{i:05d}.jpg"
        path.write_bytes(render(spec, i, photos))
        files.append(path)
    manifest.write_text(json.dumps(expected))
    return files


def load_set(name: str, root: Path | None = None, progress: bool = True) -> list[bytes]:
    return [p.read_bytes() for p in ensure_set(name, root, progress)]


def bits_per_pixel(datas: list[bytes], spec: SetSpec) -> float:
    return float(np.mean([len(d) * 8 / (spec.width * spec.height) for d in datas]))
