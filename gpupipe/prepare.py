"""``prepare``: a lossless transcode of a dataset that adds restart markers, so that crops decode
only their own part of the entropy-coded data (see csrc/decode/restart.h).

Every JPEG is rewritten with identical DCT coefficients (so identical pixels, verified per file),
optimised Huffman tables and restart intervals that tile each MCU row. Non-JPEG and corrupt files
(any libjpeg warning), and JPEGs over a limit of :func:`gpupipe.set_limits`, are copied unchanged
and reported with the reason (``copied``), never rewritten. What cannot be read or written (a file
removed after the listing, a FIFO or device, a file or tar member over ``max_file_size``, a sparse
tar member, an unreadable shard, a full disk) is reported in ``failed`` and left out; the run goes
on. Folder trees keep their layout (so labels in class folders survive); tar shards keep their
members, names and order. A destination inside the source folder is never read as a source.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import secrets
import shutil
import stat
import tarfile
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Optional, Sequence, Union

import torch

from gpupipe import _C
from gpupipe._args import is_python_int
from gpupipe.decode_types import check_thread_count
from gpupipe.limits import get_limits
from gpupipe.sources import member_refusal, read_file
from gpupipe.sources import walk_following_links as _walk

_JPEG = b"\xff\xd8"


@dataclasses.dataclass
class PrepareReport:
    files: int = 0
    transcoded: int = 0
    copied: list = dataclasses.field(default_factory=list)  # (path, reason): non-JPEG / corrupt, copied unchanged
    failed: list = dataclasses.field(default_factory=list)  # (path, reason): not read or not written, left out
    skipped_existing: int = 0  # already prepared by an earlier run (resume)
    bytes_in: int = 0
    bytes_out: int = 0

    @property
    def overhead(self) -> float:
        """Relative size change of the transcoded JPEGs (negative: smaller)."""
        return self.bytes_out / self.bytes_in - 1 if self.bytes_in else 0.0

    def __str__(self) -> str:
        return (f"{self.files} files: {self.transcoded} JPEGs transcoded ({100 * self.overhead:+.2f}% size), "
                f"{len(self.copied)} copied unchanged, {len(self.failed)} failed, {self.skipped_existing} already "
                "prepared")


def prepare_bytes(data: bytes, *, restart_rows: int = 1, restart_mcus: int = 8, verify: bool = True) -> bytes:
    """One JPEG, transcoded with restart markers.

    Raises:
        gpupipe.JpegError (its subclass says why): unreadable, corrupt or truncated (any libjpeg
            warning: a corrupt source is never rewritten into a clean-looking file), unsupported,
            or over a limit of :func:`gpupipe.set_limits` (checked before anything is allocated).
        RuntimeError: the transcoded pixels differ from the source's (never expected).
    """
    out = _C.transcode_with_restarts(data, restart_rows, restart_mcus)
    if verify:  # both decoded strictly: any warning would have been an error above already
        h, w = _C.read_header(data)[:2]
        a = torch.empty((h, w, 3), dtype=torch.uint8)
        b = torch.empty((h, w, 3), dtype=torch.uint8)
        _C.decode_into(data, a.data_ptr(), a.numel(), 0, 0, h, w, h, w, strict=True)
        _C.decode_into(out, b.data_ptr(), b.numel(), 0, 0, h, w, h, w, strict=True, use_restarts=False)
        if not torch.equal(a, b):
            raise RuntimeError("transcoded pixels differ from the source")
    return out


def prepare(src: Union[str, os.PathLike, Sequence], dst: Union[str, os.PathLike], *, restart_rows: int = 1,
            restart_mcus: int = 8, num_threads: Optional[int] = None, verify: bool = True,
            progress: bool = True) -> PrepareReport:
    """Transcodes a dataset for restart-marker crops.

    Args:
        src: a folder tree, a ``.tar`` shard, or a list of shards.
        dst: the output folder (created); the same relative layout / shard names.
        restart_rows: MCU rows per restart interval when a row cannot be split.
        restart_mcus: target MCUs per interval inside rows (0: rows only).
        num_threads: parallel files (the transcode releases the GIL); None or 0: the default
            decode thread count (:func:`gpupipe.cpu_share`).
        verify: decode source and result and require identical pixels.
        progress: a tqdm bar, where tqdm is installed (``pip install 'torch-gpupipe[progress]'``).

    Resumable: a destination file newer than its source is kept as is.

    Raises:
        FileNotFoundError: ``src`` (a folder or a shard) does not exist.
        ValueError: ``src`` is a file but not a shard, a folder among several sources, or
            ``num_threads`` is out of range; ``dst`` is ``src``, or a shard's output would be the
            shard itself or another shard's output (two shards of one name): a source would be
            overwritten or lost.
        OSError: ``dst`` cannot be created or written in (checked before any file is read).
    """
    for name, value, low in (("restart_rows", restart_rows, 1), ("restart_mcus", restart_mcus, 0)):
        if not is_python_int(value) or not low <= value <= 65535:
            raise ValueError(f"{name} must be an int in [{low}, 65535], got {value!r}")
    if num_threads is not None:  # (before any progress bar)
        check_thread_count("num_threads", num_threads, default_ok=True)
    threads = num_threads or _C.default_num_threads()
    dst = Path(dst)
    report = PrepareReport()
    lock = threading.Lock()
    shards = [Path(src)] if _is_shard(src) else ([Path(p) for p in src] if isinstance(src, (list, tuple)) else None)
    for path in shards or [Path(src)]:
        _check_source(path, shard=shards is not None)
    if shards is None and dst.resolve() == Path(src).resolve():
        raise ValueError(f"prepare: the destination {str(dst)!r} is the source folder: its files would be overwritten")
    if shards is not None:
        names = [_output_name(s) for s in shards]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"prepare: shards of the same name ({', '.join(twice)}) would write the same output in "
                             f"{str(dst)!r}")
        same = [str(s) for s in shards if (dst / _output_name(s)).resolve() == s.resolve()]
        if same:
            raise ValueError(f"prepare: the output of {same[0]} would be the shard itself: choose another destination")
    writable_folder(dst, "prepare: the destination")

    def convert(name: str, data: bytes) -> tuple:
        """(the bytes to write, what they are: the source's size for a transcode, or why they are
        copied unchanged); counted by ``record`` once written."""
        if data[:2] != _JPEG:
            return data, "not a JPEG"
        try:
            return prepare_bytes(data, restart_rows=restart_rows, restart_mcus=restart_mcus, verify=verify), len(data)
        except Exception as e:  # unreadable: kept unchanged, reported
            return data, f"{type(e).__name__}: {e}"

    def record(outcomes: list) -> None:
        """Counts ``(name, bytes written, what convert said)`` once the files are in the output."""
        with lock:
            for name, written, what in outcomes:
                if isinstance(what, str):
                    report.copied.append((name, what))
                else:
                    report.transcoded += 1
                    report.bytes_in += what
                    report.bytes_out += written

    def fail(name: str, error: BaseException) -> None:
        with lock:
            report.failed.append((name, f"{type(error).__name__}: {error}"))

    bar = _bar(progress)
    if shards is None:
        root = Path(src)
        files = _source_files(root, dst, fail)
        report.files = len(files)
        if bar is not None:
            bar.reset(total=len(files))

        def one(path: Path):
            target = dst / path.relative_to(root)
            try:
                if target.exists() and target.stat().st_mtime >= path.stat().st_mtime and \
                        (target.stat().st_size > 0 or path.stat().st_size == 0):  # (an empty file: copied once)
                    with lock:
                        report.skipped_existing += 1
                else:
                    data = read_file(path)  # regular files within max_file_size only
                    out, what = convert(str(path), data)
                    _write_atomically(target, out, stat_from=path if out is data else None)
                    record([(str(path), len(out), what)])
            except OSError as e:  # removed after the listing, unreadable, not writable: this file only
                fail(str(path), e)
            if bar is not None:
                bar.update(1)

        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(one, files))
    else:
        with ThreadPoolExecutor(threads) as pool:
            for shard in shards:
                target = dst / _output_name(shard)
                try:
                    if target.exists() and target.stat().st_mtime >= shard.stat().st_mtime:
                        report.skipped_existing += 1
                        continue
                    with _AtomicFile(target) as out, tarfile.open(fileobj=out, mode="w") as tout:
                        outcomes = _copy_shard(shard, tout, pool, threads, convert, fail)
                    report.files += len(outcomes)  # the shard is in place: its members count
                    record(outcomes)
                except (tarfile.TarError, OSError, EOFError) as e:  # an unreadable shard, a failed write: the others go on
                    fail(str(shard), e)
                if bar is not None:
                    bar.update(1)
    if bar is not None:
        bar.close()
    return report


_SHARD_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz")


def _is_shard(src) -> bool:
    return isinstance(src, (str, os.PathLike)) and str(src).lower().endswith(_SHARD_SUFFIXES)


def _check_source(path: Path, shard: bool) -> None:
    """A clear error for a source that is missing or of the wrong kind: one folder tree, or shards."""
    if not path.exists():
        raise FileNotFoundError(f"prepare: {'shard' if shard else 'source folder'} {str(path)!r} does not exist")
    if shard and not path.is_file():
        raise ValueError(f"prepare: {str(path)!r} is not a .tar shard (a folder is prepared on its own, as the "
                         "only source)")
    if not shard and not path.is_dir():
        raise ValueError(f"prepare: {str(path)!r} is not a folder or a .tar shard ({', '.join(_SHARD_SUFFIXES)})")


def writable_folder(path: Path, what: str) -> Path:
    """Creates ``path`` (parents too) and checks that files can be written in it, once, before any
    work: not one failure per file, nor a traceback after a benchmark's measurements. An OSError of
    one line naming ``what`` otherwise (NotADirectoryError: it is a file)."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise NotADirectoryError(f"{what} {str(path)!r}: is a file, not a folder") from None
    except OSError as e:  # a file above it, no permission, a read-only file system
        raise type(e)(f"{what} {str(path)!r}: cannot create the folder ({e.strerror or e})") from None
    try:
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as e:
        raise type(e)(f"{what} {str(path)!r}: cannot write in the folder ({e.strerror or e})") from None
    return path


