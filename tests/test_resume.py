"""A resumable Loader (torchdata's StatefulDataLoader contract): state taken after k batches, restored
in a new process with another thread count, yields exactly the remaining batches of an uninterrupted
run, pixels, keyed augmentation and batch transform included; ranks and tar shards too."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import gpupipe
from gpupipe import crops, keyed, sources
from helpers import TESTS
from loader_data import make_image_folder

N = 60


class KeyedNoise(torch.nn.Module):
    """A keyed augmentation (the protocol BatchAugment follows): a per-sample offset drawn from
    (seed, epoch, index), so a resumed run must hand it the same indices."""

    def sample_params(self, n, *, seed=None, epoch=None, indices=None):
        u = keyed.uniforms(seed, epoch, indices, 1, stream=keyed.stream_of("KeyedNoise"))
        return {"offset": torch.from_numpy(u[:, 0] * 50).float()}

    def forward(self, x, params=None):
        return x.float() + params["offset"][:, None, None, None]


class KeyedMix:
    """A keyed batch transform: mixes each sample with the next one by a weight drawn from the
    batch's first index (the MixUp protocol)."""

    def sample_params(self, n, *, seed=None, epoch=None, indices=None):
        u = keyed.uniforms(seed, epoch, np.asarray(indices)[:1], 1, stream=keyed.stream_of("KeyedMix"))
        return {"lam": float(u[0, 0])}

    def __call__(self, images, labels, params=None):
        lam = params["lam"]
        return lam * images + (1 - lam) * images.roll(1, 0), torch.stack([labels, labels.roll(1, 0)], 1)


def make_loader(source, **kw):
    return gpupipe.Loader(source, batch_size=7, crop=crops.RandomResizedCrop(24), seed=11, augment=KeyedNoise(),
                          batch_transform=KeyedMix(), **kw)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("resume")
    make_image_folder(str(root))
    return str(root)


