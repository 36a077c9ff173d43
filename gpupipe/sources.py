"""Where samples come from: keys, labels and encoded bytes, behind one protocol.

A :class:`Source` yields, per epoch, the :class:`Sample` records of one rank in order
(``epoch_samples``). Map-style sources (:class:`ImageFolder`, :class:`FileList`) give random
access (``len(src)``, ``src.keys[i]``, ``src.labels[i]``, ``src.read(i) -> bytes``) and order
their samples as ``torch.utils.data.DistributedSampler`` does; their bytes are read by the
Loader's I/O threads. :class:`TarShards` streams WebDataset-convention shards (``key.jpg`` +
``key.cls``) with the bytes in the records.
"""

from __future__ import annotations

import csv
import errno
import io
import itertools
import math
import os
import stat
import sys
import tarfile
import threading
import warnings
from pathlib import Path
from typing import Any, Iterator, NamedTuple, Optional, Protocol, Sequence, runtime_checkable

import numpy as np

from gpupipe import _C
from gpupipe._buffers import as_buffer
from gpupipe._errors import user_stacklevel
from gpupipe._exit import call_scope, wait_for
from gpupipe.limits import get_limits

# torchvision.datasets.folder.IMG_EXTENSIONS
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


class Sample(NamedTuple):
    """One sample of an epoch, as a source yields it."""

    index: int  #: the dataset index (map-style) or the position in the stream (``pos * world_size + rank``)
    key: str  #: a path, or ``shard:member``
    label: int
    data: Optional[bytes]  #: the encoded bytes, or None when the Loader reads them (``source.read(index)``)
    error: Optional[str] = None  #: why the sample could not be read (a bad label, an unreadable shard)


@runtime_checkable
class Source(Protocol):
    """What the Loader iterates: one rank's samples of one epoch, in order, from ``start`` on."""

    def epoch_samples(self, *, epoch: int, seed: int, shuffle: bool, rank: int, world_size: int, drop_last: bool,
                      start: int = 0) -> Iterator[Sample]:
        ...


def distributed_indices(n: int, *, epoch: int, seed: int, shuffle: bool, rank: int, world_size: int,
                        drop_last: bool) -> np.ndarray:
    """One rank's sample indices of an epoch, as ``torch.utils.data.DistributedSampler`` orders them
    (a permutation by (seed, epoch), padded by repetition or cut to split evenly)."""
    order = np.random.default_rng([seed, epoch]).permutation(n) if shuffle else np.arange(n)
    per_rank = n // world_size if drop_last else math.ceil(n / world_size)  # DistributedSampler's count
    total = per_rank * world_size
    if total > n:  # pad by repeating from the start, as DistributedSampler
        order = np.concatenate([order, np.resize(order, total - n)])
    return order[:total][rank::world_size]


def indented(text: str) -> str:
    """Every line of ``text`` indented 4 spaces: an object's repr nested in another's."""
    return "\n".join("    " + line for line in text.splitlines())


class KeyList(list):
    """A source's keys: a list that counts its changes, so that the read stage's encoded paths
    (made once per list) follow a key set in place (``src.keys[i] = path``)."""

    def __init__(self, items=()):
        super().__init__(items)
        self.changes = 0


def _counting(name: str):
    method = getattr(list, name)

    def changed(self, *args, **kwargs):
        self.changes += 1
        return method(self, *args, **kwargs)

    changed.__name__ = name
    return changed


for _name in ("__setitem__", "__delitem__", "__iadd__", "__imul__", "append", "extend", "insert", "pop", "remove",
              "clear", "sort", "reverse"):
    setattr(KeyList, _name, _counting(_name))


def walk_following_links(root, onerror=None) -> Iterator[tuple]:
    """``os.walk(root, followlinks=True)`` (torchvision's listing), each real folder listed once:
    a link to a folder already listed (above it, beside it: two folders linking to each other, or
    two links to one folder) is not entered. os.walk would go round until the path is too long,
    listing each file again each time, and with two such links never return."""
    seen = set()
    for dirpath, dirnames, filenames in os.walk(root, onerror=onerror, followlinks=True):
        here = os.path.realpath(dirpath)
        if here in seen:  # (reached through two links at once)
            dirnames[:] = []
            continue
        seen.add(here)
        keep = []
        for d in dirnames:
            real = os.path.realpath(os.path.join(dirpath, d))
            if real not in seen and not here.startswith(real.rstrip(os.sep) + os.sep):
                keep.append(d)
        dirnames[:] = keep
        yield dirpath, dirnames, filenames


