"""Argument validators shared by the crop samplers and the augmentation modules.

Each returns the checked value in its canonical form or raises a ``ValueError`` (``TypeError``
where noted) naming the argument. Where two callers accept different inputs for the same kind of
argument (sizes, ranges, fills), the rules stay distinct, each under a name that says which inputs
it accepts, and the docstrings say how they differ.
"""

from __future__ import annotations

import math
from typing import Any, Optional, Sequence, Union

import numpy as np
import torch

from gpupipe import _C

INTERPOLATIONS = dict(_C.INTERPOLATIONS)  # the warps' sampling modes: name -> the kernels' code (defined in C++)

Size = Union[int, Sequence[int]]


# --- devices ---------------------------------------------------------------------------------------


def concrete_device(device: torch.device) -> torch.device:
    """``cuda`` without an index as the calling thread's current device, fixed now. The current
    device is per thread and a new thread starts on device 0: a Loader of a rank that called
    ``torch.cuda.set_device(k)`` would otherwise allocate, decode and pin memory on device 0 in its
    stage threads (and make a CUDA context there), while its labels went to device k."""
    if device.type == "cuda" and device.index is None and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return device


# --- predicates ------------------------------------------------------------------------------------


def is_int(value: Any) -> bool:
    """An int, a numpy integer or a 0-d integer array or tensor (what ``operator.index`` takes, as a
    sampler's tensor of indices yields them), not a bool."""
    if isinstance(value, (int, np.integer)):
        return not isinstance(value, bool)
    return _scalar_kind(value) in ("i", "u")


def as_int(name: str, value: Any) -> int:
    """``value`` as an int (:func:`is_int`): ``2.5`` or ``True`` is a TypeError naming ``name``, not 2 or 1."""
    if not is_int(value):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    return int(value)


def _scalar_kind(value: Any) -> Optional[str]:
    """The numpy kind letter of a 0-d array or tensor ("i", "u", "f", "b", ...), else None."""
    if isinstance(value, np.ndarray):
        return value.dtype.kind if value.ndim == 0 else None
    if isinstance(value, torch.Tensor) and value.dim() == 0:
        if value.dtype == torch.bool:
            return "b"
        return "f" if value.is_floating_point() else "c" if value.is_complex() else "u" if value.dtype == torch.uint8 else "i"
    return None


