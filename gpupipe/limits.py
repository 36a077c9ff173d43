"""Process-wide resource limits applied to every decode, checked from the header before allocating,
this process's share of the cores, and the instruction set its CPU kernels use."""

from __future__ import annotations

import numbers
import os
import threading
import warnings
from typing import NamedTuple, Optional

import torch

from gpupipe import _C


class Limits(NamedTuple):
    max_pixels: int  #: width * height above which an image is refused (DecompressionBombError)
    max_scans: int  #: progressive scans above which an image is refused (scan bomb)
    max_memory: int  #: bytes of working memory one decode may use (libjpeg's; Pillow's decoded image)
    max_file_size: int  #: bytes of one sample read from a file or a tar member (checked before reading)
    max_batch_bytes: int  #: bytes of one batch's files read together (a file past it fails, not read)


def get_limits() -> Limits:
    """The limits in force."""
    return Limits(*_C.get_limits())


def check_output_size(height: int, width: int) -> None:
    """Refuses (ValueError) an output of more pixels than an image may have (``max_pixels``), before
    anything is allocated for it. A no-op while ``torch.compile`` traces (the op checks when it runs)."""
    if torch.compiler.is_compiling():
        return
    limit = _C.get_limits()[0]
    if height * width > limit:
        raise ValueError(f"output size {height}x{width} is larger than max_pixels={limit}, the largest image "
                         "allowed (gpupipe.set_limits)")


def set_limits(
    max_pixels: Optional[int] = None, max_scans: Optional[int] = None, max_memory: Optional[int] = None,
    max_file_size: Optional[int] = None, max_batch_bytes: Optional[int] = None,
) -> Limits:
    """Sets the limits given (the others keep their value) and returns the previous ones. Each is a
    positive integer (a float only when integral: ``1e8``); ValueError naming it otherwise.

    Defaults: ``max_pixels`` = 89,478,485 (Pillow's ``Image.MAX_IMAGE_PIXELS``), ``max_scans`` =
    100 (as libjpeg-turbo's fuzzers), ``max_memory`` = 1 GiB, ``max_file_size`` = 1 GiB (a sample's
    bytes, checked from the file's or the tar member's size before it is read), ``max_batch_bytes`` =
    4 GiB (the files of one batch read together, a map-style source's: taken in order while their
    sizes add up to it, a file that would pass it fails alone, ``READ``, before it is read).

    Calls from several threads are serialised (one's limits never undo another's). A decode running
    meanwhile checks each limit as it reaches it: it may see some of the new values and not others.
    """
    given = {"max_pixels": max_pixels, "max_scans": max_scans, "max_memory": max_memory,
             "max_file_size": max_file_size, "max_batch_bytes": max_batch_bytes}
    new = {name: _limit_value(name, v) for name, v in given.items() if v is not None}
    with _set_lock:
        old = get_limits()
        _C.set_limits(*(new.get(name, value) for name, value in old._asdict().items()))
    return old


_set_lock = threading.Lock()  # set_limits' read of the old values and its write, as one step


def _limit_value(name: str, value) -> int:
    """A limit as an int in its range (max_scans is a C int, the others uint64); ValueError naming it otherwise."""
    top = 2**31 - 1 if name == "max_scans" else 2**64 - 1
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not 1 <= value <= top:
        raise ValueError(f"{name} must be a positive integer (at most {top}), got {value!r}")
    return int(value)


def set_entropy_index_size(max_bytes: int) -> int:
    """Bounds the memory of the process's entropy index, and returns the previous bound (bytes).

    A baseline JPEG without restart markers has no random access: a crop's decode Huffman-decodes
    every MCU before it, the rows above the crop and the columns either side of it. Each batch decode
    records where the MCU rows it reaches start (about 6 bytes a row, keyed by the file's size and a
    128-bit hash of its bytes), and a later decode of the same bytes (the next epoch) starts from
    the row at its crop and leaves each crop row for the next row's start as soon as its crop is
    done. The pixels are the same, bit for bit. Measured on one thread of an AMD EPYC (Zen 4),
    RandomResizedCrop 224, a decode after one that learned: 1.13x on the benchmark's default set,
    1.15x on 800x533 photos, 1.28x on 1920x1280 photos (docs/benchmarks.md).

    Default: 256 MiB (``GPUPIPE_ENTROPY_INDEX_MB`` sets it at start-up), about 825,000 files of the
    default set's sizes (~325 bytes each). Once full, files not yet in it decode as without it.
    0 turns it off and empties it; a bound below what it holds empties it too.
    """
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, numbers.Integral) or max_bytes < 0:
        raise ValueError(f"max_bytes must be a non-negative int, got {max_bytes!r}")
    return _C.set_entropy_index_bytes(int(max_bytes))


