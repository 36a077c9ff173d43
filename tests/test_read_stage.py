"""The Loader's read stage against sources of its own: a read that raises, hangs or gives no bytes
fails that sample (kind READ, named), never its batch or the epoch; the read pool's timeout; and a
keyed augment's parameters cut per sample whatever containers hold them."""

from __future__ import annotations

import collections
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import gpupipe
from gpupipe import _read_pool, crops, loader as loader_module, sources
from gpupipe.data import DecodeCropDataset, SkippedSample
from loader_data import make_image_folder


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("reads")
    make_image_folder(root, per_class=8)  # 24 files
    return sources.ImageFolder(root)


class Custom(sources.MapSource):
    """The folder's files through a read of its own, with answers of its own for some indices."""

    def __init__(self, base, answers: dict, release: threading.Event | None = None):
        self.keys, self.labels = list(base.keys), np.arange(len(base.keys), dtype=np.int64)
        self.answers, self.release = answers, release

    def read(self, i):
        if i in self.answers:
            answer = self.answers[i]
            if isinstance(answer, str) and answer == "hang":
                self.release.wait()
            elif isinstance(answer, BaseException):
                raise answer
            else:
                return answer
        with open(self.keys[i], "rb") as f:
            return f.read()


NOT_BYTES = {
    1: None,
    4: "a path, not its bytes",
    6: 7,
    9: np.zeros((4, 4), np.uint8),
    11: torch.zeros(16),
    14: memoryview(bytearray(64))[::2],  # strided
    17: [0xFF, 0xD8],
    20: KeyError("no such record"),
}


@pytest.mark.parametrize("chunk_images", [0, 256])
def test_a_read_that_gives_no_bytes_fails_that_sample_alone(files, monkeypatch, chunk_images):
    """Whatever a source's read returns that is not encoded bytes fails that sample (READ, its key,
    the type named), under every policy; the others are delivered, in order, with their labels."""
    monkeypatch.setattr(loader_module, "CHUNK_IMAGES", chunk_images)
    src = Custom(files, NOT_BYTES)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ld = gpupipe.Loader(src, batch_size=5, crop=crops.CenterCrop(16), shuffle=False, num_threads=1,
                            on_error="skip", io_threads=2)
        labels = [int(v) for _, y in ld for v in y]
    assert labels == [i for i in range(len(src)) if i not in NOT_BYTES]
    failures = {f.key: f for f in ld.stats()["skipped"]}
    assert set(failures) == {src.keys[i] for i in NOT_BYTES}
    assert all(f.kind == gpupipe.ErrorKind.READ for f in failures.values())
    assert "got NoneType" in failures[src.keys[1]].message and "got str" in failures[src.keys[4]].message
    assert "1-D uint8 array" in failures[src.keys[9]].message and "contiguous" in failures[src.keys[14]].message
    assert "KeyError" in failures[src.keys[20]].message
    ld = gpupipe.Loader(src, batch_size=5, crop=crops.CenterCrop(16), shuffle=False, num_threads=1,
                        on_error="raise")
    it = iter(ld)
    with pytest.raises(OSError, match=str(src.keys[1])):  # the first batch holds index 1 (READ: OSError)
        next(it)
    ds = DecodeCropDataset(src, crops.CenterCrop(16), on_error="skip")
    with pytest.warns(gpupipe.SkippedSamplesWarning, match="sample 4 .* skipped"):
        skipped = ds[4]
    assert isinstance(skipped, SkippedSample) and skipped.key == src.keys[4] and "got str" in skipped.failure.message
    assert ds[5][1] == 5


def test_a_streamed_sample_without_bytes_fails_alone(files):
    """A stream source (epoch_samples) whose sample carries no bytes: that sample fails, READ."""

    class Stream:
        def epoch_samples(self, *, epoch, seed, shuffle, rank, world_size, drop_last, start=0):
            for i, key in enumerate(files.keys[start:12], start):
                data = None if i == 3 else Path(key).read_bytes()  # (closed at once: an open file left to GC warns)
                yield sources.Sample(i, str(key), i, data)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ld = gpupipe.Loader(Stream(), batch_size=4, crop=crops.CenterCrop(16), num_threads=1)
        labels = [int(v) for _, y in ld for v in y]
    assert labels == [i for i in range(12) if i != 3]
    (failure,) = ld.stats()["skipped"]
    assert failure.key == str(files.keys[3]) and failure.kind == gpupipe.ErrorKind.READ


