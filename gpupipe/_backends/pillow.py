"""The route for files that are not JPEGs (PNG, WebP, BMP, GIF, TIFF, ...): Pillow reads them with
the CPU core's box semantics (a crop, then Pillow's BILINEAR resize with ``reducing_gap=None``, or a
window of the resized image), so every entry point delivers the same samples from a mixed folder.
Pillow's EXIF orientation (``ImageOps.exif_transpose``) applies when asked for; gpupipe's pixel
limit holds before any pixel is decoded. Only the formats in ``FORMATS`` are opened (Pillow would
otherwise hand an EPS file to Ghostscript); libtiff's messages, which it prints to stderr, become the
sample's warning (its error with ``strict``)."""

from __future__ import annotations

import contextlib
import io
import math
import re
from typing import Sequence

import numpy as np
import torch

from gpupipe import _stderr
from gpupipe.decode_types import BatchStatus, DecodeOptions, Route
from gpupipe._errors import ErrorKind
from gpupipe._quiet_warnings import quiet as quiet_warnings
from gpupipe._transfer import to_device
from gpupipe.limits import get_limits

name = "pillow"


FORMATS = ("PNG", "WEBP", "BMP", "GIF", "TIFF", "PPM")  # (PPM: PGM and PBM too; ImageFolder lists .ppm, .pgm)
# libtiff's handlers print "module: message", the module a function ("ZIPDecode") or the file's name
# ("tempfile.tif", Pillow's name for an in-memory TIFF)
_LIBTIFF_MESSAGE = re.compile(r"^[^\s:]+: ")
# Every magic Pillow's TIFF plugin opens (TiffImagePlugin.PREFIXES): classic, BigTIFF, and the
# byte-swapped versions it accepts ("II\0*"), which libtiff then refuses out loud.
_TIFF_MAGICS = (b"MM\x00*", b"II*\x00", b"MM*\x00", b"II\x00*", b"MM\x00+", b"II+\x00")


def _open(data):
    from PIL import Image

    return Image.open(io.BytesIO(bytes(data)), formats=FORMATS)


def _load_plugins() -> None:
    from PIL import Image

    Image.init()


def _quiet_pillow():
    """Pillow's warnings (its bomb warning, palette and EXIF notes) dropped on this thread only."""
    return quiet_warnings("PIL", load=_load_plugins)


def _quiet(data):
    """Catches what libtiff prints while a TIFF is read (a context yielding the list of its lines)."""
    if bytes(data[:4]) in _TIFF_MAGICS:
        return _stderr.captured(lambda line: _LIBTIFF_MESSAGE.match(line.strip()) is not None)
    return contextlib.nullcontext([])


def decoded_bytes(img) -> int:
    """A bound on the memory Pillow takes to decode ``img`` and convert it to RGB or L: its decoded
    image (Pillow holds 1, 2 or 4 bytes a pixel, RGB as 4) twice (the decoder's working copy, or a
    crop), and two images of 4 bytes a pixel (the conversion's copy, which Pillow makes even to the
    same mode, and its staging); WebP's decoder holds one more. Measured at 4000 x 4000: an RGB PNG
    peaked at 8.1 bytes a pixel (bound 16), a palette PNG 8.2 (10), a WebP 16.1 (20)."""
    pixel = 1 if img.mode in ("1", "L", "P") else 2 if img.mode.startswith("I;16") else 4
    per_pixel = 2 * pixel + 8 + (4 if img.format == "WEBP" else 0)
    return img.size[0] * img.size[1] * per_pixel


def probe(buffers: Sequence, indices, jpeg_messages: dict, orientation: bool = False) -> tuple[dict, dict]:
    """Headers of the files at ``indices`` that Pillow reads: ({index: (height, width, EXIF
    orientation)}, {index: (ErrorKind, message)} for the rest, after libjpeg's message). Decodes no
    pixels: the size is checked against ``max_pixels`` and the decode's memory against
    ``max_memory`` first (the limits hold in every route), and EXIF is read only when
    ``orientation`` is asked for (reading a PNG's EXIF loads its pixels)."""
    from PIL import Image

    found, failed = {}, {}
    limits = get_limits()
    limit = limits.max_pixels
    for i in indices:
        try:
            with _quiet_pillow(), _quiet(buffers[i]):  # Pillow's own bomb warning: gpupipe's limit is checked below
                img = _open(buffers[i])
                w, h = img.size
        except Image.DecompressionBombError as e:  # Pillow's hard limit (2x its MAX_IMAGE_PIXELS)
            failed[int(i)] = (ErrorKind.PIXEL_LIMIT, f"{e} (Pillow's own limit, which holds even above "
                                                     "gpupipe's max_pixels)")
            continue
        except Exception as e:
            reason = type(e).__name__ if type(e).__name__ == "UnidentifiedImageError" else f"{type(e).__name__}: {e}"
            failed[int(i)] = (ErrorKind.NOT_JPEG, f"{jpeg_messages.get(int(i), 'not a JPEG')} (nor an image Pillow "
                                                  f"reads: {reason})")
            continue
        if h * w > limit:
            failed[int(i)] = (ErrorKind.PIXEL_LIMIT, f"image is {w}x{h} = {h * w} pixels, over the max_pixels limit of "
                                                     f"{limit} (gpupipe.set_limits(max_pixels=...) raises it)")
            continue
        need = decoded_bytes(img)
        if need > limits.max_memory:
            failed[int(i)] = (ErrorKind.MEMORY_LIMIT, f"decoding this {w}x{h} {img.mode} image takes {need} bytes, over the "
                                                      f"max_memory limit of {limits.max_memory} (gpupipe.set_limits("
                                                      "max_memory=...) raises it)")
            continue
        turn = 1
        if orientation:
            try:
                turn = int(img.getexif().get(0x0112, 1))
            except Exception:  # unreadable EXIF: no orientation, as Pillow's exif_transpose
                turn = 1
        found[int(i)] = (h, w, turn if 1 <= turn <= 8 else 1)
    return found, failed


