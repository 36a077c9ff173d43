"""The Loader: order, determinism, error policies, shutdown, sharding (with a real torchrun)."""

import csv
import gc
import io
import json
import os
import socket
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import gpupipe
from gpupipe import _C, crops, sources
from helpers import BACKEND_DEVICES
from loader_data import index_of, jpeg_bytes, make_image_folder, make_messy_folder

N = 60


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("imagefolder")
    samples = make_image_folder(str(root))
    return str(root), samples


def all_indices(loader):
    out, labels = [], []
    for images, y in loader:
        assert images.dtype == torch.uint8 and images.shape[1:] == (3, 32, 32)
        out += [index_of(img) for img in images]
        labels += y.tolist()
    return out, labels


def gpupipe_threads():
    return [t for t in threading.enumerate() if t.name.startswith("gpupipe")]


def test_image_folder_matches_torchvision(folder):
    from torchvision.datasets import ImageFolder

    root, _ = folder
    ours, tv = sources.ImageFolder(root), ImageFolder(root)
    assert ours.classes == tv.classes and ours.class_to_idx == tv.class_to_idx
    assert ours.keys == [p for p, _ in tv.samples] and ours.labels.tolist() == tv.targets


@pytest.mark.parametrize("backend,device", BACKEND_DEVICES)
def test_every_sample_once_in_sampler_order(folder, backend, device):
    root, samples = folder
    loader = gpupipe.Loader(sources.ImageFolder(root), batch_size=8, crop=crops.RandomCrop(32), seed=1,
                            backend=backend, device=device)
    got, labels = all_indices(loader)
    expected = loader.indices().tolist()
    assert got == expected and sorted(got) == list(range(N))
    assert labels == [samples[i][1] for i in expected]
    assert len(loader) == 8 and loader.stats()["images"] == N


def test_identical_for_any_thread_count_and_epoch_dependent(folder):
    root, _ = folder

    def run(threads, epoch):
        loader = gpupipe.Loader(sources.ImageFolder(root), batch_size=16, crop=crops.RandomResizedCrop(24),
                                num_threads=threads, seed=3)
        loader.set_epoch(epoch)
        return [(x.clone(), y) for x, y in loader]

    a, b, c = run(1, 0), run(2, 0), run(2, 1)
    for (xa, ya), (xb, yb) in zip(a, b):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    assert not all(torch.equal(ya, yc) for (_, ya), (_, yc) in zip(a, c))


def test_batches_stay_valid_after_later_batches(folder):
    root, _ = folder
    loader = gpupipe.Loader(sources.ImageFolder(root), batch_size=4, crop=crops.CenterCrop(32), prefetch=1, shuffle=False)
    kept = list(loader)  # the ring has 3 slots; 15 batches reuse them
    assert [index_of(img) for x, _ in kept for img in x] == list(range(N))


def test_drop_last_and_len(folder):
    root, _ = folder
    loader = gpupipe.Loader(sources.ImageFolder(root), batch_size=7, crop=crops.CenterCrop(32), drop_last=True)
    assert len(loader) == 8 and sum(x.shape[0] for x, _ in loader) == 56