def entropy_index_stats() -> dict:
    """The entropy index (:func:`set_entropy_index_size`): ``files`` indexed, their ``bytes``, the
    bound ``max_bytes``, and counts of decodes: ``keyed`` (hashed their file's bytes: scans of the
    kind gpupipe's Huffman reader decodes; a file on the restart route or a progressive one is not),
    ``found`` (started with known rows), ``learned`` (added rows) and ``full`` (rows that did not
    fit the bound)."""
    return _C.entropy_index_stats()


def cpu_share() -> dict:
    """This process's share of the cores, the default thread count of its decode pool.

    Under a launcher that starts several ranks per node and leaves each the same cores (``torchrun``
    sets ``LOCAL_WORLD_SIZE``), every rank's pool would otherwise take the whole machine. When the
    process's CPU affinity covers more than its fair share of the online cores, ``threads`` is the
    affinity count divided by ``LOCAL_WORLD_SIZE``; a launcher that binds each rank to its own cores
    already gave it its share. ``GPUPIPE_NUM_THREADS`` overrides the default thread count.

    Returns:
        dict: ``threads`` (the share), ``affinity``, ``online``, ``local_world_size``.
    """
    return _C.cpu_share()


CPU_CAPABILITIES = ("default", "avx2", "avx512", "avx512_vbmi")  #: narrowest first


def cpu_capability() -> dict:
    """The x86-64 instruction set level the CPU kernels (decode's resize, the augmentations, the
    policies, MixUp, erasing) run at, and the widest this CPU has.

    Every level gives the same bits. The level is the CPU's widest unless lowered by the environment
    variable ``GPUPIPE_CPU_CAPABILITY`` (read at import, like torch's ``ATEN_CPU_CAPABILITY``) or by
    :func:`set_cpu_capability`.

    Returns:
        dict: ``active`` and ``supported``, each one of ``default`` (x86-64; any other architecture),
        ``avx2`` (AVX2 + FMA), ``avx512`` (F, BW, VL, DQ, CD), ``avx512_vbmi`` (and VBMI).
    """
    active, supported = _C.cpu_capability()
    return {"active": active, "supported": supported}


def set_cpu_capability(name: str) -> str:
    """Caps the level the CPU kernels run at (one of :data:`CPU_CAPABILITIES`; a level above the
    CPU's gives the CPU's) and returns the level now in force. Process-wide; for comparing paths
    and benchmarking narrower CPUs."""
    if name not in CPU_CAPABILITIES:
        raise ValueError(f"unknown CPU capability {name!r}: expected one of {', '.join(CPU_CAPABILITIES)}")
    return _C.set_cpu_capability(name)


def _apply_environment() -> None:
    """GPUPIPE_CPU_CAPABILITY, read at import (so DataLoader workers and other processes started
    with it follow it; set_cpu_capability is this process's only). A wrong value warns and leaves
    the CPU's level, as torch does with ATEN_CPU_CAPABILITY: a typo must not stop a training job."""
    name = os.environ.get("GPUPIPE_CPU_CAPABILITY", "").strip().lower()
    if not name:
        return
    if name not in CPU_CAPABILITIES:
        warnings.warn(f"GPUPIPE_CPU_CAPABILITY={name!r} is not one of {', '.join(CPU_CAPABILITIES)}: ignored, the CPU "
                      f"kernels run at {_C.cpu_capability()[1]}", RuntimeWarning, stacklevel=2)
        return
    set_cpu_capability(name)


_apply_environment()
