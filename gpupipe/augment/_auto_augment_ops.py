"""The op table of torchvision's automatic augmentation policies, and the machinery the policy modules
(:class:`~gpupipe.augment.TrivialAugmentWide`, :class:`~gpupipe.augment.RandAugment`,
:class:`~gpupipe.augment.AutoAugment`) share.

Each op is torchvision.transforms.v2's ``_AutoAugmentBase._apply_image_or_video_transform`` with the
same magnitude: ShearX/Y and TranslateX/Y are ``F.affine`` (shear about the top-left corner, translate
by ``int(magnitude)`` pixels), Rotate is ``F.rotate``; Brightness, Color, Contrast and Sharpness take
``1 + magnitude`` as their factor; Posterize ``int(magnitude)`` bits; Solarize the threshold
``255 * magnitude``. The magnitude spaces below are torchvision's ``_AUGMENTATION_SPACE`` lambdas,
copied (tests/test_policies.py holds them equal to torchvision's).

A batch runs as a few *op slots* (one for TrivialAugmentWide, ``num_ops`` for RandAugment, two for
AutoAugment); in each slot every sample undergoes its own op. All slots go to one kernel call
(:func:`gpupipe.augment._policy_kernels.policy_apply`), which runs each sample's ops in order.
Everything per sample is a tensor: no Python loop over samples.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch

from gpupipe._args import is_python_int, parse_interpolation, policy_fill
from gpupipe._transfer import to_device
from gpupipe.augment import _kernels
from gpupipe.augment._keyed_module import KeyedModule
from gpupipe.augment.affine_matrix import affine_matrices
from gpupipe.augment._policy_kernels import KINDS, policy_apply

MagnitudeFn = Callable[[int, int, int], Optional[torch.Tensor]]

# Every op of the three policies; a module's ops are indices into this tuple.
OP_NAMES = ("Identity", "ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate", "Brightness", "Color", "Contrast",
            "Sharpness", "Posterize", "Solarize", "AutoContrast", "Equalize", "Invert")
_KIND_OF_OP = {"Identity": "identity", "ShearX": "affine", "ShearY": "affine", "TranslateX": "affine",
               "TranslateY": "affine", "Rotate": "affine", "Brightness": "brightness", "Color": "color",
               "Contrast": "contrast", "Sharpness": "sharpness", "Posterize": "posterize", "Solarize": "solarize",
               "AutoContrast": "autocontrast", "Equalize": "equalize", "Invert": "invert"}
_OP_KINDS = torch.tensor([KINDS[_KIND_OF_OP[name]] for name in OP_NAMES], dtype=torch.int64)
_OP = {name: i for i, name in enumerate(OP_NAMES)}
# A 1-channel image, run as three equal channels: torchvision's Color (adjust_saturation) returns it
# unchanged and its Contrast blends with the mean of its own levels.
_GRAY_KINDS = torch.arange(len(KINDS), dtype=torch.int64)
_GRAY_KINDS[KINDS["color"]] = KINDS["identity"]
_GRAY_KINDS[KINDS["contrast"]] = KINDS["contrast_gray"]


def _none(num_bins: int, height: int, width: int) -> None:
    return None


def _linspace(end: float) -> MagnitudeFn:
    return lambda num_bins, height, width: torch.linspace(0.0, end, num_bins)


def _posterize(max_drop: int) -> MagnitudeFn:
    return lambda num_bins, height, width: (8 - (torch.arange(num_bins) / ((num_bins - 1) / max_drop))).round().int()


def _solarize(num_bins: int, height: int, width: int) -> torch.Tensor:
    return torch.linspace(1.0, 0.0, num_bins)


# torchvision.transforms.v2 TrivialAugmentWide._AUGMENTATION_SPACE: name -> (magnitudes, signed)
TRIVIAL_AUGMENT_WIDE_SPACE: dict = {
    "Identity": (_none, False),
    "ShearX": (_linspace(0.99), True),
    "ShearY": (_linspace(0.99), True),
    "TranslateX": (_linspace(32.0), True),
    "TranslateY": (_linspace(32.0), True),
    "Rotate": (_linspace(135.0), True),
    "Brightness": (_linspace(0.99), True),
    "Color": (_linspace(0.99), True),
    "Contrast": (_linspace(0.99), True),
    "Sharpness": (_linspace(0.99), True),
    "Posterize": (_posterize(6), False),
    "Solarize": (_solarize, False),
    "AutoContrast": (_none, False),
    "Equalize": (_none, False),
}

# torchvision.transforms.v2 RandAugment._AUGMENTATION_SPACE (AutoAugment's: the same without
# Identity, with Invert).
_RAND_AUGMENT_SPACE_BASE: dict = {
    "ShearX": (_linspace(0.3), True),
    "ShearY": (_linspace(0.3), True),
    "TranslateX": (lambda num_bins, height, width: torch.linspace(0.0, 150.0 / 331.0 * width, num_bins), True),
    "TranslateY": (lambda num_bins, height, width: torch.linspace(0.0, 150.0 / 331.0 * height, num_bins), True),
    "Rotate": (_linspace(30.0), True),
    "Brightness": (_linspace(0.9), True),
    "Color": (_linspace(0.9), True),
    "Contrast": (_linspace(0.9), True),
    "Sharpness": (_linspace(0.9), True),
    "Posterize": (_posterize(4), False),
    "Solarize": (_solarize, False),
    "AutoContrast": (_none, False),
    "Equalize": (_none, False),
}
RAND_AUGMENT_SPACE: dict = {"Identity": (_none, False), **_RAND_AUGMENT_SPACE_BASE}
AUTO_AUGMENT_SPACE: dict = {**_RAND_AUGMENT_SPACE_BASE, "Invert": (_none, False)}


def check_images(x: Any) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype != torch.uint8:
        raise TypeError(f"x must be uint8 (the policies' ops are defined on uint8 images, as torchvision's), "
                        f"got {x.dtype}: apply them before converting to float")
    if x.dim() != 4 or x.shape[1] not in (1, 3):
        raise ValueError(f"x must be [N, 3, H, W] or [N, 1, H, W] (grayscale), got shape {tuple(x.shape)}")
    return x


def magnitude_table(space: dict, num_bins: int, height: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 ``[ops, num_bins]`` magnitudes (0 for ops without) and bool ``[ops]`` signed, for a
    space's ops in order, exactly torchvision's values (float32 linspace read back as Python floats)."""
    rows, signed = [], []
    for fn, is_signed in space.values():
        m = fn(num_bins, height, width)
        rows.append(torch.zeros(num_bins, dtype=torch.float64) if m is None else m.to(torch.float64))
        signed.append(is_signed)
    return torch.stack(rows), torch.tensor(signed)


