"""Hostile inputs: every one gives a clear Python exception (or, for recoverable corruption, the
documented warning / strict error), the process never dies, memory does not grow, and a valid
decode right after still works."""

import io
import os
import struct
import sys
import warnings

import numpy as np
import pytest
import torch

import gpupipe
from helpers import HEIGHT, WIDTH, encode, patch_sof, photo, run_child, stress

ERRORS = (gpupipe.JpegError, ValueError)


def attempt(data, box=(0, 0, 8, 8), **kw):
    """Decodes, returning 'ok', 'warning' or the exception class name; never raises."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", gpupipe.JpegWarning)
        try:
            gpupipe.decode_crop_jpeg(data, *box, **kw)
        except ERRORS as e:
            assert str(e), "an error must say what went wrong"
            return type(e).__name__
    return "warning" if caught else "ok"


@pytest.fixture(scope="module")
def reference(jpeg):
    return gpupipe.decode_crop_jpeg(jpeg, 5, 6, 40, 50)


def still_works(jpeg, reference):
    assert torch.equal(gpupipe.decode_crop_jpeg(jpeg, 5, 6, 40, 50), reference)


def marker_offsets(data):
    out, i = [], 2
    while i + 4 <= len(data) and data[i] == 0xFF:
        out.append(i)
        if data[i + 1] == 0xDA:
            break
        i += 2 + struct.unpack(">H", data[i + 2:i + 4])[0]
    return out + [len(data) - 2]


@pytest.mark.parametrize("name", ["ycbcr-4:2:0", "ycbcr-4:2:0-progressive", "ycbcr-4:2:0-restart-rows", "cmyk"])
def test_truncated_at_every_marker_boundary(variants, jpeg, reference, name):
    data = variants[name]
    offsets = marker_offsets(data)
    eoi = len(data) - 2
    cuts = sorted(c for c in set(offsets + [o + 1 for o in offsets] + [o + 4 for o in offsets] + [len(data) // 2]) if c < eoi)
    outcomes = {}
    for cut in cuts:
        outcomes[cut] = attempt(data[:cut], (HEIGHT - 8, WIDTH - 8, 8, 8))
        still_works(jpeg, reference)
    assert set(outcomes.values()) <= {"CorruptJpegError", "warning"}, outcomes
    assert "CorruptJpegError" in outcomes.values()  # header cuts are errors; scan cuts warn
    assert attempt(data[:eoi], (HEIGHT - 8, WIDTH - 8, 8, 8)) in ("ok", "warning")  # only EOI missing: no error


def test_random_bit_flips(variants, jpeg, reference):
    rng = np.random.default_rng(0)
    seen = set()
    for name in ("ycbcr-4:2:0", "ycbcr-4:2:0-progressive", "ycbcr-4:2:0-arithmetic", "gray"):
        data = variants[name]
        for _ in range(60):
            b = bytearray(data)
            for _ in range(int(rng.integers(1, 4))):
                i = int(rng.integers(2, len(b)))
                b[i] ^= 1 << int(rng.integers(0, 8))
            seen.add(attempt(bytes(b), (0, 0, 16, 16)))
            seen.add(attempt(bytes(b), (0, 0, 16, 16), strict=True))
    still_works(jpeg, reference)
    assert seen <= {"ok", "warning", "CorruptJpegError", "UnsupportedJpegError", "PixelLimitError", "ValueError"}


@pytest.mark.parametrize("data,cls,match", [
    (b"", gpupipe.NotAJpegError, "Empty input file"),
    (b"\xff\xd8", gpupipe.CorruptJpegError, "no image"),
    (b"\xff\xd8\xff\xd9", gpupipe.CorruptJpegError, "no image"),
    (b"\x00" * 100, gpupipe.NotAJpegError, "Not a JPEG file"),
])
def test_degenerate_files(jpeg, reference, data, cls, match):
    with pytest.raises(cls, match=match):
        gpupipe.decode_crop_jpeg(data, 0, 0, 1, 1)
    still_works(jpeg, reference)


@pytest.mark.parametrize("segment", [0xDB, 0xC4, 0xC0, 0xDA])  # DQT, DHT, SOF, SOS
@pytest.mark.parametrize("length", [0, 1, 2, 3, 0xFFFF])
def test_wrong_marker_lengths(jpeg, reference, segment, length):
    b = bytearray(jpeg)
    i = b.find(bytes([0xFF, segment]))
    b[i + 2:i + 4] = struct.pack(">H", length)
    assert attempt(bytes(b)) in {"CorruptJpegError", "warning"}
    still_works(jpeg, reference)


def test_huge_declared_dimensions_are_refused_before_allocating(jpeg, reference):
    with pytest.raises(gpupipe.PixelLimitError, match="65500x65500"):
        gpupipe.decode_crop_jpeg(patch_sof(jpeg, height=65500, width=65500), 0, 0, 8, 8)
    with pytest.raises(gpupipe.DecompressionBombError):
        gpupipe.decode_crop_jpegs([patch_sof(jpeg, height=65500, width=65500)], [[0, 0, 8, 8]])
    still_works(jpeg, reference)


def scan_bomb(progressive: bytes, copies: int) -> bytes:
    """A progressive file whose last scan is repeated `copies` times (each one a pass over the
    whole coefficient buffer)."""
    last_sos = progressive.rfind(b"\xff\xda")
    scan = progressive[last_sos:-2]
    return progressive[:-2] + scan * copies + b"\xff\xd9"


def test_progressive_scan_bomb_is_refused_and_the_limit_is_configurable(variants, jpeg, reference):
    bomb = scan_bomb(variants["ycbcr-4:2:0-progressive"], 300)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", gpupipe.JpegWarning)
        with pytest.raises(gpupipe.ScanLimitError, match="more than max_scans=100 scans"):
            gpupipe.decode_crop_jpeg(bomb, 0, 0, 8, 8)
        old = gpupipe.set_limits(max_scans=1000)
        try:
            gpupipe.decode_crop_jpeg(bomb, 0, 0, 8, 8)  # allowed now: decodes (with warnings)
        finally:
            gpupipe.set_limits(*old)
    still_works(jpeg, reference)


@pytest.mark.skipif(not gpupipe.backends_available()["dali"]["available"], reason="DALI not installed")
def test_scan_limit_holds_in_the_dali_backend(variants):
    bomb = scan_bomb(variants["ycbcr-4:2:0-progressive"], 300)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", gpupipe.JpegWarning)
        with pytest.raises(gpupipe.ScanLimitError, match="max_scans"):
            gpupipe.decode_crop_jpegs([bomb], [[0, 0, 8, 8]], backend="dali")


def test_memory_cap(reference, jpeg):
    big = encode(photo(1024, 1024, "coffee"), progressive=True)  # needs the whole coefficient buffer
    old = gpupipe.set_limits(max_memory=1 << 20)
    try:
        with pytest.raises(gpupipe.MemoryLimitError, match="max_memory"):
            gpupipe.decode_crop_jpeg(big, 0, 0, 8, 8)
    finally:
        gpupipe.set_limits(*old)
    gpupipe.decode_crop_jpeg(big, 0, 0, 8, 8)
    still_works(jpeg, reference)
    with pytest.raises(ValueError, match="positive"):
        gpupipe.set_limits(max_pixels=0)
    before = gpupipe.get_limits()
    for name, bad in [("max_pixels", -1), ("max_memory", 2**64), ("max_scans", 0.5), ("max_scans", 1.9),
                      ("max_scans", 2**31), ("max_file_size", True), ("max_batch_bytes", 0), ("max_pixels", "1000"),
                      ("max_pixels", np.float32(3.7)), ("max_pixels", float("nan"))]:
        with pytest.raises(ValueError, match=f"{name} must be a positive integer .*got"):
            gpupipe.set_limits(**{name: bad})
    assert gpupipe.get_limits() == before  # (nothing set by a refused call)
    try:
        assert gpupipe.set_limits(max_pixels=1e8, max_scans=np.int64(7)) == before
        assert gpupipe.get_limits()[:2] == (10**8, 7)
    finally:
        gpupipe.set_limits(*before)


def test_limits_set_from_several_threads_never_undo_each_other():
    """set_limits read the old values, then wrote all four: a thread setting max_scans could put
    back the max_pixels another thread had just set."""
    import threading

    before, interval = gpupipe.get_limits(), sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch between any two bytecodes: the race shows at once
    try:
        for trial in range(300):
            start = threading.Barrier(2)

            def pixels():
                start.wait()
                gpupipe.set_limits(max_pixels=1000 + trial)

            def scans():
                start.wait()
                gpupipe.set_limits(max_scans=50 + trial)

            threads = [threading.Thread(target=pixels), threading.Thread(target=scans)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert gpupipe.get_limits()[:2] == (1000 + trial, 50 + trial)
    finally:
        sys.setswitchinterval(interval)
        gpupipe.set_limits(*before)


@pytest.mark.parametrize("fmt", ["PNG", "GIF", "BMP", "WEBP", "TIFF"])
def test_other_image_formats(jpeg, reference, fmt):
    """Decoded by Pillow with the same box semantics (the "pillow" route), or refused on request."""
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(photo(20, 30)).save(buf, fmt)
    data = buf.getvalue()
    expected = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))[2:10, 3:11]
    np.testing.assert_array_equal(gpupipe.decode_crop_jpeg(data, 2, 3, 8, 8).permute(1, 2, 0).numpy(), expected)
    batch = gpupipe.decode_crop_jpegs([data, jpeg], [[2, 3, 8, 8]] * 2)
    assert batch.routes == ["pillow", "cpu"] and 0 in batch.fallback
    with pytest.raises(gpupipe.NotAJpegError, match="Not a JPEG file"):
        gpupipe.decode_crop_jpeg(data, 0, 0, 8, 8, non_jpeg="error")
    still_works(jpeg, reference)


def test_concurrent_stress_with_a_corrupt_sample(variants):
    datas = list(variants.values())[:12]
    datas[5] = datas[5][:100] + os.urandom(200)
    boxes = np.array([[0, 0, 32, 32]] * len(datas))
    serial = gpupipe.decode_crop_jpegs(datas, boxes, on_error="skip", num_threads=2)
    singles = [attempt(d, (0, 0, 32, 32)) for d in datas]

    def work(k):
        for _ in range(10):
            r = gpupipe.decode_crop_jpegs(datas, boxes, on_error="skip", num_threads=2)
            assert torch.equal(r.images, serial.images) and torch.equal(r.ok, serial.ok), "batch differs"
            assert [attempt(d, (0, 0, 32, 32)) for d in datas[k % 3::3]] == singles[k % 3::3], "single op differs"

    stress(work, threads=8)
    assert not serial.ok[5]


def test_memory_does_not_grow_with_corrupt_inputs(variants):
    """The short version of benchmarks/memory.py: 6,000 decodes, half of them failing. In a process
    of its own: threads left by earlier tests (an epoch ahead, a read left to finish) would
    allocate or free in this one's window."""
    out = run_child(f"""
        import gc, warnings
        import numpy as np
        import gpupipe
        from helpers import patch_sof, rss_mb
        good = {variants["ycbcr-4:2:0"]!r}
        bad = [good[: len(good) // 2], good[:300], b"\\xff\\xd8\\xff\\xdb" + bytes(70), patch_sof(good, precision=12)]
        rng = np.random.default_rng(0)

        def round_(n):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", gpupipe.JpegWarning)
                for i in range(n):
                    data = good if i % 2 else bad[i // 2 % len(bad)]
                    try:
                        gpupipe.decode_crop_jpeg(data, int(rng.integers(0, 100)), int(rng.integers(0, 100)), 32, 32)
                    except (gpupipe.JpegError, ValueError):
                        pass

        round_(2000)  # warm-up: allocator pools, thread-local decoder
        gc.collect()
        before = rss_mb()
        round_(4000)
        gc.collect()
        print(rss_mb() - before)
        """)
    assert float(out.stdout.split()[-1]) < 5.0
