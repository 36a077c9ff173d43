"""Random draws keyed by (seed, epoch, sample index): the one source of randomness for crops and
augmentations.

A draw is a counter-based hash (SplitMix64) of ``(seed, epoch, index, stream, counter)``, computed
vectorised over a batch, so a sample's parameters never depend on the batch it falls in, the
thread count, the backend or what ran before: ``Loader.set_epoch(e)`` reproduces epoch ``e`` in a
fresh process, and a resumed run continues with the same draws.

``stream`` separates independent consumers (the crop sampler is stream 0; each augmentation module
uses :func:`stream_of` its own name), so adding an augmentation does not change the crops.

A module follows the keyed protocol, :class:`Keyed`, when its ``sample_params(n, *, seed=None,
epoch=None, indices=None)`` takes keys and it replays with ``module(..., params=p)``.
"""

from __future__ import annotations

import abc
import inspect
import zlib
from typing import Any

import numpy as np
import torch

from gpupipe import _C
from gpupipe._args import as_int, is_int

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MASK = 2**64 - 1


def _mix(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser on uint64 arrays (wrapping arithmetic)."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def key_int(value: Any, name: str) -> int:
    """A seed, epoch or stream as the hash takes it: an int (:func:`gpupipe._args.as_int`: never a
    float, bool or text that would key the draws of another value silently) modulo 2**64."""
    return as_int(name, value) & _MASK


def key_indices(indices: Any) -> np.ndarray:
    """Sample indices as int64: integers only (a float index would be truncated to another sample's),
    any int taken modulo 2**64 as seeds are (the hash reads the int64's bits: -1 is 2**64 - 1)."""
    if isinstance(indices, torch.Tensor):
        indices = indices.cpu()
    elif not isinstance(indices, np.ndarray):
        indices = list(indices)  # any iterable: a range, a generator
    arr = np.asarray(indices)
    if arr.size and arr.dtype.kind not in "iu":
        # Python ints numpy holds in no integer dtype: [-1, 2**63] becomes float64, 2**64 object
        values = indices if isinstance(indices, list) else arr.tolist() if arr.dtype == object else None
        if values is None or not all(is_int(v) for v in values):
            raise TypeError(f"indices must be integers, got {arr.dtype}")
        arr = np.array([int(v) % 2**64 for v in values], dtype=np.uint64)
    return arr.astype(np.int64, copy=False)


def uniforms(seed: int, epoch: int, indices: Any, count: int, *, stream: int = 0) -> np.ndarray:
    """float64 ``[N, count]`` uniform draws in [0, 1), a pure function of (seed, epoch, index, stream).

    Args:
        seed, epoch: integers (any sign; taken modulo 2**64).
        indices: ``N`` sample indices (the dataset index of each sample): integers (:func:`key_indices`).
        count: draws per sample; draw ``k`` of a sample does not depend on ``count``.
        stream: an independent sequence per consumer (0, modulo 2**64: the crop samplers).
    """
    idx = key_indices(indices).reshape(-1)
    # The hash in native code (csrc/common/keyed_uniforms.h): a batch's draws in microseconds, where
    # the same as numpy passes cost ~0.1 ms. Its definition in numpy: tests/test_keyed.py.
    return _C.keyed_uniforms(key_int(seed, "seed"), key_int(epoch, "epoch"), key_int(stream, "stream"), idx,
                             int(count))


def normals(keys: np.ndarray, counters: np.ndarray) -> np.ndarray:
    """float64 standard normal values, one per (key, counter) pair of the uint64 arrays (same
    shape): Box-Muller on two 53-bit uniforms of the same SplitMix64 hash as :func:`uniforms`, so
    a value is a pure function of its key and counter."""
    with np.errstate(over="ignore"):
        k = _mix(keys.astype(np.uint64) + _GOLDEN)
        c = counters.astype(np.uint64)
        u = [(_mix(k ^ _mix(2 * c + np.uint64(j) + _GOLDEN)) >> np.uint64(11)).astype(np.float64) * (1.0 / 2**53)
             for j in (1, 2)]
    return np.sqrt(-2.0 * np.log1p(-u[0])) * np.cos(2.0 * np.pi * u[1])


def stream_of(name: str) -> int:
    """A stable stream number for a consumer's name (the same in every process and version)."""
    return zlib.crc32(name.encode()) + 1  # never 0, the crop samplers' stream


def derive_seed(seed: int, *keys: int) -> int:
    """A seed for a sub-consumer (e.g. the k-th module of a chain), a pure function of its inputs."""
    with np.errstate(over="ignore"):
        h = _mix(np.array([int(seed) & _MASK], dtype=np.uint64) + _GOLDEN)
        for k in keys:
            h = _mix(h ^ (np.array([int(k) & _MASK], dtype=np.uint64) + _GOLDEN))
    return int(h[0])


class Keyed(abc.ABC):
    """The keyed protocol as a type: ``isinstance(module, Keyed)``.

    A keyed module draws its parameters with ``sample_params(n, *, seed=None, epoch=None,
    indices=None)`` (a pure function of (seed, epoch, sample index) when ``seed`` is given) and
    replays them with ``module(..., params=p)``. A class is Keyed when its ``sample_params``
    accepts ``seed`` (looked up once per class: gpupipe's modules and those of another library or
    of the user alike), so a module of the first protocol, ``sample_params(n)`` alone, is not.
    :func:`takes_keys` also sees a wrapper that forwards ``sample_params`` per instance (the
    ``OptimizedModule`` of ``torch.compile(module)``).
    """

    @classmethod
    def __subclasshook__(cls, other: type) -> Any:
        if cls is Keyed and _sample_params_takes_seed(other):
            return True
        return NotImplemented


def _sample_params_takes_seed(owner: Any) -> bool:
    fn = getattr(owner, "sample_params", None)
    if fn is None:
        return False
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    # seed by name, or **kwargs that forward it (a subclass's sample_params(self, n, **kw) calling super)
    return "seed" in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def takes_keys(module: Any) -> bool:
    """True when ``module`` follows the keyed protocol: ``isinstance(module, Keyed)``, or a wrapper
    whose instance forwards a keyed ``sample_params`` (``torch.compile(module)``)."""
    return isinstance(module, Keyed) or (module is not None and _sample_params_takes_seed(module))


# what decides how a module draws and applies its parameters: a subclass that overrides one of them
# has to declare samples_independent again to be vouched for
_PER_SAMPLE_METHODS = ("forward", "sample_params", "_params_from_uniforms", "_transform", "_transform_identity")


def samples_independent(module: Any) -> bool:
    """True when ``module`` declares that it maps each sample on its own (``samples_independent``):
    its output for a batch, given the batch's per-sample parameters (rows of a leading dim ``n``),
    or called in ``eval()`` mode without, equals its outputs for any split of the batch given the
    matching rows, concatenated. The Loader then augments a chunk's batches in one call. Undeclared
    modules (a batch-level draw, MixUp, a user's module) are False: called once per batch. The
    declaration is a class's (or an instance's) and is not inherited by a subclass that overrides
    how parameters are drawn or applied (:data:`_PER_SAMPLE_METHODS`) without declaring it again;
    ``torch.compile(module)`` is the module it compiles."""
    module = getattr(module, "_orig_mod", module)
    if "samples_independent" in getattr(module, "__dict__", {}):  # an instance's own
        return bool(module.samples_independent)
    mro = type(module).__mro__
    declared = next((k for k, c in enumerate(mro) if "samples_independent" in vars(c)), None)
    if declared is None or any(m in vars(c) for c in mro[:declared] for m in _PER_SAMPLE_METHODS):
        return False
    return bool(module.samples_independent)


def child_params(child: Any, k: int, n: int, *, seed: Any, epoch: Any, indices: Any) -> Any:
    """Child ``k``'s parameters for a batch of ``n`` inside a container (Compose, RandomChoice):
    keyed with the child seed ``derive_seed(seed, k)`` when there is a seed and the child takes
    keys, drawn from the child's own generator otherwise, None when it has no ``sample_params``."""
    if not hasattr(child, "sample_params"):
        return None
    if seed is not None and takes_keys(child):
        return child.sample_params(n, seed=derive_seed(seed, k), epoch=epoch, indices=indices)
    return child.sample_params(n)


__all__ = ["uniforms", "normals", "stream_of", "derive_seed", "Keyed", "takes_keys", "samples_independent", "child_params"]
