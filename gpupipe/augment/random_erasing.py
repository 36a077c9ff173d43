"""RandomErasing: a random rectangle per sample set to a value, on the (normalised) batch."""

from __future__ import annotations

import math
from typing import Any, Optional, Sequence, Union

import numpy as np
import torch

from gpupipe import _C, keyed
from gpupipe._args import bounded_pair, is_number, probability
from gpupipe._transfer import to_device
from gpupipe.augment import _kernels
from gpupipe.augment._keyed_module import KeyedModule
from gpupipe.augment._keyed_params import GeneratorLike

_TRIES = 10  # torchvision's attempts at a box that fits
# the element types the host kernel writes (int64 images take the torch ops)
_ERASE_KERNEL_TYPES = {t for t in _kernels.ELEM_TYPES if t is not torch.int64}


def _normal_noise(keys: torch.Tensor, sample: torch.Tensor, counter: torch.Tensor) -> torch.Tensor:
    """float32 standard normal values, a pure function of (keys[sample], counter)."""
    key = keys.numpy().astype(np.uint64)[sample.numpy()]
    return torch.from_numpy(keyed.normals(key, counter.numpy()).astype(np.float32))


@torch.library.custom_op("gpupipe::erase_normal_noise", mutates_args=())
def _normal_noise_op(keys: torch.Tensor, sample: torch.Tensor, counter: torch.Tensor) -> torch.Tensor:
    """:func:`_normal_noise` as an op, opaque to torch.compile (which cannot trace numpy's uint64)."""
    return _normal_noise(keys, sample, counter)


@_normal_noise_op.register_fake
def _(keys, sample, counter):
    return sample.new_empty(sample.shape, dtype=torch.float32)


def _fill(values: list, x: torch.Tensor) -> torch.Tensor:
    """The erased elements' values in ``x``'s dtype, as torchvision converts them: a float32 tensor
    (``torch.tensor`` of the floats) cast to ``x``'s dtype."""
    return torch.tensor(values, dtype=torch.float32).to(x.dtype)


def _erase_values(value: Any) -> Optional[list]:
    """The erase value per channel as floats (None: normal noise, ``"random"``); errors naming it."""
    if isinstance(value, str):
        if value != "random":
            raise ValueError(f"value must be a number, a sequence of numbers or 'random', got {value!r}")
        return None
    if is_number(value):
        return [float(value)]
    try:
        values = [float(v) for v in value]
    except (TypeError, ValueError):
        raise TypeError(f"value must be a number, a sequence of numbers or 'random', got {value!r}") from None
    if not values:
        raise ValueError("value must not be empty")
    return values


