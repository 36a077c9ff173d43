"""RandomChoice: one of several transforms per batch."""

from __future__ import annotations

import math
from typing import Any, Optional, Sequence

import numpy as np
import torch
from torch import nn

from gpupipe import keyed
from gpupipe.augment._batch_transform import batch_rng
from gpupipe.augment._containers import container_entries, unwrap
from gpupipe.augment._keyed_params import GeneratorLike, as_generator


class RandomChoice(nn.Module):
    """torchvision v2's ``RandomChoice``: per batch, one of ``transforms`` picked with probabilities ``p``.

    Meant for the batch transforms (``RandomChoice([MixUp(...), CutMix(...)])``, torchvision's
    classification recipe), it forwards whatever it is called with, so it also picks among image
    augmentations. The choice is one draw per batch; the chosen transform then draws its own
    parameters, keyed with the child seed ``keyed.derive_seed(seed, k)`` (``k``: its position).

    Args:
        transforms: the candidates (``nn.Module`` or callables); those with a keyed ``sample_params``
            get replayable parameters. Held in ``self.transforms``, an ``nn.ModuleList`` (a plain
            callable wrapped, shown as itself), which is what runs.
        p: a weight per transform (normalised to sum to 1), None for equal weights.
        generator: ``torch.Generator`` or int seed seeding the unkeyed draws.

    Parameters (``sample_params``, ``last_params``): ``n`` (batch size), ``choice`` (int64 scalar) and
    ``params`` (the chosen transform's parameters, or None). With a ``seed``, the choice is drawn
    from ``numpy.random.default_rng(keyed.derive_seed(seed, epoch, first index,
    keyed.stream_of("RandomChoice")))``. In ``eval()`` mode (without ``params``) the chosen transform
    runs in its own mode and ``params`` is what it recorded (its ``last_params``: the identity
    parameters of gpupipe's modules), so replaying ``last_params`` gives the eval output.

    Example:
        >>> import torch
        >>> from gpupipe.augment import CutMix, MixUp, RandomChoice
        >>> choose = RandomChoice([MixUp(0.2, num_classes=10), CutMix(1.0, num_classes=10)])
        >>> images, labels = torch.rand(4, 3, 16, 16), torch.tensor([0, 3, 3, 9])
        >>> out, soft = choose(images, labels, params=choose.sample_params(4, seed=0))
        >>> int(choose.last_params["choice"]) in (0, 1), soft.shape
        (True, torch.Size([4, 10]))
    """

    def __init__(self, transforms: Sequence[Any], p: Optional[Sequence[float]] = None,
                 generator: GeneratorLike = None):
        super().__init__()
        entries = container_entries(transforms, "transforms")
        weights = [1.0] * len(transforms) if p is None else [float(v) for v in p]
        if len(weights) != len(transforms):
            raise ValueError(f"p has {len(weights)} entries for {len(transforms)} transforms")
        if any(not 0 <= w < math.inf for w in weights) or not 0 < sum(weights) < math.inf:
            raise ValueError(f"p must be finite non-negative weights with a positive sum, got {p!r}")
        self.transforms = entries  # what runs (see _containers)
        total = sum(weights)
        self.p = [w / total for w in weights]
        self.generator = as_generator(generator)
        self.last_params: Optional[dict] = None

    def _children(self) -> list:
        return [unwrap(t) for t in self.transforms]

    def _choose(self, n: int, seed: Optional[int], epoch: Optional[int], indices: Any) -> int:
        rng = batch_rng(keyed.stream_of("RandomChoice"), n, self.generator, seed, epoch, indices)
        k = int(np.searchsorted(np.cumsum(self.p), rng.random(), side="right"))
        return min(k, len(self.p) - 1)

    def sample_params(self, n: int, *, seed: Optional[int] = None, epoch: Optional[int] = None,
                      indices: Any = None) -> dict:
        """The batch's choice and the chosen transform's parameters."""
        if indices is not None:
            indices = keyed.key_indices(indices)  # once: the choice and the child both read them
        k = self._choose(n, seed, epoch, indices)
        child_params = keyed.child_params(self._children()[k], k, n, seed=seed, epoch=epoch, indices=indices)
        return {"n": torch.tensor(n, dtype=torch.int64), "choice": torch.tensor(k, dtype=torch.int64),
                "params": child_params}

    def forward(self, *inputs: Any, params: Optional[dict] = None) -> Any:
        """Applies the chosen transform to ``inputs`` (e.g. ``images, labels``)."""
        if not inputs:
            raise ValueError("RandomChoice needs inputs (e.g. images, labels)")
        n = inputs[0].shape[0] if isinstance(inputs[0], torch.Tensor) and inputs[0].dim() > 0 else None
        children = self._children()
        if params is None and not self.training:
            # the chosen transform follows its own (eval) mode; what it applied is recorded (not a
            # draw it never used), so replaying last_params gives this output
            k = self._choose(n if n is not None else 0, None, None, None)
            child = children[k]
            out = child(*inputs)
            self.last_params = {"n": torch.tensor(n if n is not None else 0, dtype=torch.int64),
                                "choice": torch.tensor(k, dtype=torch.int64),
                                "params": getattr(child, "last_params", None)}
            return out
        if params is None:
            params = self.sample_params(n if n is not None else 0)
        elif not isinstance(params, dict) or "choice" not in params:
            raise ValueError("params must be a dict from sample_params (with 'choice')")
        elif n is not None and int(params["n"]) != n:
            raise ValueError(f"params were drawn for a batch of {int(params['n'])}, this batch has {n}")
        k = int(params["choice"])
        if not 0 <= k < len(children):
            raise ValueError(f"params['choice'] must lie in [0, {len(children)}), got {k}")
        self.last_params = params
        child = children[k]
        if params["params"] is not None:
            return child(*inputs, params=params["params"])
        return child(*inputs)

    def extra_repr(self) -> str:
        return f"p={self.p}"
