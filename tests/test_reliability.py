"""Reliability, round 2: each report of the issue, reproduced. Cases that could take the process down
run in a child process, so a crash, an abort or a hang is a test failure instead of the suite dying;
the child must also print nothing to stderr (no libjpeg message may reach it)."""

from __future__ import annotations

import io
from pathlib import Path
import struct
import warnings

import numpy as np
import pytest
import torch

import crafted
import gpupipe
from gpupipe import _C
from helpers import encode, photo
from helpers import limits, run_child

# --- 1. the restart-marker walk --------------------------------------------------------------------

@pytest.mark.parametrize("builder", ["restart_walk_heap_overflow", "restart_walk_garbage"])
def test_crafted_restart_layouts_do_not_crash_and_decode_as_the_normal_path(builder):
    out = run_child(f"""
        import numpy as np, torch, gpupipe, crafted
        from gpupipe import _C
        data = crafted.{builder}()
        boxes = [(0, 0, 64, 64), (8, 8, 16, 16), (40, 0, 24, 64), (56, 56, 8, 8)]
        for t, l, h, w in boxes:
            fast = torch.zeros((h, w, 1), dtype=torch.uint8)
            slow = torch.zeros((h, w, 1), dtype=torch.uint8)
            _, _, used = _C.decode_into(data, fast.data_ptr(), fast.numel(), t, l, h, w, h, w, mode=1)
            _C.decode_into(data, slow.data_ptr(), slow.numel(), t, l, h, w, h, w, mode=1, use_restarts=False)
            assert not used, "a layout the walk cannot trust must take the normal path"
            assert torch.equal(fast, slow)
        for _ in range(50):  # the public entry points, repeatedly (heap corruption shows up late)
            gpupipe.decode_crop_jpeg(data, 8, 8, 16, 16)
            r = gpupipe.decode_crop_jpegs([data] * 4, np.array(boxes), size=16, on_error="skip", num_threads=2)
            assert bool(r.ok.all())
        print("ok")
    """)
    assert out.stdout.strip() == "ok"


def test_restart_walk_rejects_segment_lengths_that_disagree_with_the_frame():
    base = crafted.gray_restart_jpeg()
    sof = base.find(b"\xff\xc0")
    bad_len = bytearray(base)
    bad_len[sof + 3] += 3  # SOF length no longer 8 + 3 * Nf (libjpeg refuses it too)
    with pytest.raises(gpupipe.CorruptJpegError):
        gpupipe.decode_crop_jpeg(bytes(bad_len), 0, 0, 8, 8)
    # intact: the restart route is taken
    out = torch.empty((8, 8, 1), dtype=torch.uint8)
    assert _C.decode_into(base, out.data_ptr(), out.numel(), 8, 8, 8, 8, 8, 8, mode=1)[2]


def test_a_file_without_tables_decodes_the_same_whatever_was_decoded_before(pixels):
    """Found by the transcode fuzzer: a reused libjpeg decompressor keeps the last file's Huffman
    tables, so a file that omits its DHT was decoded with the previous file's tables."""
    standard = encode(pixels)  # standard Huffman tables
    abbreviated = crafted.without_segments(standard, 0xC4)
    optimized = encode(pixels, optimize=True)  # other tables in the same slots
    h, w = pixels.shape[:2]
    reference = gpupipe.decode_crop_jpeg(standard, 0, 0, h, w)
    assert torch.equal(gpupipe.decode_crop_jpeg(abbreviated, 0, 0, h, w, strict=True), reference)
    gpupipe.decode_crop_jpeg(optimized, 0, 0, h, w)
    assert torch.equal(gpupipe.decode_crop_jpeg(abbreviated, 0, 0, h, w, strict=True), reference)
    r = gpupipe.decode_crop_jpegs([optimized, abbreviated] * 4, [[0, 0, h, w]] * 8, num_threads=1)
    assert torch.equal(r.images[1::2], reference.expand(4, *reference.shape))


# --- 2, 3. prepare holds the limits and never launders corrupt files -----------------------------