def _output_name(shard: Path) -> str:
    """A shard's output name: the prepared shard is a plain tar (``a.tar.gz`` -> ``a.tar``)."""
    lower = shard.name.lower()
    for suffix in _SHARD_SUFFIXES[1:]:
        if lower.endswith(suffix):
            return shard.name[: -len(suffix)] + ".tar"
    return shard.name


def _source_files(root: Path, dst: Path, fail) -> list:
    """The files under ``root`` to prepare, sorted: regular files (symlinks to them too), never those
    under ``dst`` (a destination inside the source: its outputs are not sources). Symlinked folders
    are followed, as ImageFolder follows them (a link to a folder above it is not: a loop); a folder
    that cannot be listed, a broken or looping link and other kinds (FIFOs, devices) are reported
    failed."""
    skip = os.path.realpath(dst)
    files = []
    for dirpath, dirnames, filenames in _walk(root, lambda e: fail(str(e.filename), e)):
        dirnames[:] = sorted(d for d in dirnames if os.path.realpath(os.path.join(dirpath, d)) != skip)
        for name in sorted(filenames):
            p = Path(dirpath) / name
            try:
                mode = p.stat().st_mode
            except OSError as e:
                fail(str(p), e)
                continue
            if stat.S_ISREG(mode):
                files.append(p)
            elif not stat.S_ISDIR(mode):
                fail(str(p), OSError(f"not a regular file (mode {stat.filemode(mode)}): not read"))
    return sorted(files)