def _resume_in_child(source: str, state: dict, kind: str, tmp_path: Path, **kw) -> list:
    """Restores `state` in a new process (num_threads=2) and returns the rest of the epoch."""
    out = tmp_path / "rest.pt"
    code = f"""
import sys, pickle, torch
sys.path.insert(0, {str(TESTS)!r})
from gpupipe import sources
from test_resume import make_loader
source = sources.ImageFolder({source!r}) if {kind!r} == "folder" else sources.TarShards(pickle.loads({pickle.dumps(source)!r}), shuffle_buffer=5)
loader = make_loader(source, num_threads=2, **{kw!r})
loader.load_state_dict({json.loads(json.dumps(state))!r})
loader.set_epoch({state["epoch"]})  # what a training loop does: the position is kept
torch.save([(x, y) for x, y in loader], {str(out)!r})
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return torch.load(out)


@pytest.mark.parametrize("k", [0, 3, 8])
def test_resumed_epoch_equals_the_uninterrupted_one(folder, tmp_path, k):
    full = make_loader(sources.ImageFolder(folder), num_threads=1)
    full.set_epoch(2)
    expected = [(x.clone(), y.clone()) for x, y in full]
    interrupted = make_loader(sources.ImageFolder(folder), num_threads=1)
    interrupted.set_epoch(2)
    it = iter(interrupted)
    for _ in range(k):
        next(it)
    state = interrupted.state_dict()
    del it
    assert state["epoch"] == 2 and state["batches"] == k
    rest = _resume_in_child(folder, state, "folder", tmp_path)
    assert len(rest) == len(expected) - k
    for (xa, ya), (xb, yb) in zip(expected[k:], rest):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)


def test_resume_under_sharding_and_the_next_epoch(folder, tmp_path):
    kw = dict(rank=1, world_size=3, drop_last=True)
    full = make_loader(sources.ImageFolder(folder), **kw)
    full.set_epoch(5)
    expected = [x.clone() for x, _ in full]
    part = make_loader(sources.ImageFolder(folder), **kw)
    part.set_epoch(5)
    it = iter(part)
    next(it)
    state = part.state_dict()
    rest = _resume_in_child(folder, state, "folder", tmp_path, **kw)
    assert [x.shape for x, _ in rest] == [x.shape for x in expected[1:]]
    assert all(torch.equal(a, b) for a, (b, _) in zip(expected[1:], rest))
    # after the resumed epoch, the next one starts from its first batch
    restored = make_loader(sources.ImageFolder(folder), **kw)
    restored.load_state_dict(state)
    list(restored)
    restored.set_epoch(6)
    assert sum(x.shape[0] for x, _ in restored) == (N // 3) // 7 * 7


def test_resume_of_tar_shards(folder, tmp_path):
    src_folder = sources.ImageFolder(folder)
    paths = sources.write_tar_shards(((f"s{i:04d}", int(src_folder.labels[i]), src_folder.read(i), "jpg")
                                      for i in range(N)), tmp_path / "shards", samples_per_shard=8)
    full = make_loader(sources.TarShards(paths, shuffle_buffer=5))
    expected = [x.clone() for x, _ in full]
    part = make_loader(sources.TarShards(paths, shuffle_buffer=5))
    it = iter(part)
    for _ in range(4):
        next(it)
    rest = _resume_in_child(paths, part.state_dict(), "tar", tmp_path)
    assert len(rest) == len(expected) - 4
    assert all(torch.equal(a, b) for a, (b, _) in zip(expected[4:], rest))


def test_a_state_from_another_configuration_is_refused(folder):
    a = make_loader(sources.ImageFolder(folder))
    state = a.state_dict()
    b = gpupipe.Loader(sources.ImageFolder(folder), batch_size=8, crop=crops.CenterCrop(24), seed=11)
    with pytest.raises(ValueError, match="batch_size=7"):
        b.load_state_dict(state)
    with pytest.raises(ValueError, match="version"):
        a.load_state_dict({**state, "version": 99})


def test_keyed_modules_get_the_batch_indices(folder):
    seen = []

    class Spy(KeyedNoise):
        def sample_params(self, n, *, seed=None, epoch=None, indices=None):
            seen.append((seed, epoch, list(np.asarray(indices))))
            return super().sample_params(n, seed=seed, epoch=epoch, indices=indices)

    loader = gpupipe.Loader(sources.ImageFolder(folder), batch_size=16, crop=crops.CenterCrop(24), seed=4, augment=Spy())
    loader.set_epoch(3)
    list(loader)
    assert [i for _, e, idx in seen if e == 3 for i in idx] == loader.indices().tolist()
    # the Loader's lookahead may have drawn the first batches of epoch 4 already, keyed as such
    assert {(s, e) for s, e, _ in seen} <= {(4, 3), (4, 4)}


def test_a_state_taken_after_a_whole_epoch_resumes_as_the_next_iteration_would(folder):
    a = make_loader(sources.ImageFolder(folder))
    first = [x.clone() for x, _ in a]
    state = a.state_dict()
    assert state["batches"] == 0  # nothing in progress
    again = [x.clone() for x, _ in a]  # the uninterrupted run's next iteration
    b = make_loader(sources.ImageFolder(folder))
    b.load_state_dict(state)
    restored = [x for x, _ in b]
    assert len(restored) == len(again) == len(first)
    assert all(torch.equal(x, y) for x, y in zip(restored, again))


def test_a_state_of_another_dataset_is_refused(folder, tmp_path):
    other = tmp_path / "other"
    make_image_folder(str(other), classes=("a", "b", "c"))  # same length, other files
    state = make_loader(sources.ImageFolder(folder)).state_dict()
    with pytest.raises(ValueError, match="source"):
        make_loader(sources.ImageFolder(str(other))).load_state_dict(state)


def test_a_state_resumes_on_the_same_files_in_another_folder(folder, tmp_path):
    """A job's data is often staged to a folder of its own (local scratch named by the job, another
    mount point): the state names the files from the folder they share, its name included, so the
    same files resume from a copy of that folder. A state taken before (a hash of the whole paths)
    still loads where it was taken."""
    import shutil
    import zlib

    moved = tmp_path / "scratch" / "job42" / Path(folder).name  # (the dataset's folder keeps its name)
    shutil.copytree(folder, moved)
    full = make_loader(sources.ImageFolder(folder))
    full.set_epoch(1)
    expected = [x.clone() for x, _ in full]
    part = make_loader(sources.ImageFolder(folder))
    part.set_epoch(1)
    it = iter(part)
    for _ in range(2):
        next(it)
    state = part.state_dict()
    del it
    there = make_loader(sources.ImageFolder(str(moved)))
    there.load_state_dict(state)
    rest = [x for x, _ in there]
    assert len(rest) == len(expected) - 2
    assert all(torch.equal(a, b) for a, b in zip(expected[2:], rest))

    keys = sources.ImageFolder(folder).keys
    before = {**state, "source": f"{len(keys)}:{zlib.crc32(chr(10).join(keys).encode()):08x}"}
    make_loader(sources.ImageFolder(folder)).load_state_dict(before)
    with pytest.raises(ValueError, match="source"):  # (that hash names the old folder)
        make_loader(sources.ImageFolder(str(moved))).load_state_dict(before)
    renamed = tmp_path / "elsewhere" / "other-name"  # the same files in a folder of another name: refused
    shutil.copytree(folder, renamed)
    with pytest.raises(ValueError, match="source"):
        make_loader(sources.ImageFolder(str(renamed))).load_state_dict(state)
    (moved / "cat" / "img000.jpg").rename(moved / "cat" / "renamed.jpg")  # other files: refused
    with pytest.raises(ValueError, match="source"):
        make_loader(sources.ImageFolder(str(moved))).load_state_dict(state)


def test_tar_shards_resume_from_another_folder(folder, tmp_path):
    import shutil

    src_folder = sources.ImageFolder(folder)
    paths = sources.write_tar_shards(((f"s{i:04d}", int(src_folder.labels[i]), src_folder.read(i), "jpg")
                                      for i in range(16)), tmp_path / "shards", samples_per_shard=8)
    shutil.copytree(tmp_path / "shards", tmp_path / "elsewhere" / "shards")
    moved = [str(tmp_path / "elsewhere" / "shards" / Path(p).name) for p in paths]
    state = make_loader(sources.TarShards(paths)).state_dict()
    make_loader(sources.TarShards(moved)).load_state_dict(state)
    with pytest.raises(ValueError, match="source"):
        make_loader(sources.TarShards(moved[::-1])).load_state_dict(state)


def test_set_epoch_replays_gpupipes_own_modules_with_any_thread_count(folder):
    """BatchAugment, the policies (in a Compose), MixUp / CutMix (in a RandomChoice): epoch 2 of a
    run with 2 threads that went through epochs 0 and 1 equals epoch 2 of a new Loader with 1 thread."""
    from gpupipe import augment

    def loader(num_threads):
        chain = augment.Compose([augment.TrivialAugmentWide(),
                                 augment.BatchAugment(hflip=0.5, rotation=15, brightness=0.3, hue=0.05)])
        mix = augment.RandomChoice([augment.MixUp(0.2, num_classes=3), augment.CutMix(1.0, num_classes=3)])
        return gpupipe.Loader(sources.ImageFolder(folder), batch_size=8, crop=crops.RandomResizedCrop(24), seed=5,
                              augment=chain, batch_transform=mix, num_threads=num_threads)

    first = loader(2)
    for epoch in range(3):
        first.set_epoch(epoch)
        run = [(x.clone(), y.clone()) for x, y in first]
    again = loader(1)
    again.set_epoch(2)
    replay = list(again)
    assert len(replay) == len(run) and len(run) > 3
    for (x, y), (x2, y2) in zip(run, replay):
        assert torch.equal(x, x2) and torch.equal(y, y2)
    epoch1 = loader(1)
    epoch1.set_epoch(1)
    assert not torch.equal(next(iter(epoch1))[0], run[0][0])  # the key changes with the epoch


def test_a_compiled_augmentation_stays_keyed(folder):
    """torch.compile(module) forwards sample_params per instance: the Loader still keys its draws,
    so two Loaders of one seed deliver the same pixels whatever torch's global generator holds."""
    from gpupipe import augment

    def first_batch(global_seed):
        torch.manual_seed(global_seed)
        aug = torch.compile(augment.BatchAugment(hflip=0.5, rotation=20, brightness=0.4), backend="eager")
        assert keyed.takes_keys(aug)
        loader = gpupipe.Loader(sources.ImageFolder(folder), batch_size=8, crop=crops.RandomResizedCrop(24), seed=5,
                                augment=aug, num_threads=1)
        return next(iter(loader))[0]

    assert torch.equal(first_batch(1), first_batch(2))