class MapSource:
    """Random access to keys, labels and bytes; ordered per epoch as DistributedSampler."""

    keys: list
    labels: np.ndarray

    def __len__(self) -> int:
        return len(self.keys)

    def __repr__(self) -> str:  # torchvision's dataset repr: the class, then indented facts
        lines = [f"Number of datapoints: {len(self)}", *self._repr_lines()]
        return f"{type(self).__name__}\n" + indented("\n".join(lines))

    def _repr_lines(self) -> list:
        return []

    def read(self, i: int) -> bytes:
        """The bytes of sample ``i``'s file: a regular file of at most ``max_file_size`` bytes
        (:func:`gpupipe.set_limits`), else ``OSError`` (a FIFO, a device, a directory, too large)."""
        return read_file(self.keys[i])

    def reads_files(self) -> bool:
        """Whether ``read`` is this class's (the key's file), not one a subclass or the instance gave."""
        return getattr(self.read, "__func__", None) is MapSource.read

    def read_many(self, indices: Sequence[int], num_threads: int) -> list:
        """The bytes of several samples, or the exception that stopped each read: one native call
        reading the files on ``num_threads`` threads without the GIL. A subclass that overrides
        ``read`` gets its own ``read`` called per sample."""
        if not self.reads_files():
            return [call_or_error(self.read, i) for i in indices]
        return _in_place(*self.read_batch(indices, num_threads))

    def read_batch(self, indices: Sequence[int], num_threads: int, arenas: Optional["Arenas"] = None,
                   timeout: Optional[float] = None, batch_size: int = 0) -> tuple[list, dict]:
        """The Loader's read stage for a source whose ``read`` is this class's: the bytes of each
        sample (``b""`` where its read failed) and ``{position: the exception}``, one native call
        and no Python per file (the keys' encoded paths are kept after the first batch). With
        ``arenas``, the files of the batch are read into one reused buffer and given as memoryview
        slices of it. ``timeout``: seconds the batch's reads may take (a stalled file system fails its
        files, named, with a TimeoutError). ``batch_size``: the indices are batches of that many
        (0: one batch), each read within ``max_batch_bytes``."""
        paths, all_bytes = self._encoded_paths()
        return _read_paths(paths[np.asarray(indices, dtype=np.int64)].tolist(), num_threads, arenas, all_bytes,
                           timeout, batch_size)

    def _encoded_paths(self) -> tuple[np.ndarray, bool]:
        """The keys as file paths (bytes), or the ValueError open() would raise, in an object array
        (a batch's are taken in one indexing), and whether all are paths; made once per list of keys."""
        cached = getattr(self, "_paths_cache", None)
        changes = getattr(self.keys, "changes", None)  # (a KeyList's: a custom source's list is read once)
        if cached is None or cached[0] is not self.keys or cached[3] != changes or len(cached[1]) != len(self.keys):
            paths = np.empty(len(self.keys), dtype=object)
            paths[:] = [call_or_error(_file_path, k) for k in self.keys]
            cached = (self.keys, paths, all(type(p) is bytes for p in paths), changes)
            self._paths_cache = cached
        return cached[1], cached[2]

    def epoch_samples(self, *, epoch, seed, shuffle, rank, world_size, drop_last, start=0) -> Iterator[Sample]:
        order = distributed_indices(len(self), epoch=epoch, seed=seed, shuffle=shuffle, rank=rank,
                                    world_size=world_size, drop_last=drop_last)
        for i in order[start:]:
            yield Sample(int(i), self.keys[i], int(self.labels[i]), None)


def read_files(paths: Sequence, num_threads: int) -> list:
    """The bytes of each file, or the exception that stopped its read: one native call on
    ``num_threads`` threads without the GIL. Only regular files of at most ``max_file_size`` bytes
    are read, in order while they add up to ``max_batch_bytes``; a FIFO, a device (a symlink to
    ``/dev/zero``), a directory, a larger file or one past the budget fails alone."""
    return _in_place(*_read_paths([call_or_error(_file_path, p) for p in paths], num_threads))


