"""Restart-marker crops: prepare() is lossless, the fast path is bit-exact to the normal path and
really taken, damaged markers fall back to the normal path."""

import io
import subprocess
import sys
import tarfile
import warnings

import numpy as np
import pytest
import torch

import gpupipe
from gpupipe import _C
from gpupipe.prepare import prepare_bytes
from helpers import HEIGHT, WIDTH, encode, full_decode, photo


def decode(data, box, size=None, mode=0, use_restarts=True):
    t, l, h, w = box
    oh, ow = size or (h, w)
    out = torch.empty((oh, ow, 3 if mode == 0 else 1), dtype=torch.uint8)
    warning, _, fast = _C.decode_into(data, out.data_ptr(), out.numel(), t, l, h, w, oh, ow, resize=size is not None,
                                      mode=mode, use_restarts=use_restarts)
    return out, fast


@pytest.mark.parametrize("restart_mcus", [0, 8])
def test_prepared_files_are_pixel_identical_for_every_variant(variants, restart_mcus):
    for name, data in variants.items():
        out = prepare_bytes(data, restart_mcus=restart_mcus)
        info = gpupipe.read_header(out)
        assert info.restart_interval > 0 and not info.progressive and not info.arithmetic, name
        np.testing.assert_array_equal(full_decode(out), full_decode(data), err_msg=name)


def boxes_for(h, w, n, seed):
    rng = np.random.default_rng(seed)
    boxes = [(0, 0, h, w), (0, 0, 1, 1), (h - 1, w - 1, 1, 1), (0, 0, 16, w), (h - 16, 0, 16, w),  # first/last MCU rows
             (15, 15, 2, 2), (16, 0, 16, 16), (h - 17, w - 33, 17, 33)]
    for _ in range(n):
        t, l = int(rng.integers(0, h)), int(rng.integers(0, w))
        boxes.append((t, l, int(rng.integers(1, h - t + 1)), int(rng.integers(1, w - l + 1))))
    return boxes


@pytest.mark.parametrize("shape", [(157, 203), (480, 640), (100, 1000)])
@pytest.mark.parametrize("opts", [{}, {"h_samp": 1, "v_samp": 1}, {"h_samp": 2, "v_samp": 1}, {"h_samp": 1, "v_samp": 2},
                                  {"colorspace": "gray"}], ids=["420", "444", "422", "440", "gray"])
@pytest.mark.parametrize("restart_mcus", [0, 4, 8])
def test_fast_path_is_bit_exact_to_the_normal_path(shape, opts, restart_mcus):
    h, w = shape
    data = prepare_bytes(encode(photo(h, w, "coffee"), quality=90, **opts), restart_mcus=restart_mcus)
    for box in boxes_for(h, w, 25, seed=h + restart_mcus):
        for mode in (0, 1):
            fast, used = decode(data, box, mode=mode)
            slow, used_slow = decode(data, box, mode=mode, use_restarts=False)
            assert used and not used_slow
            assert torch.equal(fast, slow), (box, mode)