def _readable_exif(img) -> bool:
    try:
        img.getexif()
    except Exception:  # a malformed EXIF block: Pillow's exif_transpose would raise reading it
        return False
    return True


def _window(img, box: tuple, oh: int, ow: int):
    """The ``oh x ow`` window ``box`` (top, left, height, width) of the whole image resized, as the
    CPU core computes it: the image resized to ``(round(W * ow / w), round(H * oh / h))`` (torchvision's
    ``Resize``), then cropped at the box's place there when it falls on whole pixels (a
    ``ResizeCenterCrop`` box: torchvision's ``Resize`` + ``CenterCrop`` exactly). Elsewhere Pillow's
    ``resize(box=...)``, which takes its pass order from the box's size (within a level or two)."""
    from PIL import Image

    t, l, h, w = box
    W, H = img.size
    rw, rh = round(W * ow / w), round(H * oh / h)
    x, y = l * rw / W, t * rh / H  # the box in the resized frame (the boxes' float64 edges: within ulps)
    if all(abs(v - round(v)) < 1e-6 for v in (x, y, x + w * rw / W, y + h * rh / H)):
        x, y = int(round(x)), int(round(y))
        return img.resize((rw, rh), Image.BILINEAR, reducing_gap=None).crop((x, y, x + ow, y + oh))
    return img.resize((ow, oh), Image.BILINEAR, box=(l, t, l + w, t + h), reducing_gap=None)


def decode(buffers: Sequence, boxes: np.ndarray, out: torch.Tensor, options: DecodeOptions,
           sizes: Sequence[tuple[int, int]]) -> BatchStatus:
    """Decodes each file with Pillow into its slot of ``out`` (uint8 NHWC, any device); ``sizes``
    are their (height, width) in the frame of the boxes (displayed when orientation is applied)."""
    from PIL import Image, ImageOps

    n = len(buffers)
    status = BatchStatus.empty(n)
    oh, ow = out.shape[1:3]
    for i in range(n):
        t, l, h, w = (float(v) for v in boxes[i])
        H, W = sizes[i]
        if not (math.isfinite(t + l + h + w) and t >= 0 and l >= 0 and h > 0 and w > 0 and h <= H - t and w <= W - l):
            status.fail(i, ErrorKind.INVALID_ARGUMENT, f"crop box {tuple(boxes[i].tolist())} is not inside the image "
                                                       f"of {W}x{H} (width x height)")
            continue
        if not options.resize and not all(v == int(v) for v in (t, l, h, w)):
            status.fail(i, ErrorKind.INVALID_ARGUMENT, f"crop box {tuple(boxes[i].tolist())} is fractional: only a "
                                                       "resized box (size=...) may be")
            continue
        try:
            with _quiet_pillow(), _quiet(buffers[i]) as messages:
                img = _open(buffers[i])
                if options.apply_exif_orientation and _readable_exif(img):  # (unreadable: orientation 1, as probe())
                    img = ImageOps.exif_transpose(img)
                img = img.convert("RGB" if options.mode == "rgb" else "L")
                if not options.resize:
                    img = img.crop((int(l), int(t), int(l + w), int(t + h)))
                elif options.window:  # the filter reads around the box, up to the image's edges
                    img = _window(img, (t, l, h, w), oh, ow)
                else:  # crop the whole pixels covering the box, then resample the box from them
                    x0, y0 = math.floor(l), math.floor(t)
                    img = img.crop((x0, y0, math.ceil(l + w), math.ceil(t + h)))
                    img = img.resize((ow, oh), Image.BILINEAR, box=(l - x0, t - y0, l - x0 + w, t - y0 + h),
                                     reducing_gap=None)
                pixels = np.array(img).reshape(oh, ow, -1)  # writable: torch.from_numpy warns on read-only
        except Exception as e:  # truncated or corrupt: Pillow's own message
            said = f"; libtiff: {' '.join(messages)}" if messages else ""
            status.fail(i, ErrorKind.CORRUPT, f"Pillow could not decode it ({type(e).__name__}: {e}{said})")
            continue
        if messages:  # libtiff decoded it but reported damage: a warning, as libjpeg's are
            if options.strict:
                status.fail(i, ErrorKind.CORRUPT, f"libtiff: {' '.join(messages)} (strict)")
                continue
            status.warnings[i] = f"libtiff: {' '.join(messages)}"
        out[i] = to_device(pixels, out.device)
        status.route[i] = Route.PILLOW
        status.fallback[i] = "not a JPEG: decoded by Pillow"
    return status
