"""Helpers shared by the test modules (import this, never conftest): test data made from real photos
(single photos, photo batches, lists of encoded photos), references, the devices and the backend x
device cases, limits, child processes, memory, and the concurrency stress."""

from __future__ import annotations

import contextlib
import io
import os
import struct
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import pytest
import torch

import gpupipe
from gpupipe import _C

TESTS = Path(__file__).resolve().parent


@contextlib.contextmanager
def switched(setter, value):
    """setter(value) for the duration of the block, for a setter that returns the previous value
    (gpupipe._C's test switches: the Huffman reader, the entropy index's pause, the AVX2 IDCTs)."""
    before = setter(value)
    try:
        yield
    finally:
        setter(before)


@contextlib.contextmanager
def limits(**kwargs):
    """gpupipe.set_limits(**kwargs) for the duration of the block."""
    old = gpupipe.set_limits(**kwargs)
    try:
        yield
    finally:
        gpupipe.set_limits(*old)


def run_child(code: str, timeout: float = 120, env: dict | None = None) -> subprocess.CompletedProcess:
    """Runs `code` in a fresh interpreter (tests/ importable, warnings ignored), so that a crash, an
    abort or a hang fails the test instead of killing the suite. Asserts the child exits 0 and
    writes nothing to stderr; returns the finished process (stdout for the caller)."""
    prologue = "import sys, warnings\nsys.path.insert(0, %r)\nwarnings.simplefilter('ignore')\n" % str(TESTS)
    r = subprocess.run([sys.executable, "-c", prologue + textwrap.dedent(code)], capture_output=True, text=True,
                       timeout=timeout, env=dict(os.environ, **(env or {})))
    assert r.returncode == 0, f"child died with {r.returncode}:\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
    assert r.stderr == "", f"child wrote to stderr:\n{r.stderr[-4000:]}"
    return r


def in_forked_child(target: Callable, *args, timeout: float = 60):
    """``target(*args, queue)`` in a child made by fork() (the parent's threads and locks as they
    were), its one ``queue.put`` returned; asserts the child exits 0 within ``timeout`` (a hang or
    a crash fails the test, never the suite)."""
    import multiprocessing as mp
    import warnings

    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork() with threads (Python 3.12+)
        child = ctx.Process(target=target, args=(*args, queue))
        child.start()
    child.join(timeout=timeout)
    if child.is_alive():
        child.kill()
        child.join()
    assert child.exitcode == 0, f"child hung or crashed (exit code {child.exitcode})"
    return queue.get(timeout=5)


def rss_mb() -> float:
    """This process's resident memory (VmRSS) in MB. Fails where /proc/self/status has no VmRSS
    (rather than reading 0 and letting a growth check pass); skips, saying why, off Linux."""
    if not sys.platform.startswith("linux"):
        pytest.skip(f"resident memory is read from /proc/self/status (Linux), not on {sys.platform}")
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("/proc/self/status has no VmRSS line: the memory check cannot measure anything")


