"""The Loader's chunks (loader.CHUNK_IMAGES): batches smaller than a chunk go through the read, plan,
decode and collect stages together, and the consumer gets exactly the batches, pixels, labels,
augmentations, failures and statistics it gets with every batch alone."""

from __future__ import annotations

import threading
import time
import warnings

import numpy as np
import pytest
import torch

import gpupipe
from gpupipe import crops, loader as loader_module, sources
from gpupipe.augment import BatchAugment
from helpers import BACKEND_DEVICES
from loader_data import index_of, jpeg_bytes, make_image_folder, make_messy_folder


@pytest.fixture(scope="module")
def messy(tmp_path_factory):
    """37 good JPEGs and, among them, a corrupt one, a truncated one, a PNG and a non-image."""
    return make_messy_folder(tmp_path_factory.mktemp("messy-chunks"), good=37,
                             bad_names=("a13_corrupt.jpg", "a21_truncated.jpg", "a27_image.png", "a30_notes.jpg"))


def run(root, chunk_images, monkeypatch, epochs=(0, 1), **kw):
    """Every batch of the epochs (images on the CPU, labels) and the last epoch's stats."""
    monkeypatch.setattr(loader_module, "CHUNK_IMAGES", chunk_images)
    kw = {"batch_size": 4, "crop": crops.RandomResizedCrop(24), "num_threads": 2, "seed": 5, **kw}
    ld = gpupipe.Loader(sources.ImageFolder(root), **kw)
    out = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", gpupipe.SkippedSamplesWarning)
        for epoch in epochs:
            ld.set_epoch(epoch)
            out += [(x.cpu(), y.cpu()) for x, y in ld]
    return out, ld.stats()


def same_batches(a, b) -> bool:
    return len(a) == len(b) and all(torch.equal(x, u) and torch.equal(y, v) for (x, y), (u, v) in zip(a, b))


def test_chunk_size_in_batches():
    assert loader_module.chunk_batches(64) == 4 and loader_module.chunk_batches(100) == 2
    assert loader_module.chunk_batches(256) == loader_module.chunk_batches(1000) == 1


def augment_of(kind):
    from gpupipe.augment import AutoAugment, Compose, RandomChoice, RandomErasing, TrivialAugmentWide

    if kind == "batch":  # samples independent: a chunk's batches augmented in one call
        return BatchAugment(hflip=0.5, brightness=0.4, generator=0)
    if kind == "chain":  # the same, the chain's every module independent
        return Compose([TrivialAugmentWide(), BatchAugment(hflip=0.5, contrast=0.3), RandomErasing(0.5, value=0.0)])
    if kind == "eval":  # called plainly, in eval mode: conversion and normalisation
        return BatchAugment(hflip=0.5).eval()
    if kind == "choice":  # a choice per batch, keyed on its first index: drawn per batch, not per chunk
        return RandomChoice([TrivialAugmentWide(), AutoAugment()])
    return None


