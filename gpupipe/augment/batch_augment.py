"""BatchAugment: the per-sample torchvision chain (rotation / affine, flips, ColorJitter, grayscale,
ToTensor, Normalize) as one batched ``nn.Module``, run by a one-pass engine on the input's device."""

from __future__ import annotations

import collections
import contextlib
import operator
from typing import Any, Callable, Optional, Sequence, Union

import numpy as np
import torch

from gpupipe import _C, keyed
from gpupipe._args import (INTERPOLATIONS, finite_number, finite_numbers, is_number, parse_interpolation, probability,
                           warp_fill)
from gpupipe.augment import _kernels, fused
from gpupipe.augment._keyed_module import KeyedModule, like_input
from gpupipe.augment._keyed_params import check_count
from gpupipe.augment.affine_matrix import affine_matrices
from gpupipe.augment.color_linear import linear_color_params

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

Range = Union[float, Sequence[float]]
PARAM_KEYS = ("hflip", "vflip", "angle", "translate", "scale", "shear", "brightness", "contrast", "saturation", "hue",
              "order", "grayscale")
# Columns of the per-sample uniform draws (keyed or from the generator), defined with the native
# mapping (csrc/augment/augment_params.h); new draws go at the end so that existing ones keep their values.
_DRAW = dict(_C.AUGMENT_DRAW_COLUMNS)
DRAWS = _C.AUGMENT_DRAWS
# linear_color_params' columns, in order: where _pack_linear puts them (fused.PARAM_LAYOUT)
_LINEAR_COLUMNS = ("linear_a", "linear_t", "linear_u", "linear_mean")
STREAM = keyed.stream_of("BatchAugment")  # BatchAugment.stream
_KERNEL_PATHS = {"cpu": "cpu-kernel", "cuda": "cuda-kernel"}  # BatchAugment.last_path by device


def _factor_range(value: Range, name: str) -> tuple[float, float]:
    """torchvision's ColorJitter convention: a float v means [max(0, 1 - v), 1 + v]."""
    if is_number(value):
        v = finite_number(value, name)
        if v < 0:
            raise ValueError(f"{name} must be non-negative, got {value}")
        return (max(0.0, 1.0 - v), 1.0 + v)
    lo, hi = finite_numbers(value, name, (2,))
    if not 0 <= lo <= hi:
        raise ValueError(f"{name} range must satisfy 0 <= min <= max, got {value}")
    return (lo, hi)


def _symmetric_range(value: Range, name: str, bound: Optional[float] = None) -> tuple[float, float]:
    if is_number(value):
        v = finite_number(value, name)
        if v < 0:
            raise ValueError(f"{name} must be non-negative, got {value}")
        lo, hi = -v, v
    else:
        lo, hi = finite_numbers(value, name, (2,))
    if lo > hi:
        raise ValueError(f"{name} must be a (min, max) range with min <= max, got {value}")
    if bound is not None and (lo < -bound or hi > bound):
        raise ValueError(f"{name} must be within [-{bound}, {bound}], got {value}")
    return (lo, hi)


def _translate_range(value) -> tuple[float, float]:
    if value is None:
        return (0.0, 0.0)
    a, b = finite_numbers(value, "translate", (2,))
    if not (0.0 <= a <= 1.0 and 0.0 <= b <= 1.0):
        raise ValueError(f"translate must be two fractions in [0, 1] (RandomAffine's), got {value}")
    return (a, b)


def _scale_range(value) -> tuple[float, float]:
    if value is None:
        return (1.0, 1.0)
    lo, hi = finite_numbers(value, "scale", (2,))
    if not 0 < lo <= hi:
        raise ValueError(f"scale must be a (min, max) range with 0 < min <= max, got {value}")
    return (lo, hi)


def _one_of(name: str, allowed) -> Callable[[Any], Any]:
    def check(value):
        if value not in allowed:
            raise ValueError(f"{name} must be one of {list(allowed)}, got {value!r}")
        return value
    return check


_MEMORY_FORMATS = _one_of("out_memory_format", (torch.contiguous_format, torch.channels_last))


