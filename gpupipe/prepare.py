"""``prepare``: a lossless transcode of a dataset that adds restart markers, so that crops decode
only their own part of the entropy-coded data (see csrc/restart.h).

Every JPEG is rewritten with identical DCT coefficients (so identical pixels, verified per file),
optimised Huffman tables and restart intervals that tile each MCU row. Non-JPEG, unreadable and
corrupt files (any libjpeg warning), and files over a limit of :func:`gpupipe.set_limits`, are
copied unchanged and reported with the reason, never dropped and never rewritten. Folder trees keep their layout (so labels
in class folders survive); tar shards keep their members, names and order.
"""

from __future__ import annotations

import dataclasses
import io
import os
import shutil
import tarfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Optional, Sequence, Union

import torch

from gpupipe import _C

_JPEG = b"\xff\xd8"


@dataclasses.dataclass
class PrepareReport:
    files: int = 0
    transcoded: int = 0
    copied: list = dataclasses.field(default_factory=list)  # (path, reason): non-JPEG / unreadable
    skipped_existing: int = 0  # already prepared by an earlier run (resume)
    bytes_in: int = 0
    bytes_out: int = 0

    @property
    def overhead(self) -> float:
        """Relative size change of the transcoded JPEGs (negative: smaller)."""
        return self.bytes_out / self.bytes_in - 1 if self.bytes_in else 0.0

    def __str__(self) -> str:
        return (f"{self.files} files: {self.transcoded} JPEGs transcoded ({100 * self.overhead:+.2f}% size), "
                f"{len(self.copied)} copied unchanged, {self.skipped_existing} already prepared")


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
        num_threads: parallel files (the transcode releases the GIL).
        verify: decode source and result and require identical pixels.
        progress: a tqdm bar.

    Resumable: a destination file newer than its source is kept as is.
    """
    dst = Path(dst)
    report = PrepareReport()
    lock = threading.Lock()
    threads = num_threads or _C.default_num_threads()
    shards = [Path(src)] if str(src).endswith(".tar") else ([Path(p) for p in src] if isinstance(src, (list, tuple)) else None)

    def convert(name: str, data: bytes) -> bytes:
        if data[:2] != _JPEG:
            with lock:
                report.copied.append((name, "not a JPEG"))
            return data
        try:
            out = prepare_bytes(data, restart_rows=restart_rows, restart_mcus=restart_mcus, verify=verify)
        except Exception as e:  # unreadable: kept unchanged, reported
            with lock:
                report.copied.append((name, f"{type(e).__name__}: {e}"))
            return data
        with lock:
            report.transcoded += 1
            report.bytes_in += len(data)
            report.bytes_out += len(out)
        return out

    bar = _bar(progress)
    if shards is None:
        root = Path(src)
        files = sorted(p for p in root.rglob("*") if p.is_file())
        report.files = len(files)
        if bar is not None:
            bar.reset(total=len(files))

        def one(path: Path):
            target = dst / path.relative_to(root)
            if target.exists() and target.stat().st_mtime >= path.stat().st_mtime and target.stat().st_size > 0:
                with lock:
                    report.skipped_existing += 1
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                data = path.read_bytes()
                out = convert(str(path), data)
                tmp = target.with_name(target.name + ".part")
                if out is data:
                    shutil.copy2(path, tmp)
                else:
                    tmp.write_bytes(out)
                os.replace(tmp, target)  # atomic: an interrupted run leaves no half file
            if bar is not None:
                bar.update(1)

        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(one, files))
    else:
        dst.mkdir(parents=True, exist_ok=True)
        for shard in shards:
            target = dst / shard.name
            if target.exists() and target.stat().st_mtime >= shard.stat().st_mtime:
                report.skipped_existing += 1
                continue
            with tarfile.open(shard, "r") as tin:
                members = [m for m in tin.getmembers()]
                payloads = [tin.extractfile(m).read() if m.isfile() else None for m in members]
            with ThreadPoolExecutor(threads) as pool:
                converted = list(pool.map(lambda mp: convert(f"{shard}:{mp[0].name}", mp[1]) if mp[1] is not None else None,
                                          zip(members, payloads)))
            tmp = target.with_name(target.name + ".part")
            with tarfile.open(tmp, "w") as tout:
                for m, data in zip(members, converted):
                    report.files += m.isfile()
                    if data is None:
                        tout.addfile(m)
                    else:
                        info = tarfile.TarInfo(m.name)
                        info.size, info.mtime, info.mode = len(data), m.mtime, m.mode
                        tout.addfile(info, io.BytesIO(data))
            os.replace(tmp, target)
            if bar is not None:
                bar.update(1)
    if bar is not None:
        bar.close()
    return report


def _bar(progress: bool):
    if not progress:
        return None
    try:
        from tqdm import tqdm

        return tqdm(unit="file", desc="prepare")
    except ImportError:
        return None