@pytest.mark.parametrize("batch_size, drop_last", [(4, False), (5, True), (7, False)])
@pytest.mark.parametrize("on_error", ["skip", "replace"])
@pytest.mark.parametrize("augment", [None, "batch", "chain", "eval", "choice"])
def test_chunks_give_the_batches_of_batches_alone(messy, monkeypatch, batch_size, drop_last, on_error, augment):
    """Chunks of 16 images (4, 3 and 2 batches, the epoch's last chunk shorter, a last batch short
    or dropped), failures inside chunks, keyed augmentation (its parameters drawn per batch, the
    host ring on the CPU backend): the same batches, and the same statistics."""
    kw = {"batch_size": batch_size, "drop_last": drop_last, "on_error": on_error,
          "augment": augment_of(augment)}
    alone, st_alone = run(messy, 0, monkeypatch, **kw)
    chunked, st = run(messy, 16, monkeypatch, **kw)
    assert same_batches(chunked, alone)
    assert len(chunked) == 2 * (41 // batch_size if drop_last else -(-41 // batch_size))
    for key in ("batches", "images", "routes", "failures"):
        assert st[key] == st_alone[key], key
    lost = "skipped" if on_error == "skip" else "replaced"
    assert [(f.key, f.kind) for f in st[lost]] == [(f.key, f.kind) for f in st_alone[lost]]
    assert [k for k, _ in st["fallback"]] == [k for k, _ in st_alone["fallback"]]


@pytest.mark.parametrize("backend, device", [c for c in BACKEND_DEVICES if c.values[0] == "cpu"])
def test_on_error_raise_comes_at_the_failing_batch_of_a_chunk(messy, monkeypatch, backend, device):
    """The corrupt file is sample 13 in order: batches 0-2 of 4 are delivered, then batch 3 raises
    naming it, though its chunk (64 images) was collected whole before."""
    monkeypatch.setattr(loader_module, "CHUNK_IMAGES", 64)
    ld = gpupipe.Loader(sources.ImageFolder(messy), batch_size=4, crop=crops.CenterCrop(24), shuffle=False,
                        on_error="raise", backend=backend, device=device)
    it = iter(ld)
    got = [index_of(img) for _ in range(3) for img in next(it)[0]]
    assert got == list(range(12))
    with pytest.raises(gpupipe.CorruptJpegError, match="a13_corrupt.jpg"):
        next(it)


def test_resume_inside_a_chunk_gives_the_same_rest(tmp_path, monkeypatch):
    make_image_folder(tmp_path, per_class=20)
    monkeypatch.setattr(loader_module, "CHUNK_IMAGES", 40)  # 5 batches of 8 a chunk
    make = lambda: gpupipe.Loader(sources.ImageFolder(tmp_path), batch_size=8, crop=crops.RandomResizedCrop(24),
                                  seed=2, num_threads=2, augment=BatchAugment(hflip=0.5, generator=0))
    whole = [x for x, _ in make()]
    part = make()
    it = iter(part)
    for _ in range(3):  # in the middle of the first chunk
        next(it)
    state = part.state_dict()
    del it
    again = make()
    again.load_state_dict(state)
    assert same_batches([(x, x) for x, _ in again], [(x, x) for x in whole[3:]])


def test_the_stages_run_once_a_chunk(tmp_path, monkeypatch):
    """The point of chunks: one read (and plan, decode, collect) per chunk, not per batch."""
    make_image_folder(tmp_path, per_class=20)  # 60 files: batches of 4, chunks of 16 images
    reads = []
    real = sources.ImageFolder.read_batch
    monkeypatch.setattr(sources.ImageFolder, "read_batch", lambda self, idx, *a, **k: reads.append(len(idx))
                        or real(self, idx, *a, **k))
    batches, st = run(tmp_path, 16, monkeypatch, epochs=(0,))
    assert [x.shape[0] for x, _ in batches] == [4] * 15 and st["batches"] == 15
    assert reads[:4] == [16, 16, 16, 12]  # (then the next epoch, started ahead)


class SlowCopy(torch.nn.Module):
    """An augment that takes its time and hands back a copy of what it got."""

    def forward(self, x):
        time.sleep(0.01)
        return x.clone()


def test_a_chunks_batches_share_its_ring_slot_until_the_last_lets_go(tmp_path, monkeypatch):
    """The CPU backend's host ring (an augment on CPU outputs): a chunk's slot is reused only once
    its last batch was augmented. Were it freed by its first batch, the decode of a later chunk
    (waiting for a slot: a ring of prefetch + 3 = 4) would write into batches a slow augment has
    not read yet."""
    make_image_folder(tmp_path, per_class=20)
    kw = {"augment": SlowCopy(), "prefetch": 1, "epochs": (0, 1)}
    alone, _ = run(tmp_path, 0, monkeypatch, **kw)
    chunked, _ = run(tmp_path, 12, monkeypatch, **kw)
    assert same_batches(chunked, alone)


def test_hybrid_chunks_route_and_decode_as_batches_alone(tmp_path, monkeypatch):
    """The hybrid backend (host stand-ins for the GPU engines) on chunks: the same routes, pixels and
    engine counts as its batches alone (routes key on (seed, epoch, index), never on the chunk)."""
    import test_hybrid
    from gpupipe import backends
    from gpupipe._backends import hybrid

    made = test_hybrid.engines()
    monkeypatch.setattr(hybrid, "gpu_engines", lambda device: made)
    monkeypatch.setattr(hybrid, "unavailable_reason", lambda device=None: None)
    resolve = backends.resolve
    monkeypatch.setattr(backends, "resolve", lambda b, d: "hybrid" if b == "hybrid" else resolve(b, d))
    make_image_folder(tmp_path, per_class=12)
    kw = {"backend": "hybrid", "decode_shares": {"cpu": 0.4, "hardware": 0.4, "cuda": 0.2}, "batch_size": 6}
    alone, st_alone = run(tmp_path, 0, monkeypatch, **kw)
    calls = len(made["hardware"].calls)
    chunked, st = run(tmp_path, 18, monkeypatch, **kw)
    assert same_batches(chunked, alone)
    assert st["routes"] == st_alone["routes"] and st["routes"]["gpu-hardware"] > 0
    assert {e: v["given"] for e, v in st["engines"].items()} == {e: v["given"] for e, v in st_alone["engines"].items()}
    assert len(made["hardware"].calls) - calls < calls  # a call a chunk: fewer than a call a batch
    # stats() counts delivered batches: after 4 batches of a 3-batch chunk, the engines' images are
    # the samples they decoded in those batches, not the whole chunks'
    ld = gpupipe.Loader(sources.ImageFolder(tmp_path), crop=crops.RandomResizedCrop(24), num_threads=2, seed=5, **kw)
    it = iter(ld)
    for _ in range(4):
        next(it)
    st = ld.stats()
    assert st["images"] == 24 and st["engines"]["hardware"]["images"] == st["routes"]["gpu-hardware"]
    assert st["engines"]["cuda"]["images"] == st["routes"]["gpu-cuda"]
    del it


class BrokenStream:
    """A streamed source whose iteration raises after ``good`` samples."""

    def __init__(self, data: bytes, good: int):
        self.data, self.good = data, good

    def epoch_samples(self, *, epoch, seed, shuffle, rank, world_size, drop_last, start=0):
        for i in range(start, self.good):
            yield sources.Sample(i, f"s{i}", 0, self.data)
        raise OSError("the shard server went away")


def test_a_stream_that_fails_mid_chunk_delivers_the_batches_it_gave_first(monkeypatch):
    monkeypatch.setattr(loader_module, "CHUNK_IMAGES", 64)
    ld = gpupipe.Loader(BrokenStream(jpeg_bytes(3, 0, 40, 50), 10), batch_size=4, crop=crops.CenterCrop(24))
    it = iter(ld)
    assert [next(it)[0].shape[0] for _ in range(2)] == [4, 4]  # the stream's first 8 samples, of a chunk of 16
    with pytest.raises(OSError, match="went away"):
        next(it)


def test_a_chunks_seconds_are_shared_out_by_what_each_batch_decoded():
    from gpupipe.decode_types import BatchStatus, Route

    status = BatchStatus(np.zeros(10, np.int64), np.array([1, 5, 5, 1, 4, 5, 0, 1, 1, 5]))
    status.engine_seconds = {"hardware": (4, 5, 2.0)}
    status.cpu_busy_seconds = 1.0
    routes = {"cpu": (Route.CPU, Route.CPU_FALLBACK), "hardware": (Route.GPU_HARDWARE,), "cuda": (Route.GPU_CUDA,)}
    parts = status.split_seconds([3, 3, 4], routes)
    assert [p[0]["hardware"][0] for p in parts] == [2, 1, 1]  # the hardware decoder's samples in each part
    assert [p[0]["hardware"][2] for p in parts] == [1.0, 0.5, 0.5]
    assert [p[1] for p in parts] == [pytest.approx(0.2), pytest.approx(0.4), pytest.approx(0.4)]  # cpu 1, 2, 2
    part = status.rows(3, 6)
    assert part.route.tolist() == [1, 4, 5] and not part.engine_seconds


class FakeEvent:
    def synchronize(self):
        pass


def test_a_chunks_slot_released_by_some_of_its_batches_is_carried_with_their_copy():
    """An iteration that ends mid-chunk: the copies its delivered batches started still read the
    slot, and the next epoch's ring (made from pending()) must wait for them, not write the slot."""
    ring = loader_module._Ring([torch.zeros(1) for _ in range(2)])
    slot = ring.acquire()
    use = loader_module._SlotUse(3)
    event = FakeEvent()
    ring.release(slot, event, use)
    ring.release(slot, None, use)
    assert ring.pending() == [(event, slot)]
    again = loader_module._Ring(ring.buffers, ring.pending())
    assert again.acquire() != slot  # the free one first; the carried slot only after its copy
    ring.release(slot, None, use)  # the chunk's last batch: the slot waits for the latest copy
    assert ring.pending() == [(event, slot)]


def test_batches_are_finished_one_by_one_not_a_chunk_at_a_time(tmp_path, monkeypatch):
    """The finish stage (CPU outputs: augment, batch_transform) takes a chunk's batches one at a time,
    held back by its queue: a consumer that took one batch has not had 16 augmented for it."""
    make_image_folder(tmp_path, per_class=20)
    monkeypatch.setattr(loader_module, "CHUNK_IMAGES", 64)  # 16 batches of 4
    calls = []

    class Counting(torch.nn.Module):
        def forward(self, x):
            calls.append(len(x))
            return x.clone()

    ld = gpupipe.Loader(sources.ImageFolder(tmp_path), batch_size=4, crop=crops.CenterCrop(24), num_threads=2,
                        augment=Counting(), prefetch=1, lookahead=False)
    it = iter(ld)
    next(it)
    time.sleep(0.3)
    assert len(calls) <= 4, calls  # the one taken, the queue's, the one in hand
    del it


class CountingAugment(BatchAugment):
    """BatchAugment counting its calls' batch sizes (its forward overridden: declared again)."""

    samples_independent = BatchAugment.samples_independent

    def __init__(self, calls: list, **kw):
        super().__init__(**kw)
        self.calls = calls

    def forward(self, x, params=None):
        self.calls.append(len(x))
        return super().forward(x, params=params)


class Independent(torch.nn.Module):
    """A plain module that declares its samples independent (in eval mode: no draws)."""

    samples_independent = True

    def __init__(self, calls: list):
        super().__init__()
        self.calls = calls

    def forward(self, x):
        self.calls.append(len(x))
        return x.flip(3)


@pytest.mark.parametrize("make", ["keyed", "plain eval", "plain train"])
def test_a_samples_independent_augment_takes_a_chunk_in_one_call(tmp_path, monkeypatch, make):
    """The finish stage's per-call cost paid per chunk: a keyed augment whose samples are
    independent, or such a module in eval mode, is called once a chunk, each batch then its rows,
    with the pixels of its batches alone; a plain module in train mode (its draws are its own) is
    still called once a batch."""
    make_image_folder(tmp_path, per_class=20)  # 60 files: batches of 4, chunks of 16 images
    calls: list = []
    if make == "keyed":
        augment = lambda: CountingAugment(calls, hflip=0.5, saturation=0.5, generator=0)
    else:
        augment = lambda: Independent(calls).train(make == "plain train")
    alone, _ = run(tmp_path, 0, monkeypatch, epochs=(0,), augment=augment())
    assert calls == [4] * 15
    calls.clear()
    chunked, st = run(tmp_path, 16, monkeypatch, epochs=(0,), augment=augment(), lookahead=False)
    assert same_batches(chunked, alone) and st["batches"] == 15
    assert calls == ([4] * 15 if make == "plain train" else [16, 16, 16, 12])


def test_a_chunk_finished_whole_keeps_its_batches_failures_and_transform(messy, monkeypatch):
    """A chunk with a failed sample under on_error="skip" is finished batch by batch (the batches
    shrink), the others whole; the batch transform (MixUp: one draw per batch) runs per batch on
    the rows of the chunk's augmented images: all as the batches alone."""
    from gpupipe.augment import MixUp

    calls: list = []
    kw = {"augment": CountingAugment(calls, hflip=0.5, brightness=0.3, generator=0), "on_error": "skip",
          "batch_transform": MixUp(0.4, num_classes=2), "shuffle": False, "epochs": (0,), "lookahead": False}
    alone, st_alone = run(messy, 0, monkeypatch, **kw)
    calls.clear()
    chunked, st = run(messy, 8, monkeypatch, **kw)  # chunks of 2 batches
    assert same_batches(chunked, alone)
    sizes = [x.shape[0] for x, _ in alone]
    assert sizes == [4, 4, 4, 3, 4, 3, 4, 4, 3, 4, 1]  # three of the files fail
    assert calls == [8, 4, 3, 4, 3, 8, 3, 4, 1]  # the chunks without a failure in one call
    assert st["skipped"] == st_alone["skipped"] and len(st["skipped"]) == 3


def test_a_failed_chunk_draw_falls_back_to_the_batches_draws(tmp_path, monkeypatch):
    """A keyed augment whose draw fails for one batch (here: any draw holding index 9): drawn whole
    for its chunk first, the draw is then made per batch, and the batches before the failing one
    are delivered before it raises."""
    make_image_folder(tmp_path, per_class=20)

    class FailsOnNine(BatchAugment):
        def sample_params(self, n, **kw):
            if 9 in kw["indices"].tolist():
                raise ValueError("no parameters for sample 9")
            return super().sample_params(n, **kw)

    monkeypatch.setattr(loader_module, "CHUNK_IMAGES", 16)
    ld = gpupipe.Loader(sources.ImageFolder(tmp_path), batch_size=4, crop=crops.CenterCrop(24), shuffle=False,
                        augment=FailsOnNine(hflip=0.5, generator=0), num_threads=2)
    it = iter(ld)
    assert [next(it)[0].shape[0] for _ in range(2)] == [4, 4]
    with pytest.raises(ValueError, match="sample 9"):
        next(it)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA outputs need a CUDA device")
def test_a_chunk_finished_whole_on_cuda_serves_a_consumer_that_changes_streams(tmp_path, monkeypatch):
    """CUDA outputs: a chunk's transfer and augmentation are queued on the consumer's stream at its
    first batch; a batch taken on another stream waits for them there (and its memory is kept for
    that stream): the same batches as alone, whatever the stream, with work queued behind."""
    make_image_folder(tmp_path, per_class=20)
    kw = {"augment": BatchAugment(hflip=0.5, brightness=0.4, generator=0), "device": "cuda", "epochs": (0,),
          "lookahead": False}
    alone, _ = run(tmp_path, 0, monkeypatch, **kw)
    monkeypatch.setattr(loader_module, "CHUNK_IMAGES", 16)
    ld = gpupipe.Loader(sources.ImageFolder(tmp_path), batch_size=4, crop=crops.RandomResizedCrop(24), num_threads=2,
                        seed=5, **{k: v for k, v in kw.items() if k != "epochs"})
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    got = []
    it = iter(ld)
    for k in range(len(alone)):
        with torch.cuda.stream(streams[k % 2]):
            torch.cuda._sleep(2_000_000)  # a busy stream: a batch read before its work would be wrong
            x, y = next(it)
            got.append((x.cpu(), y.cpu()))
    assert same_batches(got, alone)


def test_a_chunk_finished_whole_shares_its_seconds_out_by_batch(tmp_path, monkeypatch):
    """stats() counts delivered batches: the chunk's one transfer and augment call is added a
    batch's rows' share at a time (a clock reading 1 s per interval: 1 s per chunk in all)."""

    class OneSecond:
        def read(self):
            return 1.0, 1.0

    make_image_folder(tmp_path, per_class=20)  # 60 files: chunks of 16, 16, 16, 12
    monkeypatch.setattr(loader_module, "HostClock", OneSecond)
    _, st = run(tmp_path, 16, monkeypatch, epochs=(0,), lookahead=False,
                augment=CountingAugment([], hflip=0.5, generator=0))
    assert st["busy_s"]["augment"] == pytest.approx(4.0) and st["busy_s"]["transfer"] == pytest.approx(4.0)
    assert st["host_s"]["augment"] == pytest.approx(4.0)


class FailsOnBigCalls(CountingAugment):
    """Refuses calls of more than 4 images (as a GPU out of memory for a chunk's output would)."""

    samples_independent = BatchAugment.samples_independent

    def forward(self, x, params=None):
        if len(x) > 4:
            self.calls.append(-len(x))
            raise torch.cuda.OutOfMemoryError("no memory for a chunk's output (a test's refusal)")
        return super().forward(x, params=params)


def test_a_chunk_whose_one_call_fails_is_augmented_batch_by_batch(tmp_path, monkeypatch):
    """The chunk's call fails: each of its batches is then augmented alone from the chunk's images
    with its rows of the parameters, as without chunks; the ring slot is given back after the last
    batch (a ring of prefetch + 3 = 4 slots for 8 chunks an epoch: one never given back would
    leave the decode waiting for a slot)."""
    make_image_folder(tmp_path, per_class=20)  # 60 files: 7 chunks of 8 (two batches), then one batch
    calls: list = []
    kw = {"augment": FailsOnBigCalls(calls, hflip=0.5, brightness=0.3, generator=0), "prefetch": 1,
          "epochs": (0, 1), "lookahead": False}
    alone, st_alone = run(tmp_path, 0, monkeypatch, **kw)
    calls.clear()
    got = {}
    worker = threading.Thread(target=lambda: got.update(zip(("batches", "stats"), run(tmp_path, 8, monkeypatch, **kw))),
                              daemon=True)
    worker.start()
    worker.join(60)
    assert not worker.is_alive(), "the Loader stopped: a ring slot was never given back"
    assert same_batches(got["batches"], alone) and got["stats"]["batches"] == st_alone["batches"] == 15
    assert calls == 2 * ([-8, 4, 4] * 7 + [4])


class FailsOnSample(CountingAugment):
    """Refuses any call holding the image that encodes index 9."""

    samples_independent = BatchAugment.samples_independent

    def forward(self, x, params=None):
        if any(index_of(img) == 9 for img in x):
            raise ValueError("sample 9 is refused")
        return super().forward(x, params=params)


def test_a_chunks_failed_call_raises_at_the_failing_batch_after_those_before(tmp_path, monkeypatch):
    make_image_folder(tmp_path, per_class=20)
    monkeypatch.setattr(loader_module, "CHUNK_IMAGES", 16)
    ld = gpupipe.Loader(sources.ImageFolder(tmp_path), batch_size=4, crop=crops.CenterCrop(24), shuffle=False,
                        num_threads=2, augment=FailsOnSample([], hflip=0.0, generator=0).eval())
    it = iter(ld)
    assert [next(it)[0].shape[0] for _ in range(2)] == [4, 4]  # samples 0-7
    with pytest.raises(ValueError, match="sample 9"):
        next(it)