@pytest.mark.parametrize("world_size,drop_last", [(2, False), (3, False), (7, False), (7, True)])
def test_ranks_split_like_distributed_sampler(folder, world_size, drop_last):
    from torch.utils.data import DistributedSampler

    root, _ = folder
    per_rank = []
    for rank in range(world_size):
        loader = gpupipe.Loader(sources.ImageFolder(root), batch_size=5, crop=crops.CenterCrop(32), rank=rank,
                                world_size=world_size, drop_last=drop_last, seed=2)
        loader.set_epoch(4)
        got, _ = all_indices(loader)
        mine = loader.indices().tolist()
        ref = DistributedSampler(range(N), num_replicas=world_size, rank=rank, drop_last=drop_last)
        assert len(mine) == len(ref)
        if drop_last:  # the last partial batch goes too, as DataLoader(drop_last=True)
            mine = mine[: len(mine) // 5 * 5]
        assert got == mine
        per_rank.append(loader.indices().tolist())
    flat = [i for r in per_rank for i in r]
    if drop_last:
        assert len(set(flat)) == len(flat) == N - N % world_size
    else:
        assert set(flat) == set(range(N)) and len(flat) == -(-N // world_size) * world_size


def test_torchrun_two_ranks_cover_each_epoch_once(folder, tmp_path):
    root, _ = folder
    out = tmp_path / "seen.json"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    with socket.socket() as sock:  # a free port: other runs on this machine may hold a fixed one
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={port}",
           os.path.join(os.path.dirname(__file__), "dist_loader_worker.py"), root, str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    seen = json.loads(out.read_text())["seen"]
    for epoch in ("0", "1"):
        r0, r1 = seen[epoch]
        assert not set(r0) & set(r1) and sorted(r0 + r1) == list(range(N))
    assert seen["0"][0] != seen["1"][0]  # shards change with the epoch


@pytest.fixture(scope="module")
def messy(tmp_path_factory):
    """Good JPEGs, a corrupt one, a truncated one, a PNG and a non-image, in one class folder."""
    return make_messy_folder(tmp_path_factory.mktemp("messy"))


@pytest.mark.parametrize("backend,device", BACKEND_DEVICES)
def test_on_error_skip_reports_and_continues(messy, backend, device):
    loader = gpupipe.Loader(sources.ImageFolder(messy), batch_size=5, crop=crops.CenterCrop(32), shuffle=False,
                            on_error="skip", backend=backend, device=device)
    # the user hears about it: one warning at the epoch's end, by kind, naming the first
    with pytest.warns(gpupipe.SkippedSamplesWarning, match=r"epoch 0: 3 of 14 samples skipped \(on_error='skip'\): "
                                                           r"2 CORRUPT, 1 NOT_JPEG; first: '.*b_corrupt\.jpg': "):
        got, _ = all_indices(loader)
    assert got == list(range(10)) + [12]  # the PNG decoded through the fallback
    st = loader.stats()
    skipped = {os.path.basename(f.key): f for f in st["skipped"]}
    assert set(skipped) == {"b_corrupt.jpg", "c_truncated.jpg", "e_notes.jpg"}
    assert skipped["e_notes.jpg"].kind == gpupipe.ErrorKind.NOT_JPEG
    assert "nor an image Pillow reads" in skipped["e_notes.jpg"].message
    assert skipped["b_corrupt.jpg"].kind == skipped["c_truncated.jpg"].kind == gpupipe.ErrorKind.CORRUPT
    assert st["failures"] == {"corrupt": 2, "not_jpeg": 1}
    # a GPU backend's decoder: "gpu" (torchvision's, DALI's), or nvImageCodec's engines where they run
    main_routes = ("cpu",) if backend == "cpu" else ("gpu", "gpu-hardware", "gpu-cuda")
    assert sum(st["routes"].get(r, 0) for r in main_routes) == 10, st["routes"]
    assert st["routes"]["pillow"] == 1 and sum(st["routes"].values()) == 11, st["routes"]
    assert len(st["fallback"]) == 1 and st["fallback"][0][0].endswith("d_image.png")


@pytest.mark.parametrize("on_error", ["skip", "replace"])
def test_losses_are_reported_when_an_epoch_is_left_early_or_never_asked_past_its_end(messy, on_error):
    """A loop that breaks, or that stops at len(loader) (zip, islice), never reaches the epoch's
    StopIteration: what it skipped was reported nowhere, and the next epoch's stats replaced it."""
    loader = gpupipe.Loader(sources.ImageFolder(messy), batch_size=4, crop=crops.CenterCrop(32), shuffle=False,
                            on_error=on_error)
    with pytest.warns(gpupipe.SkippedSamplesWarning, match=r"epoch 0, left after 3 batches: 2 of 12 samples") as left:
        for k, _ in enumerate(loader):  # (the third batch holds samples 10, 11: both fail; the fourth, 13)
            if k == 2:
                break
        gc.collect()
    assert left[0].filename == __file__  # the user's line, not weakref.py's (its finalizer reports it)
    loader.set_epoch(1)
    with pytest.warns(gpupipe.SkippedSamplesWarning, match=r"epoch 1: 3 of 14 samples") as caught:
        for _ in zip(range(len(loader)), loader):  # never asks for one more
            pass
    assert len(caught) == 1  # once an epoch
    loader.set_epoch(2)
    it = iter(loader)
    next(it)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing lost yet: nothing to say
        it.close()


def test_samples_delivered_with_decoder_warnings_are_counted_once_an_epoch(tmp_path):
    """A JPEG cut off mid-scan decodes, its missing rows filled (libjpeg's "Premature end of JPEG
    file"), and the Loader delivers it; torchvision and Pillow raise on it. The user heard nothing:
    the warnings went to stats() only. One JpegWarning an epoch now counts them, naming the first."""
    from helpers import encode, photo

    (tmp_path / "a").mkdir()
    for i in range(5):
        data = encode(photo())
        if i in (1, 3):
            data = data[:len(data) // 3]  # (the centre crop lies past the cut)
        (tmp_path / "a" / f"{i}.jpg").write_bytes(data)
    loader = gpupipe.Loader(sources.ImageFolder(tmp_path), batch_size=2, crop=crops.CenterCrop(32), shuffle=False)
    for epoch in range(2):
        loader.set_epoch(epoch)
        with pytest.warns(gpupipe.JpegWarning) as caught:
            assert sum(len(x) for x, _ in loader) == 5  # delivered, as before
        assert len(caught) == 1, [str(w.message) for w in caught]
        assert str(caught[0].message).startswith(f"gpupipe.Loader epoch {epoch}: 2 of 5 delivered samples decoded "
                                                 "with warnings")
        assert "1.jpg': Premature end of JPEG file" in str(caught[0].message) and caught[0].filename == __file__
        assert [os.path.basename(k) for k, _ in loader.stats()["warnings"]] == ["1.jpg", "3.jpg"]
    # a caller that makes the warning an error (-W error) gets it before the last batch, which the
    # state does not count yet and the next call delivers (the position had moved past it: lost)
    loader.set_epoch(2)
    it = iter(loader)
    with warnings.catch_warnings():
        warnings.simplefilter("error", gpupipe.JpegWarning)
        got = [len(next(it)[0]) for _ in range(2)]
        with pytest.raises(gpupipe.JpegWarning):
            next(it)
    state = loader.state_dict()
    assert got == [2, 2] and state["batches"] == 2
    assert len(next(it)[0]) == 1 and loader.state_dict()["batches"] == 3
    with pytest.raises(StopIteration):
        next(it)
    resumed = gpupipe.Loader(sources.ImageFolder(tmp_path), batch_size=2, crop=crops.CenterCrop(32), shuffle=False)
    resumed.load_state_dict(state)
    assert [len(x) for x, _ in resumed] == [1]  # (4.jpg, undamaged: nothing to say)


@pytest.mark.filterwarnings("ignore::gpupipe.SkippedSamplesWarning")
def test_on_error_skip_cuts_nested_augment_params(messy):
    """A RandomChoice of keyed policies as the augment: its parameters (the batch size, the chosen
    policy's per-sample rows) are cut to the samples kept, and each kept sample gets the
    augmentation its own index keys, as in a batch without failures."""
    from gpupipe.augment import AutoAugment, RandomChoice, TrivialAugmentWide

    def batches(augment):
        loader = gpupipe.Loader(sources.ImageFolder(messy), batch_size=5, crop=crops.CenterCrop(32), shuffle=False,
                                on_error="skip", augment=augment, seed=3)
        return [images for images, _ in loader]

    augment = RandomChoice([TrivialAugmentWide(), AutoAugment()], p=[1.0, 0.0])  # the choice keys on a
    plain, augmented = batches(None), batches(augment)                         # batch's first index
    kept = [list(range(5)), list(range(5, 10)), [12]]  # 10, 11, 13 fail (test_on_error_skip_...)
    assert [b.shape[0] for b in augmented] == [len(k) for k in kept]
    assert int(augment.last_params["n"]) == 1 and augment.last_params["params"]["op"].shape == (1,)
    for images, raw, indices in zip(augmented, plain, kept):
        params = augment.sample_params(len(indices), seed=3, epoch=0, indices=indices)
        assert torch.equal(images, augment(raw, params=params))


@pytest.mark.parametrize("backend,device", BACKEND_DEVICES)
def test_on_error_replace_keeps_zero_images(messy, backend, device):
    loader = gpupipe.Loader(sources.ImageFolder(messy), batch_size=5, crop=crops.CenterCrop(32), shuffle=False,
                            on_error="replace", backend=backend, device=device)
    with pytest.warns(gpupipe.SkippedSamplesWarning, match="3 of 14 samples replaced by zero images"):
        images = torch.cat([x for x, _ in loader])
    assert images.shape[0] == 14 and len(loader.stats()["replaced"]) == 3
    assert (images[10] == 0).all() and (images[11] == 0).all() and (images[13] == 0).all()


@pytest.mark.parametrize("backend,device", BACKEND_DEVICES)
def test_on_error_raise_names_the_key(messy, backend, device):
    loader = gpupipe.Loader(sources.ImageFolder(messy), batch_size=5, crop=crops.CenterCrop(32), shuffle=False,
                            on_error="raise", backend=backend, device=device)
    with pytest.raises(gpupipe.CorruptJpegError, match="b_corrupt.jpg"):
        list(loader)
    deadline = time.monotonic() + 10.0  # they exit: a loaded machine may take more than a moment
    while gpupipe_threads() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not gpupipe_threads()


def _exits_quickly(check):
    deadline = time.time() + 10.0  # (returns as soon as it holds: a loaded machine may take a while)
    while time.time() < deadline:
        if check():
            return True
        time.sleep(0.02)
    return False


def test_early_break_and_garbage_collection_stop_every_thread(folder):
    root, _ = folder
    threads_before = _C.pool_threads()
    loader = gpupipe.Loader(sources.ImageFolder(root), batch_size=4, crop=crops.CenterCrop(32), num_threads=2)
    for _ in loader:
        break  # the iterator is dropped here
    gc.collect()
    assert _exits_quickly(lambda: not gpupipe_threads()), gpupipe_threads()
    it = iter(loader)
    next(it)
    del it
    gc.collect()
    assert _exits_quickly(lambda: not gpupipe_threads())
    assert _C.pool_threads() <= max(threads_before, 0) + 2  # the C++ pool is shared and bounded


@pytest.mark.parametrize("augment", [None, "cpu"])
@pytest.mark.parametrize("lookahead", [False, True])
def test_an_epoch_that_cannot_start_its_threads_stops_those_it_started(folder, monkeypatch, augment, lookahead):
    """A KeyboardInterrupt (or no thread to be had) while an epoch starts its stage threads left the
    started ones blocked for good; with a host ring the cleanup raised an AttributeError instead,
    which the lookahead swallowed with the interrupt."""
    from gpupipe.augment import BatchAugment

    root, _ = folder
    loader = gpupipe.Loader(sources.ImageFolder(root), batch_size=4, crop=crops.CenterCrop(32), num_threads=2,
                            augment=BatchAugment() if augment else None, lookahead=lookahead)
    batches = len(loader)
    start, started = threading.Thread.start, []
    failing = 3 + (5 if lookahead else 0)  # (with lookahead: a thread of the epoch started ahead)

    def flaky_start(thread):
        if thread.name.startswith("gpupipe-") and not thread.name.startswith(("gpupipe-pool", "gpupipe-read")):
            started.append(thread.name)
            if len(started) == failing:
                raise KeyboardInterrupt
        return start(thread)

    monkeypatch.setattr(threading.Thread, "start", flaky_start)
    with pytest.raises(KeyboardInterrupt):
        for _ in loader:
            pass
    monkeypatch.undo()
    gc.collect()
    assert _exits_quickly(lambda: not gpupipe_threads()), gpupipe_threads()
    assert sum(1 for _ in loader) == batches  # the Loader works on


def test_exception_in_the_training_loop_stops_threads(folder):
    root, _ = folder
    loader = gpupipe.Loader(sources.ImageFolder(root), batch_size=4, crop=crops.CenterCrop(32))

    def train():
        for i, _ in enumerate(loader):
            if i == 2:
                raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train()
    gc.collect()
    assert _exits_quickly(lambda: not gpupipe_threads())


def test_tar_shards(folder, tmp_path):
    root, samples = folder
    paths = sources.write_tar_shards(((f"s{i:04d}", label, Path(p).read_bytes(), "jpg") for p, label, i in samples),
                                     tmp_path, samples_per_shard=9)
    assert len(paths) == 7
    src = sources.TarShards(paths, shuffle_buffer=10)
    loader = gpupipe.Loader(src, batch_size=8, crop=crops.CenterCrop(32), seed=1)
    got, labels = all_indices(loader)
    assert sorted(got) == list(range(N)) and got != sorted(got)
    assert labels == [samples[i][1] for i in got]
    with pytest.raises(TypeError, match="not known"):
        len(loader)
    ranks = [all_indices(gpupipe.Loader(src, batch_size=8, crop=crops.CenterCrop(32), rank=r, world_size=2))[0] for r in (0, 1)]
    assert not set(ranks[0]) & set(ranks[1]) and sorted(ranks[0] + ranks[1]) == list(range(N))


def test_file_list_from_csv(folder, tmp_path):
    root, samples = folder
    csv_path = tmp_path / "list.csv"
    with open(csv_path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["path", "label"])
        for p, label, _ in samples[::3]:
            w.writerow([os.path.relpath(p, tmp_path), label])
    src = sources.FileList.from_csv(csv_path)
    assert len(src) == 20 and src.labels.tolist() == [s[1] for s in samples[::3]]
    got, _ = all_indices(gpupipe.Loader(src, batch_size=6, crop=crops.CenterCrop(32), shuffle=False))
    assert got == [s[2] for s in samples[::3]]


def test_dataloader_dataset_gives_the_loaders_pixels(folder):
    root, _ = folder
    src = sources.ImageFolder(root)
    crop = crops.RandomResizedCrop(28)
    loader = gpupipe.Loader(src, batch_size=10, crop=crop, shuffle=False, seed=9)
    loader.set_epoch(2)
    ds = gpupipe.data.DecodeCropDataset(src, crop, seed=9)
    ds.set_epoch(2)
    dl = torch.utils.data.DataLoader(ds, batch_size=10, collate_fn=gpupipe.data.collate)
    for (a, ya), (b, yb) in zip(loader, dl):
        assert torch.equal(a, b) and torch.equal(ya, yb)
        assert b.is_contiguous(memory_format=torch.channels_last)


def test_augment_stage_and_stats(folder):
    root, _ = folder
    aug = gpupipe.augment.BatchAugment(hflip=0.5, brightness=0.2, generator=0)
    loader = gpupipe.Loader(sources.ImageFolder(root), batch_size=16, crop=crops.CenterCrop(32), augment=aug)
    batches = list(loader)
    assert all(x.dtype == torch.float32 and x.shape[1:] == (3, 32, 32) for x, _ in batches)
    st = loader.stats()
    assert st["images"] == N and st["batches"] == 4 and st["images_per_s"] > 0
    assert set(st["busy_s"]) == {"read", "plan", "decode", "collect", "transfer", "augment"}
    assert st["busy_s"]["augment"] > 0
    assert st["decode_pool"]["busy_s"] > 0 and 0 < st["decode_pool"]["utilisation"] <= 1


class _ViewThroughDLPack(torch.nn.Module):
    """An augment that hands back part of its input through a storage of its own (as another array
    library's transform may)."""

    def forward(self, x):
        return torch.from_dlpack(x[:, :, 1:])


@pytest.mark.parametrize("module", [lambda x: x[:, :, 1:], _ViewThroughDLPack()], ids=["view", "dlpack"])
def test_batches_an_augment_hands_back_as_views_of_the_ring_are_never_overwritten(folder, monkeypatch, module):
    root, _ = folder
    monkeypatch.setattr(gpupipe.loader, "CHUNK_IMAGES", 0)  # a ring slot a batch: reused within the epoch
    ld = gpupipe.Loader(sources.ImageFolder(root), batch_size=4, crop=crops.RandomResizedCrop(24), num_threads=2,
                        seed=3, augment=module, prefetch=1)
    kept, copies = [], []
    for x, _ in ld:
        kept.append(x)
        copies.append(x.clone())
    assert len(kept) >= 6 and all(torch.equal(k, c) for k, c in zip(kept, copies))


def test_argument_validation(folder):
    root, _ = folder
    src = sources.ImageFolder(root)
    with pytest.raises(TypeError, match="crops"):
        gpupipe.Loader(src, batch_size=4, crop=(32, 32))
    with pytest.raises(ValueError, match="on_error"):
        gpupipe.Loader(src, batch_size=4, crop=crops.CenterCrop(8), on_error="ignore")
    with pytest.raises(TypeError, match="augment must be callable"):
        gpupipe.Loader(src, batch_size=4, crop=crops.CenterCrop(8), augment=5)
    with pytest.raises(TypeError, match="batch_transform must be callable"):
        gpupipe.Loader(src, batch_size=4, crop=crops.CenterCrop(8), batch_transform="mixup")
    with pytest.raises(ValueError, match="rank"):
        gpupipe.Loader(src, batch_size=4, crop=crops.CenterCrop(8), rank=3, world_size=2)
    for bad in (0, _C.MAX_THREADS + 1):
        with pytest.raises(ValueError, match="io_threads"):
            gpupipe.Loader(src, batch_size=4, crop=crops.CenterCrop(8), io_threads=bad)
    with pytest.raises(TypeError, match="io_threads"):
        gpupipe.Loader(src, batch_size=4, crop=crops.CenterCrop(8), io_threads=2.5)


@pytest.mark.filterwarnings("ignore::gpupipe.SkippedSamplesWarning")
@pytest.mark.skipif(not gpupipe.backends_available()["dali"]["available"], reason="DALI not installed")
def test_loader_with_the_dali_backend_matches_the_cpu_core(folder, messy):
    root, _ = folder
    kw = dict(batch_size=16, crop=crops.RandomCrop(32), seed=4)
    a = [(x.clone(), y) for x, y in gpupipe.Loader(sources.ImageFolder(root), **kw)]
    b = [(x.clone(), y) for x, y in gpupipe.Loader(sources.ImageFolder(root), backend="dali", **kw)]
    for (xa, ya), (xb, yb) in zip(a, b):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    loader = gpupipe.Loader(sources.ImageFolder(messy), batch_size=5, crop=crops.CenterCrop(32), shuffle=False, backend="dali")
    got, _ = all_indices(loader)
    assert got == list(range(10)) + [12] and len(loader.stats()["skipped"]) == 3


def test_loader_backend_errors_are_clear(folder):
    root, _ = folder
    with pytest.raises(ValueError, match="device='cuda'"):
        gpupipe.Loader(sources.ImageFolder(root), batch_size=4, crop=crops.CenterCrop(8), backend="nvjpeg")
    with pytest.raises(ValueError, match="backend must be one of"):
        gpupipe.Loader(sources.ImageFolder(root), batch_size=4, crop=crops.CenterCrop(8), backend="pil")


def test_loader_and_dataset_take_resize_center_crop(folder):
    root, _ = folder
    src = sources.ImageFolder(root)
    crop = crops.ResizeCenterCrop(32, 40)
    loader = gpupipe.Loader(src, batch_size=16, crop=crop, shuffle=False)
    images = torch.cat([x for x, _ in loader])
    datas = [src.read(i) for i in range(len(src))]
    heights, widths = zip(*[gpupipe.read_header(d)[:2] for d in datas])
    ref = gpupipe.decode_crop_jpegs(datas, crop.boxes(heights, widths), size=32, window=True, dct_scaling=False)
    assert torch.equal(images, ref.images)
    ds = gpupipe.data.DecodeCropDataset(src, crop)
    assert torch.equal(ds[5][0], ref.images[5])


@pytest.mark.filterwarnings("ignore::gpupipe.SkippedSamplesWarning")
def test_tar_shards_with_bad_samples_go_on_and_report_them(folder, tmp_path):
    import tarfile

    root, samples = folder
    good = sources.write_tar_shards(((f"s{i:04d}", label, Path(p).read_bytes(), "jpg") for p, label, i in samples[:20]),
                                    tmp_path / "good", samples_per_shard=10)
    bad_label = tmp_path / "bad_label.tar"
    with tarfile.open(bad_label, "w") as tar:
        for name, payload in (("x.jpg", Path(samples[0][0]).read_bytes()), ("x.cls", b"cat")):
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
    truncated = tmp_path / "truncated.tar"
    truncated.write_bytes(Path(good[0]).read_bytes()[:3000])
    loader = gpupipe.Loader(sources.TarShards(good + [str(bad_label), str(truncated)]), batch_size=8,
                            crop=crops.CenterCrop(32), shuffle=False)
    got, _ = all_indices(loader)
    assert set(got) == set(range(20)) and len(got) >= 20  # plus what the truncated shard held before the damage
    failures = {os.path.basename(f.key): f for f in loader.stats()["skipped"]}
    assert failures["bad_label.tar:x"].kind == gpupipe.ErrorKind.READ and "not an integer" in failures["bad_label.tar:x"].message
    assert failures["truncated.tar"].kind == gpupipe.ErrorKind.READ and "unreadable shard" in failures["truncated.tar"].message


def test_tar_shards_samples_per_rank_keep_ranks_in_step(folder, tmp_path):
    root, samples = folder
    paths = sources.write_tar_shards(((f"s{i:04d}", label, Path(p).read_bytes(), "jpg") for p, label, i in samples),
                                     tmp_path, samples_per_shard=25)  # 3 shards of 25, 25, 10
    counts = []
    for rank in range(2):
        src = sources.TarShards(paths, samples_per_rank=30)
        loader = gpupipe.Loader(src, batch_size=8, crop=crops.CenterCrop(32), rank=rank, world_size=2)
        counts.append([x.shape[0] for x, _ in loader])
    assert counts[0] == counts[1] == [8, 8, 8, 6]


@pytest.mark.filterwarnings("ignore::gpupipe.SkippedSamplesWarning")
def test_stats_count_what_was_delivered_and_an_all_failed_batch_is_empty(messy):
    loader = gpupipe.Loader(sources.ImageFolder(messy), batch_size=1, crop=crops.CenterCrop(32), shuffle=False,
                            prefetch=3)
    it = iter(loader)
    next(it)
    time.sleep(0.3)  # the stages run ahead; stats() must not count their batches yet
    assert loader.stats()["batches"] == 1 and loader.stats()["images"] == 1
    shapes = [x.shape[0] for x, _ in it]
    assert shapes.count(0) == 3  # the three failed samples: empty batches keep ranks in step
    del it


def test_the_cpu_augment_stage_runs_with_its_own_thread_budget(folder):
    """augment_threads is set on the augment stage's thread only: the training loop's torch setting
    stays (torch's OpenMP builds keep it per thread)."""
    from gpupipe import loader as loader_module

    root, _ = folder
    seen = []

    class Probe(torch.nn.Module):
        def forward(self, x):
            seen.append(torch.get_num_threads())
            return x.float()

    before = torch.get_num_threads()
    loader = gpupipe.Loader(sources.ImageFolder(root), batch_size=32, crop=crops.CenterCrop(32), augment=Probe(),
                            augment_threads=1, num_threads=2)
    list(loader)
    assert torch.get_num_threads() == before
    if loader_module._PER_THREAD_TORCH_THREADS:
        assert set(seen) == {1}
    with pytest.raises(ValueError, match="augment_threads"):
        gpupipe.Loader(sources.ImageFolder(root), batch_size=4, crop=crops.CenterCrop(8), augment_threads=0)


def test_a_module_in_eval_mode_is_called_plainly(folder):
    """Keyed parameters are drawn only in training mode: BatchAugment().eval() in the Loader (the
    evaluation recipe) converts and normalises only, as it does when called directly."""
    root, _ = folder
    aug = gpupipe.augment.BatchAugment(hflip=1.0, brightness=0.5)
    plain = gpupipe.Loader(sources.ImageFolder(root), batch_size=20, crop=crops.CenterCrop(32), shuffle=False)
    raw = torch.cat([x for x, _ in plain])
    aug.eval()
    evaluated = gpupipe.Loader(sources.ImageFolder(root), batch_size=20, crop=crops.CenterCrop(32), shuffle=False,
                               augment=aug)
    assert torch.equal(torch.cat([x for x, _ in evaluated]), aug(raw))
    aug.train()
    trained = gpupipe.Loader(sources.ImageFolder(root), batch_size=20, crop=crops.CenterCrop(32), shuffle=False,
                             augment=aug)
    assert not torch.equal(torch.cat([x for x, _ in trained]), aug.eval()(raw))


def test_map_source_read_many_equals_read_and_keeps_each_failure(folder, tmp_path):
    """The read stage's native batch read: the bytes read() gives, and per failed file the OSError
    subclass open() raises, in order; a subclass's own read() is called per sample."""
    root, samples = folder
    (tmp_path / "empty.jpg").write_bytes(b"")
    (tmp_path / "dir.jpg").mkdir()
    paths = [samples[0][0], str(tmp_path / "missing.jpg"), str(tmp_path / "dir.jpg"), str(tmp_path / "empty.jpg"),
             samples[1][0]]
    src = sources.FileList(paths, [0] * len(paths))
    got = src.read_many(range(len(paths)), 3)
    assert got[0] == src.read(0) and got[4] == src.read(4) and got[3] == b""
    assert type(got[1]) is FileNotFoundError and got[1].filename == paths[1] and got[1].errno == 2
    assert type(got[2]) is IsADirectoryError
    with pytest.raises(FileNotFoundError) as raised:
        src.read(1)
    assert str(raised.value) == str(got[1])  # the message open() would give

    class Upper(sources.FileList):
        def read(self, i):
            if i == 1:
                raise KeyError("no such record")
            return b"record %d" % i

    got = Upper(paths, [0] * len(paths)).read_many([0, 1, 2], 3)
    assert got[0] == b"record 0" and type(got[1]) is KeyError and got[2] == b"record 2"
    patched = sources.FileList(paths, [0] * len(paths))
    patched.read = lambda i: b"patched"  # replaced on the instance: still its own read
    assert patched.read_many([0], 2) == [b"patched"]
    # a key open() refuses fails alone, as open() fails (not truncated at the NUL, not the batch)
    nul = sources.FileList([paths[0] + "\0zz", paths[0]], [0, 0]).read_many([0, 1], 2)
    assert type(nul[0]) is ValueError and "null byte" in str(nul[0]) and nul[1] == src.read(0)


def test_read_batch_into_arenas_gives_the_same_bytes_and_failures(folder, tmp_path):
    """With arenas (the Loader's read stage) a batch's files are memoryview slices of one reused
    buffer: the same bytes and the same failures as bytes objects, an empty file empty."""
    root, samples = folder
    (tmp_path / "empty.jpg").write_bytes(b"")
    (tmp_path / "dir.jpg").mkdir()
    paths = [samples[0][0], str(tmp_path / "missing.jpg"), str(tmp_path / "dir.jpg"), str(tmp_path / "empty.jpg"),
             samples[1][0], samples[2][0] + "\0x"]  # the last: a key open() refuses
    src = sources.FileList(paths, [0] * len(paths))
    plain, plain_failed = src.read_batch(range(len(paths)), 3)
    arenas = sources.Arenas(keep=2)
    views, failed = src.read_batch(range(len(paths)), 3, arenas)
    assert [type(v) for v in views] == [memoryview, bytes, bytes, memoryview, memoryview, bytes]
    assert [bytes(v) for v in views] == plain and views[3] == b""
    assert {k: (type(e), str(e)) for k, e in failed.items()} == {k: (type(e), str(e)) for k, e in plain_failed.items()}
    assert sorted(failed) == [1, 2, 5]
    assert views[0].obj is views[4].obj is arenas.buffers[0] and views[0].readonly is False


def test_arenas_are_reused_only_once_nothing_references_them(folder):
    root, samples = folder
    src = sources.FileList([p for p, _, _ in samples[:8]], [0] * 8)
    want = [src.read(i) for i in range(8)]
    arenas = sources.Arenas(keep=2)
    first, _ = src.read_batch(range(8), 2, arenas)
    second, _ = src.read_batch(range(8), 2, arenas)  # the first batch is alive: another buffer
    assert first[0].obj is not second[0].obj and len(arenas.buffers) == 2
    third, _ = src.read_batch(range(8), 2, arenas)  # both alive, the pool full: a buffer of its own
    assert third[0].obj is not first[0].obj and third[0].obj is not second[0].obj and len(arenas.buffers) == 2
    assert [bytes(v) for v in first] == [bytes(v) for v in second] == [bytes(v) for v in third] == want
    kept = first[3]  # one slice is enough to keep its buffer from being read into
    del first
    fourth, _ = src.read_batch(range(8), 2, arenas)
    assert fourth[0].obj is not kept.obj and bytes(kept) == want[3]
    del second, fourth, kept  # every pooled buffer free again: one of them is read into
    again, _ = src.read_batch([1, 0], 2, arenas)
    assert any(again[0].obj is b for b in arenas.buffers) and len(arenas.buffers) == 2
    assert [bytes(v) for v in again] == [want[1], want[0]]
    big = sources.Arenas(keep=1)
    small, _ = src.read_batch([0], 1, big)
    del small
    large, _ = src.read_batch(range(8), 2, big)  # the free buffer is too small: replaced
    assert large[0].obj.nbytes >= sum(len(w) for w in want) and len(big.buffers) == 1


def test_arenas_give_the_smallest_fit_and_shrink_after_a_huge_batch(folder):
    """A batch that once held huge files must not keep its buffer (times the batches in flight)
    alive for the Loader's life: a free buffer far larger than the request is dropped."""
    import weakref

    root, samples = folder
    src = sources.FileList([p for p, _, _ in samples[:8]], [0] * 8)
    size = len(src.read(0))
    arenas = sources.Arenas(keep=2)
    arenas.SHRINK_BYTES = 0  # the rule at this test's scale (64 MB by default)
    many, _ = src.read_batch(range(8), 2, arenas)
    one, _ = src.read_batch([0], 1, arenas)
    big, small = weakref.ref(many[0].obj), weakref.ref(one[0].obj)  # (a reference would keep them taken)
    assert many[0].obj.nbytes > arenas.OVERSIZE * one[0].obj.nbytes
    del many, one
    again, _ = src.read_batch([0], 1, arenas)  # both free: the smaller one; the big one dropped
    assert again[0].obj is small() and big() is None
    shrunk, _ = src.read_batch([0], 1, arenas)  # the small one taken: a fresh one of the request's size
    assert shrunk[0].obj is not small() and shrunk[0].obj.nbytes < 2 * size and len(arenas.buffers) == 2
    assert bytes(shrunk[0]) == bytes(again[0]) == src.read(0)
    del again, shrunk
    arenas.SHRINK_BYTES = 1 << 40  # under the floor a free buffer that fits is reused, however large
    many, _ = src.read_batch(range(8), 2, arenas)
    kept = weakref.ref(many[0].obj)
    del many
    one, _ = src.read_batch([0], 1, arenas)
    two, _ = src.read_batch([0], 1, arenas)
    assert kept() is not None and any(kept() is view[0].obj for view in (one, two))


def test_the_loader_reads_into_the_same_buffers_epoch_after_epoch(folder):
    """A short epoch (here 3 batches) would never reuse a buffer if each epoch made its own."""
    root, samples = folder
    ld = gpupipe.Loader(sources.ImageFolder(root), batch_size=8, crop=gpupipe.crops.RandomResizedCrop(16),
                        num_threads=2, prefetch=1, drop_last=True)
    first = [x.clone() for x, _ in ld]
    arenas = ld._arenas
    made = {id(b) for b in arenas.buffers}
    assert 0 < len(made) <= arenas.keep
    taken, take = [], arenas.take
    arenas.take = lambda n: taken.append(take(n)) or taken[-1]
    for epoch in (1, 2):
        ld.set_epoch(epoch)
        list(ld)
    assert ld._arenas is arenas and len(arenas.buffers) <= arenas.keep
    reused = [b for b in taken if id(b) in made]
    assert reused, "the first epoch's buffers were not read into again"
    del arenas.take, taken, reused  # the slices they hold would keep their buffers
    ld.set_epoch(0)
    assert all(torch.equal(a, x) for a, (x, _) in zip(first, ld))  # the bytes read into reused buffers are right


def test_read_files_refuses_a_buffer_it_cannot_write_and_leaks_no_file(folder):
    root, samples = folder
    paths = [p.encode() for p, _, _ in samples[:4]]
    fds = len(os.listdir("/proc/self/fd"))
    for bad, match in ((lambda n: bytes(n), "writable"), (lambda n: bytearray(n - 1 if n > 1 else 0), "at least"),
                       (lambda n: np.empty((n, 2), np.uint8)[:, 0], "contiguous")):
        with pytest.raises(ValueError, match=match):
            _C.read_files(paths, 2, bad)
    with pytest.raises(ZeroDivisionError):
        _C.read_files(paths, 2, lambda n: 1 / 0)
    assert len(os.listdir("/proc/self/fd")) == fds


@pytest.mark.filterwarnings("ignore::gpupipe.SkippedSamplesWarning")
def test_loader_reports_a_file_gone_after_listing_as_a_read_failure(folder, tmp_path):
    root, samples = folder
    paths = [p for p, _, _ in samples[:12]]
    gone = tmp_path / "gone.jpg"
    gone.write_bytes(Path(paths[0]).read_bytes())
    src = sources.FileList(paths + [str(gone)], list(range(13)))
    gone.unlink()
    loader = gpupipe.Loader(src, batch_size=5, crop=crops.CenterCrop(32), shuffle=False)
    labels = [int(v) for _, y in loader for v in y]
    assert labels == list(range(12))
    (failure,) = loader.stats()["skipped"]
    assert failure.key == str(gone) and failure.kind == gpupipe.ErrorKind.READ
    assert failure.message.startswith("read error: FileNotFoundError: [Errno 2]"), failure.message


# --- lookahead: the next epoch started while this one drains --------------------------------------


def _epochs(loader, epochs):
    out = []
    for e in epochs:
        loader.set_epoch(e)
        out.append([x.clone() for x, _ in loader])
    return out


def test_lookahead_delivers_the_same_batches_and_starts_the_epoch_asked_for(folder):
    root, _ = folder

    def make(lookahead):
        return gpupipe.Loader(sources.ImageFolder(root), batch_size=8, crop=crops.RandomResizedCrop(24), seed=2,
                              num_threads=2, lookahead=lookahead)

    ahead, plain = make(True), make(False)
    assert len(_epochs(ahead, [0])[0]) == len(plain)
    assert ahead._ahead is not None and ahead._ahead.epoch.epoch_number == 1 and plain._ahead is None
    # epochs 1, 2 adopt the epoch started ahead; then epoch 7: the one started ahead (3) is dropped
    for a, b in zip(_epochs(ahead, [1, 2, 7]), _epochs(plain, [1, 2, 7])):
        assert len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))
    again, plain_again = make(True), make(False)  # an epoch iterated twice (no set_epoch): the same one ahead
    for a, b in zip(_epochs(again, [0, 0, 0]), _epochs(plain_again, [0, 0, 0])):
        assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert again._ahead.epoch.epoch_number == 0
    st = again.stats()
    assert st["images"] == len(again.indices()) and st["batches"] == len(again)


def test_lookahead_work_is_dropped_on_resume_and_stops_with_the_loader(folder):
    root, _ = folder

    def make():
        return gpupipe.Loader(sources.ImageFolder(root), batch_size=8, crop=crops.RandomResizedCrop(24), seed=2,
                              num_threads=2)

    ld = make()
    it = iter(ld)
    next(it), next(it)
    state = ld.state_dict()
    rest = [x.clone() for x, _ in it]
    assert ld._ahead is not None
    ld.load_state_dict(state)  # the epoch started ahead is dropped: the state's position wins
    assert ld._ahead is None
    resumed = [x for x, _ in ld]
    assert len(resumed) == len(rest) and all(torch.equal(a, b) for a, b in zip(rest, resumed))
    assert ld._ahead is not None and gpupipe_threads()
    del ld, it
    gc.collect()
    assert _exits_quickly(lambda: not gpupipe_threads()), gpupipe_threads()


def test_an_epoch_whose_last_batch_was_delivered_keeps_its_epoch_ahead(folder):
    """A loop of len(loader) steps never asks for one more batch (zip, islice): the epoch is complete
    once its last batch is delivered, so the next epoch started ahead is kept and taken; a loop that
    stops one batch early drops it."""
    root, _ = folder
    ld = gpupipe.Loader(sources.ImageFolder(root), batch_size=8, crop=crops.RandomResizedCrop(24), seed=2,
                        num_threads=2)
    plain = gpupipe.Loader(sources.ImageFolder(root), batch_size=8, crop=crops.RandomResizedCrop(24), seed=2,
                           num_threads=2, lookahead=False)
    got = [x.clone() for _, (x, _) in zip(range(len(ld)), ld)]
    assert len(got) == len(ld)
    ahead = ld._ahead
    assert ahead is not None and ahead.epoch.epoch_number == 1
    ld.set_epoch(1)
    it = iter(ld)
    assert it.epoch is ahead.epoch  # taken over, not started again
    first = [x.clone() for _, (x, _) in zip(range(len(ld) - 2), it)]
    assert _exits_quickly(lambda: it.epoch.read_all)  # its last batch read: the next __next__ starts epoch 2
    first.append(next(it)[0].clone())
    assert ld._ahead is not None and ld._ahead.epoch.epoch_number == 2
    plain.set_epoch(1)
    assert all(torch.equal(a, b) for a, b in zip(first, [x for x, _ in plain]))
    it.close()  # one batch short of the end: the epoch ahead it started is dropped
    assert ld._ahead is None


def test_lookahead_runs_the_users_modules_only_for_an_epoch_iterated(folder):
    root, _ = folder
    calls = []

    def transform(images, labels):
        calls.append(images.shape[0])
        return images, labels

    ld = gpupipe.Loader(sources.ImageFolder(root), batch_size=8, crop=crops.CenterCrop(24), num_threads=2,
                        batch_transform=transform)
    list(ld)
    time.sleep(0.3)  # the epoch ahead decodes meanwhile; its batches wait before the user's transform
    assert len(calls) == len(ld) and ld._ahead is not None
    ld.set_epoch(5)  # not the one started ahead: dropped, its transform never ran
    list(ld)
    assert len(calls) == 2 * len(ld)


def test_a_refused_state_keeps_the_epoch_ahead_and_a_failed_start_turns_lookahead_off(folder, monkeypatch):
    root, _ = folder
    ld = gpupipe.Loader(sources.ImageFolder(root), batch_size=8, crop=crops.CenterCrop(24), num_threads=2)
    list(ld)
    ahead = ld._ahead
    state = ld.state_dict()
    with pytest.raises(ValueError, match="seed"):
        ld.load_state_dict({**state, "seed": 99})
    assert ld._ahead is ahead  # nothing of a refused state is taken
    real = gpupipe.loader._Epoch

    def failing(*args, ahead=False, **kw):
        if ahead:
            raise RuntimeError("out of pinned memory")
        return real(*args, ahead=ahead, **kw)

    monkeypatch.setattr(gpupipe.loader, "_Epoch", failing)
    ld.set_epoch(3)  # the epoch ahead (1) is dropped; starting 4 ahead fails
    with pytest.warns(RuntimeWarning, match="could not be started ahead .*out of pinned memory.*lookahead is off"):
        got = [x for x, _ in ld]
    assert len(got) == len(ld) and not ld.lookahead and ld._ahead is None


def test_a_warning_on_the_consumer_is_not_lost_while_a_stage_thread_reads_a_png():
    """Pillow's warnings are dropped on the thread that reads the file only: catch_warnings on a
    stage thread swapped the whole process's filters (the Loader's SkippedSamplesWarning went
    missing when the epoch started ahead read a PNG at the epoch's end)."""
    import warnings

    from gpupipe._quiet_warnings import quiet

    inside, go_on = threading.Event(), threading.Event()

    def pillow_thread():
        with quiet("PIL"):
            from PIL import Image as PILImage

            PILImage.warnings.warn("a Pillow note, dropped on this thread")
            inside.set()
            go_on.wait(5)

    t = threading.Thread(target=pillow_thread)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        t.start()
        assert inside.wait(5)
        warnings.warn("the consumer's warning", UserWarning)
        from PIL import Image as PILImage

        PILImage.warnings.warn("a Pillow warning on another thread")  # still shown: only the quiet thread drops
        go_on.set()
        t.join()
    assert [str(w.message) for w in seen] == ["the consumer's warning", "a Pillow warning on another thread"]
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with quiet("PIL", DeprecationWarning):  # only the categories named
            PILImage.warnings.warn("deprecated", DeprecationWarning)
            PILImage.warnings.warn("a note")
    assert [str(w.message) for w in seen] == ["a note"]


def test_a_started_decode_reports_its_own_busy_seconds():
    from gpupipe._backends import cpu
    from gpupipe.decode_types import DecodeOptions

    datas = [jpeg_bytes(i, 0, 64, 64) for i in range(6)]
    boxes = np.tile(np.array([[0, 0, 32, 32]], dtype=np.float64), (6, 1))
    out = torch.empty((6, 32, 32, 3), dtype=torch.uint8)
    before = _C.decode_busy_seconds()
    status = cpu.wait(cpu.start(datas, boxes, out, DecodeOptions(size=(32, 32), resize=False, num_threads=2)), 6)
    assert status.ok.all() and 0 < status.cpu_busy_seconds <= _C.decode_busy_seconds() - before + 1e-6


@pytest.mark.parametrize("left", ["an epoch ahead", "an iteration mid-epoch"])
def test_a_process_ends_at_once_with_batches_waiting(folder, left):
    """Batches waiting for the consumer (a free ring slot, the iteration that takes an epoch
    started ahead) wait outside their stage's call scope: the process's exit does not wait for them
    (gpupipe._exit)."""
    root, _ = folder
    use = ("n = sum(x.shape[0] for x, _ in ld)\nassert ld._ahead is not None, 'no epoch ahead'\n"
           if left == "an epoch ahead" else "it = iter(ld)\nn = next(it)[0].shape[0]\n")
    script = (f"import gpupipe, time\n"
              f"ld = gpupipe.Loader(gpupipe.sources.ImageFolder({str(root)!r}), batch_size=4, num_threads=2,\n"
              f"                    crop=gpupipe.crops.CenterCrop(24), augment=lambda x: x + 0)\n"
              f"{use}time.sleep(0.5)\n"  # the stages fill the ring meanwhile
              f"print('delivered', n, time.monotonic(), flush=True)\n")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    exited = time.monotonic()  # (CLOCK_MONOTONIC is the system's: the child's reading compares with ours)
    assert r.returncode == 0 and "delivered" in r.stdout and not r.stderr, r.stderr
    # timed from the script's end, not the child's start (a loaded machine imports torch slowly)
    assert exited - float(r.stdout.split()[-1]) < 15  # (the exit hook waits up to 30 s for a call in hand)


def test_a_loader_made_before_set_device_says_so(tmp_path, monkeypatch):
    """device='cuda' is the current device when the Loader is made; a rank that calls
    torch.cuda.set_device(local_rank) only after making it is told, once, at its first iteration
    (its Loader decodes on the device that was current). Stood in for on a host without CUDA."""
    make_image_folder(tmp_path, per_class=2)
    ld = gpupipe.Loader(sources.ImageFolder(tmp_path), batch_size=2, crop=crops.CenterCrop(16))
    ld._bare_cuda, ld.device = True, torch.device("cuda", 0)  # as made with device="cuda" while cuda:0 was current
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    with pytest.warns(UserWarning, match=r"made with device='cuda' while cuda:0 was the current device; cuda:1 is "
                                         r"current now.*torch.device\('cuda', local_rank\)"):
        with pytest.raises(Exception):  # (no CUDA here: the epoch cannot start)
            iter(ld)
    ld.device = torch.device("cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert sum(len(x) for x, _ in ld) == 6  # said once