def test_prepare_refuses_a_huge_declared_size_before_allocating(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "bomb.jpg").write_bytes(crafted.huge_declared_size(30000, 30000))
    (src / "bomb65500.jpg").write_bytes(crafted.huge_declared_size(65500, 65500))
    out = run_child(f"""
        import resource, gpupipe
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        report = gpupipe.prepare({str(src)!r}, {str(tmp_path / 'dst')!r}, progress=False)
        grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
        assert report.transcoded == 0 and len(report.copied) == 2, report
        assert all("PixelLimitError" in reason and "max_pixels" in reason for _, reason in report.copied), report.copied
        assert grown_mb < 50, grown_mb
        print("ok")
    """)
    assert out.stdout.strip() == "ok"
    assert (tmp_path / "dst" / "bomb.jpg").read_bytes() == (src / "bomb.jpg").read_bytes()  # copied unchanged


def test_prepare_holds_the_scan_and_memory_limits(variants):
    progressive = variants["ycbcr-4:2:0-progressive"]  # 10 scans (jpeg_simple_progression)
    with limits(max_scans=5), pytest.raises(gpupipe.ScanLimitError, match="max_scans=5"):
        _C.transcode_with_restarts(progressive, 1, 8)
    assert gpupipe.read_header(_C.transcode_with_restarts(progressive, 1, 8)).restart_interval > 0
    big = encode(photo(1024, 1024, "coffee"), progressive=True)  # 3 MB of coefficient arrays
    with limits(max_memory=1 << 20), pytest.raises(gpupipe.MemoryLimitError, match="max_memory"):
        _C.transcode_with_restarts(big, 1, 8)
    assert gpupipe.read_header(_C.transcode_with_restarts(big, 1, 8)).restart_interval > 0


def test_prepare_keeps_a_progressive_file_with_missing_scans_unchanged(tmp_path, variants):
    """Found by the transcode fuzzer: libjpeg smooths the coefficients such a file leaves unknown, so
    a baseline copy of its coefficients would decode to other pixels."""
    data = crafted.incomplete_progressive(variants["ycbcr-4:2:0-progressive"])
    with warnings.catch_warnings():
        warnings.simplefilter("error", gpupipe.JpegWarning)
        gpupipe.decode_crop_jpeg(data, 0, 0, 8, 8, strict=True)  # a valid file
    with pytest.raises(gpupipe.UnsupportedJpegError, match="smooths"):
        _C.transcode_with_restarts(data, 1, 8)
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.jpg").write_bytes(data)
    report = gpupipe.prepare(tmp_path / "src", tmp_path / "dst", progress=False)
    assert report.transcoded == 0 and "UnsupportedJpegError" in report.copied[0][1]
    assert (tmp_path / "dst" / "a.jpg").read_bytes() == data