def _in_place(datas: list, failed: dict) -> list:
    """The bytes of each read, with the exception that stopped a failed one in its place."""
    for k, error in failed.items():
        datas[k] = error
    return datas


class Arenas:
    """Byte buffers that batches of files are read into (``read_batch(..., arenas=)``), each
    handed out again once no slice of it is alive: freeing 256 separate 75 KB bytes objects cost
    the Loader's threads ~1.1 ms of GIL time per batch (glibc returns such chunks to the system one
    by one), a reused buffer nothing. At most ``keep`` buffers are kept (the batches in flight).
    A Loader keeps one across its epochs (a new buffer's first touch costs page faults, and a short
    epoch would otherwise never reuse one); a lock makes each buffer go to one taker.

    A take gets the smallest free buffer that fits, and drops each free buffer more than
    :data:`OVERSIZE` times the request and over :data:`SHRINK_BYTES`: a batch that once held a few
    huge files does not keep its buffers alive for the Loader's life."""

    OVERSIZE = 4
    SHRINK_BYTES = 64 << 20

    def __init__(self, keep: int = 8):
        self.keep = keep
        self.buffers: list = []
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> np.ndarray:
        """A uint8 buffer of at least ``nbytes`` that nothing else references."""
        want = nbytes + nbytes // 4  # room for the next batch's larger files
        too_large = max(self.OVERSIZE * want, self.SHRINK_BYTES)
        with self._lock:
            taken, free = [], []
            for b in self.buffers:  # free: referenced by the list, b and the argument only
                if sys.getrefcount(b) > 3:
                    taken.append(b)
                elif b.nbytes <= too_large:  # (one far too large is dropped)
                    free.append(b)
            fits = [b for b in free if b.nbytes >= nbytes]
            if fits:
                self.buffers = taken + free
                return min(fits, key=lambda b: b.nbytes)
            fresh = np.empty(want, dtype=np.uint8)
            kept = taken + free[1:]  # a free buffer that is too small gives its place
            self.buffers = kept + [fresh] if len(kept) < self.keep else kept
            return fresh


def _read_paths(paths: list, num_threads: int, arenas: Optional[Arenas] = None,
                all_bytes: bool = False, timeout: Optional[float] = None, batch_size: int = 0) -> tuple[list, dict]:
    """(bytes per path, b"" where it failed; {position: exception}) for paths as bytes, or the
    exception a path already is (a key open() refuses fails alone; ``all_bytes``: none is).
    ``timeout``: seconds the reads may take (:func:`_read_within`); ``batch_size``: the paths are
    batches of that many (0: one), each within ``max_batch_bytes``."""
    failed = {} if all_bytes else {k: p for k, p in enumerate(paths) if type(p) is not bytes}
    given = [b"" if k in failed else p for k, p in enumerate(paths)] if failed else paths
    take = None if arenas is None else arenas.take
    if timeout is None:
        datas, errors = _C.read_files(given, num_threads, take, batch_size)
    else:
        datas, errors = _read_within(given, num_threads, take, timeout, failed, batch_size)
    for k, code, message in errors:
        if k not in failed:  # the OSError subclass open() would raise (FileNotFoundError, IsADirectoryError, ...)
            failed[k] = OSError(code, message, os.fsdecode(paths[k]))
    return datas, failed


def _in_thread(fn) -> tuple[threading.Thread, threading.Event, list]:
    """``fn()`` on a daemon thread of its own: (the thread, set when it returned, [its result or
    exception])."""
    done, out = threading.Event(), []

    def run():
        try:
            out.append(fn())
        except BaseException as e:  # (its caller raises it)
            out.append(e)
        done.set()

    thread = threading.Thread(target=run, name="gpupipe-read", daemon=True)
    thread.start()
    return thread, done, out


def _read_within(paths: list, num_threads: int, take, timeout: float, failed: dict,
                 batch_size: int = 0) -> tuple[list, list]:
    # A call scope: a wait given up at exit (its read thread parked for good: gpupipe._exit) ends
    # here with the calling thread parked, not as a traceback of a daemon thread on stderr.
    with call_scope():
        return _read_within_scope(paths, num_threads, take, timeout, failed, batch_size)