def test_a_read_that_hangs_fails_its_sample_after_the_timeout(files):
    """A read that does not return within read_timeout fails its sample (the timeout named); the
    batch and the epoch go on, the stuck thread's place taken; the thread stops once the read
    returns."""
    import gc

    release = threading.Event()
    src = Custom(files, {2: "hang", 13: "hang"}, release)
    before = threading.active_count()
    try:
        # (2 s: the good reads are timed too, and a loaded machine may hold one for a while)
        ld = gpupipe.Loader(src, batch_size=6, crop=crops.CenterCrop(16), shuffle=False, num_threads=1,
                            read_timeout=2, io_threads=2, lookahead=False)
        start = time.monotonic()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            labels = [int(v) for _, y in ld for v in y]
        assert time.monotonic() - start < 40
        assert labels == [i for i in range(len(src)) if i not in (2, 13)]
        failures = ld.stats()["skipped"]
        assert [f.key for f in failures] == [src.keys[2], src.keys[13]]
        assert all(f.kind == gpupipe.ErrorKind.READ and "2 s timeout" in f.message for f in failures)
    finally:
        release.set()
    del ld  # its read pool (one a Loader, across epochs) shut down with it
    gc.collect()
    deadline = time.monotonic() + 10
    while threading.active_count() > before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert threading.active_count() <= before


def test_a_read_that_never_returns_does_not_hold_the_process_at_exit(files, tmp_path):
    """The read pool's threads are daemons: a process whose read hangs forever still exits."""
    script = tmp_path / "hang.py"
    script.write_text(f"""
import threading, warnings
import gpupipe
from gpupipe import crops, sources
base = sources.ImageFolder({str(files.root)!r})
class Hangs(sources.MapSource):
    keys, labels = base.keys, base.labels
    def read(self, i):
        if i == 1:
            threading.Event().wait()
        return open(self.keys[i], "rb").read()
warnings.simplefilter("ignore")
ld = gpupipe.Loader(Hangs(), batch_size=4, crop=crops.CenterCrop(16), num_threads=1, read_timeout=2, shuffle=False)
print(sum(len(y) for _, y in ld))
from gpupipe import loader
loader.CHUNK_IMAGES = 0
ld = gpupipe.Loader(Hangs(), batch_size=1, crop=crops.CenterCrop(16), num_threads=1, read_timeout=60, shuffle=False)
it = iter(ld)
next(it)  # the next batch's read hangs: the process ends with that read running
import time
print(time.monotonic(), flush=True)
""")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    exited = time.monotonic()  # (CLOCK_MONOTONIC is the system's: the child's reading compares with ours)
    assert done.returncode == 0, done.stderr
    count, ended = done.stdout.split()
    assert count == str(len(files) - 1) and done.stderr == ""
    assert exited - float(ended) < 20  # timed from the script's end (not the 60 s read_timeout, not forever)


