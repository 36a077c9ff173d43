"""Shared by the batch transforms (:class:`~gpupipe.augment.MixUp`, :class:`~gpupipe.augment.CutMix`,
:class:`~gpupipe.augment.RandomChoice`): the keyed per-batch random generator and the labels.

A batch transform draws once per batch. With a ``seed``, its draws come from
``numpy.random.default_rng(keyed.derive_seed(seed, epoch, first, stream))``, ``first`` being the
batch's first sample index and ``stream`` the module's :func:`gpupipe.keyed.stream_of` its class
name: a pure function of (seed, epoch, the batch's first index), so ``Loader.set_epoch(e)`` replays
epoch ``e`` in any process. Without a seed, the numpy generator is seeded from the module's
``generator`` (torch's global one by default).
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np
import torch
import torch.nn.functional as F

from gpupipe import keyed
from gpupipe._args import is_int, is_number
from gpupipe.augment._keyed_module import KeyedModule
from gpupipe.augment._keyed_params import GeneratorLike, check_count
from gpupipe.keyed import key_int


def batch_rng(stream: int, n: int, generator: Optional[torch.Generator], seed: Optional[int], epoch: Optional[int],
              indices: Any) -> np.random.Generator:
    """The numpy generator of one batch's draws (see the module docstring)."""
    n = check_count(n)
    if seed is None:
        if epoch is not None or indices is not None:
            raise ValueError("epoch and indices key the draws to a seed: pass seed as well")
        return np.random.default_rng(int(torch.randint(0, 2**62, (), generator=generator)))
    seed, epoch = key_int(seed, "seed"), 0 if epoch is None else key_int(epoch, "epoch")
    if indices is None:
        first = 0
    else:
        idx = keyed.key_indices(indices).reshape(-1)
        if idx.shape[0] != n:
            raise ValueError(f"indices has {idx.shape[0]} entries for n={n} samples")
        first = int(idx[0]) if n else 0
    return np.random.default_rng(keyed.derive_seed(seed, epoch, first, stream))


def check_alpha(alpha: Any) -> float:
    if not is_number(alpha) or not 0 < alpha < float("inf"):
        raise ValueError(f"alpha must be a positive finite number (the Beta(alpha, alpha) parameter), got {alpha!r}")
    return float(alpha)


def check_num_classes(num_classes: Any) -> Optional[int]:
    if num_classes is None:
        return None
    if not is_int(num_classes) or num_classes < 1:
        raise ValueError(f"num_classes must be a positive int, got {num_classes!r}")
    return int(num_classes)


def _check_unit(value: Any, name: str, count: int) -> None:
    """``value`` holds ``count`` numbers within [0, 1] (NaN is not)."""
    try:
        values = torch.as_tensor(value, dtype=torch.float64).reshape(-1).tolist()
    except (TypeError, ValueError, RuntimeError):
        raise TypeError(f"params[{name!r}] must be {count} number(s), got {value!r}") from None
    if len(values) != count:
        raise ValueError(f"params[{name!r}] must be {count} number(s), got {len(values)}")
    if not all(0.0 <= v <= 1.0 for v in values):
        raise ValueError(f"params[{name!r}] must be within [0, 1], got {values if count > 1 else values[0]}")


