"""Compose: a keyed chain of augmentation modules."""

from __future__ import annotations

from typing import Any, Optional, Sequence

from torch import nn

from gpupipe import keyed


class Compose(nn.Module):
    """Augmentation modules applied in order, with keyed, replayable parameters for the whole chain.

    ``sample_params(n, seed=s, ...)`` gives child ``k`` the seed ``keyed.derive_seed(s, k)`` (two
    identical modules in a chain draw differently) and returns ``{"0": params of child 0, "1": ...}``;
    ``forward(x, params=p)`` hands each child its own entry, so a chain replays exactly. A child whose
    ``sample_params`` takes no keys (e.g. a ``BatchAugment(...).sample_params(n)`` of the first
    engine) is sampled plainly from its own generator and replayed from what it drew; a child without
    ``sample_params`` is simply called. The Loader takes a Compose as its ``augment``:
    ``Compose([TrivialAugmentWide(), BatchAugment(...), RandomErasing(0.1)])``.

    Args:
        transforms: the modules (or callables), applied in order.

    Shapes:
        whatever the chain maps: e.g. uint8 ``[N, 3, H, W]`` in, normalised float out.

    Example:
        >>> import torch
        >>> from gpupipe.augment import Compose, RandomErasing, TrivialAugmentWide
        >>> chain = Compose([TrivialAugmentWide(), RandomErasing(p=0.5)])
        >>> x = torch.randint(0, 256, (4, 3, 24, 24), dtype=torch.uint8)
        >>> p = chain.sample_params(4, seed=3, epoch=0, indices=[0, 1, 2, 3])
        >>> sorted(p)
        ['0', '1']
        >>> torch.equal(chain(x, params=p), chain(x, params=chain.last_params))
        True
    """

    def __init__(self, transforms: Sequence[Any]):
        super().__init__()
        if isinstance(transforms, nn.Module) or not isinstance(transforms, Sequence) or not transforms:
            raise ValueError("transforms must be a non-empty sequence of modules")
        if not all(callable(t) for t in transforms):
            raise TypeError("every entry of transforms must be callable")
        self._transforms = list(transforms)
        self.transforms = nn.ModuleList([t for t in transforms if isinstance(t, nn.Module)])
        self.last_params: Optional[dict] = None

    def sample_params(self, n: int, *, seed: Optional[int] = None, epoch: Optional[int] = None,
                      indices: Any = None) -> dict:
        """``{str(k): child k's parameters}`` (None for a child without ``sample_params``)."""
        params = {}
        for k, child in enumerate(self._transforms):
            if seed is None and (epoch is not None or indices is not None) and hasattr(child, "sample_params"):
                raise ValueError("epoch and indices key the draws to a seed: pass seed as well")
            params[str(k)] = keyed.child_params(child, k, n, seed=seed, epoch=epoch, indices=indices)
        return params

    @property
    def samples_independent(self) -> bool:
        """Each sample mapped on its own when every module of the chain does (:func:`gpupipe.keyed.samples_independent`)."""
        return all(keyed.samples_independent(t) for t in self._transforms)

    def forward(self, x: Any, params: Optional[dict] = None) -> Any:
        """Applies the chain; ``params=None`` lets each child draw (or not, in ``eval()``) itself."""
        if params is not None:
            if not isinstance(params, dict) or set(params) != {str(k) for k in range(len(self._transforms))}:
                raise ValueError(f"params must be a dict with keys '0'..'{len(self._transforms) - 1}' "
                                 f"(from sample_params), got {type(params).__name__}")
        drawn = {}
        for k, child in enumerate(self._transforms):
            p = None if params is None else params[str(k)]
            x = child(x) if p is None else child(x, params=p)
            drawn[str(k)] = getattr(child, "last_params", None) if params is None else p
        self.last_params = drawn
        return x

    def extra_repr(self) -> str:
        return "\n".join(f"({k}): {t!r}" for k, t in enumerate(self._transforms) if not isinstance(t, nn.Module))


