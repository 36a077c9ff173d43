"""AutoAugment: one of the learned sub-policies of a data set per sample, on a uint8 batch."""

from __future__ import annotations

from typing import Any, Optional

import torch

from gpupipe.augment._auto_augment_ops import AUTO_AUGMENT_SPACE, PolicyBase, negate_draw, uniform_index
from gpupipe.augment._keyed_params import GeneratorLike

# torchvision.transforms.v2 AutoAugment._get_policies: per data set, 25 sub-policies of two
# (op, probability, magnitude bin of 10) steps.
POLICIES: dict = {
    "imagenet": [
        (("Posterize", 0.4, 8), ("Rotate", 0.6, 9)),
        (("Solarize", 0.6, 5), ("AutoContrast", 0.6, None)),
        (("Equalize", 0.8, None), ("Equalize", 0.6, None)),
        (("Posterize", 0.6, 7), ("Posterize", 0.6, 6)),
        (("Equalize", 0.4, None), ("Solarize", 0.2, 4)),
        (("Equalize", 0.4, None), ("Rotate", 0.8, 8)),
        (("Solarize", 0.6, 3), ("Equalize", 0.6, None)),
        (("Posterize", 0.8, 5), ("Equalize", 1.0, None)),
        (("Rotate", 0.2, 3), ("Solarize", 0.6, 8)),
        (("Equalize", 0.6, None), ("Posterize", 0.4, 6)),
        (("Rotate", 0.8, 8), ("Color", 0.4, 0)),
        (("Rotate", 0.4, 9), ("Equalize", 0.6, None)),
        (("Equalize", 0.0, None), ("Equalize", 0.8, None)),
        (("Invert", 0.6, None), ("Equalize", 1.0, None)),
        (("Color", 0.6, 4), ("Contrast", 1.0, 8)),
        (("Rotate", 0.8, 8), ("Color", 1.0, 2)),
        (("Color", 0.8, 8), ("Solarize", 0.8, 7)),
        (("Sharpness", 0.4, 7), ("Invert", 0.6, None)),
        (("ShearX", 0.6, 5), ("Equalize", 1.0, None)),
        (("Color", 0.4, 0), ("Equalize", 0.6, None)),
        (("Equalize", 0.4, None), ("Solarize", 0.2, 4)),
        (("Solarize", 0.6, 5), ("AutoContrast", 0.6, None)),
        (("Invert", 0.6, None), ("Equalize", 1.0, None)),
        (("Color", 0.6, 4), ("Contrast", 1.0, 8)),
        (("Equalize", 0.8, None), ("Equalize", 0.6, None)),
    ],
    "cifar10": [
        (("Invert", 0.1, None), ("Contrast", 0.2, 6)),
        (("Rotate", 0.7, 2), ("TranslateX", 0.3, 9)),
        (("Sharpness", 0.8, 1), ("Sharpness", 0.9, 3)),
        (("ShearY", 0.5, 8), ("TranslateY", 0.7, 9)),
        (("AutoContrast", 0.5, None), ("Equalize", 0.9, None)),
        (("ShearY", 0.2, 7), ("Posterize", 0.3, 7)),
        (("Color", 0.4, 3), ("Brightness", 0.6, 7)),
        (("Sharpness", 0.3, 9), ("Brightness", 0.7, 9)),
        (("Equalize", 0.6, None), ("Equalize", 0.5, None)),
        (("Contrast", 0.6, 7), ("Sharpness", 0.6, 5)),
        (("Color", 0.7, 7), ("TranslateX", 0.5, 8)),
        (("Equalize", 0.3, None), ("AutoContrast", 0.4, None)),
        (("TranslateY", 0.4, 3), ("Sharpness", 0.2, 6)),
        (("Brightness", 0.9, 6), ("Color", 0.2, 8)),
        (("Solarize", 0.5, 2), ("Invert", 0.0, None)),
        (("Equalize", 0.2, None), ("AutoContrast", 0.6, None)),
        (("Equalize", 0.2, None), ("Equalize", 0.6, None)),
        (("Color", 0.9, 9), ("Equalize", 0.6, None)),
        (("AutoContrast", 0.8, None), ("Solarize", 0.2, 8)),
        (("Brightness", 0.1, 3), ("Color", 0.7, 0)),
        (("Solarize", 0.4, 5), ("AutoContrast", 0.9, None)),
        (("TranslateY", 0.9, 9), ("TranslateY", 0.7, 9)),
        (("AutoContrast", 0.9, None), ("Solarize", 0.8, 3)),
        (("Equalize", 0.8, None), ("Invert", 0.1, None)),
        (("TranslateY", 0.7, 9), ("AutoContrast", 0.9, None)),
    ],
    "svhn": [
        (("ShearX", 0.9, 4), ("Invert", 0.2, None)),
        (("ShearY", 0.9, 8), ("Invert", 0.7, None)),
        (("Equalize", 0.6, None), ("Solarize", 0.6, 6)),
        (("Invert", 0.9, None), ("Equalize", 0.6, None)),
        (("Equalize", 0.6, None), ("Rotate", 0.9, 3)),
        (("ShearX", 0.9, 4), ("AutoContrast", 0.8, None)),
        (("ShearY", 0.9, 8), ("Invert", 0.4, None)),
        (("ShearY", 0.9, 5), ("Solarize", 0.2, 6)),
        (("Invert", 0.9, None), ("AutoContrast", 0.8, None)),
        (("Equalize", 0.6, None), ("Rotate", 0.9, 3)),
        (("ShearX", 0.9, 4), ("Solarize", 0.3, 3)),
        (("ShearY", 0.8, 8), ("Invert", 0.7, None)),
        (("Equalize", 0.9, None), ("TranslateY", 0.6, 6)),
        (("Invert", 0.9, None), ("Equalize", 0.6, None)),
        (("Contrast", 0.3, 3), ("Rotate", 0.8, 4)),
        (("Invert", 0.8, None), ("TranslateY", 0.0, 2)),
        (("ShearY", 0.7, 6), ("Solarize", 0.4, 8)),
        (("Invert", 0.6, None), ("Rotate", 0.8, 4)),
        (("ShearY", 0.3, 7), ("TranslateX", 0.9, 3)),
        (("ShearX", 0.1, 6), ("Invert", 0.6, None)),
        (("Solarize", 0.7, 2), ("TranslateY", 0.6, 7)),
        (("ShearY", 0.8, 4), ("Invert", 0.8, None)),
        (("ShearX", 0.7, 9), ("TranslateY", 0.8, 3)),
        (("ShearY", 0.8, 5), ("AutoContrast", 0.7, None)),
        (("ShearX", 0.7, 2), ("Invert", 0.1, None)),
    ],
}