def test_read_pool_bounds_the_reads_left_running(monkeypatch):
    """Past MAX_STUCK reads left running, reads fail at once, naming how many; once they return,
    their threads serve again; shutting down fails the reads not started."""
    monkeypatch.setattr(_read_pool, "MAX_STUCK", 2)
    release = threading.Event()
    pool = _read_pool.ReadPool(1, 0.2)  # (one thread: which read is running when is not a race)
    try:
        got = pool.map(lambda x: release.wait() if x < 3 else x, [0, 1, 2, 3, 4])
        assert [type(r) for r in got[:3]] == [TimeoutError] * 3  # 0, then 1 timed out; 2 was refused
        assert "0.2 s timeout" in str(got[0]) and "2 reads of this source are still running" in str(got[2])
        assert all(isinstance(r, TimeoutError) for r in got[3:])  # refused too: 2 are stuck
        assert pool.stuck == 2
        assert all("still running" in str(r) for r in pool.map(lambda x: x, [5, 6]))
        release.set()
        deadline = time.monotonic() + 10
        while pool.stuck and time.monotonic() < deadline:
            time.sleep(0.02)
        assert pool.stuck == 0 and pool.map(lambda x: x * 2, [1, 2, 3]) == [2, 4, 6]
        assert isinstance(pool.map(lambda x: 1 / x, [0])[0], ZeroDivisionError)
    finally:
        release.set()
        pool.shutdown()
    with pytest.raises(RuntimeError, match="shut down"):
        pool.map(lambda x: x, [1])
    unlimited = _read_pool.ReadPool(1, None)
    assert unlimited.map(lambda x: x + 1, range(5)) == [1, 2, 3, 4, 5]
    unlimited.shutdown()


def test_a_pool_shut_down_or_a_map_given_up_returns_at_once():
    """A map waiting on a read that hangs returns at once when its caller gives up (an epoch
    closed) or the pool shuts down; a map racing a shutdown never waits for reads no thread takes."""
    release = threading.Event()
    pool = _read_pool.ReadPool(2, 60.0)
    cancel = threading.Event()
    threading.Timer(0.2, cancel.set).start()
    start = time.monotonic()
    got = pool.map(lambda x: release.wait() if x == 0 else x, [0, 1, 2], cancel)
    assert time.monotonic() - start < 20 and got[1:] == [1, 2] or all(isinstance(r, RuntimeError) for r in got[1:])
    assert isinstance(got[0], RuntimeError) and "epoch was closed" in str(got[0])
    threading.Timer(0.2, pool.shutdown).start()
    start = time.monotonic()
    got = pool.map(lambda x: release.wait(), [0, 1, 2, 3])
    assert time.monotonic() - start < 20 and all("shut down" in str(r) for r in got)
    release.set()
    for k in range(200):  # shutdown racing map(): a result, a RuntimeError, never a wait
        pool = _read_pool.ReadPool(1, 5.0)  # (the shutdown is raced here, not the timeout)
        racer = threading.Thread(target=pool.shutdown)
        racer.start()
        try:
            got = pool.map(lambda x: x, list(range(k % 5 + 1)))
            assert all(r == i or isinstance(r, RuntimeError) for i, r in enumerate(got))
        except RuntimeError as e:
            assert "shut down" in str(e)
        racer.join()


def test_reads_left_running_are_bounded_for_the_loaders_life(files, monkeypatch):
    """One read pool a Loader: reads that hang in every epoch leave at most MAX_STUCK threads (plus
    the serving ones), whatever the number of epochs."""
    monkeypatch.setattr(_read_pool, "MAX_STUCK", 4)
    release = threading.Event()
    src = Custom(files, {i: "hang" for i in range(0, 24, 3)}, release)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ld = gpupipe.Loader(src, batch_size=6, crop=crops.CenterCrop(8), num_threads=1, io_threads=2,
                                read_timeout=0.1)
            delivered = sum(len(y) for _, y in ld)
            failures = ld.stats()["skipped"]
            assert 0 < delivered <= 16 and len(failures) == 24 - delivered
            assert all("timeout" in f.message for f in failures)
            for epoch in range(1, 4):  # the 4 reads still hang: every read is refused at once
                ld.set_epoch(epoch)
                with pytest.raises(ValueError, match="[45] reads of this source are still running"):
                    list(ld)  # (4, or 5: the second thread's read had started when the fourth was left)
                assert sum(t.name == "gpupipe-io" for t in threading.enumerate()) <= 4 + 2
    finally:
        release.set()