@pytest.mark.parametrize("damage", ["truncated", "bitflip"])
def test_prepare_reports_a_corrupt_source_and_copies_it_unchanged(tmp_path, jpeg, damage):
    bad = jpeg[: len(jpeg) * 2 // 3] if damage == "truncated" else _flip_entropy_bytes(jpeg)
    with warnings.catch_warnings():
        warnings.simplefilter("error", gpupipe.JpegWarning)
        with pytest.raises(gpupipe.JpegWarning):  # the source really is corrupt
            gpupipe.decode_crop_jpeg(bad, 0, 0, *gpupipe.read_header(bad)[:2])
    with pytest.raises(gpupipe.CorruptJpegError, match="corrupt or truncated data.*not transcoded"):
        _C.transcode_with_restarts(bad, 1, 8)
    src = tmp_path / "src"
    src.mkdir()
    (src / "bad.jpg").write_bytes(bad)
    (src / "good.jpg").write_bytes(jpeg)
    out = run_child(f"""
        import gpupipe
        r = gpupipe.prepare({str(src)!r}, {str(tmp_path / 'dst')!r}, progress=False)
        assert r.transcoded == 1 and [p.split("/")[-1] for p, _ in r.copied] == ["bad.jpg"], r
        print(r.copied[0][1])
    """)
    assert "CorruptJpegError" in out.stdout
    assert (tmp_path / "dst" / "bad.jpg").read_bytes() == bad


def _flip_entropy_bytes(jpeg: bytes) -> bytes:
    b = bytearray(jpeg)
    start = crafted.sos_offset(jpeg) + 20
    for i in range(start, len(b) - 2, 97):
        if b[i] not in (0xFF, 0x00) and b[i - 1] != 0xFF:
            b[i] ^= 0x5A
    return bytes(b)


# --- 4. nothing of libjpeg reaches stderr ---------------------------------------------------------

def test_no_entry_point_writes_to_stderr(tmp_path, variants):
    good = variants["ycbcr-4:2:0"]
    corrupt = [good[: len(good) // 2], _flip_entropy_bytes(good), variants["ycbcr-4:2:0-progressive"][:-300],
               good[:300], b"\xff\xd8\xff\xdb" + bytes(70), b"not a jpeg", crafted.restart_walk_garbage()]
    folder = tmp_path / "imgs" / "c0"
    folder.mkdir(parents=True)
    for i, d in enumerate([good] + corrupt):
        (folder / f"{i}.jpg").write_bytes(d)
    np.save(tmp_path / "datas.npy", np.array(corrupt, dtype=object), allow_pickle=True)
    run_child(f"""
        import numpy as np, gpupipe
        from gpupipe import crops, sources
        datas = list(np.load({str(tmp_path / 'datas.npy')!r}, allow_pickle=True))
        for d in datas:
            for strict in (False, True):
                try:
                    gpupipe.read_header(d)
                    gpupipe.decode_crop_jpeg(d, 0, 0, 8, 8, strict=strict)
                except (gpupipe.JpegError, ValueError):
                    pass
        boxes = np.zeros((len(datas), 4), dtype=np.int64) + [0, 0, 8, 8]
        backends = ["cpu"] + (["dali"] if gpupipe.backends_available()["dali"]["available"] else [])
        for backend in backends:
            gpupipe.decode_crop_jpegs(datas, boxes, on_error="skip", backend=backend)
        gpupipe.prepare({str(tmp_path / 'imgs')!r}, {str(tmp_path / 'prepared')!r}, progress=False)
        loader = gpupipe.Loader(sources.ImageFolder({str(tmp_path / 'imgs')!r}), batch_size=4,
                                crop=crops.RandomResizedCrop(16), num_threads=2)
        assert sum(x.shape[0] for x, _ in loader) >= 1
    """)


# --- 5. the thread pool never takes the interpreter down ------------------------------------------

def test_absurd_thread_counts_are_a_clear_error(jpeg):
    with pytest.raises(ValueError, match="num_threads must be within 1..1024"):
        gpupipe.decode_crop_jpegs([jpeg] * 2, [[0, 0, 8, 8]] * 2, num_threads=100000)
    with pytest.raises(ValueError, match="num_threads"):
        _C.decode_batch_into([jpeg], np.zeros((1, 4), np.int64), 0, 0, 8, 8, False, 0, False, True, -5)


def test_a_thread_the_system_refuses_is_a_runtime_error_not_an_abort(jpeg):
    """With the address space capped, starting 1000 threads fails part way (each needs a stack):
    the pool joins what started and raises; the interpreter goes on and decodes."""
    out = run_child(f"""
        import resource, numpy as np, gpupipe
        data = {jpeg!r}
        with open("/proc/self/status") as f:
            vm = next(int(l.split()[1]) for l in f if l.startswith("VmSize")) * 1024
        resource.setrlimit(resource.RLIMIT_AS, (vm + (256 << 20), resource.RLIM_INFINITY))
        try:
            gpupipe.decode_crop_jpegs([data] * 4, np.array([[0, 0, 8, 8]] * 4), num_threads=1000)
            print("no failure")
        except RuntimeError as e:
            assert "could not start 1000 decode threads" in str(e), e
            print("raised")
        r = gpupipe.decode_crop_jpegs([data] * 4, np.array([[0, 0, 8, 8]] * 4), num_threads=2)
        assert bool(r.ok.all())
    """)
    assert out.stdout.strip() in ("raised", "no failure")
    if out.stdout.strip() == "no failure":
        pytest.skip("this machine started 1000 threads within the address-space cap")


def test_an_exception_inside_pool_work_comes_back_as_an_error():
    # _C._pool_selftest runs a parallel_for whose body throws at one index (a test hook).
    with pytest.raises(RuntimeError, match="selftest failure at index 37"):
        _C._pool_selftest(4, 100, 37)
    assert _C._pool_selftest(4, 100, -1) == 100  # the pool survived and runs every index


# --- 6. EXIF orientation in any APP1 --------------------------------------------------------------

@pytest.mark.parametrize("order", ["xmp-first", "exif-first", "two-exif"])
def test_exif_orientation_is_found_after_an_xmp_app1(jpeg, order):
    import io

    from PIL import Image

    segments = {"xmp-first": (crafted.xmp_app1(), crafted.exif_app1(6)),
                "exif-first": (crafted.exif_app1(6), crafted.xmp_app1()),
                "two-exif": (crafted.xmp_app1(), crafted.exif_app1(6), crafted.exif_app1(3))}[order]
    data = crafted.with_app1s(jpeg, *segments)
    pillow = Image.open(io.BytesIO(data)).getexif().get(0x0112)
    assert pillow == 6
    assert gpupipe.read_header(data).orientation == pillow
    infos = np.empty((1, len(_C.INFO_COLUMNS)), np.int64)
    _C.read_header_infos([data], infos.ctypes.data, infos.nbytes)
    assert infos[0, _C.INFO_COLUMNS.index("orientation")] == 6


def test_truncated_exif_payloads_read_as_no_orientation(jpeg):
    full = crafted.exif_app1(6)
    for cut in range(4, len(full)):
        seg = full[:2] + (cut - 2).to_bytes(2, "big") + full[4:cut]
        assert gpupipe.read_header(crafted.with_app1s(jpeg, seg)).orientation in (1, 6)


# --- 7. fork while other threads use the pool -----------------------------------------------------

def test_fork_while_another_thread_takes_the_pool_lock_never_hangs(jpeg):
    out = run_child(f"""
        import os, threading, time, numpy as np, gpupipe
        from gpupipe import _C
        data = {jpeg!r}
        boxes = np.array([[0, 0, 8, 8]] * 2)
        stop = False
        warm = threading.Barrier(3)
        def hammer():
            gpupipe.decode_crop_jpegs([data] * 2, boxes, num_threads=2)
            warm.wait()  # forking while another thread imports a module hangs any Python child: not ours
            while not stop:
                _C.pool_threads()  # takes the pool registry's lock
                gpupipe.decode_crop_jpegs([data] * 2, boxes, num_threads=2)
        threads = [threading.Thread(target=hammer) for _ in range(2)]
        for t in threads:
            t.start()
        warm.wait()
        hung = 0
        for _ in range(60):
            pid = os.fork()
            if pid == 0:
                r = gpupipe.decode_crop_jpegs([data] * 2, boxes, num_threads=2)
                os._exit(0 if bool(r.ok.all()) else 3)
            deadline = time.time() + 60
            while True:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    assert os.waitstatus_to_exitcode(status) == 0
                    break
                if time.time() > deadline:  # hung: show where (gdb, when installed), then kill it
                    import shutil, subprocess
                    if shutil.which("gdb"):
                        print(subprocess.run(["gdb", "-p", str(pid), "-batch", "-ex", "set auto-load safe-path /",
                                              "-ex", "thread apply all bt 25", "-ex", "thread apply all py-bt"],
                                             capture_output=True, text=True).stdout[-8000:])
                    os.kill(pid, 9)
                    os.waitpid(pid, 0)
                    hung += 1
                    break
                time.sleep(0.005)
        stop = True
        for t in threads:
            t.join()
        print("hung", hung)
    """, timeout=900)
    assert out.stdout.strip().endswith("hung 0"), out.stdout


# --- 8. overflow-safe arithmetic and validated buffers --------------------------------------------

@pytest.mark.parametrize("box", [(2**62, 0, 2**62, 8), (0, 2**62, 8, 2**62), (1, 1, 2**63 - 1, 8), (0, 0, -2**63, 8),
                                 (float("nan"), 0, 8, 8), (0, 0, float("inf"), 8)])
def test_huge_and_non_finite_boxes_are_value_errors(jpeg, box):
    with pytest.raises(ValueError):
        gpupipe.decode_crop_jpeg(jpeg, *box, size=8) if any(isinstance(v, float) for v in box) else \
            gpupipe.decode_crop_jpeg(jpeg, *box)
    boxes = np.array([box], dtype=np.float64 if any(isinstance(v, float) for v in box) else np.int64)
    if not np.isfinite(boxes).all() or (boxes < 0).any():  # no box whatever the image: the caller's mistake
        with pytest.raises(ValueError, match=r"boxes\[0\] = .* (not finite|a negative corner)"):
            gpupipe.decode_crop_jpegs([jpeg], boxes, size=8, on_error="skip")
        return
    r = gpupipe.decode_crop_jpegs([jpeg], boxes, size=8, on_error="skip")  # outside this image: its sample fails
    assert not bool(r.ok[0]) and "not inside the image" in r.errors[0]


def test_scale_choice_is_safe_for_any_int64():
    assert _C.choose_scale_num(2**62, 2**62, 224, 224) == 1
    assert _C.choose_scale_num(2**63 - 1, 2**63 - 1, 2**31 - 1, 2**31 - 1) == 1
    assert _C.choose_scale_num(-5, 10, 224, 224) == 8
    assert _C.choose_scale_num(448, 448, 224, 224) == 4 and _C.choose_scale_num(447, 900, 224, 224) == 8


def test_output_sizes_that_overflow_are_value_errors(jpeg):
    with pytest.raises(ValueError, match="too large"):
        _C.decode_batch_into([jpeg] * 3, np.zeros((3, 4), np.int64), 1, 2**62, 2**31 - 1, 2**31 - 1, True, 0, False,
                             True, 1)
    with pytest.raises(ValueError, match="holds 10 bytes"):
        _C.decode_into(jpeg, 1, 10, 0, 0, 8, 8, 8, 8)


def test_boxes_buffer_dtype_and_output_aliasing_are_checked(jpeg):
    out = torch.empty((1, 8, 8, 3), dtype=torch.uint8)
    with pytest.raises(ValueError, match="int64 or float64"):
        _C.decode_batch_into([jpeg], np.zeros((1, 4), np.int32), out.data_ptr(), out.numel(), 8, 8, False, 0, False,
                             True, 1)
    data = torch.frombuffer(bytearray(jpeg + bytes(8 * 8 * 3)), dtype=torch.uint8)
    with pytest.raises(ValueError, match="overlaps input 0"):
        _C.decode_batch_into([data.numpy()], np.zeros((1, 4), np.int64) + [0, 0, 8, 8], data.data_ptr() + 10, 192, 8,
                             8, False, 0, False, True, 1)
    with pytest.raises(ValueError, match="overlaps input 0"):
        _C.decode_into(data.numpy(), data.data_ptr(), 192, 0, 0, 8, 8, 8, 8)


def test_a_sequence_whose_length_changes_is_refused_not_read_past(jpeg):
    """The binding reads len(datas) for the boxes and iterates datas for the inputs: a sequence that
    answers differently (a length that grows) is refused, never read past the boxes' end."""

    class Growing(list):
        calls = 0

        def __len__(self):
            Growing.calls += 1
            return 1 if Growing.calls == 1 else 2

    out = torch.empty((2, 8, 8, 3), dtype=torch.uint8)
    with pytest.raises(ValueError, match="inputs but 1 boxes"):
        _C.decode_batch_into(Growing([jpeg, jpeg]), np.zeros((1, 4), np.int64) + [0, 0, 8, 8], out.data_ptr(),
                             out.numel(), 8, 8, False, 0, False, True, 1)


def test_fractional_boxes_need_a_resize(jpeg):
    with pytest.raises(ValueError, match="fractional"):
        gpupipe.decode_crop_jpegs([jpeg], np.array([[0.5, 0, 8, 8]]), on_error="raise")
    with pytest.raises(ValueError, match="fractional"):
        gpupipe.decode_crop_jpeg(jpeg, 0.5, 0, 8, 8)
    r = gpupipe.decode_crop_jpegs([jpeg], np.array([[0.5, 0, 8.25, 8]]), size=8)
    assert bool(r.ok[0])


# --- found by a fresh-eyes audit (2026-11-22) ------------------------------------------------------


def _segment_at(data: bytes, marker: int) -> tuple[int, int]:
    i = data.index(bytes([0xFF, marker]))
    return i, struct.unpack(">H", data[i + 2:i + 4])[0]


def _sequential_scans(count: int) -> bytes:
    """A baseline (non-progressive) 3-component file with ``count`` one-component scans."""
    gray = encode(np.full((32, 32), 100, np.uint8), colorspace="gray")
    sos, sos_len = _segment_at(gray, 0xDA)
    sof, sof_len = _segment_at(gray, 0xC0)
    frame = gray[sof + 4:sof + 2 + sof_len][:5] + b"\x03\x01\x11\x00\x02\x11\x00\x03\x11\x00"
    seg = lambda m, body: bytes([0xFF, m]) + struct.pack(">H", len(body) + 2) + body  # noqa: E731
    scans = b"".join(seg(0xDA, bytes([1, 1 + k % 3, 0, 0, 63, 0])) + gray[sos + 2 + sos_len:-2] for k in range(count))
    return gray[:sof] + seg(0xC0, frame) + gray[sof + 2 + sof_len:sos] + scans + b"\xff\xd9"


def test_baseline_files_with_many_scans_count_against_max_scans_in_every_route():
    from gpupipe._backends import gpu_fallback
    from gpupipe.decode_types import DecodeOptions
    from gpupipe.routing import probe

    datas = [_sequential_scans(3), _sequential_scans(150)]
    infos = probe(datas)  # (as a GPU backend probes: the scans counted)
    assert infos.column("progressive").tolist() == [0, 0] and infos.column("scans").tolist() == [3, 150]
    assert gpu_fallback.gpu_eligible(infos, np.array([[0, 0, 8, 8]] * 2), DecodeOptions(size=None)).tolist() == [True, False]
    with pytest.raises(gpupipe.ScanLimitError, match="sample 1: JPEG has more than max_scans=100"):
        gpupipe.decode_crop_jpegs(datas, [[0, 0, 8, 8]] * 2)


def test_erase_boxes_that_overflow_int64_are_value_errors():
    from gpupipe.augment._kernels import buffer

    x = torch.zeros((1, 3, 8, 8), dtype=torch.uint8)
    value = torch.full((3,), 255, dtype=torch.uint8)
    for box in ([0, 1, 1, 2**63 - 1], [0, 2**62, 1, 2**62], [1, 0, 2**63 - 1, 1]):
        with pytest.raises(ValueError, match="not inside"):
            _C.erase_boxes(buffer(x), buffer(torch.tensor([box])), buffer(value), 1)
    assert (x == 0).all()


def test_bad_loader_and_thread_arguments_are_short_clear_errors(jpeg, tmp_path):
    with pytest.raises(TypeError, match=r"^num_threads must be an int, got float$"):
        gpupipe.decode_crop_jpegs([jpeg] * 3, [[0, 0, 8, 8]] * 3, num_threads=1.5)
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.jpg").write_bytes(jpeg)
    with pytest.raises(ValueError, match="prefetch must be an int within 1..64"):
        gpupipe.Loader(gpupipe.sources.ImageFolder(tmp_path), batch_size=1, crop=gpupipe.crops.CenterCrop(8),
                       prefetch=10**9)


def test_pillow_route_opens_only_its_formats_and_keeps_libtiff_off_stderr(capfd):
    from PIL import Image

    eps = b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 8 8\nshowpage\n%%EOF\n"  # Pillow would call Ghostscript
    with pytest.raises(gpupipe.NotAJpegError, match="sample 0: .*UnidentifiedImageError"):
        gpupipe.decode_crop_jpegs([eps], [[0, 0, 4, 4]])
    pixels = (np.arange(64 * 64 * 3) % 251).astype(np.uint8).reshape(64, 64, 3)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="TIFF", compression="jpeg")
    damaged = bytearray(buf.getvalue())
    k = damaged.find(b"\xff\xda")
    for i in range(k + 20, k + 200, 7):
        damaged[i] ^= 0x5A
    with pytest.raises(gpupipe.CorruptJpegError, match="libtiff: .*strict"):
        gpupipe.decode_crop_jpeg(bytes(damaged), 0, 0, 8, 8, strict=True)
    with pytest.warns(gpupipe.JpegWarning, match="libtiff"):
        gpupipe.decode_crop_jpegs([bytes(damaged)], [[0, 0, 8, 8]])
    assert capfd.readouterr().err == ""


def test_a_transcode_that_fails_after_its_output_grew_frees_once():
    """fuzz_transcode's finding: a source whose error comes after the output outgrew its first 4 KB
    (here a DCT coefficient out of range). libjpeg's memory destination had freed the first buffer
    and not yet reported the new one, so the transcoder freed it again (a double free: the process
    aborted). It is an error of the sample now, in a child that stays alive and quiet."""
    crash = Path(__file__).resolve().parents[1] / "csrc/fuzz/regressions/transcode/transcode-crash-62453c06c980f1a8abf5f13a3d4783c569d1b170"
    run_child(f"""
        import pytest, gpupipe
        from gpupipe import _C
        data = open({str(crash)!r}, "rb").read()
        gpupipe.set_limits(max_pixels=1 << 20, max_scans=100, max_memory=256 << 20)  # the harness's
        for _ in range(3):
            with pytest.raises(gpupipe.CorruptJpegError, match="coefficient"):
                _C.transcode_with_restarts(data[2:], 1 + data[0] % 4, data[1] % 12)
    """)