def _read_within_scope(paths: list, num_threads: int, take, timeout: float, failed: dict,
                       batch_size: int) -> tuple[list, list]:
    """_C.read_files on a thread of its own, waited for ``timeout`` seconds: a file system that
    stalls a read (a hung NFS or FUSE mount) holds that thread, never the epoch (the buffer it
    reads into stays referenced by it: the arenas never hand it out again). When the batch's read
    times out, each file is read again alone, on its own thread with its own deadline: the files
    that answer are read, the ones that stall fail in ``failed``, named; each batch's (``batch_size``
    files, 0: all) still within ``max_batch_bytes``, as read_files keeps them."""
    thread, done, out = _in_thread(lambda: _C.read_files(paths, num_threads, take, batch_size))
    if wait_for(done.wait, timeout, thread):
        if isinstance(out[0], BaseException):
            raise out[0]
        return out[0]
    datas, errors = [b""] * len(paths), []
    budget, per = get_limits().max_batch_bytes, batch_size or max(len(paths), 1)
    taken = [0] * (len(paths) // per + 1)  # bytes read in each batch
    for k, path in enumerate(paths):
        if k in failed or not path:
            continue
        thread, done, out = _in_thread(lambda path=path: _C.read_files([path], 1, None))
        if not wait_for(done.wait, timeout, thread):
            failed[k] = TimeoutError(f"reading {os.fsdecode(path)!r} took over read_timeout={timeout:g} s (a stalled "
                                     f"file system?); the read is left to finish on its own thread")
        elif isinstance(out[0], BaseException):
            failed[k] = out[0]
        else:
            (data,), errs = out[0]
            if len(data) > budget - taken[k // per]:
                errors.append((k, errno.EFBIG, f"the files of its batch read before it hold {taken[k // per]} bytes; its "
                                               f"{len(data)} more would pass the max_batch_bytes limit of {budget} "
                                               "(gpupipe.set_limits(max_batch_bytes=...) raises it): not kept"))
                continue
            taken[k // per] += len(data)
            datas[k] = data
            errors += [(k, code, message) for _, code, message in errs]
    return datas, errors


def read_file(path) -> bytes:
    """One file's bytes, as :func:`read_files` reads them; raises its ``OSError``."""
    got = read_files([path], 1)[0]
    if isinstance(got, BaseException):
        raise got
    return got


def _file_path(key) -> bytes:
    """The key as the bytes of a file path, refused as open() refuses it."""
    path = os.fsencode(key)
    if b"\0" in path:
        raise ValueError("embedded null byte")
    return path


def labels_of(source: "MapSource") -> np.ndarray:
    """A map-style source's ``labels`` as the Loader delivers them: int64, one per key (a list, an
    array or a CPU tensor of integers, as :class:`FileList` takes them: :func:`labels_array`);
    ValueError naming what is wrong otherwise."""
    labels = source.labels
    if not (type(labels) is np.ndarray and labels.dtype == np.int64):
        labels = labels_array(labels, source.keys)
    if labels.shape != (len(source),):
        raise ValueError(f"{type(source).__name__}.labels must hold one label per key ({len(source)}), got shape "
                         f"{labels.shape}")
    return labels


def read_result(value: Any) -> tuple[Any, Optional[str]]:
    """A read's outcome as the decode takes it: ``(buffer, None)``; ``(b"", why)`` when the read
    raised (``value`` is the exception) or gave something that is not encoded bytes (bytes,
    bytearray, a contiguous memoryview, a 1-D uint8 numpy array or CPU tensor): that sample fails
    with kind READ, not its batch."""
    if type(value) is bytes:
        return value, None
    if isinstance(value, BaseException):
        return b"", f"read error: {type(value).__name__}: {value}"
    try:
        return as_buffer(value, "the read's result"), None
    except (TypeError, ValueError) as e:
        return b"", f"read error: {e}"
    except Exception as e:  # (a tensor that cannot be made contiguous bytes: sparse, on a device, ...)
        return b"", f"read error: the read's result could not be taken as bytes: {type(e).__name__}: {e}"


def call_or_error(fn, *args):
    """``fn(*args)``, or the exception it raised: a sample's failure, reported with the sample."""
    try:
        return fn(*args)
    except Exception as e:  # the sample's failure, reported with it
        return e


class ImageFolder(MapSource):
    """torchvision's ``ImageFolder`` layout (``root/<class>/<image>``): the same ``classes``,
    ``class_to_idx`` and sample order (sorted classes, sorted files, followed symlinks)."""

    def __init__(self, root: str | os.PathLike, extensions: str | Sequence[str] = IMG_EXTENSIONS, *,
                 allow_empty: bool = False):
        self.root = Path(os.path.expanduser(root))
        if not self.root.is_dir():
            raise FileNotFoundError(f"ImageFolder root {str(self.root)!r} is not a directory")
        self.classes = sorted(e.name for e in os.scandir(self.root) if e.is_dir())
        if not self.classes:
            raise FileNotFoundError(f"no class folders in {str(self.root)!r}")
        self.class_to_idx = {c: i for i, c in enumerate(self.classes)}
        exts = tuple(e.lower() for e in ((extensions,) if isinstance(extensions, str) else extensions))  # as torchvision
        keys, labels, unlisted = [], [], []
        for c in self.classes:
            listed = len(keys)
            try:
                walked = sorted(walk_following_links(self.root / c, onerror=unlisted.append))
            except RecursionError:  # (os.walk recurses per level)
                raise ValueError(f"the folders under {str(self.root / c)!r} nest deeper than os.walk can list") from None
            for dirpath, _, files in walked:
                for name in sorted(files):
                    if name.lower().endswith(exts):
                        keys.append(os.path.join(dirpath, name))
                        labels.append(self.class_to_idx[c])
            if len(keys) == listed and not allow_empty:  # torchvision's DatasetFolder raises too
                raise FileNotFoundError(f"found no valid file for the class {c} (extensions {', '.join(exts)}; a "
                                        "folder that cannot be listed counts as empty): allow_empty=True keeps it")
        if not keys:
            raise FileNotFoundError(f"no images with extensions {exts} under {str(self.root)!r}")
        if unlisted:  # (torchvision's os.walk drops them silently)
            said = "; ".join(f"{getattr(e, 'filename', '?')} ({e.strerror or type(e).__name__})" for e in unlisted[:3])
            warnings.warn(f"ImageFolder could not list {len(unlisted)} folder(s) under {str(self.root)!r}, whose files "
                          f"are not in the dataset: {said}{' ...' if len(unlisted) > 3 else ''}", UserWarning,
                          stacklevel=user_stacklevel())
        self.keys = KeyList(keys)
        self.labels = np.asarray(labels, dtype=np.int64)

    def _repr_lines(self) -> list:
        return [f"Root location: {self.root}", f"Classes: {len(self.classes)}"]


class FileList(MapSource):
    """An explicit list of files and integer labels."""

    def __init__(self, paths: Sequence[str | os.PathLike], labels: Sequence[int]):
        if len(paths) != len(labels):
            raise ValueError(f"{len(paths)} paths but {len(labels)} labels")
        self.keys = KeyList(os.fspath(p) for p in paths)
        self.labels = labels_array(labels, self.keys)

    @classmethod
    def from_csv(cls, path: str | os.PathLike, *, path_column: str = "path", label_column: str = "label",
                 root: Optional[str | os.PathLike] = None) -> "FileList":
        """Reads ``path,label`` rows (a header row naming the columns, spaces around the names and a
        UTF-8 byte-order mark allowed); relative paths are taken from ``root`` (default: the CSV's
        folder, made absolute). A row without a path, or whose label is not a decimal integer, is a
        ``ValueError`` naming the line."""
        base = Path(root) if root is not None else Path(path).parent.absolute()
        paths, labels = [], []
        with open(path, newline="", encoding="utf-8-sig") as f:
            reader = csv.DictReader(f)
            reader.fieldnames = [name.strip() for name in reader.fieldnames or []]
            missing = [c for c in (path_column, label_column) if c not in reader.fieldnames]
            if missing:
                raise ValueError(f"{os.fspath(path)}: no column {', '.join(map(repr, missing))} in the header row "
                                 f"(its columns: {reader.fieldnames})")
            for row in reader:
                where = f"{os.fspath(path)}, line {reader.line_num}"
                if not row[path_column]:
                    raise ValueError(f"{where}: the path is empty")
                p = Path(row[path_column])
                paths.append(p if p.is_absolute() else base / p)
                labels.append(decimal_label(row[label_column], where))
        return cls(paths, labels)


class TarShards:
    """WebDataset-convention tar shards, streamed: members ``<key>.<ext>`` grouped by key; the
    image is the first member with an image extension, the label the integer in ``<key>.cls``
    (-1 for a sample without one: unlabelled data). As WebDataset, a sample's members are
    consecutive in the shard: a ``.cls`` apart from its image is not that image's.

    Each epoch, shards are shuffled (by seed and epoch), split across ranks by shard, read in
    order, and samples are shuffled within a bounded buffer (``shuffle_buffer``).

    Under ``torch.distributed`` the ranks' shards may hold different numbers of samples, and a rank
    that runs out first leaves the others waiting in their collectives: pass ``samples_per_rank``
    (e.g. ``total // world_size``) to give every rank exactly that many samples per epoch (its
    stream cut there, or started over with another shuffle), as WebDataset's ``with_epoch`` does.
    """

    def __init__(self, paths: Sequence[str | os.PathLike], shuffle_buffer: int = 1000,
                 samples_per_rank: Optional[int] = None):
        one = isinstance(paths, (str, bytes, os.PathLike))  # a shard, as WebDataset takes it
        self.paths = [os.fspath(paths)] if one else [os.fspath(p) for p in paths]
        if not self.paths:
            raise ValueError("no shards given")
        self.shuffle_buffer = int(shuffle_buffer)
        if samples_per_rank is not None and samples_per_rank < 1:
            raise ValueError(f"samples_per_rank must be >= 1, got {samples_per_rank}")
        self.samples_per_rank = samples_per_rank

    def __repr__(self) -> str:
        per_rank = "" if self.samples_per_rank is None else f", samples_per_rank={self.samples_per_rank}"
        return (f"TarShards({len(self.paths)} shards from {self.paths[0]!r}, shuffle_buffer={self.shuffle_buffer}"
                f"{per_rank})")

    def shards_for(self, *, epoch: int, seed: int, rank: int, world_size: int, shuffle: bool) -> list:
        if len(self.paths) < world_size:  # a rank without a shard has no samples: the others would wait for it
            raise ValueError(f"{len(self.paths)} shards for {world_size} ranks: rank {rank} would have none (shards "
                             "are split across ranks whole); write at least as many shards as ranks")
        order = list(range(len(self.paths)))
        if shuffle:
            order = list(np.random.default_rng([seed, epoch, 0x5A4D]).permutation(len(self.paths)))
        return [self.paths[i] for i in order[rank::world_size]]

    @staticmethod
    def read_shard(path: str) -> Iterator[tuple]:
        """(key, label, image bytes, error) per sample, in the shard's order. A sample whose label
        is not an integer, a sample with a member that is not read (sparse, a link or device, over
        ``max_file_size``: checked from the member's header, before any of it is read), and a shard
        that cannot be read (truncated, not a tar), come out as one record with the error, so the
        stream goes on with the next sample or shard."""
        current, parts, refused, seen = None, {}, [], set()
        max_size = get_limits().max_file_size
        try:
            on_disk = os.stat(path)
            if not stat.S_ISREG(on_disk.st_mode):  # (opening a FIFO would wait for a writer for good)
                raise OSError(f"{path!r} is not a regular file")
            with tarfile.open(path, "r|*") as tar:
                plain = getattr(tar.fileobj, "comptype", None) == "tar"
                for member in tar:
                    if plain and not member.issparse() and member.offset_data + member.size > on_disk.st_size:
                        # (skipping it, tarfile's stream would read past the end block by block: for ever
                        # with a size of terabytes in a PAX header; a sparse member's stored data is smaller)
                        raise tarfile.ReadError(f"member {member.name!r} claims {member.size} bytes, past the "
                                                f"shard's end")
                    if member.isdir():
                        continue
                    base = os.path.basename(member.name)
                    key = os.path.join(os.path.dirname(member.name), base.split(".", 1)[0])
                    ext = base.split(".", 1)[1].lower() if "." in base else ""
                    if current is not None and key != current:
                        yield from TarShards._sample(current, parts, refused, path)
                        parts, refused, seen = {}, [], set()
                    current = key
                    if ext in seen:  # (which one is the sample's? WebDataset refuses a duplicate name too)
                        refused.append(f"member {member.name!r} comes twice in a row (a duplicate name)")
                    seen.add(ext)
                    image = _shard_image(ext) and not any(map(_shard_image, parts))
                    if not (image or ext == "cls"):
                        continue  # never read: a key's other members (metadata, a second image) cost nothing
                    why = member_refusal(member, max_size)
                    if why is not None:
                        refused.append(f"member {member.name!r} {why}")
                    else:
                        parts[ext] = tar.extractfile(member).read()
        except (tarfile.TarError, OSError, EOFError) as e:
            yield f"{path}", -1, None, f"unreadable shard ({type(e).__name__}: {e}); the rest of it is skipped"
            return
        whole = TarShards._ends_properly(path)  # (tarfile takes a cut-off header for the archive's end)
        if current is not None and whole:
            yield from TarShards._sample(current, parts, refused, path)
        elif current is not None:  # its members may go on past the cut (its .cls): never delivered unlabelled
            yield f"{path}:{current}", -1, None, "the shard is truncated right after this sample's members: some may be lost"
        if not whole:
            yield f"{path}", -1, None, ("unreadable shard (truncated: no end-of-archive blocks); the samples after "
                                        "the damage are lost")

    @staticmethod
    def _ends_properly(path: str) -> bool:
        """A tar archive is whole 512-byte blocks ending with two zero blocks (uncompressed shards;
        a compressed one is checked by its decompressor)."""
        try:
            with open(path, "rb") as f:
                if f.read(2) in (b"\x1f\x8b", b"BZ", b"\xfd7"):  # gzip, bzip2, xz
                    return True
                size = f.seek(0, os.SEEK_END)
                if size % 512:
                    return False
                f.seek(max(0, size - 1024))
                return not any(f.read(1024))
        except OSError:
            return False

    @staticmethod
    def _sample(key: str, parts: dict, refused: list, shard: str):
        if refused:  # it may have been the image or the label: the sample fails, named
            yield f"{shard}:{key}", -1, None, "; ".join(refused)
            return
        image = next((parts[e] for e in parts if _shard_image(e)), None)
        if image is None:
            if "cls" in parts:  # labelled, so meant as a sample: say why it is not one
                yield f"{shard}:{key}", -1, None, (f"no image member for {key} (images are the members with an "
                                                   f"extension of {', '.join(_SHARD_IMAGE_EXTS)})")
            return  # a key without an image or a label (e.g. metadata only) is not a sample
        try:
            label = decimal_label(parts["cls"].decode(), "") if "cls" in parts else -1
        except (ValueError, UnicodeDecodeError):
            yield f"{shard}:{key}", -1, None, f"the label {parts['cls'][:32]!r} in {key}.cls is not an integer"
            return
        if not _INT64_MIN <= label <= _INT64_MAX:
            yield f"{shard}:{key}", -1, None, f"the label {label} in {key}.cls is outside the int64 range of labels"
            return
        yield f"{shard}:{key}", label, image, None

    def epoch_samples(self, *, epoch, seed, shuffle, rank, world_size, drop_last=False, start=0) -> Iterator[Sample]:
        """This rank's samples in stream order; a sample's index is ``pos * world_size + rank``.
        Resuming at ``start`` reads and drops the first ``start`` samples (no decoding). With
        ``samples_per_rank``, the stream is cut at, or cycled up to, that many samples."""
        def stream(cycle: int):
            return self.iter_samples(epoch=epoch + cycle * 1_000_003, seed=seed, rank=rank, world_size=world_size,
                                     shuffle=shuffle)

        def cycled():  # the rank's stream again and again (another shuffle each time), if it has any
            for cycle in itertools.count():
                count = 0
                for record in stream(cycle):
                    count += 1
                    yield record
                if count == 0:
                    return

        records = stream(0) if self.samples_per_rank is None else itertools.islice(cycled(), self.samples_per_rank)
        for pos, (key, label, data, error) in enumerate(itertools.islice(records, start, None), start):
            yield Sample(pos * world_size + rank, key, label, data, error)

    def iter_samples(self, *, epoch: int, seed: int, rank: int, world_size: int, shuffle: bool) -> Iterator[tuple]:
        """(key, label, bytes, error) records of this rank's shards, shuffled within the buffer."""
        rng = np.random.default_rng([seed, epoch, rank, 0xB0F])
        buffer = []
        for shard in self.shards_for(epoch=epoch, seed=seed, rank=rank, world_size=world_size, shuffle=shuffle):
            for sample in self.read_shard(shard):
                if not shuffle:
                    yield sample
                    continue
                buffer.append(sample)
                if len(buffer) >= self.shuffle_buffer:
                    j = int(rng.integers(len(buffer)))
                    buffer[j], buffer[-1] = buffer[-1], buffer[j]
                    yield buffer.pop()
        rng.shuffle(buffer)
        yield from buffer


_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
# a sample's image: its first member of these (the last part of a dotted extension: c.left.jpg is an image of c)
_SHARD_IMAGE_EXTS = tuple(e[1:] for e in IMG_EXTENSIONS) + ("gif",)


def _shard_image(ext: str) -> bool:
    return ext.rsplit(".", 1)[-1] in _SHARD_IMAGE_EXTS


def decimal_label(text: str, where: str) -> int:
    """A label written as a decimal integer (ASCII digits, a sign, spaces around); ValueError naming
    ``where`` for anything else (``int`` would also take ``1_000`` and other scripts' digits)."""
    t = text.strip()
    digits = t[1:] if t[:1] in "+-" else t
    if not (digits.isascii() and digits.isdigit()):
        raise ValueError(f"{where}: the label {text!r} is not an integer")
    return int(t)


def labels_array(labels: Any, keys: Sequence) -> np.ndarray:
    """``labels`` as int64, or ValueError naming the first that is not an integer of that range (a
    whole float or a bool is taken as the integer it is, as numpy casts it)."""
    try:
        arr = np.asarray(labels)
    except (TypeError, ValueError, OverflowError) as e:
        raise ValueError(f"labels must be integers: {e}") from None
    arr = arr.reshape(-1) if arr.ndim else arr.reshape(1)
    if arr.dtype.kind in "biu":
        bad = np.flatnonzero(arr > _INT64_MAX) if arr.dtype.kind == "u" else np.zeros(0, np.int64)
    elif arr.dtype.kind == "f":
        bad = np.flatnonzero(~np.isfinite(arr) | (arr != np.round(arr)) | (arr < _INT64_MIN) | (arr >= 2.0**63))
    else:
        bad = [i for i, v in enumerate(arr) if isinstance(v, bool) or not isinstance(v, (int, np.integer))
               or not _INT64_MIN <= v <= _INT64_MAX]
    if len(bad):
        i = int(bad[0])
        value = arr[i].item() if isinstance(arr[i], np.generic) else arr[i]
        raise ValueError(f"label {value!r} of {keys[i]!r} is not an int64 integer")
    return arr.astype(np.int64)


def member_refusal(member: tarfile.TarInfo, max_size: int) -> Optional[str]:
    """Why a tar member's data is not read (its kind and size, from its header), or None. A sparse
    member expands to its claimed size from a map (a 4.5 KB shard made a 300 MB sample, 1 TB a
    MemoryError); links and devices hold no data of their own."""
    if member.issparse():
        return f"is a sparse file claiming {member.size} bytes: not read"
    if not member.isreg():
        kind = {tarfile.SYMTYPE: "a symbolic link", tarfile.LNKTYPE: "a hard link", tarfile.CHRTYPE: "a character device",
                tarfile.BLKTYPE: "a block device", tarfile.FIFOTYPE: "a FIFO"}.get(member.type, f"of type {member.type!r}")
        return f"is {kind}, not a regular file: not read"
    if member.size > max_size:
        return (f"is {member.size} bytes, over the max_file_size limit of {max_size} (gpupipe.set_limits("
                "max_file_size=...) raises it): not read")
    return None


def write_tar_shards(samples, folder: str | os.PathLike, samples_per_shard: int = 100) -> list[str]:
    """Writes (key, label, bytes, ext) samples as WebDataset-style shards; returns their paths."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths, tar, count = [], None, 0
    for key, label, data, ext in samples:
        if tar is None or count == samples_per_shard:
            if tar is not None:
                tar.close()
            paths.append(str(folder / f"shard-{len(paths):05d}.tar"))
            tar, count = tarfile.open(paths[-1], "w"), 0
        for suffix, payload in ((ext, data), ("cls", str(label).encode())):
            info = tarfile.TarInfo(f"{key}.{suffix}")
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
        count += 1
    if tar is not None:
        tar.close()
    return paths


__all__ = ["Source", "Sample", "MapSource", "ImageFolder", "FileList", "TarShards", "write_tar_shards",
           "distributed_indices", "IMG_EXTENSIONS"]