def is_python_int(value: Any) -> bool:
    """A Python int (not a bool, not a numpy integer)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """An int, a float, a numpy number or a 0-d real array or tensor (not a bool)."""
    if isinstance(value, (int, float, np.integer, np.floating)):
        return not isinstance(value, bool)
    return _scalar_kind(value) in ("i", "u", "f")


def flag(value: Any, name: str) -> bool:
    """A yes/no argument: a bool (numpy's too). Anything else is a TypeError naming it: ``None``, 2
    or ``"no"`` were taken as their truth value (``"no"`` as True)."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise TypeError(f"{name} must be True or False, got {value!r}")


# --- numbers ---------------------------------------------------------------------------------------


def finite_number(value: Any, name: str) -> float:
    """A finite :func:`is_number` as a float."""
    if not is_number(value):
        raise ValueError(f"{name} must be a number, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return float(value)


def finite_numbers(value: Any, name: str, counts: Sequence[int]) -> tuple:
    """A sequence (numpy array, tensor) of finite numbers of one of the lengths ``counts``, as floats."""
    if isinstance(value, (str, bytes)) or not isinstance(value, (Sequence, np.ndarray, torch.Tensor)):
        raise ValueError(f"{name} must be a sequence of {' or '.join(map(str, counts))} numbers, got {value!r}")
    values = list(value.tolist() if isinstance(value, (np.ndarray, torch.Tensor)) else value)
    if len(values) not in counts:
        raise ValueError(f"{name} must have {' or '.join(map(str, counts))} entries, got {value!r}")
    return tuple(finite_number(v, name) for v in values)


def probability(p: Any, name: str) -> float:
    """A number in [0, 1] (:func:`is_number`: numpy's too, not a bool)."""
    if not is_number(p) or not 0.0 <= p <= 1.0:
        raise ValueError(f"{name} must be a probability in [0, 1], got {p!r}")
    return float(p)


# --- (min, max) pairs ------------------------------------------------------------------------------


def positive_pair(value: Any, name: str) -> tuple[float, float]:
    """A (min, max) Sequence of two finite :func:`is_number` values with ``0 < min <= max``
    (the crop samplers' ``scale`` and ``ratio``; numpy arrays and tensors refused)."""
    if not isinstance(value, Sequence) or len(value) != 2 or not all(is_number(v) for v in value):
        raise ValueError(f"{name} must be a (min, max) pair of numbers, got {value!r}")
    lo, hi = float(value[0]), float(value[1])
    if not (math.isfinite(lo) and math.isfinite(hi) and 0 < lo <= hi):
        raise ValueError(f"{name} must be finite, positive and (min, max), got {value!r}")
    return lo, hi


def bounded_pair(value: Any, name: str, low: float, high: float) -> tuple[float, float]:
    """A (min, max) of any two values ``float()`` converts (numeric strings too, as before) with
    ``low <= min <= max <= high`` (RandomErasing's ``scale`` and ``ratio``)."""
    try:
        lo, hi = (float(v) for v in value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a (min, max) pair of numbers, got {value!r}") from None
    if not low <= lo <= hi <= high:
        raise ValueError(f"{name} must satisfy {low} <= min <= max <= {high}, got {value!r}")
    return lo, hi


# --- sizes, sampling, fill -------------------------------------------------------------------------


def _integer_vector(value: Any) -> bool:
    """A 1-D integer numpy array or torch tensor (taken as the sequence of its values)."""
    if isinstance(value, np.ndarray):
        return value.ndim == 1 and value.dtype.kind in "iu"
    if isinstance(value, torch.Tensor):
        return value.dim() == 1 and not value.dtype.is_floating_point and value.dtype != torch.bool
    return False


def size_pair(size: Size, name: str = "size") -> tuple[int, int]:
    """(height, width) from a positive :func:`is_int` (a square) or two of them (a Sequence, a 1-D
    integer array or tensor); floats refused (the crop samplers' sizes and the decode ops' ``size``)."""
    pair = (size, size) if is_int(size) else size
    if _integer_vector(pair):
        pair = pair.tolist()
    if not isinstance(pair, Sequence) or len(pair) != 2 or not all(is_int(v) and v >= 1 for v in pair):
        raise ValueError(f"{name} must be a positive int or (height, width) of positive ints, got {size!r}")
    return int(pair[0]), int(pair[1])


_PILLOW_CODES = {0: "nearest", 2: "bilinear"}  # Image.Resampling's codes, which torchvision also takes


def interpolation_mode(value: Any) -> Optional[str]:
    """The key of :data:`INTERPOLATIONS` a string, a torchvision ``InterpolationMode`` or a Pillow
    integer code (0 nearest, 2 bilinear, as torchvision takes them) names, None for any other value
    (the caller raises, naming what it accepts)."""
    if is_int(value):  # (Image.Resampling's members are ints)
        return _PILLOW_CODES.get(int(value))
    value = getattr(value, "value", value)
    return value if isinstance(value, str) and value in INTERPOLATIONS else None  # (a list is unhashable)


def parse_interpolation(interpolation: Any) -> str:
    """"nearest" or "bilinear" from a string, a torchvision ``InterpolationMode`` or a Pillow code;
    ValueError otherwise."""
    value = interpolation_mode(interpolation)
    if value is None:
        raise ValueError(f"interpolation must be 'nearest' or 'bilinear' (or the InterpolationMode or Pillow code "
                         f"of one), got {interpolation!r}")
    return value


def warp_fill(fill: Any) -> Optional[list]:
    """``warp_affine``'s and BatchAugment's fill: None, an int or float (numpy's too, a bool too) for
    all channels, or exactly 3 values ``float()`` converts (numpy numbers, numeric strings), within
    [0, 255], as 3 floats. Unlike :func:`policy_fill`: a 1-entry sequence is refused, and the
    entries of a sequence need only convert."""
    if fill is None:
        return None
    try:
        one = isinstance(fill, (int, float, np.integer, np.floating))
        values = [float(fill)] * 3 if one else [float(v) for v in fill]
    except (TypeError, ValueError):
        values = []
    if len(values) != 3 or isinstance(fill, (str, bytes)):
        raise ValueError(f"fill must be a number or 3 numbers (one per channel), got {fill}")
    if not all(0.0 <= v <= 255.0 for v in values):
        raise ValueError(f"fill must be within [0, 255] (the uint8 scale), got {fill}")
    return values


def policy_fill(fill: Union[None, float, Sequence[float]]) -> Optional[list]:
    """The policies' fill, as torchvision's: None, an :func:`is_number` or a sequence of 1 or 3 of
    them, within [0, 255], as 3 floats (None stays None). Unlike :func:`warp_fill`, a 1-entry
    sequence is accepted, and bools and numeric strings are refused. (torchvision's check takes a
    numpy scalar as a number; only its conversion then fails, iterating it.)"""
    if fill is None:
        return None
    try:  # (a bool is not a number here, as everywhere in gpupipe's arguments)
        values = [fill] if is_number(fill) else list(fill)
    except TypeError:
        values = []
    if len(values) not in (1, 3) or not all(is_number(v) for v in values):
        raise ValueError(f"fill must be None, a number or a sequence of 1 or 3 numbers, got {fill!r}")
    if not all(0 <= v <= 255 for v in values):
        raise ValueError(f"fill must lie in [0, 255] for uint8 images, got {fill!r}")
    return [float(v) for v in values] * (3 // len(values))