def test_closing_an_epoch_whose_read_hangs_returns_at_once(files, monkeypatch):
    """An iteration closed while its read stage waits on a read that hangs (a 60 s timeout) closes
    at once, and the process exits at once."""
    monkeypatch.setattr(loader_module, "CHUNK_IMAGES", 0)  # a batch a chunk: the second one's read hangs
    release = threading.Event()
    src = Custom(files, {i: "hang" for i in range(4, 24)}, release)
    try:
        ld = gpupipe.Loader(src, batch_size=4, crop=crops.CenterCrop(8), num_threads=1, shuffle=False,
                            read_timeout=60.0, lookahead=False)
        it = iter(ld)
        assert next(it)[1].tolist() == [0, 1, 2, 3]
        time.sleep(0.3)  # (the next batch's reads started)
        start = time.monotonic()
        it.close()
        assert time.monotonic() - start < 3
    finally:
        release.set()


def test_read_timeout_is_checked(files):
    for bad in (0, -1, float("inf"), float("nan"), "5", True):
        with pytest.raises(ValueError, match="read_timeout"):
            gpupipe.Loader(files, batch_size=2, crop=crops.CenterCrop(8), read_timeout=bad)
    assert gpupipe.Loader(files, batch_size=2, crop=crops.CenterCrop(8), read_timeout=None).read_timeout is None


Pair = collections.namedtuple("Pair", "a b")


def test_parameter_rows_are_cut_in_every_container():
    """A failed sample's rows leave every per-sample parameter: tensors and numpy arrays of leading
    dimension n, in dicts, lists, tuples and named tuples; batch-level values are kept whole."""
    keep = torch.tensor([0, 2, 3])
    params = {"t": torch.arange(4), "a": np.arange(8).reshape(4, 2), "l": [torch.arange(4) * 2, np.arange(4) + 1],
              "p": Pair(np.arange(4.0), "level"), "scalar": 0.5, "mean": np.zeros(3), "n": torch.tensor(4),
              "nested": ({"x": torch.arange(4)},)}
    rows = loader_module._rows(params, keep, 4)
    assert torch.equal(rows["t"], torch.tensor([0, 2, 3])) and rows["a"].tolist() == [[0, 1], [4, 5], [6, 7]]
    assert type(rows["l"]) is list and torch.equal(rows["l"][0], torch.tensor([0, 4, 6]))
    assert rows["l"][1].tolist() == [1, 3, 4]
    assert type(rows["p"]) is Pair and rows["p"].a.tolist() == [0.0, 2.0, 3.0] and rows["p"].b == "level"
    assert rows["scalar"] == 0.5 and rows["mean"].shape == (3,) and int(rows["n"]) == 3
    assert torch.equal(rows["nested"][0]["x"], torch.tensor([0, 2, 3]))


class NumpyKeyed(torch.nn.Module):
    """A keyed module whose parameters are numpy arrays (and a tuple of tensors): each sample's value
    is its index, so what a delivered image got says whose parameters it was given."""

    samples_independent = True

    def sample_params(self, n, *, seed=None, epoch=None, indices=None):
        idx = np.asarray(indices, dtype=np.int64)
        return {"index": idx.copy(), "pair": (torch.from_numpy(idx.copy()), torch.from_numpy(idx * 2))}

    def forward(self, x, params=None):
        assert params["index"].shape == (x.shape[0],) and torch.equal(params["pair"][1], params["pair"][0] * 2)
        out = torch.zeros(x.shape[0], 1)
        out[:, 0] = torch.from_numpy(params["index"]).float()
        return out


@pytest.mark.parametrize("chunk_images", [0, 256])
def test_a_keyed_augment_with_numpy_parameters_gets_each_samples_own(files, monkeypatch, chunk_images):
    """on_error="skip" with a failed sample: every delivered sample gets the parameters drawn for its
    own index, with the chunk finished whole or batch by batch."""
    monkeypatch.setattr(loader_module, "CHUNK_IMAGES", chunk_images)
    src = Custom(files, {3: None, 10: None})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ld = gpupipe.Loader(src, batch_size=4, crop=crops.CenterCrop(16), num_threads=1, augment=NumpyKeyed(),
                            on_error="skip", seed=3)
        for out, labels in ld:
            assert out[:, 0].long().tolist() == labels.tolist()