def _per_channel(value, name: str) -> tuple:
    """The floats given: 3 numbers, or 1 for every channel (torchvision's Normalize broadcasts it)."""
    return tuple(float(v) for v in finite_numbers(value, name, (1, 3)))


def _std(value) -> tuple:
    std = _per_channel(value, "std")
    if 0.0 in std:  # (a negative one is taken, as torchvision's Normalize takes it)
        raise ValueError(f"std must not be 0 (a division by zero), got {std}")
    return std


def _setting(name: str, check: Callable[[Any], Any]) -> property:
    """An attribute checked and normalised as the constructor does, whenever it is set: a schedule
    (or a user) setting it later gets the constructor's errors, never a value the engine ignores or
    cannot take. Stored as ``_name``: reads are plain attribute reads."""
    slot = "_" + name

    def get_value(self):  # (a function: dynamo traces it, not an attrgetter)
        return getattr(self, slot)

    def set_value(self, value):
        setattr(self, slot, check(value))

    return property(get_value, set_value, doc=f"{name}, checked when set")


def _per_channel_setting(name: str, check: Callable[[Any], tuple]) -> property:
    """mean / std: set as 1 or 3 values (kept as given), read as 3. How many were given decides
    the channels of a 1-channel image's output (:meth:`BatchAugment.out_channels`)."""
    slot = "_" + name

    def get_value(self):
        values = getattr(self, slot)
        return values * (3 // len(values))

    def set_value(self, value):
        setattr(self, slot, check(value))

    return property(get_value, set_value, doc=f"{name}, 3 values (1 given: for every channel)")


def _shear_ranges(value) -> tuple[float, float, float, float]:
    """RandomAffine's shear: s -> x in [-s, s]; (a, b) -> x in [a, b]; (a, b, c, d) -> x, y."""
    if value is None:
        return (0.0, 0.0, 0.0, 0.0)
    if is_number(value):
        lo, hi = _symmetric_range(value, "shear")
        r = (lo, hi, 0.0, 0.0)
    else:
        r = finite_numbers(value, "shear", (2, 4))
        r = r if len(r) == 4 else r + (0.0, 0.0)  # (a, b): x only
    if r[0] > r[1] or r[2] > r[3] or max(abs(v) for v in r) >= 90:
        raise ValueError(f"shear ranges must be (min, max) within (-90, 90) degrees, got {value}")
    return r


@torch.library.custom_op("gpupipe::augment_pack_params", mutates_args=())
def _pack_op(params: list[torch.Tensor], height: int, width: int) -> torch.Tensor:
    return _pack(params, height, width)


@_pack_op.register_fake
def _(params, height, width):
    return params[2].new_empty((params[2].shape[0], fused.PARAM_COUNT), dtype=torch.float32, device="cpu")


def _pack(params: list, height: int, width: int) -> torch.Tensor:
    """The engine's rows from parameters in :data:`PARAM_KEYS` order, their values checked, in native
    code (csrc/augment/augment_params.h): a few microseconds for 256 samples."""
    return torch.from_numpy(_C.pack_augment_params(*_as_numpy(params), height, width))


_VERSION, _DTYPE = operator.attrgetter("_version"), operator.attrgetter("dtype")
_DRAWN_DTYPES = [torch.bool, torch.bool, *[torch.float64] * 8, torch.int64, torch.bool]  # PARAM_KEYS


class DrawnParams(dict):
    """:meth:`BatchAugment.sample_params`' dict in eager mode: each tensor a view of one of three
    native blocks (floats, flags, order), which the packing reads in one call while the dict holds
    those very tensors, untouched. A tensor changed in place (its values, or its shape, strides or
    storage: any in-place op counts, as torch's version counter does) or replaced takes the
    general path, which checks every key's shape, dtype and values; copies are plain dicts (or
    OrderedDicts: pickle, deepcopy)."""

    __slots__ = ("blocks", "tensors", "pointers")

    def __init__(self, arrays: tuple):
        # (not inference tensors, which have no version counter to check)
        with torch.inference_mode(False) if torch.is_inference_mode_enabled() else contextlib.nullcontext():
            tensors = tuple(map(torch.from_numpy, arrays))
        super().__init__(zip(PARAM_KEYS, tensors))
        self.blocks = (arrays[2].base, arrays[0].base, arrays[10])  # (see _C.augment_params_from_uniforms)
        self.tensors = tensors
        self.pointers = list(map(torch.Tensor.data_ptr, tensors))  # (``.data =`` keeps the version)

    def intact_blocks(self) -> Optional[tuple]:
        """The blocks, when every key still holds its drawn tensor as drawn (no in-place op: each
        version still torch.from_numpy's 0; its memory and dtype); else None."""
        ts = self.tensors
        if (all(map(operator.is_, map(self.get, PARAM_KEYS), ts)) and not any(map(_VERSION, ts))
                and list(map(torch.Tensor.data_ptr, ts)) == self.pointers and list(map(_DTYPE, ts)) == _DRAWN_DTYPES):
            return self.blocks
        return None

    def __reduce__(self):  # copies (pickle, deepcopy) are OrderedDicts (torch.load(weights_only=True) takes
        return (collections.OrderedDict, (list(self.items()),))  # them, not dict): their tensors are not views of blocks


def _drawn_blocks(params) -> Optional[tuple]:
    return params.intact_blocks() if type(params) is DrawnParams else None


def _as_numpy(params) -> list:
    """numpy views of parameter tensors, floating ones as float64 (numpy has no bfloat16); the
    usual case (CPU tensors as sample_params makes them) with one torch call per tensor (the
    native packing converts float32 and float16 rows to float64 exactly, as ``.to`` would)."""
    try:
        return [v.numpy() for v in params]
    except (RuntimeError, TypeError):  # a tensor that needs grad, on a device, or bfloat16
        pass
    out = []
    for v in params:
        if v.requires_grad:
            v = v.detach()
        if v.device.type != "cpu":
            v = v.cpu()
        if v.is_floating_point() and v.dtype != torch.float64:
            v = v.to(torch.float64)
        out.append(v.numpy())
    return out


class BatchAugment(KeyedModule):
    """Batched, per-sample augmentation and normalisation, as one module on the input's device.

    The chain, per sample, in this order (torchvision's definitions; ``docs/semantics.md``):
    rotation / affine (``F.affine(img, -angle, translate, scale, shear)``: ``F.rotate(img, angle)``
    without the rest), horizontal flip, vertical flip, the color ops in the sample's random order
    (ColorJitter's), grayscale, normalise. ``engine="fused"`` runs it in one pass per output pixel
    (a CUDA kernel on CUDA, its host build on the CPU); with ``color="torchvision"`` (default) it
    matches ``torchvision.transforms.v2.functional`` applied per sample with the same parameters to
    0.5/255 in mean (tested on real photos).

    Args:
        hflip, vflip: probability of a horizontal / vertical flip per sample.
        rotation: degrees ``d`` (uniform in [-d, d]) or a (min, max) range, counter-clockwise
            (RandomRotation's ``degrees``).
        translate: RandomAffine's ``(a, b)``: fractions of the width / height, uniform in [-a, a],
            [-b, b], rounded to whole pixels. None: no translation.
        scale: RandomAffine's ``(min, max)``. None: 1.
        shear: RandomAffine's: ``s`` (x in [-s, s]), ``(a, b)`` (x) or ``(a, b, c, d)`` (x, y), degrees.
        interpolation: ``"nearest"`` (torchvision's default) or ``"bilinear"``.
        fill: value(s) of pixels from outside the image on the uint8 scale (0..255), per channel;
            0 as torchvision's RandomRotation / RandomAffine, None for plain zero padding
            (``F.rotate(..., fill=None)``: the two differ at bilinear edges, as in torchvision).
        brightness, contrast, saturation: ColorJitter ranges (``v`` -> [max(0, 1 - v), 1 + v]).
        hue: turns, ``v`` -> [-v, v], v <= 0.5.
        grayscale: probability of converting a sample to gray (three equal channels).
        mean, std: normalisation per channel on the [0, 1] scale (3 values, or 1 for all, as
            torchvision's ``Normalize`` broadcasts it; read back as 3).
        out_dtype: float32, bfloat16 or float16.
        out_memory_format: ``torch.contiguous_format`` or ``torch.channels_last``.
        color: ``"torchvision"``: torchvision v2's float ops (clamps between ops, HSV hue,
            per-sample op order). ``"linear"``: the chain folded into one 3x4 matrix per sample
            (no clamps between ops, YIQ hue, fixed order; DALI-like, faster on hue-heavy chains;
            :mod:`gpupipe.augment.color_linear`).
        engine: ``"fused"`` (default) or ``"kornia"``: the same chain with Kornia's warp and color
            functions, op by op on float tensors (the slow reference).
        generator: a ``torch.Generator`` (CPU) or an int seed for the draws of ``forward(x)``
            without parameters; :meth:`sample_params` with ``seed=`` ignores it.
        reuse_outputs: on the CPU, hand out again output buffers nothing references any more.

    Shapes:
        input: uint8 ``[N, 3, H, W]``, any memory format (channels-last is gpupipe's decode output),
        CPU or CUDA. Output: ``out_dtype`` ``[N, 3, H, W]`` in ``out_memory_format`` on the same device.
        Grayscale ``[N, 1, H, W]`` inputs are taken as torchvision takes them (saturation, hue and
        grayscale change nothing; ``fill`` one value); the output has 1 channel when ``mean`` and
        ``std`` were given as one value each, else 3 (Normalize's broadcast): :meth:`out_channels`.

    ``train()`` samples new per-sample parameters every call, kept in ``last_params``;
    ``module(x, params=p)`` replays ``p`` exactly (see :meth:`sample_params`); ``eval()`` only
    converts and normalises, so the module can sit in a model's ``forward``, also under
    ``torch.compile(fullgraph=True)``.

    Parameters (``sample_params``, ``last_params``): ``hflip, vflip, grayscale`` bool ``[n]``;
    ``angle`` (degrees, counter-clockwise), ``scale``, ``brightness, contrast, saturation, hue``
    float64 ``[n]``; ``translate`` float64 ``[n, 2]`` (fractions of W and H; the shift is
    ``round(translate * (W, H))`` pixels), ``shear`` float64 ``[n, 2]`` (degrees, x and y);
    ``order`` int64 ``[n, 4]`` (ColorJitter's ``fn_idx``: 0 brightness, 1 contrast, 2 saturation,
    3 hue). Keyed stream: ``keyed.stream_of("BatchAugment")``.

    Example:
        >>> import torch
        >>> from gpupipe.augment import BatchAugment
        >>> aug = BatchAugment(hflip=0.5, rotation=25, interpolation="bilinear", brightness=0.4,
        ...                    contrast=0.4, saturation=0.4, hue=0.1)
        >>> x = torch.randint(0, 256, (8, 3, 32, 32), dtype=torch.uint8)
        >>> p = aug.sample_params(8, seed=0, epoch=3, indices=range(100, 108))
        >>> y = aug(x, params=p)
        >>> y.shape, y.dtype
        (torch.Size([8, 3, 32, 32]), torch.float32)
        >>> torch.equal(aug(x, params=aug.last_params), y)
        True
    """

    _stream_name = "BatchAugment"
    _draws = DRAWS

    def __init__(
        self,
        *,
        hflip: float = 0.5,
        vflip: float = 0.0,
        rotation: Range = 0.0,
        translate: Optional[Sequence[float]] = None,
        scale: Optional[Sequence[float]] = None,
        shear: Union[None, float, Sequence[float]] = None,
        interpolation: str = "nearest",
        fill: Union[None, float, Sequence[float]] = 0,
        brightness: Range = 0.0,
        contrast: Range = 0.0,
        saturation: Range = 0.0,
        hue: Range = 0.0,
        grayscale: float = 0.0,
        mean: Sequence[float] = IMAGENET_MEAN,
        std: Sequence[float] = IMAGENET_STD,
        out_dtype: torch.dtype = torch.float32,
        out_memory_format: torch.memory_format = torch.contiguous_format,
        color: str = "torchvision",
        engine: str = "fused",
        generator: Union[torch.Generator, int, None] = None,
        reuse_outputs: bool = True,
    ):
        super().__init__()
        self.engine = engine  # (each setting checked as it is set: the properties below the class)
        self.color = color
        self.interpolation = interpolation
        self.out_dtype = out_dtype
        self.out_memory_format = out_memory_format
        self.mean = mean
        self.std = std
        self.hflip = hflip
        self.vflip = vflip
        self.grayscale = grayscale
        self.rotation = rotation
        self.translate = translate
        self.scale = scale
        self.shear = shear
        self.fill = fill
        self.brightness = brightness
        self.contrast = contrast
        self.saturation = saturation
        self.hue = hue
        self._set_generator(generator)
        self.reuse_outputs = reuse_outputs
        self._outputs = fused.OutputCache()
        self.last_path: Optional[str] = None  # which implementation ran: "cuda-kernel", "cpu-kernel", "kornia"

    # --- parameters (sample_params: KeyedModule's) ---------------------------------------------------

    @property
    def samples_independent(self) -> bool:
        """The fused engine maps each sample from its own row (:func:`gpupipe.keyed.samples_independent`);
        Kornia's float ops are not vouched for bit for bit across batch sizes."""
        return self.engine == "fused"

    def _params_from_uniforms(self, u: torch.Tensor) -> dict:
        if torch.compiler.is_compiling() or type(u) is not torch.Tensor:
            return self._params_from(u, torch)
        # native in eager mode (a dozen small torch ops cost ~0.1 ms, more than the CUDA kernel's batch;
        # the numpy definition below ~35 us): the same float64 operations, equal bit for bit
        arrays = _C.augment_params_from_uniforms(u.numpy(), self.hflip, self.vflip, self.grayscale, self.rotation,
                                                 self.translate, self.scale, self.shear, self.brightness, self.contrast,
                                                 self.saturation, self.hue)
        return DrawnParams(arrays)

    def _params_from(self, u, xp) -> dict:
        """The parameters from uniforms ``u`` with the array module ``xp`` (numpy or torch): the same
        float64 operations either way, and as the native mapping of eager mode, so eager and compiled
        draws are equal (numpy: the definition the native mapping is tested against)."""
        def between(lo_hi, col):
            lo, hi = lo_hi
            return lo + (hi - lo) * u[:, col]

        d = _DRAW
        translate = (2 * u[:, d["translate"]:d["translate"] + 2] - 1) * xp.asarray(self.translate, dtype=xp.float64)
        shear = xp.stack([between(self.shear[:2], d["shear"]), between(self.shear[2:], d["shear"] + 1)], 1)
        rank = u[:, d["order"]:d["order"] + 4]
        order = (xp.argsort(rank, axis=1, kind="stable") if xp is np  # a uniform permutation
                 else xp.argsort(rank, dim=1, stable=True))
        return {
            "hflip": u[:, d["hflip"]] < self.hflip,
            "vflip": u[:, d["vflip"]] < self.vflip,
            "angle": between(self.rotation, d["angle"]),
            "translate": translate,
            "scale": between(self.scale, d["scale"]),
            "shear": shear,
            "brightness": between(self.brightness, d["brightness"]),
            "contrast": between(self.contrast, d["contrast"]),
            "saturation": between(self.saturation, d["saturation"]),
            "hue": between(self.hue, d["hue"]),
            "order": order,
            "grayscale": u[:, d["grayscale"]] < self.grayscale,
        }

    @staticmethod
    def identity_params(n: int) -> dict:
        """Parameters that change nothing (``eval()``): the chain reduces to convert + normalise.
        Drawn natively as mid-range draws of empty ranges (no flip, zeros, ones, +0.0 shifts, order
        0..3), so they pack as drawn parameters do; under torch.compile, as torch ops."""
        if torch.compiler.is_compiling():
            return BatchAugment._traced_identity_params(n)
        u = np.full((check_count(n), DRAWS), 0.5)
        return DrawnParams(_C.augment_params_from_uniforms(u, 0.0, 0.0, 0.0, (0.0, 0.0), (0.0, 0.0), (1.0, 1.0),
                                                           (0.0, 0.0, 0.0, 0.0), (1.0, 1.0), (1.0, 1.0), (1.0, 1.0),
                                                           (0.0, 0.0)))

    @staticmethod
    def _traced_identity_params(n: int) -> dict:
        false = torch.zeros(n, dtype=torch.bool)
        zero = torch.zeros(n, dtype=torch.float64)
        one = torch.ones(n, dtype=torch.float64)
        return {"hflip": false, "vflip": false, "angle": zero, "translate": torch.zeros(n, 2, dtype=torch.float64),
                "scale": one, "shear": torch.zeros(n, 2, dtype=torch.float64), "brightness": one, "contrast": one,
                "saturation": one, "hue": zero, "order": torch.arange(4).expand(n, 4), "grayscale": false}

    @staticmethod
    def check_params(params: dict, n: int, *, values: bool = True) -> None:
        """Raises ``ValueError`` / ``TypeError`` naming the key for parameters that are not a batch of
        ``n`` valid draws (shapes and dtypes always; values, with ``values``, in eager mode here, and
        in the native packing of ``color="torchvision"`` under torch.compile too)."""
        blocks = None if torch.compiler.is_compiling() else _drawn_blocks(params)
        if blocks is not None and blocks[2].shape[0] == n:  # shapes and dtypes as drawn, for n samples
            if values:
                _C.pack_drawn_augment_params(*blocks, 1, 1)
            return
        if not isinstance(params, dict):
            raise TypeError(f"params must be a dict, got {type(params).__name__}")
        missing = [k for k in PARAM_KEYS if k not in params]
        if missing:
            raise ValueError(f"params lack {missing}")
        for k in PARAM_KEYS:
            v = params[k]
            if not isinstance(v, torch.Tensor):
                raise TypeError(f"params[{k!r}] must be a tensor, got {type(v).__name__}")
            shape = (n, 2) if k in ("translate", "shear") else (n, 4) if k == "order" else (n,)
            if tuple(v.shape) != shape:
                raise ValueError(f"params[{k!r}] must have shape {list(shape)} for a batch of {n}, got {list(v.shape)}")
            if k in ("hflip", "vflip", "grayscale"):
                if v.dtype != torch.bool:
                    raise TypeError(f"params[{k!r}] must be bool, got {v.dtype}")
            elif k == "order":
                if v.dtype != torch.int64:
                    raise TypeError(f"params['order'] must be int64, got {v.dtype}")
            elif not v.is_floating_point():
                raise TypeError(f"params[{k!r}] must be floating point, got {v.dtype}")
        if not values or torch.compiler.is_compiling():
            return
        # every value checked in native code (csrc/augment/augment_params.h), the packed rows of a 1x1 image unused
        _C.pack_augment_params(*_as_numpy(params[k] for k in PARAM_KEYS), 1, 1)

    def _checked_params(self, params: dict, n: int) -> dict:
        # The fused engine's torchvision colour model packs the values in native code right after,
        # checking each before any kernel runs: checking them here too cost a second packing per call.
        self.check_params(params, n, values=self.engine == "kornia" or self.color == "linear")
        return params

    def pack_params(self, params: dict, height: int, width: int) -> torch.Tensor:
        """float32 ``[N, fused.PARAM_COUNT]`` on the CPU: the engine's per-sample rows, each parameter
        in its columns of ``fused.PARAM_LAYOUT`` (``csrc/augment/augment_kernels.h``)."""
        if self.color == "torchvision" and not torch.compiler.is_compiling():
            blocks = _drawn_blocks(params)
            if blocks is not None:  # as drawn: one call over the blocks
                return torch.from_numpy(_C.pack_drawn_augment_params(*blocks, height, width))
        p = [params[k] for k in PARAM_KEYS]
        if self.color == "linear":  # opt-in; its color matrices stay torch ops
            return self._pack_linear({k: v.detach().cpu() for k, v in zip(PARAM_KEYS, p)}, height, width)
        if torch.compiler.is_compiling() or any(type(v) is not torch.Tensor for v in p):
            # the same native code, opaque
            return torch.ops.gpupipe.augment_pack_params([v.detach() for v in p], height, width)
        return _pack(p, height, width)  # (_as_numpy detaches what needs it)

    def _pack_linear(self, p: dict, height: int, width: int) -> torch.Tensor:
        f64 = torch.float64
        n = p["angle"].shape[0]
        shift = torch.round(p["translate"].to(f64) * torch.tensor([width, height], dtype=f64))
        columns = {"matrix": affine_matrices(-p["angle"].to(f64), shift, p["scale"].to(f64), p["shear"].to(f64), None,
                                             p["hflip"], p["vflip"], size=(height, width)).reshape(n, 6)}
        widths = [fused.PARAM_LAYOUT[k][1] for k in _LINEAR_COLUMNS]
        columns.update(zip(_LINEAR_COLUMNS, linear_color_params(p, self.mean, self.std).split(widths, 1)))
        return fused.pack_rows(columns, n)

    # --- forward (KeyedModule's template) ---------------------------------------------------------

    def forward(self, x: torch.Tensor, params: Optional[dict] = None) -> torch.Tensor:
        if type(params) is DrawnParams and self.engine == "fused" and self.color == "torchvision" and \
                not torch.compiler.is_compiling():
            # replayed draws, as drawn (the Loader's call): the forward template's steps, the blocks
            # checked once and packed in one call (the template would check them twice)
            blocks = params.intact_blocks()
            if blocks is not None:
                n = self._check_inputs(x)
                if blocks[2].shape[0] == n and x.shape[1] == 3:
                    self.__dict__["last_params"] = params  # (nn.Module.__setattr__'s checks: a plain value)
                    return like_input(self._run_kernel(x, torch.from_numpy(_C.pack_drawn_augment_params(
                        *blocks, x.shape[2], x.shape[3]))), x)
        return self._forward((x,), params)

    def _check_inputs(self, x: torch.Tensor) -> int:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"x must be a tensor, got {type(x).__name__}")
        if x.dim() != 4 or x.shape[1] not in (1, 3):
            raise ValueError(f"x must be [N, 3, H, W] or [N, 1, H, W] (grayscale) images, got shape {tuple(x.shape)}")
        if x.dtype != torch.uint8:
            raise TypeError(f"x must be uint8 (gpupipe's decode output; convert float images in [0, 1] with "
                            f"(x * 255).round().to(torch.uint8)), got {x.dtype}")
        if x.shape[1] == 1:
            _kernels.check_gray_fill(self.fill)
        return x.shape[0]

    def out_channels(self, channels: int) -> int:
        """The output's channels for an input of ``channels`` (1 or 3): 3, or 1 for a 1-channel input
        normalised with one mean and one std. torchvision's ``Normalize`` broadcasts 3 values over a
        1-channel image to 3 channels, and so does this module."""
        return 1 if channels == 1 and len(self._mean) == 1 and len(self._std) == 1 else 3

    def _transform_identity(self, x: torch.Tensor, params: dict) -> torch.Tensor:
        return self._transform(x, params)  # eval(): conversion and normalisation

    def _transform(self, x: torch.Tensor, params: dict) -> torch.Tensor:
        if x.shape[1] == 1:
            return self._transform_gray(x, params)
        h, w = x.shape[2], x.shape[3]
        if self.engine == "kornia":
            from gpupipe.augment.kornia_engine import kornia_augment

            self.last_path = "kornia"
            return kornia_augment(self, x, params)
        return self._run_kernel(x, self.pack_params(params, h, w))

    def _transform_gray(self, x: torch.Tensor, params: dict) -> torch.Tensor:
        """A 1-channel batch as torchvision treats one: saturation, hue and grayscale leave it as it
        is; contrast blends with its mean (here with the gray level of its channel read three times:
        0.2989 + 0.587 + 0.114 = 0.9999 times it: the blend is off by at most 1e-4 of full scale,
        0.026 of a level, in the worst case of a white image at factor 0); the rest is per
        channel. So the 3-channel chain runs on the channel repeated, with those three ops as
        identities (``last_params`` keeps their draws, as ColorJitter draws them for any image)."""
        three = _kernels.as_three_channels(x)
        params = dict(params, saturation=torch.ones_like(params["saturation"]), hue=torch.zeros_like(params["hue"]),
                      grayscale=torch.zeros_like(params["grayscale"]))
        out = self._transform(three, params)
        return out if self.out_channels(1) == 3 else out[:, :1].clone()

    def _run_kernel(self, x: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
        """The fused engine on ``x`` with its packed rows (host): one copy to x's device, one call."""
        device = x.device
        if device.type == "cuda":
            if not torch.compiler.is_compiling():
                packed = packed.pin_memory()
            packed = packed.to(device, non_blocking=True)  # the one transfer of the batch
        elif device.type != "cpu":
            raise ValueError(f"x must be on a CPU or CUDA device for engine='fused', got {device}")
        out = None
        if device.type == "cpu" and self.reuse_outputs and not torch.compiler.is_compiling():
            out = self._outputs.get(tuple(x.shape), self.out_dtype, self.out_memory_format)
        self.__dict__["last_path"] = _KERNEL_PATHS[device.type]
        return fused.augment_batch(x, packed, interpolation=INTERPOLATIONS[self.interpolation], fill=self.fill,
                                   color=fused.COLOR_MODELS[self.color], mean=self.mean, std=self.std,
                                   out_dtype=self.out_dtype, channels_last=self._channels_last,
                                   out=out)

    # the settings, checked whenever set (a schedule may change them between calls)
    hflip = _setting("hflip", lambda v: probability(v, "hflip"))
    vflip = _setting("vflip", lambda v: probability(v, "vflip"))
    grayscale = _setting("grayscale", lambda v: probability(v, "grayscale"))
    rotation = _setting("rotation", lambda v: _symmetric_range(v, "rotation"))
    translate = _setting("translate", _translate_range)
    scale = _setting("scale", _scale_range)
    shear = _setting("shear", _shear_ranges)
    interpolation = _setting("interpolation", parse_interpolation)
    fill = _setting("fill", warp_fill)
    brightness = _setting("brightness", lambda v: _factor_range(v, "brightness"))
    contrast = _setting("contrast", lambda v: _factor_range(v, "contrast"))
    saturation = _setting("saturation", lambda v: _factor_range(v, "saturation"))
    hue = _setting("hue", lambda v: _symmetric_range(v, "hue", bound=0.5))
    mean = _per_channel_setting("mean", lambda v: _per_channel(v, "mean"))
    std = _per_channel_setting("std", _std)
    out_dtype = _setting("out_dtype", _one_of("out_dtype", fused.OUT_DTYPES))
    color = _setting("color", _one_of("color", fused.COLOR_MODELS))
    engine = _setting("engine", _one_of("engine", ("fused", "kornia")))

    @property
    def out_memory_format(self) -> torch.memory_format:
        return torch.channels_last if self._channels_last else torch.contiguous_format

    @out_memory_format.setter
    def out_memory_format(self, value) -> None:  # (kept as a bool: torch.save's pickle protocol 2 cannot store it)
        self._channels_last = _MEMORY_FORMATS(value) == torch.channels_last

    def extra_repr(self) -> str:
        return (f"engine={self.engine!r}, color={self.color!r}, hflip={self.hflip}, vflip={self.vflip}, "
                f"rotation={self.rotation}, translate={self.translate}, scale={self.scale}, shear={self.shear}, "
                f"interpolation={self.interpolation!r}, fill={self.fill}, brightness={self.brightness}, "
                f"contrast={self.contrast}, saturation={self.saturation}, hue={self.hue}, grayscale={self.grayscale}, "
                f"mean={self._mean}, std={self._std}, out_dtype={self.out_dtype}, "
                f"out_memory_format={self.out_memory_format}")