class RandomErasing(KeyedModule):
    """torchvision's ``RandomErasing``, batched: each sample gets its own box, as torchvision draws it.

    Per sample, as ``torchvision.transforms.v2.RandomErasing``: with probability ``p``, up to 10
    tries of an area ``H * W * uniform(scale)`` and an aspect ratio ``exp(uniform(log(ratio)))``;
    the first box with ``h = round(sqrt(area * ratio)) < H`` and ``w = round(sqrt(area / ratio)) < W``
    is placed uniformly (top in ``[0, H - h]``, left in ``[0, W - w]``) and set to ``value``; when no
    try fits, the sample is left as is. No Python loop over samples: on the CPU one kernel call writes
    every box (only the boxes' elements, after a copy of the batch unless ``inplace``); elsewhere, and
    under ``torch.compile``, one select over the batch with a mask built from the boxes.

    Args:
        p: probability of erasing a sample.
        scale: (min, max) fraction of the image area to erase, within [0, 1].
        ratio: (min, max) aspect ratio (height / width) of the box, positive.
        value: the erased pixels' value: a number, one number per channel, or ``"random"``
            (standard normal noise per pixel, float batches only: a pure function of the sample's
            keyed draws, so replays and keyed runs reproduce it).
        inplace: write into the input instead of a copy.
        generator: ``torch.Generator`` or int seed for the unkeyed draws.

    Shapes:
        input: ``[N, C, H, W]`` of any dtype (``"random"``: floating), on any device; typically the
        normalised float batch. Output: the same shape, dtype and device.

    Parameters (``sample_params``, ``last_params``; uniforms, turned into boxes for the image size
    at ``forward``, see :meth:`boxes`): ``erase`` bool ``[N]``, ``area``, ``log_ratio``, ``top``,
    ``left`` float64 ``[N, 10]`` (one column per try), ``noise_key`` int64 ``[N]``. Keyed stream:
    ``keyed.stream_of("RandomErasing")``.

    Example:
        >>> import torch
        >>> from gpupipe.augment import RandomErasing
        >>> erase = RandomErasing(p=1.0, value=0)
        >>> x = torch.ones(4, 3, 32, 40)
        >>> y = erase(x, params=erase.sample_params(4, seed=0, epoch=0, indices=[7, 8, 9, 10]))
        >>> bool((y == 0).any()), y.shape
        (True, torch.Size([4, 3, 32, 40]))
        >>> apply, boxes = erase.boxes(erase.last_params, 32, 40)  # (top, left, height, width)
        >>> boxes.shape
        torch.Size([4, 4])
    """

    _stream_name = "RandomErasing"
    samples_independent = True  #: a box (and noise) per sample, from its own row (gpupipe.keyed)
    _draws = 2 + 4 * _TRIES

    def __init__(self, p: float = 0.5, scale: Sequence[float] = (0.02, 0.33), ratio: Sequence[float] = (0.3, 3.3),
                 value: Union[float, str, Sequence[float]] = 0.0, inplace: bool = False,
                 generator: GeneratorLike = None):
        super().__init__()
        self.p = probability(p, "p")
        self.scale = bounded_pair(scale, "scale", 0.0, 1.0)
        self.ratio = bounded_pair(ratio, "ratio", 0.0, math.inf)
        if self.ratio[0] <= 0:
            raise ValueError(f"ratio must be positive, got {ratio!r}")
        self.value = value
        self.inplace = bool(inplace)
        self._set_generator(generator)

    @property
    def value(self) -> Any:
        return self._value

    @value.setter
    def value(self, value: Any) -> None:  # (parsed whenever set: a later `erase.value = 5` erases with 5)
        self._values = _erase_values(value)
        self._value = value

    def _params_from_uniforms(self, u: torch.Tensor) -> dict:
        tries = u[:, 2:].reshape(-1, _TRIES, 4)
        s0, s1 = self.scale
        l0, l1 = math.log(self.ratio[0]), math.log(self.ratio[1])
        return {"erase": u[:, 0] < self.p, "area": s0 + (s1 - s0) * tries[..., 0],
                "log_ratio": l0 + (l1 - l0) * tries[..., 1], "top": tries[..., 2], "left": tries[..., 3],
                "noise_key": (u[:, 1] * 2**53).to(torch.int64)}

    _SHAPES = {"erase": (), "area": (_TRIES,), "log_ratio": (_TRIES,), "top": (_TRIES,), "left": (_TRIES,),
               "noise_key": ()}
    _DTYPES = {"erase": torch.bool, "area": torch.float64, "log_ratio": torch.float64, "top": torch.float64,
               "left": torch.float64, "noise_key": torch.int64}

    def _param_spec(self) -> tuple[dict, dict]:
        return self._SHAPES, self._DTYPES

    def _checked_params(self, params: Any, n: int) -> dict:
        params = super()._checked_params(params, n)
        if not torch.compiler.is_compiling():  # values no draw gives: a box outside the image, or none at all
            for k in ("area", "top", "left"):
                outside = ~((params[k] >= 0) & (params[k] <= 1))
                if bool(outside.any()):
                    raise ValueError(f"params[{k!r}] must be uniforms within [0, 1], got {params[k][outside][0]}")
            if not bool(torch.isfinite(params["log_ratio"]).all()):
                raise ValueError("params['log_ratio'] must be finite")
        return params

    @staticmethod
    def boxes(params: dict, height: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(erased, boxes)`` for images of ``height x width``: bool ``[N]`` (the sample is erased: it
        was drawn and a try fitted) and int64 ``[N, 4]`` ``(top, left, h, w)`` as torchvision's
        ``make_params`` computes them (zeros where not erased)."""
        area = height * width * params["area"]
        aspect = torch.exp(params["log_ratio"])
        h = torch.round(torch.sqrt(area * aspect)).to(torch.int64)  # round half to even, as Python's round
        w = torch.round(torch.sqrt(area / aspect)).to(torch.int64)
        fits = (h < height) & (w < width)
        first = torch.argmax(fits.to(torch.uint8), dim=1, keepdim=True)  # the first try that fits
        found = fits.gather(1, first)[:, 0]
        h, w = h.gather(1, first)[:, 0], w.gather(1, first)[:, 0]
        top = torch.clamp((params["top"].gather(1, first)[:, 0] * (height - h + 1)).to(torch.int64), max=height - h)
        left = torch.clamp((params["left"].gather(1, first)[:, 0] * (width - w + 1)).to(torch.int64), max=width - w)
        erased = params["erase"] & found
        box = torch.stack([top, left, h, w], dim=1)
        return erased, torch.where(erased[:, None], box, 0)

    def forward(self, x: torch.Tensor, params: Optional[dict] = None) -> torch.Tensor:
        """Erases a box per drawn sample: ``[N, C, H, W]`` -> ``[N, C, H, W]``, same dtype and device.

        ``params=None`` draws in ``train()`` mode and erases nothing in ``eval()`` mode; ``params=p``
        replays exactly.
        """
        return self._forward((x,), params)

    def _check_inputs(self, x: Any) -> int:
        if not isinstance(x, torch.Tensor) or x.dim() != 4:
            raise ValueError(f"x must be an [N, C, H, W] tensor, got {getattr(x, 'shape', type(x).__name__)}")
        c = x.shape[1]
        if self._values is not None and len(self._values) not in (1, c):
            raise ValueError(f"value has {len(self._values)} entries; images have {c} channels (give 1 or {c})")
        if self._values is None and not x.is_floating_point():
            raise TypeError(f"value='random' (normal noise) needs floating-point images, got {x.dtype}")
        return x.shape[0]

    def _transform(self, x: torch.Tensor, params: dict) -> torch.Tensor:
        n, c, height, width = x.shape
        erased, box = self.boxes(params, height, width)  # box: zeros where not erased
        values = None if self._values is None else self._values * (c // len(self._values))
        if self.inplace and _kernels.may_self_overlap(x):  # (index_put_ would only warn, and write each box to all)
            raise RuntimeError("RandomErasing(inplace=True): more than one element of x refers to a single memory "
                               "location (an expanded batch?); clone() it first, or erase out of place")
        if values is not None and x.device.type == "cpu" and x.dtype in _ERASE_KERNEL_TYPES and \
                not torch.compiler.is_compiling() and _kernels.untracked(x):
            # the boxes' elements only (after a copy of x unless inplace), as torchvision writes a slice
            out = x if self.inplace else x.clone()
            fill = _fill(values, x)
            box = box.contiguous()  # (held while the kernel reads it: a buffer is an address only)
            _C.erase_boxes(_kernels.buffer(out), _kernels.buffer(box), _kernels.buffer(fill), _kernels.num_threads())
            if self.inplace:  # as torch's in-place ops: autograd then refuses a graph that saved x
                torch.autograd.graph.increment_version(out)
            return out
        # [N, 1, H, W], broadcast over channels: rows and columns inside each sample's box
        top, left, h, w = (v[:, None, None, None] for v in box.unbind(1))
        rows = torch.arange(height)[None, None, :, None]
        cols = torch.arange(width)[None, None, None, :]
        mask = erased[:, None, None, None] & (rows >= top) & (rows < top + h) & (cols >= left) & (cols < left + w)
        if self._values is None:
            out = x if self.inplace else x.clone()
            sample, ch, yy, xx = mask.expand(n, c, height, width).nonzero(as_tuple=True)
            # torchvision fills the box from a [C, h, w] normal tensor: count positions in that order
            counter = (ch * box[sample, 2] + (yy - box[sample, 0])) * box[sample, 3] + (xx - box[sample, 1])
            noise = (_normal_noise_op if torch.compiler.is_compiling() else _normal_noise)(params["noise_key"], sample,
                                                                                           counter)
            out[tuple(to_device(t, x.device) for t in (sample, ch, yy, xx))] = to_device(noise.to(x.dtype), x.device)
            return out
        # other devices, and under torch.compile: a select over the batch from the mask
        fill = to_device(_fill(values, x), x.device)
        out = torch.where(to_device(mask, x.device), fill[None, :, None, None], x)
        return x.copy_(out) if self.inplace else out

    def extra_repr(self) -> str:
        return f"p={self.p}, scale={self.scale}, ratio={self.ratio}, value={self.value!r}, inplace={self.inplace}"