def test_a_sources_labels_are_delivered_as_int64_or_refused(files):
    """A map-style source's labels as a list, a tensor or int32 come out int64 (as FileList takes
    them); labels that are not integers, or not one per key, are refused when the Loader is made,
    named; an empty source's [] is no label at all."""
    src = Custom(files, {})
    for labels in (list(range(len(src))), torch.arange(len(src), dtype=torch.int32), np.arange(len(src), dtype=np.int32)):
        src.labels = labels
        ld = gpupipe.Loader(src, batch_size=8, crop=crops.CenterCrop(8), shuffle=False, num_threads=1)
        got = [y for _, y in ld]
        assert all(y.dtype == torch.int64 for y in got) and torch.cat(got).tolist() == list(range(len(src)))
    for labels, error, match in ((np.arange(len(src)) + 0.5, ValueError, "label 0.5 of .* is not an int64 integer"),
                                 (["a"] * len(src), ValueError, "not an int64 integer"),
                                 (np.arange(3), ValueError, "one label per key")):
        src.labels = labels
        with pytest.raises(error, match=match):
            gpupipe.Loader(src, batch_size=8, crop=crops.CenterCrop(8))
    src.keys, src.labels = [], []
    assert list(gpupipe.Loader(src, batch_size=8, crop=crops.CenterCrop(8))) == []


def test_files_not_opened_for_want_of_descriptors_are_read_one_by_one(tmp_path):
    """The read stage opens a chunk of up to 256 files at once: under a low descriptor limit (a
    process holding many sockets, several Loaders) 60 of 300 good samples failed every epoch with
    EMFILE. They are read again one at a time once the chunk's are closed."""
    from helpers import encode, photo, run_child

    data = encode(photo(16, 16))
    for k in range(300):
        (tmp_path / f"{k}.jpg").write_bytes(data)
    out = run_child(f"""
        import glob, os, resource
        import gpupipe
        from gpupipe import crops, sources
        paths = sorted(glob.glob({str(tmp_path)!r} + "/*.jpg"))
        resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 64,
                                                    resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
        got = sources.read_files(paths, 4)
        print(sum(isinstance(g, bytes) for g in got))
        loader = gpupipe.Loader(sources.FileList(paths, [0] * len(paths)), batch_size=300, crop=crops.CenterCrop(8),
                                num_threads=2, lookahead=False)
        print(sum(x.shape[0] for x, _ in loader))
    """)
    assert out.stdout.split() == ["300", "300"]


def test_a_file_whose_read_stalls_fails_named_and_the_epoch_goes_on(tmp_path, monkeypatch):
    """A file system that never answers a read (a hung NFS or FUSE mount, stood in for by a native
    read that waits) held the read stage, and the epoch, for good: read_timeout applies to native
    reads too; the batch's files are read again one by one, the stalled one fails named."""
    import threading

    import gpupipe
    from gpupipe import _C, crops, sources
    from loader_data import make_image_folder

    make_image_folder(tmp_path, per_class=3)
    stalled = sorted(str(p) for p in tmp_path.rglob("*.jpg"))[4]
    release = threading.Event()
    real = _C.read_files

    def stalling(paths, *a):
        if any(p == stalled.encode() for p in paths):
            release.wait(30)
        return real(paths, *a)

    monkeypatch.setattr(_C, "read_files", stalling)
    loader = gpupipe.Loader(sources.ImageFolder(tmp_path), batch_size=4, crop=crops.CenterCrop(16), shuffle=False,
                            read_timeout=3, num_threads=1)  # (the good files' reads are timed too: no race)
    try:
        with pytest.warns(gpupipe.SkippedSamplesWarning):
            seen = sum(len(x) for x, _ in loader)
        skipped = loader.stats()["skipped"]
        assert seen == 8 and [f.key for f in skipped] == [stalled]
        assert "took over read_timeout=3 s" in skipped[0].message and "TimeoutError" in skipped[0].message
    finally:
        release.set()