def geometric_matrices(op: torch.Tensor, magnitude: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """float32 ``[N, 6]`` output pixel -> input coordinate maps of the geometric ops (global op ids
    ``op``, signed magnitudes) as torchvision applies them, the identity for the other ops:
    ShearX/Y ``F.affine(shear=(degrees(atan(m)), 0) or (0, ...), center=[0, 0])``, TranslateX/Y
    ``F.affine(translate=(int(m), 0) or (0, int(m)))``, Rotate ``F.rotate(m)`` (``affine(-m % 360)``
    about the centre); through :func:`gpupipe.augment.affine_matrices`.
    """
    zero = torch.zeros_like(magnitude)
    shear = torch.rad2deg(torch.atan(magnitude))
    is_shear = (op == _OP["ShearX"]) | (op == _OP["ShearY"])
    translate = torch.trunc(magnitude)  # int(magnitude)
    centre = torch.tensor([width / 2, height / 2], dtype=torch.float64)
    m = affine_matrices(
        torch.where(op == _OP["Rotate"], -torch.remainder(magnitude, 360.0), zero),  # rotate: angle % 360, then -angle
        torch.stack([torch.where(op == _OP["TranslateX"], translate, zero),
                     torch.where(op == _OP["TranslateY"], translate, zero)], dim=1),
        1.0,
        torch.stack([torch.where(op == _OP["ShearX"], shear, zero), torch.where(op == _OP["ShearY"], shear, zero)], dim=1),
        torch.where(is_shear[:, None], torch.zeros(2, dtype=torch.float64), centre),  # shears about the corner
        size=(height, width),
    )
    return m.reshape(-1, 6).to(torch.float32)


def slot_arguments(op: torch.Tensor, magnitude: torch.Tensor, height: int, width: int):
    """The kernel's (kinds int64, params float64, matrices float32) for one slot: global op ids
    ``op`` (int64 [N], indices of :data:`OP_NAMES`) with signed magnitudes (float64 [N])."""
    kinds = _OP_KINDS[op]
    factor = 1.0 + magnitude
    params = torch.where(op == _OP["Posterize"], torch.trunc(magnitude),
                         torch.where(op == _OP["Solarize"], 255.0 * magnitude, factor))
    return kinds, params, geometric_matrices(op, magnitude, height, width)


class SlotTable:
    """Everything a slot needs, for every (op, bin, sign) a module can draw, at one image size: the
    draws are discrete, so a batch only gathers rows (no per-batch trigonometry). Row
    ``(op * bins + bin) * 2 + negate`` (negate only counts for signed ops); the last row is the
    identity (AutoAugment's steps that do not apply)."""

    def __init__(self, space: dict, num_bins: int, height: int, width: int, op_ids: torch.Tensor):
        magnitudes, signed = magnitude_table(space, num_bins, height, width)  # [O, B], [O]
        sign = torch.tensor([1.0, -1.0], dtype=torch.float64)
        magnitude = magnitudes[:, :, None] * torch.where(signed[:, None, None], sign, 1.0)  # [O, B, 2]
        op = op_ids[:, None, None].expand(magnitude.shape)
        self.op = torch.cat([op.reshape(-1), torch.tensor([_OP["Identity"]])])
        self.magnitude = torch.cat([magnitude.reshape(-1), torch.zeros(1, dtype=torch.float64)])
        self.kinds, self.params, self.matrices = slot_arguments(self.op, self.magnitude, height, width)
        self.identity = self.op.shape[0] - 1


class PolicyBase(KeyedModule):
    """Shared by the policy modules: the op tables and the slots' kernel call (the keyed parameters
    and ``forward``: :class:`~gpupipe.augment._keyed_module.KeyedModule`'s; ``eval()`` returns x).

    A subclass sets ``_space`` (its ops in torchvision's order), ``_stream_name``, ``_num_bins``,
    ``_draws`` (uniforms per sample) and implements ``_params_from_uniforms``, ``_param_spec`` and
    ``_slot_rows`` (per slot, the :class:`SlotTable` row of each sample), and writes its own
    ``forward`` (``return self._forward((x,), params)``: one code object per class, as
    :class:`~gpupipe.augment._keyed_module.KeyedModule` says, so that compiling the three policies
    in one process stays within torch.compile's per-code-object recompile limit).
    """

    _space: dict
    _num_bins: int

    def __init__(self, interpolation: Any, fill: Any, generator: Any):
        super().__init__()
        self.interpolation = parse_interpolation(interpolation)
        self.fill = fill
        self._set_generator(generator)
        self._op_ids = torch.tensor([_OP[name] for name in self._space], dtype=torch.int64)
        self._signed = torch.tensor([signed for _, signed in self._space.values()])
        self._tables: dict = {}

    @property
    def fill(self) -> Any:
        return self._given_fill

    @fill.setter
    def fill(self, fill: Any) -> None:  # (checked whenever set: a later `policy.fill = 128` fills with 128)
        self._fill = policy_fill(fill)
        self._given_fill = fill

    def _table(self, height: int, width: int) -> SlotTable:
        if torch.compiler.is_compiling():
            # built in the graph, never stored: a per-size entry written to the module inside the
            # compiled region is module state dynamo guards on, a recompile per image size
            return SlotTable(self._space, self._num_bins, height, width, self._op_ids)
        key = (height, width)
        if key not in self._tables:
            if len(self._tables) > 16:
                self._tables.clear()
            self._tables[key] = SlotTable(self._space, self._num_bins, height, width, self._op_ids)
        return self._tables[key]

    def _row(self, op_index: torch.Tensor, bins: torch.Tensor, negate: torch.Tensor) -> torch.Tensor:
        """The SlotTable row of (op, bin, sign) draws (the sign counts for signed ops only)."""
        return (op_index * self._num_bins + bins) * 2 + (negate & self._signed[op_index]).to(torch.int64)

    def _check_inputs(self, x: Any) -> int:
        n = check_images(x).shape[0]
        if x.shape[1] == 1:
            _kernels.check_gray_fill(self._fill)
        return n

    def _transform(self, x: torch.Tensor, params: dict) -> torch.Tensor:
        table = self._table(x.shape[2], x.shape[3])
        slot_rows = self._slot_rows(params)
        if not slot_rows:  # RandAugment(num_ops=0): torchvision returns the input
            return x
        rows = torch.stack(slot_rows, dim=1)  # [N, slots]: every step in one kernel call
        kinds, p, matrices = table.kinds[rows], table.params[rows], table.matrices[rows]
        gray = x.shape[1] == 1
        if gray:  # its channel read as three (the kernels' layout), the first kept: per channel, the same ops
            kinds = _GRAY_KINDS[kinds]
            x = _kernels.as_three_channels(x)
        if x.device.type != "cpu":
            kinds, p, matrices = (to_device(t, x.device) for t in (kinds, p, matrices))
        out = policy_apply(x, kinds, p, matrices, self.interpolation, self._fill)
        return out[:, :1].clone() if gray else out

    def _slots(self, params: dict, height: int, width: int) -> list:
        """Per slot, (global op ids [N], signed magnitudes [N]): what each sample undergoes."""
        table = self._table(height, width)
        return [(table.op[rows], table.magnitude[rows]) for rows in self._slot_rows(params)]

    @staticmethod
    def _check_range(params: dict, key: str, high: int) -> None:
        v = params[key]
        if not torch.compiler.is_compiling() and bool(((v < 0) | (v >= high)).any()):  # a data-dependent guard
            raise ValueError(f"params[{key!r}] must lie in [0, {high})")

    def extra_repr(self) -> str:
        return f"interpolation={self.interpolation!r}, fill={self.fill!r}"


def uniform_index(u: torch.Tensor, count: int) -> torch.Tensor:
    """Integers uniform in [0, count) from uniforms in [0, 1) (as torch.randint's distribution)."""
    return torch.clamp((u * count).to(torch.int64), max=count - 1)


def negate_draw(u: torch.Tensor) -> torch.Tensor:
    """torchvision's ``torch.rand(()) <= 0.5``: negate a signed magnitude."""
    return u <= 0.5


def check_bins(num_magnitude_bins: Any) -> int:
    if not is_python_int(num_magnitude_bins) or num_magnitude_bins < 2:
        raise ValueError(f"num_magnitude_bins must be an int >= 2, got {num_magnitude_bins!r}")
    return num_magnitude_bins


__all__ = ["OP_NAMES", "PolicyBase", "geometric_matrices", "magnitude_table", "slot_arguments"]
