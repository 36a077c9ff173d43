"""Identity-encoded datasets for the loader tests: image i is a flat color that encodes i, so any
reordering or mixing of samples shows in the pixels (as ffcv's DummyDataset does)."""

import io
import os

from PIL import Image

STEP, BASE, SIDE = 18, 20, 12


def color_of(i: int, label: int) -> tuple:
    return (BASE + (i % SIDE) * STEP, BASE + (i // SIDE) * STEP, 30 + 60 * label)


def index_of(img) -> int:
    """The index encoded in a decoded uint8 [3, H, W] image (or crop of it)."""
    m = img.float().mean(dim=(1, 2))
    return int(round((m[0].item() - BASE) / STEP)) + SIDE * int(round((m[1].item() - BASE) / STEP))


def jpeg_bytes(i: int, label: int, h: int, w: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (w, h), color_of(i, label)).save(buf, "JPEG", quality=95, subsampling=0)
    return buf.getvalue()


def make_image_folder(root, classes=("cat", "dog", "eel"), per_class=20) -> list:
    """root/<class>/<idx>.jpg; returns (path, label, index) in torchvision's sample order."""
    out = []
    i = 0
    for label, c in enumerate(classes):
        os.makedirs(os.path.join(root, c), exist_ok=True)
        for k in range(per_class):
            h, w = 48 + (i * 7) % 40, 56 + (i * 11) % 50
            path = os.path.join(root, c, f"img{k:03d}.jpg")
            with open(path, "wb") as f:
                f.write(jpeg_bytes(i, label, h, w))
            out.append((path, label, i))
            i += 1
    return out