DEVICES = [pytest.param("cpu"),
           pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"))]

HEIGHT, WIDTH = 157, 203  # neither a multiple of 8 nor of 16
PHOTOS = ("astronaut", "coffee", "chelsea", "rocket")  # scikit-image's bundled photos


def _pil_photo(name: str):
    import skimage.data
    from PIL import Image

    return Image.fromarray(np.asarray(getattr(skimage.data, name)())).convert("RGB")


def photo(height: int = HEIGHT, width: int = WIDTH, name: str = "astronaut") -> np.ndarray:
    """uint8 HWC: scikit-image's photo ``name``, resized whole (Lanczos)."""
    from PIL import Image

    return np.asarray(_pil_photo(name).resize((width, height), Image.LANCZOS))


def photos(height: int, width: int, channels_last: bool = True) -> torch.Tensor:
    """uint8 ``[4, 3, height, width]``: the four PHOTOS, each resized whole; channels-last memory
    as gpupipe's decoder writes it, unless ``channels_last=False``."""
    x = torch.from_numpy(np.stack([photo(height, width, name) for name in PHOTOS])).permute(0, 3, 1, 2)
    return x if channels_last else x.contiguous()


def photo_batch(n: int, h: int, w: int, *, seed: int = 0, device: str = "cpu", channels_last: bool = True) -> torch.Tensor:
    """uint8 ``[n, 3, h, w]``: a different random crop of a real photo per sample (resized with
    Lanczos), channels-last as gpupipe's decoder writes it."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    imgs = []
    for i in range(n):
        pil = _pil_photo(PHOTOS[i % len(PHOTOS)])
        side = int(rng.integers(min(pil.size) // 2, min(pil.size) + 1))
        top = int(rng.integers(0, pil.size[1] - side + 1))
        left = int(rng.integers(0, pil.size[0] - side + 1))
        imgs.append(np.asarray(pil.crop((left, top, left + side, top + side)).resize((w, h), Image.LANCZOS)))
    x = torch.from_numpy(np.stack(imgs)).permute(0, 3, 1, 2)  # NHWC memory
    if not channels_last:
        x = x.contiguous()
    return x.to(device)


def encode(pixels: np.ndarray, **options) -> bytes:
    h, w = pixels.shape[:2]
    c = 1 if pixels.ndim == 2 else pixels.shape[2]
    return _C.encode_jpeg(np.ascontiguousarray(pixels).tobytes(), h, w, c, **options)


def photo_jpegs(names: Sequence[str], options: Sequence[dict], size: tuple[int, int] = (150, 190),
                step: tuple[int, int] = (7, 11)) -> list[bytes]:
    """One JPEG per name: photo ``i`` (``names[i]``) at ``size + i * step`` (height, width), encoded
    with ``options[i % len(options)]`` (:func:`encode`'s keywords): a batch of distinct photos,
    sizes and variants."""
    return [encode(photo(size[0] + step[0] * i, size[1] + step[1] * i, name), **options[i % len(options)])
            for i, name in enumerate(names)]


# name -> encoder options; stored color space, sampling (luma h, v), coding
SAMPLINGS = {"4:4:4": (1, 1), "4:2:2": (2, 1), "4:2:0": (2, 2), "4:4:0": (1, 2), "4:1:1": (4, 1), "4:1:0": (4, 2)}


def legal_samplings(components: int) -> list[tuple[tuple[int, int], ...]]:
    """Every per-component (h, v) sampling a baseline file may carry and libjpeg implements: factors
    1..4, at most 10 blocks in an interleaved MCU (ITU T.81 B.2.3), each factor dividing the largest
    (libjpeg refuses non-integral ratios as unsupported). Chroma may differ per component or exceed luma."""
    import itertools

    factors = [(h, v) for h in range(1, 5) for v in range(1, 5)]
    out = []
    for s in itertools.product(factors, repeat=components):
        mh, mv = max(f[0] for f in s), max(f[1] for f in s)
        if (components == 1 or sum(h * v for h, v in s) <= 10) and all(mh % h == 0 and mv % v == 0 for h, v in s):
            out.append(s)
    return out


def make_variants(pixels: np.ndarray) -> dict[str, bytes]:
    v = {}
    for name, (h, vs) in SAMPLINGS.items():
        v[f"ycbcr-{name}"] = encode(pixels, h_samp=h, v_samp=vs)
        v[f"ycbcr-{name}-progressive"] = encode(pixels, h_samp=h, v_samp=vs, progressive=True)
    v["ycbcr-4:2:0-arithmetic"] = encode(pixels, arithmetic=True)
    v["ycbcr-4:2:0-arithmetic-progressive"] = encode(pixels, arithmetic=True, progressive=True)
    v["ycbcr-4:2:0-restart-rows"] = encode(pixels, restart_rows=1)
    v["ycbcr-4:2:2-restart-blocks"] = encode(pixels, h_samp=2, v_samp=1, restart_blocks=5)
    v["ycbcr-4:2:0-optimized"] = encode(pixels, optimize=True)
    v["rgb"] = encode(pixels, colorspace="rgb")
    v["gray"] = encode(pixels, colorspace="gray")
    v["gray-progressive"] = encode(pixels, colorspace="gray", progressive=True)
    cmyk = np.concatenate([255 - pixels, (255 - pixels.max(axis=2, keepdims=True)) // 2], axis=2)
    v["cmyk"] = encode(cmyk, colorspace="cmyk")
    v["ycck"] = encode(cmyk, colorspace="ycck", h_samp=2, v_samp=2)
    v["pillow-4:2:0-q75"] = pillow_encode(pixels, quality=75, subsampling=2)
    v["pillow-progressive"] = pillow_encode(pixels, quality=90, progressive=True)
    return v


def pillow_encode(pixels: np.ndarray, **kwargs) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "JPEG", **kwargs)
    return buf.getvalue()


def full_decode(data: bytes, mode: str = "rgb") -> np.ndarray:
    """The reference: the whole image decoded by the same libjpeg-turbo alone (without gpupipe's
    Huffman reader, csrc/decode/huffman_reader.h), as HWC numpy."""
    info = gpupipe.read_header(data)
    before = gpupipe._C._set_huffman_reader(False)
    try:
        return gpupipe.decode_crop_jpeg(data, 0, 0, info.height, info.width, mode=mode).permute(1, 2, 0).numpy()
    finally:
        gpupipe._C._set_huffman_reader(before)


def pil_decode(data: bytes, mode: str = "RGB") -> np.ndarray:
    from PIL import Image

    a = np.asarray(Image.open(io.BytesIO(data)).convert(mode))
    return a[..., None] if a.ndim == 2 else a


def patch_sof(data: bytes, *, precision: int | None = None, height: int | None = None,
              width: int | None = None, marker: int | None = None) -> bytes:
    """Rewrites fields of the first SOF segment (to fake 12-bit, lossless or huge images)."""
    b = bytearray(data)
    i = 2
    while i < len(b):
        m = b[i + 1]
        if 0xC0 <= m <= 0xCF and m not in (0xC4, 0xC8, 0xCC):
            if marker is not None:
                b[i + 1] = marker
            if precision is not None:
                b[i + 4] = precision
            if height is not None:
                b[i + 5 : i + 7] = struct.pack(">H", height)
            if width is not None:
                b[i + 7 : i + 9] = struct.pack(">H", width)
            return bytes(b)
        i += 2 + struct.unpack(">H", b[i + 2 : i + 4])[0]
    raise AssertionError("no SOF marker")


def stress(work: Callable[[int], None], threads: int = 8, timeout: float = 120) -> None:
    """Runs ``work(k)`` on ``threads`` threads at once; fails on a deadlock (a thread still alive
    after ``timeout``) or on any exception a worker raised (the first one, re-raised)."""
    errors: list = []

    def run(k):
        try:
            work(k)
        except BaseException as e:  # reported below
            errors.append(e)

    pool = [threading.Thread(target=run, args=(k,), name=f"stress-{k}") for k in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join(timeout)
    assert not any(t.is_alive() for t in pool), "deadlock: a thread did not finish"
    if errors:
        raise errors[0]


def backend_case(backend: str, device: str):
    """A pytest param for (backend, device), skipped with the reason where it cannot run here."""
    info = gpupipe.backends_available()[backend]
    marks = []
    if not info["available"]:
        marks.append(pytest.mark.skip(reason=f"{backend}: {info['reason']}"))
    elif device not in info["devices"]:
        marks.append(pytest.mark.skip(reason=f"{backend} on {device}: {info['reason'] or 'unavailable'}"))
    return pytest.param(backend, device, marks=marks, id=f"{backend}-{device}")


# Every (backend, device) pair gpupipe supports; the ones this machine lacks are skipped with a reason.
# Pixel tolerance against the CPU core, per backend and device. libjpeg-turbo based paths are exact.
# nvJPEG (nvjpeg-cuda, and DALI's mixed decoder) measured on an H100 (benchmarks/gpu_check.py,
# docs/semantics.md): 4:4:4 and gray decode bit-equal (the same IDCT), subsampled chroma is
# upsampled otherwise than libjpeg's fancy upsampling: per photo, mean |diff| <= 1.55 levels,
# 99th percentile <= 14, max 45 at sharp color edges. Held to: mean < 2, 99th percentile <= 16.
EXACT_BACKENDS = {("cpu", "cpu"), ("dali", "cpu"), ("cpu", "cuda")}


def assert_close_to_core(got, ref, backend, device):
    import torch

    def ints(a):
        return (a if isinstance(a, torch.Tensor) else torch.from_numpy(np.array(a))).cpu().int()

    diff = (ints(got) - ints(ref)).abs()
    if (backend, device) in EXACT_BACKENDS:
        assert diff.max() == 0, f"{backend}-{device} must equal the CPU core: max |diff| {int(diff.max())}"
    else:
        mean, p99 = float(diff.float().mean()), float(diff.float().quantile(0.99))
        assert mean < 2.0 and p99 <= 16, (backend, device, mean, p99)


BACKEND_DEVICES = [backend_case("cpu", "cpu"), backend_case("dali", "cpu"), backend_case("cpu", "cuda"),
                   backend_case("dali", "cuda"), backend_case("nvjpeg", "cuda")]