class AutoAugment(PolicyBase):
    """torchvision's ``AutoAugment``, batched: each sample draws its own sub-policy and steps.

    Per sample, as ``torchvision.transforms.v2.AutoAugment`` draws it: one of the policy's 25
    sub-policies uniformly; each of its two steps ``(op, probability, bin)`` applies with its
    probability, at magnitude bin ``bin`` of 10, with a random sign for signed ops; applied steps
    run in order, each exactly as torchvision applies it (tolerances per op in
    ``docs/semantics.md``, "Policies").

    Args:
        policy: ``"imagenet"``, ``"cifar10"`` or ``"svhn"`` (or torchvision's ``AutoAugmentPolicy``).
        interpolation: ``"nearest"`` (default) or ``"bilinear"`` for the geometric ops.
        fill: None (zeros, torchvision's default), a number or 3 numbers on the 0..255 scale.
        generator: ``torch.Generator`` or int seed for the unkeyed draws.

    Shapes:
        input: uint8 ``[N, 3, H, W]``, any memory format, on the CPU. Output: uint8, same shape,
        memory format and device.

    Parameters: ``policy`` int64 ``[N]`` (index of the sub-policy), ``apply`` bool ``[N, 2]``,
    ``negate`` bool ``[N, 2]``. Keyed stream: ``keyed.stream_of("AutoAugment")``.

    Example:
        >>> import torch
        >>> from gpupipe.augment import AutoAugment
        >>> aug = AutoAugment("imagenet")
        >>> x = torch.randint(0, 256, (4, 3, 37, 45), dtype=torch.uint8)
        >>> y = aug(x, params=aug.sample_params(4, seed=0))
        >>> sorted(aug.last_params), y.shape
        (['apply', 'negate', 'policy'], torch.Size([4, 3, 37, 45]))
    """

    _space = AUTO_AUGMENT_SPACE
    _stream_name = "AutoAugment"
    samples_independent = True  #: each sample's ops from its own row (gpupipe.keyed.samples_independent)
    _draws = 5
    _num_bins = 10

    def __init__(self, policy: Any = "imagenet", interpolation: Any = "nearest", fill: Any = None,
                 generator: GeneratorLike = None):
        name = getattr(policy, "value", policy)
        if name not in POLICIES:
            raise ValueError(f"policy must be one of {list(POLICIES)} (or torchvision's AutoAugmentPolicy), got {policy!r}")
        self.policy = name
        super().__init__(interpolation, fill, generator)
        ops = list(self._space)
        table = POLICIES[name]
        self._step_op = torch.tensor([[ops.index(step[0]) for step in sub] for sub in table], dtype=torch.int64)
        self._step_p = torch.tensor([[step[1] for step in sub] for sub in table], dtype=torch.float64)
        self._step_bin = torch.tensor([[step[2] or 0 for step in sub] for sub in table], dtype=torch.int64)
        # the SlotTable row of every (sub-policy, step, sign); the last row of the table: not applied
        signs = torch.tensor([False, True])
        self._step_rows = self._row(self._step_op[:, :, None], self._step_bin[:, :, None], signs)  # [25, 2, 2]
        self._not_applied = len(self._space) * self._num_bins * 2

    def forward(self, x: torch.Tensor, params: Optional[dict] = None) -> torch.Tensor:
        """Augments a batch: uint8 ``[N, 3, H, W]`` -> uint8 ``[N, 3, H, W]``, same device and memory format.

        ``params=None`` draws new parameters in ``train()`` mode and applies none in ``eval()``
        mode (x is returned as is); ``params=p`` (e.g. ``last_params``) replays exactly.
        """
        return self._forward((x,), params)  # this class's own code object (see PolicyBase)

    def _params_from_uniforms(self, u: torch.Tensor) -> dict:
        policy = uniform_index(u[:, 0], len(self._step_op))
        return {"policy": policy, "apply": u[:, 1:3] <= self._step_p[policy], "negate": negate_draw(u[:, 3:5])}

    def _param_spec(self):
        return ({"policy": (), "apply": (2,), "negate": (2,)},
                {"policy": torch.int64, "apply": torch.bool, "negate": torch.bool})

    def _slot_rows(self, params: dict) -> list:
        self._check_range(params, "policy", len(self._step_op))
        rows = self._step_rows[params["policy"][:, None], torch.arange(2), params["negate"].long()]  # [N, 2]
        rows = torch.where(params["apply"], rows, self._not_applied)
        return [rows[:, 0], rows[:, 1]]

    def extra_repr(self) -> str:
        return f"policy={self.policy!r}, " + super().extra_repr()