# --- the resume audit's findings (2026-11-28) ------------------------------------------------------

def corrupt_tail_list(root: Path, n: int = 5) -> sources.FileList:
    from helpers import encode, photo

    paths = []
    for i in range(n):
        p = root / f"{i}.jpg"
        p.write_bytes(b"\xff\xd8\xff\xdb" + bytes(300) if i == n - 1 else encode(photo(40, 40)))
        paths.append(str(p))
    return sources.FileList(paths, list(range(n)))


@pytest.mark.filterwarnings("ignore::gpupipe.SkippedSamplesWarning")
def test_a_resumed_epoch_whose_rest_failed_yields_its_empty_batch(tmp_path):
    """Resumed before a last batch of only failed samples, the Loader raised 'delivered no image'
    (the earlier batches were another run's): one rank of a gloo job raised, the others hung up."""
    src = corrupt_tail_list(tmp_path)

    def make():
        return gpupipe.Loader(src, batch_size=1, crop=crops.CenterCrop(24), shuffle=False, num_threads=1)

    whole = [tuple(x.shape) for x, _ in make()]
    a = make()
    it = iter(a)
    [next(it) for _ in range(4)]
    state = a.state_dict()
    it.close()
    b = make()
    b.load_state_dict(state)
    with pytest.warns(gpupipe.SkippedSamplesWarning, match="1 of 1 samples skipped"):
        rest = [tuple(x.shape) for x, _ in b]
    assert rest == whole[4:] == [(0, 3, 24, 24)]
    with pytest.raises(ValueError, match="delivered no image"):  # a whole epoch of failures still raises
        list(gpupipe.Loader(sources.FileList(src.keys[4:], [0]), batch_size=1, crop=crops.CenterCrop(24)))