def test_fast_path_with_dct_scaled_resize(jpeg):
    data = prepare_bytes(encode(photo(600, 800, "rocket")))
    rng = np.random.default_rng(0)
    for _ in range(30):
        bh, bw = int(rng.integers(100, 600)), int(rng.integers(100, 800))
        box = (int(rng.integers(0, 600 - bh + 1)), int(rng.integers(0, 800 - bw + 1)), bh, bw)
        size = (int(rng.integers(20, bh // 2 + 1)), int(rng.integers(20, bw // 2 + 1)))
        fast, used = decode(data, box, size=size)
        slow, _ = decode(data, box, size=size, use_restarts=False)
        assert used and torch.equal(fast, slow), (box, size)


def test_public_ops_take_the_fast_path_transparently(jpeg):
    data = prepare_bytes(jpeg)
    torch.testing.assert_close(gpupipe.decode_crop_jpeg(data, 30, 40, 64, 64), gpupipe.decode_crop_jpeg(jpeg, 30, 40, 64, 64),
                               rtol=0, atol=0)
    boxes = np.array([[0, 0, 64, 64], [HEIGHT - 64, WIDTH - 64, 64, 64]])
    a = gpupipe.decode_crop_jpegs([data, data], boxes).images
    b = gpupipe.decode_crop_jpegs([jpeg, jpeg], boxes).images
    assert torch.equal(a, b)


def test_files_without_usable_markers_take_the_normal_path(variants):
    for name in ("ycbcr-4:2:0", "ycbcr-4:2:0-progressive", "ycbcr-4:2:0-arithmetic", "ycbcr-4:2:2-restart-blocks"):
        _, used = decode(variants[name], (10, 10, 32, 32))
        assert not used, name  # no markers, or intervals that do not tile MCU rows (5 MCUs of 13)
    _, used = decode(variants["ycbcr-4:2:0-restart-rows"], (10, 10, 32, 32))
    assert used  # a libjpeg file with a marker per row is used as is


def _rst_positions(data):
    return [i for i in range(len(data) - 1) if data[i] == 0xFF and 0xD0 <= data[i + 1] <= 0xD7]


def test_damaged_restart_markers_fall_back_to_the_normal_path(jpeg):
    data = bytearray(prepare_bytes(jpeg, restart_mcus=0))
    pos = _rst_positions(data)
    assert len(pos) > 5
    wrong_number = bytearray(data)
    wrong_number[pos[3] + 1] = 0xD0 + (wrong_number[pos[3] + 1] - 0xD0 + 3) % 8
    missing = bytearray(data)
    missing[pos[4]:pos[4] + 2] = b""
    for damaged in (bytes(wrong_number), bytes(missing)):
        fast, used = decode(damaged, (100, 10, 40, 40))
        assert not used  # the index refuses it; libjpeg's own resynchronisation decides
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", gpupipe.JpegWarning)
            ref = gpupipe.decode_crop_jpeg(damaged, 100, 10, 40, 40)
        assert torch.equal(fast.permute(2, 0, 1), ref)
        with pytest.raises(gpupipe.JpegError, match="Corrupt JPEG data"):
            gpupipe.decode_crop_jpeg(damaged, 100, 10, 40, 40, strict=True)


def test_truncated_prepared_file_is_refused_by_the_index(jpeg):
    data = prepare_bytes(jpeg)
    cut = data[: len(data) * 2 // 3]
    _, used = decode(cut, (0, 0, 16, 16))
    assert not used
    with pytest.warns(gpupipe.JpegWarning, match="Premature end"):
        gpupipe.decode_crop_jpeg(cut, HEIGHT - 20, 0, 20, 20)


def test_size_overhead_is_small():
    for name in ("astronaut", "coffee", "chelsea"):
        data = encode(photo(533, 800, name), quality=90)
        assert len(prepare_bytes(data)) <= 1.02 * len(data)


def test_prepare_folder_tree(tmp_path, variants):
    src = tmp_path / "src"
    for i, data in enumerate(list(variants.values())[:6]):
        d = src / f"class{i % 2}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{i}.jpg").write_bytes(data)
    (src / "class0" / "notes.txt").write_text("labels are folders")
    (src / "class1" / "broken.jpg").write_bytes(b"\xff\xd8\xff" + bytes(50))
    report = gpupipe.prepare(src, tmp_path / "dst", progress=False)
    assert report.files == 8 and report.transcoded == 6 and len(report.copied) == 2
    assert abs(report.overhead) < 0.05 and "6 JPEGs transcoded" in str(report)
    for p in src.rglob("*"):
        if p.is_file():
            q = tmp_path / "dst" / p.relative_to(src)
            assert q.exists()
            if p.suffix == ".jpg" and p.name != "broken.jpg":
                np.testing.assert_array_equal(full_decode(q.read_bytes()), full_decode(p.read_bytes()))
                assert gpupipe.read_header(q.read_bytes()).restart_interval > 0
            elif p.is_file():
                assert q.read_bytes() == p.read_bytes()
    again = gpupipe.prepare(src, tmp_path / "dst", progress=False)  # resumable: nothing redone
    assert again.skipped_existing == 8 and again.transcoded == 0


def test_prepare_tar_shards_and_cli(tmp_path, variants):
    shard = tmp_path / "shard-00000.tar"
    with tarfile.open(shard, "w") as tar:
        for i, data in enumerate(list(variants.values())[:4]):
            for ext, payload in (("jpg", data), ("cls", str(i).encode())):
                info = tarfile.TarInfo(f"s{i}.{ext}")
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
    r = subprocess.run([sys.executable, "-m", "gpupipe", "prepare", str(shard), str(tmp_path / "out")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "4 JPEGs transcoded" in r.stdout
    with tarfile.open(tmp_path / "out" / shard.name) as tar:
        names = tar.getnames()
        assert names == [f"s{i}.{e}" for i in range(4) for e in ("jpg", "cls")]
        assert tar.extractfile("s2.cls").read() == b"2"
        assert gpupipe.read_header(tar.extractfile("s1.jpg").read()).restart_interval > 0