class BatchTransformBase(KeyedModule):
    """Batch transform on ``(images, labels)``: per-batch parameters, keyed; soft labels out.

    A subclass sets ``_stream_name`` and ``_param_keys`` (the keys of its parameters besides ``"n"``)
    and writes ``_params_from_rng(rng)`` (the batch's draws from :func:`batch_rng`) and
    ``_transform(images, labels, params)``.
    """

    _param_keys: tuple

    def __init__(self, alpha: float, num_classes: Optional[int], generator: GeneratorLike):
        super().__init__()
        self.alpha = check_alpha(alpha)
        self.num_classes = check_num_classes(num_classes)
        self._set_generator(generator)

    def sample_params(self, n: int, *, seed: Optional[int] = None, epoch: Optional[int] = None,
                      indices: Any = None) -> dict:
        """The batch's parameters: ``n`` and the draws named in the class's docstring, keyed as the
        module docstring says."""
        rng = batch_rng(self.stream, n, self.generator, seed, epoch, indices)
        return {"n": torch.tensor(n, dtype=torch.int64), **self._params_from_rng(rng)}

    def identity_params(self, n: int) -> None:
        """None: ``eval()`` mode mixes nothing (the labels still come out as soft labels)."""
        return None

    def _check_inputs(self, images: Any, labels: Any) -> int:
        if not isinstance(images, torch.Tensor) or images.dim() != 4:
            raise ValueError(f"images must be a batched [N, C, H, W] tensor, got "
                             f"{getattr(images, 'shape', type(images).__name__)}")
        n = images.shape[0]
        if not isinstance(labels, torch.Tensor) or labels.dim() not in (1, 2):
            raise ValueError(f"labels must be class indices [N] or probabilities [N, num_classes], got "
                             f"{getattr(labels, 'shape', type(labels).__name__)}")
        if labels.shape[0] != n:
            raise ValueError(f"labels hold {labels.shape[0]} samples, images {n}")
        if labels.dim() == 1:
            if self.num_classes is None:
                raise ValueError("num_classes must be given when labels are class indices [N]")
            if labels.dtype.is_floating_point or labels.dtype == torch.bool:
                raise TypeError(f"labels [N] must be integer class indices, got {labels.dtype}")
            if n and not torch.compiler.is_compiling():
                lo, hi = int(labels.min()), int(labels.max())
                if lo < 0:
                    raise ValueError(f"labels must be non-negative class indices, got {lo}")
                if hi >= self.num_classes:
                    raise ValueError(f"num_classes={self.num_classes} is smaller than a label ({hi}): labels must "
                                     f"lie in [0, num_classes)")
        elif self.num_classes is not None and labels.shape[1] != self.num_classes:
            raise ValueError(f"labels [N, C] must have C = num_classes = {self.num_classes}, got {labels.shape[1]}")
        return n

    def _checked_params(self, params: Any, n: int) -> dict:
        if not isinstance(params, dict):
            raise ValueError("params must be a dict from sample_params")
        missing = [k for k in ("n", *self._param_keys) if k not in params]
        if missing:
            raise ValueError(f"params lack {missing} (a dict from sample_params holds {['n', *self._param_keys]})")
        if int(params["n"]) != n:
            raise ValueError(f"params were drawn for a batch of {int(params['n'])}, this batch has {n}")
        if not torch.compiler.is_compiling():
            self._check_values(params)
        return params

    def _check_values(self, params: dict) -> None:
        """ValueError naming the parameter for values no draw gives (on every path alike)."""
        _check_unit(params["lam"], "lam", 1)

    def soft_labels(self, labels: torch.Tensor) -> torch.Tensor:
        """float ``[N, num_classes]``: one-hot of class indices, or the given probabilities as float."""
        if labels.dim() == 1:
            labels = F.one_hot(labels.long(), num_classes=self.num_classes)
        return labels if labels.dtype.is_floating_point else labels.float()

    def mix_labels(self, labels: torch.Tensor, lam: float) -> torch.Tensor:
        """torchvision's ``_mixup_label``: ``lam * label + (1 - lam) * label.roll(1, 0)``."""
        label = self.soft_labels(labels)
        return label.roll(1, 0).mul_(1.0 - lam).add_(label.mul(lam))

    def forward(self, images: torch.Tensor, labels: torch.Tensor, params: Optional[dict] = None):
        """``(images, labels)`` -> ``(images, soft labels [N, num_classes])``.

        ``params=None`` draws in ``train()`` mode and mixes nothing in ``eval()`` mode (the labels
        still come out as soft labels); ``params=p`` replays exactly.
        """
        return self._forward((images, labels), params)

    def _transform_identity(self, images: torch.Tensor, labels: torch.Tensor, params: None):
        return images, self.soft_labels(labels)
