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


MESSY = ("b_corrupt.jpg", "c_truncated.jpg", "d_image.png", "e_notes.jpg")


def make_messy_folder(root, good: int = 10, bad_names=MESSY) -> str:
    """root/things/: ``good`` JPEGs a00.jpg... (image i encodes i) and, named ``bad_names`` (where
    they sort decides their place), a corrupt JPEG, a truncated one, a PNG (encoding 12) and a
    file that is no image."""
    d = os.path.join(root, "things")
    os.makedirs(d, exist_ok=True)
    for i in range(good):
        with open(os.path.join(d, f"a{i:02d}.jpg"), "wb") as f:
            f.write(jpeg_bytes(i, 0, 40, 50))
    png = io.BytesIO()
    Image.new("RGB", (45, 44), color_of(12, 0)).save(png, "PNG")
    contents = (b"\xff\xd8\xff\xdb" + os.urandom(300), jpeg_bytes(11, 0, 300, 300)[:200], png.getvalue(),
                b"these are not pixels")
    for name, data in zip(bad_names, contents):
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)
    return str(root)