def test_the_position_follows_the_loaded_state_the_epoch_delivered_and_set_epoch(folder):
    """A state loaded while an iteration runs is not moved by that iterator; an epoch whose last
    batch was delivered (zip, islice) is whole; set_epoch to another epoch is its start."""
    a = make_loader(sources.ImageFolder(folder))
    it = iter(a)
    next(it)
    b = make_loader(sources.ImageFolder(folder))
    ib = iter(b)
    [next(ib) for _ in range(5)]
    a.load_state_dict(b.state_dict())
    next(it)  # the stale iterator runs on; the position stays the loaded one
    assert (a.state_dict()["epoch"], a.state_dict()["batches"]) == (0, 5)
    it.close()
    ib.close()
    c = make_loader(sources.ImageFolder(folder))
    it = iter(c)
    [next(it) for _ in range(len(c))]  # the caller never asks for one more (zip, islice)
    assert c.state_dict()["batches"] == len(c)  # a restored iteration yields what this one would: nothing
    d = make_loader(sources.ImageFolder(folder))
    d.load_state_dict(c.state_dict())
    assert list(d) == [] and list(it) == []
    c.set_epoch(2)
    assert (c.state_dict()["epoch"], c.state_dict()["batches"]) == (2, 0)
    e = make_loader(sources.ImageFolder(folder))
    e.load_state_dict(c.state_dict())
    e_first, c_first = next(iter(e))[0], next(iter(c))[0]
    assert torch.equal(e_first, c_first)
    f = make_loader(sources.ImageFolder(folder))  # set_epoch away and back: the epoch's start, stated so
    f.load_state_dict({**c.state_dict(), "epoch": 1, "batches": 1})
    f.set_epoch(2)
    f.set_epoch(1)
    assert (f.state_dict()["epoch"], f.state_dict()["batches"]) == (1, 0) and len(list(f)) == len(c)
    g = make_loader(sources.ImageFolder(folder))  # an iterator of an epoch left by set_epoch no longer moves it
    ig = iter(g)
    next(ig)
    g.set_epoch(1)
    next(ig)
    assert (g.state_dict()["epoch"], g.state_dict()["batches"]) == (1, 0)
    ig.close()


