"""decode_crop_jpegs: equal to per-sample decodes, in place, every error policy, any thread count."""

import io
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import gpupipe
from gpupipe import _C
from helpers import BACKEND_DEVICES, PHOTOS, assert_close_to_core, encode, in_forked_child, photo, photo_jpegs, stress


@pytest.fixture(scope="module")
def batch():
    """12 distinct photos of different sizes and variants."""
    return photo_jpegs(PHOTOS * 3, [{}, {"progressive": True}, {"h_samp": 1, "v_samp": 1}, {"colorspace": "gray"}])


def boxes_for(datas, h=64, w=80, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for d in datas:
        H, W = gpupipe.read_header(d)[:2]
        out.append((int(rng.integers(0, H - h + 1)), int(rng.integers(0, W - w + 1)), h, w))
    return np.array(out, dtype=np.int64)


@pytest.mark.parametrize("num_threads", [1, 2, 3])
@pytest.mark.parametrize("mode", ["rgb", "gray"])
def test_batch_equals_single_decodes(batch, num_threads, mode):
    boxes = boxes_for(batch)
    result = gpupipe.decode_crop_jpegs(batch, boxes, num_threads=num_threads, mode=mode)
    assert result.images.shape == (len(batch), 3 if mode == "rgb" else 1, 64, 80)
    assert result.images.is_contiguous(memory_format=torch.channels_last)
    assert result.ok.all() and not result.errors and not result.warnings
    for i, (d, b) in enumerate(zip(batch, boxes)):
        torch.testing.assert_close(result.images[i], gpupipe.decode_crop_jpeg(d, *b, mode=mode), rtol=0, atol=0)


@pytest.mark.parametrize("num_threads", [1, 2])
def test_resized_batch_equals_single_decodes(batch, num_threads):
    rng = np.random.default_rng(1)
    boxes = []
    for d in batch:
        H, W = gpupipe.read_header(d)[:2]
        h, w = int(rng.integers(20, H + 1)), int(rng.integers(20, W + 1))
        boxes.append((int(rng.integers(0, H - h + 1)), int(rng.integers(0, W - w + 1)), h, w))
    for dct in (True, False):
        result = gpupipe.decode_crop_jpegs(batch, boxes, size=(48, 56), num_threads=num_threads, dct_scaling=dct)
        for i, (d, b) in enumerate(zip(batch, boxes)):
            ref = gpupipe.decode_crop_jpeg(d, *b, size=(48, 56), dct_scaling=dct)
            torch.testing.assert_close(result.images[i], ref, rtol=0, atol=0)


def test_out_buffer_is_written_in_place(batch):
    boxes = boxes_for(batch)
    n = len(batch)
    nhwc = torch.full((n, 64, 80, 3), 7, dtype=torch.uint8)
    r = gpupipe.decode_crop_jpegs(batch, boxes, out=nhwc)
    assert r.images.data_ptr() == nhwc.data_ptr()
    torch.testing.assert_close(nhwc.permute(0, 3, 1, 2), r.images, rtol=0, atol=0)
    assert (nhwc != 7).any()
    nchw = torch.empty((n, 3, 64, 80), dtype=torch.uint8).to(memory_format=torch.channels_last)
    r2 = gpupipe.decode_crop_jpegs(batch, boxes, out=nchw)
    assert r2.images.data_ptr() == nchw.data_ptr()
    torch.testing.assert_close(nchw, r.images, rtol=0, atol=0)
    for bad, match in [(torch.empty((n, 3, 64, 80), dtype=torch.uint8), "channels-last"),
                       (torch.empty((n, 64, 80, 3), dtype=torch.float32), "uint8"),
                       (torch.empty((n - 1, 64, 80, 3), dtype=torch.uint8), "contiguous")]:
        with pytest.raises(ValueError, match=match):
            gpupipe.decode_crop_jpegs(batch, boxes, out=bad)


def _corrupt(data: bytes) -> bytes:
    return b"\xff\xd8\xff\xdb" + data[200:260]  # a JPEG start, then nonsense


@pytest.fixture(scope="module")
def bad_batch(batch):
    datas = list(batch)
    datas[3] = _corrupt(datas[3])
    datas[7] = b"not a jpeg at all"
    return datas


@pytest.mark.parametrize("backend,device", BACKEND_DEVICES)
def test_on_error_raise_names_the_first_failure_after_the_whole_batch(bad_batch, backend, device):
    boxes = boxes_for([d if i not in (3, 7) else encode(photo(200, 300)) for i, d in enumerate(bad_batch)])
    with pytest.raises(gpupipe.CorruptJpegError, match=r"sample 3: .*\(1 more failed") as info:
        gpupipe.decode_crop_jpegs(bad_batch, boxes, backend=backend, device=device)
    assert set(info.value.errors) == {3, 7} and "Not a JPEG" in info.value.errors[7]
    assert [f.kind for f in info.value.failures] == [gpupipe.ErrorKind.CORRUPT, gpupipe.ErrorKind.NOT_JPEG]


@pytest.mark.parametrize("backend,device", BACKEND_DEVICES)
@pytest.mark.parametrize("policy", ["skip", "replace"])
def test_on_error_skip_and_replace_report_every_failure(batch, bad_batch, policy, backend, device):
    boxes = boxes_for([d if i not in (3, 7) else encode(photo(200, 300)) for i, d in enumerate(bad_batch)])
    r = gpupipe.decode_crop_jpegs(bad_batch, boxes, on_error=policy, num_threads=2, backend=backend, device=device)
    assert r.ok.tolist() == [i not in (3, 7) for i in range(len(batch))]
    assert set(r.errors) == {3, 7} and "Not a JPEG file" in r.errors[7]
    assert r.kinds == {3: gpupipe.ErrorKind.CORRUPT, 7: gpupipe.ErrorKind.NOT_JPEG}
    assert (r.images[[3, 7]] == 0).all()  # nothing half-written: failed slots are zeros
    good = gpupipe.decode_crop_jpegs(batch, boxes)
    assert_close_to_core(r.images[r.ok.to(r.images.device)].cpu(), good.images[r.ok], backend, device)


def test_box_outside_one_image_is_a_per_sample_value_error(batch):
    boxes = boxes_for(batch)
    boxes[5] = (0, 0, 64, 80)
    boxes[5, 0] = 10_000
    with pytest.raises(ValueError, match=r"sample 5: crop box .* not inside the image of"):
        gpupipe.decode_crop_jpegs(batch, boxes)
    r = gpupipe.decode_crop_jpegs(batch, boxes, on_error="skip")
    assert r.ok.tolist().count(False) == 1 and not r.ok[5]


def test_truncated_sample_warns_once_and_strict_fails(batch):
    datas = list(batch)
    datas[2] = datas[2][: len(datas[2]) // 2]
    boxes = boxes_for(batch)
    boxes[2] = (gpupipe.read_header(datas[2]).height - 64, 0, 64, 80)  # a box inside the lost half
    with pytest.warns(gpupipe.JpegWarning, match="1 sample.*sample 2: Premature end"):
        r = gpupipe.decode_crop_jpegs(datas, boxes)
    assert r.ok.all() and list(r.warnings) == [2]
    r = gpupipe.decode_crop_jpegs(datas, boxes, strict=True, on_error="skip")
    assert r.ok.tolist().count(False) == 1 and "strict=True" in r.errors[2]


def test_decompression_bomb_in_a_batch(batch):
    from helpers import patch_sof

    datas = list(batch)
    datas[0] = patch_sof(datas[0], height=60000, width=60000)
    with pytest.raises(gpupipe.DecompressionBombError, match="sample 0: .*max_pixels"):
        gpupipe.decode_crop_jpegs(datas, boxes_for(batch))


def test_mixed_input_types_and_box_containers(batch):
    boxes = boxes_for(batch)
    mixed = [d if i % 3 == 0 else np.frombuffer(d, np.uint8) if i % 3 == 1 else torch.frombuffer(bytearray(d), dtype=torch.uint8)
             for i, d in enumerate(batch)]
    ref = gpupipe.decode_crop_jpegs(batch, boxes).images
    for b in (boxes, torch.from_numpy(boxes), boxes.tolist()):
        torch.testing.assert_close(gpupipe.decode_crop_jpegs(mixed, b).images, ref, rtol=0, atol=0)


def test_argument_errors(batch):
    boxes = boxes_for(batch)
    with pytest.raises(ValueError, match="boxes must have shape"):
        gpupipe.decode_crop_jpegs(batch, boxes[:-1])
    uneven = boxes.copy()
    uneven[1, 2] = 10
    with pytest.raises(ValueError, match="pass size="):
        gpupipe.decode_crop_jpegs(batch, uneven)
    with pytest.raises(ValueError, match="on_error"):
        gpupipe.decode_crop_jpegs(batch, boxes, on_error="ignore")
    with pytest.raises(TypeError, match="sequence of encoded images"):
        gpupipe.decode_crop_jpegs(batch[0], boxes[:1])
    with pytest.raises(ValueError, match="num_threads"):
        gpupipe.decode_crop_jpegs(batch, boxes, num_threads=0)


def test_empty_batch():
    r = gpupipe.decode_crop_jpegs([], np.zeros((0, 4), np.int64), size=(8, 8))
    assert r.images.shape == (0, 3, 8, 8) and r.ok.shape == (0,)
    assert gpupipe.decode_crop_jpegs([], [], size=(8, 8)).images.shape == (0, 3, 8, 8)  # (was "shape [0, 4]")
    assert gpupipe.decode_crop_jpegs([], []).images.shape == (0, 3, 1, 1)  # (documented: no box gives a size)
    from gpupipe.decode_types import DecodeOptions
    from gpupipe.routing import decode_into

    with pytest.raises(ValueError, match="options.backend must be one of"):  # (was a KeyError)
        decode_into([], np.zeros((0, 4), np.int64), torch.empty((0, 8, 8, 3), dtype=torch.uint8),
                    DecodeOptions(size=(8, 8), backend="auto"))


def test_arguments_that_are_no_arguments_are_named_before_anything_is_decoded(batch):
    """API audit: flags took any truth value ("no" was True), boxes of text or bools decoded, a NaN
    or negative box or a fractional one without a resize failed its sample alone (silently under
    on_error="skip"), None / numpy outputs were AttributeErrors; each is now a TypeError or
    ValueError naming the argument, and out is left as it was."""
    datas, boxes = batch[:4], boxes_for(batch[:4])
    out = torch.full((4, 64, 80, 3), 7, dtype=torch.uint8)

    def refused(error, match, *args, **kw):
        with pytest.raises(error, match=match):
            gpupipe.decode_crop_jpegs(*args, **{"out": out, **kw})
        assert (out == 7).all()

    for name in ("strict", "dct_scaling", "window", "apply_exif_orientation"):
        for bad in (None, 2, "no", []):
            refused(TypeError, f"{name} must be True or False", datas, boxes, **{name: bad})
            with pytest.raises(TypeError, match=f"{name} must be True or False"):
                gpupipe.decode_crop_jpeg(datas[0], 0, 0, 8, 8, **{name: bad})
    assert gpupipe.decode_crop_jpegs(datas, boxes, strict=np.bool_(False)).ok.all()
    for bad in (boxes.astype(bool), boxes.astype(str), None, (b for b in boxes), [[2**70, 0, 8, 8]] * 4):
        refused(TypeError, "boxes must be numbers", datas, bad)
    for k, (value, why) in enumerate([(np.nan, "not finite"), (-1, "negative corner"), (0, "empty side"),
                                      (0.5, "fractional")]):
        bad = boxes.astype(np.float64)
        bad[k % 4, 2 if value == 0 else 0] = value
        refused(ValueError, rf"boxes\[{k % 4}\] = .*{why}", datas, bad, on_error="skip")
    bad = boxes.astype(np.uint64)
    bad[1, 0] = 2**63 + 1
    refused(ValueError, r"boxes\[1\] .*past int64", datas, bad)
    whole = boxes.astype(np.float64)  # whole floats are whole pixels
    assert torch.equal(gpupipe.decode_crop_jpegs(datas, whole).images, gpupipe.decode_crop_jpegs(datas, boxes).images)
    refused(TypeError, "sequence of encoded images", None, boxes)
    refused(TypeError, "not a single buffer", np.frombuffer(datas[0], np.uint8), boxes[:1])
    with pytest.raises(TypeError, match="out must be a torch.Tensor"):
        gpupipe.decode_crop_jpegs(datas, boxes, out=np.zeros((4, 64, 80, 3), np.uint8))
    with pytest.raises(TypeError, match="top must be a number"):
        gpupipe.decode_crop_jpeg(datas[0], "3", True, "8", "8")
    with pytest.raises(ValueError, match="non_jpeg must be"):
        gpupipe.decode_crop_jpeg(datas[0], 0, 0, 8, 8, non_jpeg="bogus")
    assert gpupipe.decode_crop_jpeg(datas[0], 0, 0, 8, 8, device=None).shape == (3, 8, 8)
    with pytest.raises(TypeError, match="dct_scaling must be True or False"):
        gpupipe.crops.ResizeCenterCrop(224, 256, dct_scaling="no")
    png = io.BytesIO()
    Image.fromarray(photo(20, 30)).save(png, "PNG")
    r = gpupipe.decode_crop_jpegs([png.getvalue()], np.array([[60, 0, 5, 5]]), on_error="skip")
    assert "crop box (60, 0, 5, 5) is not inside the image of 30x20" in r.errors[0]  # (was np.int64(60), ...)


def test_what_numpy_and_torch_hand_over_is_taken():
    """Review of the checks above: an object array of files (an h5py slice, pandas' .values), 0-d
    tensors and arrays as box values, seeds and dataset indices (a sampler over a tensor of
    indices yields them) are taken as before; a float box past int64 says so."""
    from gpupipe import crops, data, sources

    jpegs = photo_jpegs(PHOTOS[:2], [{}])
    boxes = boxes_for(jpegs, 16, 16)
    ref = gpupipe.decode_crop_jpegs(jpegs, boxes).images
    files = np.empty(2, dtype=object)
    files[:] = [np.frombuffer(d, np.uint8) for d in jpegs]
    assert torch.equal(gpupipe.decode_crop_jpegs(files, boxes).images, ref)
    t, l, h, w = (int(v) for v in boxes[0])
    single = gpupipe.decode_crop_jpeg(jpegs[0], torch.tensor(t), np.array(l), torch.tensor(h), np.int32(w))
    assert torch.equal(single, ref[0])
    far = boxes.astype(np.float64)
    far[1, 0] = 1e30
    with pytest.raises(ValueError, match=r"boxes\[1\] .*past int64"):
        gpupipe.decode_crop_jpegs(jpegs, far)
    assert np.array_equal(crops.RandomCrop(8).boxes([30], [30], seed=torch.tensor(3), epoch=np.array(1)),
                          crops.RandomCrop(8).boxes([30], [30], seed=3, epoch=1))
    with pytest.raises(TypeError, match="seed must be an int"):
        crops.RandomCrop(8).boxes([30], [30], seed=torch.tensor(3.0))
    ds = data.DecodeCropDataset(sources.FileList(["a.jpg", "b.jpg", "c.jpg"], [0, 1, 2]), crops.CenterCrop(8),
                                seed=torch.tensor(2), on_error="replace")
    with pytest.warns(gpupipe.SkippedSamplesWarning, match="sample 2 "):
        assert ds[torch.tensor(-1)][1] == 2


def test_collate_and_the_dataset_name_what_they_cannot_take():
    """data.collate cast a float image to uint8 (zeros for [0, 1) values) and a float label to
    int64; DecodeCropDataset(crop=None) failed later with an AttributeError."""
    from gpupipe import data, sources

    good = (torch.zeros((3, 4, 4), dtype=torch.uint8), 1)
    images, labels = data.collate([good, good])
    assert images.shape == (2, 3, 4, 4) and labels.tolist() == [1, 1]
    for bad, match in (((torch.rand(3, 4, 4), 1), "sample 1 is torch.float32"),
                       ((torch.zeros((3, 2, 4), dtype=torch.uint8), 1), r"sample 1 is torch.uint8 \[3, 2, 4\]"),
                       ((np.zeros((3, 4, 4), np.uint8), 1), "sample 1 is ndarray"),
                       ((good[0], 1.5), "one integer label per sample")):
        with pytest.raises(ValueError, match=match):
            data.collate([good, bad])
    with pytest.raises(TypeError, match="crop must be a gpupipe.crops sampler"):
        data.DecodeCropDataset(sources.FileList(["a.jpg"], [0]), None)


def test_pools_are_kept_per_size_and_shut_down(batch):
    boxes = boxes_for(batch)
    _C.shutdown_pool()
    gpupipe.decode_crop_jpegs(batch, boxes, num_threads=3)
    assert _C.pool_threads() == 3
    gpupipe.decode_crop_jpegs(batch, boxes, num_threads=2)
    gpupipe.decode_crop_jpegs(batch, boxes, num_threads=3)  # reused, not rebuilt
    assert _C.pool_threads() == 5
    names = [Path(f"/proc/self/task/{t}/comm").read_text().strip() for t in os.listdir("/proc/self/task")]
    assert names.count("gpupipe-pool") >= 5  # named for top -H and py-spy (pools still held elsewhere count too)
    for k in range(2, 33):  # a sweep over thread counts keeps the four most recent pools only
        gpupipe.decode_crop_jpegs(batch, boxes, num_threads=k)
    assert _C.pool_threads() == 29 + 30 + 31 + 32
    _C.shutdown_pool()
    assert _C.pool_threads() == 0


def test_file_reads_get_pools_of_their_own(batch, tmp_path):
    """A read on as many threads as the decode must not queue behind the decode's loops."""
    boxes = boxes_for(batch)
    f = tmp_path / "x.jpg"
    f.write_bytes(batch[0])
    _C.shutdown_pool()
    gpupipe.decode_crop_jpegs(batch, boxes, num_threads=2)
    assert _C.read_files([bytes(f)] * 3, 2) == ([batch[0]] * 3, [])
    assert _C.pool_threads() == 4
    _C.shutdown_pool()


def test_concurrent_batches_from_many_threads(batch, bad_batch):
    boxes = boxes_for(batch)
    ref_good = gpupipe.decode_crop_jpegs(batch, boxes, num_threads=2)
    ref_bad = gpupipe.decode_crop_jpegs(bad_batch, boxes, num_threads=2, on_error="skip")

    def work(k):
        for _ in range(8):
            good = k % 2 == 0
            r = gpupipe.decode_crop_jpegs(batch if good else bad_batch, boxes, num_threads=2, on_error="skip")
            ref = ref_good if good else ref_bad
            assert torch.equal(r.images, ref.images) and torch.equal(r.ok, ref.ok), k

    stress(work, threads=6)


def _decode_in_child(datas, boxes, queue):
    r = gpupipe.decode_crop_jpegs(datas, boxes, num_threads=2)
    # numpy, not torch: torch's OpenMP pool is not fork-safe (a torch issue, not gpupipe's)
    queue.put(int(r.images.numpy().astype(np.int64).sum()))


def test_forked_child_gets_its_own_pool(batch):
    boxes = boxes_for(batch)
    expected = int(gpupipe.decode_crop_jpegs(batch, boxes, num_threads=2).images.numpy().astype(np.int64).sum())
    assert _C.pool_threads() == 2  # the parent has a live pool when it forks
    assert in_forked_child(_decode_in_child, batch, boxes) == expected


def test_default_threads_from_environment(monkeypatch, batch):
    monkeypatch.setenv("GPUPIPE_NUM_THREADS", "3")
    assert _C.default_num_threads() == 3
    _C.shutdown_pool()
    gpupipe.decode_crop_jpegs(batch, boxes_for(batch))
    assert _C.pool_threads() == 3
    monkeypatch.setenv("GPUPIPE_NUM_THREADS", "many")
    with pytest.raises(ValueError, match="GPUPIPE_NUM_THREADS"):
        gpupipe.decode_crop_jpegs(batch, boxes_for(batch))