def _copy_shard(shard: Path, tout: tarfile.TarFile, pool, threads: int, convert, fail) -> list:
    """Writes ``shard``'s members to ``tout`` in order, its JPEGs transcoded ``4 * threads`` at a time
    (memory: that many members, never the shard), leaving out (reported failed) the members a Loader
    refuses to read: sparse, over ``max_file_size``. Returns ``(name, bytes written, what convert said)`` of
    each regular member copied, for the caller to count once the shard is in place."""
    max_size = get_limits().max_file_size
    copied: list = []
    with tarfile.open(shard, "r|*") as tin:
        chunk: list = []

        def flush():
            converted = pool.map(lambda mp: convert(f"{shard}:{mp[0].name}", mp[1]) if mp[1] is not None else None, chunk)
            for (m, _), result in zip(chunk, list(converted)):
                if result is None:
                    tout.addfile(m)
                else:
                    data, what = result
                    info = tarfile.TarInfo(m.name)
                    info.size, info.mtime, info.mode = len(data), m.mtime, m.mode
                    info.uid, info.gid, info.uname, info.gname = m.uid, m.gid, m.uname, m.gname
                    info.pax_headers = {k: v for k, v in m.pax_headers.items() if k != "size"}  # (its size is new)
                    tout.addfile(info, io.BytesIO(data))
                    copied.append((f"{shard}:{m.name}", len(data), what))  # (its size: never the shard's bytes)
            chunk.clear()

        for m in tin:
            if m.isfile():  # regular or sparse
                why = member_refusal(m, max_size)
                if why is not None:
                    fail(f"{shard}:{m.name}", OSError(f"member {why}"))
                    continue
                chunk.append((m, tin.extractfile(m).read()))
            else:
                chunk.append((m, None))
            if len(chunk) >= 4 * threads:
                flush()
        flush()
    return copied


class _AtomicFile:
    """A file written through a temporary name no other source or output has, put in place on a
    clean exit (an interrupted run leaves no half file), removed otherwise."""

    def __init__(self, target: Path):
        self.target = target

    def __enter__(self):
        self.target.parent.mkdir(parents=True, exist_ok=True)
        while True:  # O_EXCL: a name nothing else holds; mode 0666 less the umask, as a plain write
            self.tmp = self.target.parent / f".{self.target.name}.{secrets.token_hex(6)}.gpupipe-part"
            try:
                fd = os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
                break
            except FileExistsError:
                continue
        self.file = os.fdopen(fd, "wb")
        return self.file

    def __exit__(self, kind, value, tb):
        self.file.close()
        if kind is None:
            os.replace(self.tmp, self.target)
        else:
            with contextlib.suppress(OSError):
                os.unlink(self.tmp)
        return False


def _write_atomically(target: Path, data: bytes, stat_from: Optional[Path] = None) -> None:
    """Writes ``target`` atomically (:class:`_AtomicFile`), with ``stat_from``'s mode and times when
    given (an unchanged copy)."""
    atomic = _AtomicFile(target)
    with atomic as f:
        f.write(data)
        if stat_from is not None:
            f.flush()
            shutil.copystat(stat_from, atomic.tmp)


def _bar(progress: bool):
    if not progress:
        return None
    try:  # best effort: the default, so it must not need the extra
        from tqdm import tqdm

        return tqdm(unit="file", desc="prepare")
    except ImportError:
        return None