def test_a_checkpoint_taken_in_the_last_step_of_an_epoch_resumes_with_the_next_epoch(folder):
    """The usual loop: set_epoch(e), then a checkpoint after every step. The one taken after an
    epoch's last batch resumes with the next epoch (its restored iteration of e yields nothing)."""
    def run(loader, epochs, checkpoints=None):
        seen = []
        for e in epochs:
            loader.set_epoch(e)
            for x, _ in loader:
                seen.append(x.clone())
                if checkpoints is not None:
                    checkpoints.append((e, loader.state_dict()))
        return seen

    checkpoints: list = []
    whole = run(make_loader(sources.ImageFolder(folder)), [0, 1], checkpoints)
    per_epoch = len(whole) // 2
    for k in (per_epoch - 1, per_epoch - 2):  # epoch 0's last step, and the one before
        e, state = checkpoints[k]
        restored = make_loader(sources.ImageFolder(folder))
        restored.load_state_dict(state)
        rest = run(restored, [e, 1])
        assert len(rest) == len(whole) - k - 1 and all(torch.equal(x, y) for x, y in zip(rest, whole[k + 1:]))


def test_the_dataset_check_sees_custom_streams_changed_keys_labels_and_orientation(folder, tmp_path):
    """A custom stream's fingerprint was '0:00000000' whatever it held; keys changed in place kept
    the old fingerprint; other labels or apply_exif_orientation were not recorded."""
    class Stream(sources.Source):
        def __init__(self, files):
            self.files = files

        def fingerprint(self):
            return ",".join(self.files)

        def epoch_samples(self, **kw):
            yield from ()

    def loader(source, **kw):
        return gpupipe.Loader(source, batch_size=4, crop=crops.CenterCrop(8), **kw)

    state = loader(Stream(["a", "b"])).state_dict()
    with pytest.raises(ValueError, match="source"):
        loader(Stream(["a", "c"])).load_state_dict(state)
    loader(Stream(["a", "b"])).load_state_dict(state)
    loader(Stream(["a", "b"])).load_state_dict({**state, "source": "0:00000000"})  # a state of before
    grows = Stream(["a"])
    ld = loader(grows)
    ld.state_dict()
    grows.files.append("b")  # what the stream says is asked each time
    assert ld.state_dict()["source"] == state["source"]

    class Listed(sources.MapSource):  # a custom map source with a plain list of keys
        def __init__(self, keys):
            self.keys, self.labels = keys, [0] * len(keys)

        def read(self, i):
            return b""

    listed = Listed(["x", "y", "z"])
    ld = loader(listed)
    taken = ld.state_dict()
    listed.keys.reverse()  # changed in place, same length
    with pytest.raises(ValueError, match="source"):
        ld.load_state_dict(taken)
    src = sources.ImageFolder(folder)
    ld = loader(src)
    state = ld.state_dict()
    src.keys.reverse()
    with pytest.raises(ValueError, match="source"):
        ld.load_state_dict(state)
    src.keys.reverse()
    ld.load_state_dict(state)
    relabelled = sources.FileList(list(src.keys), [(int(v) + 1) % 3 for v in src.labels])
    with pytest.raises(ValueError, match="labels"):
        loader(relabelled).load_state_dict(state)
    with pytest.raises(ValueError, match="apply_exif_orientation"):
        loader(src, apply_exif_orientation=True).load_state_dict(state)
    old = {k: v for k, v in state.items() if k not in ("labels", "apply_exif_orientation")}
    loader(src).load_state_dict(old)  # a state of before they were recorded
