"""Compose: a keyed chain of augmentation modules."""

from __future__ import annotations

import functools
import inspect
from typing import Any, Optional, Sequence

from torch import nn

from gpupipe import keyed
from gpupipe.augment._containers import container_entries, unwrap


class Compose(nn.Module):
    """Augmentation modules applied in order, with keyed, replayable parameters for the whole chain.

    ``sample_params(n, seed=s, ...)`` gives child ``k`` the seed ``keyed.derive_seed(s, k)`` (two
    identical modules in a chain draw differently) and returns ``{"0": params of child 0, "1": ...}``;
    ``forward(x, params=p)`` hands each child its own entry, so a chain replays exactly. A child whose
    ``sample_params`` takes no keys (e.g. a ``BatchAugment(...).sample_params(n)`` of the first
    engine) is sampled plainly from its own generator and replayed from what it drew; a child without
    ``sample_params`` is simply called. The Loader takes a Compose as its ``augment``:
    ``Compose([TrivialAugmentWide(), BatchAugment(...), RandomErasing(0.1)])``. Called with several
    inputs (``chain(images, labels)``), it passes them through as torchvision's v2 ``Compose`` does
    (see :meth:`forward`).

    Args:
        transforms: the modules (or callables), applied in order; held in ``self.transforms``, an
            ``nn.ModuleList`` (a plain callable wrapped, shown as itself), which is what runs:
            ``chain.transforms[k] = other`` replaces child ``k``.

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
        self.transforms = container_entries(transforms, "modules")  # what runs (see _containers)
        self.last_params: Optional[dict] = None

    def _children(self) -> list:
        return [unwrap(t) for t in self.transforms]

    def sample_params(self, n: int, *, seed: Optional[int] = None, epoch: Optional[int] = None,
                      indices: Any = None) -> dict:
        """``{str(k): child k's parameters}`` (None for a child without ``sample_params``)."""
        if indices is not None:
            indices = keyed.key_indices(indices)  # once: a one-shot iterable would go to the first child alone
        params = {}
        for k, child in enumerate(self._children()):
            if seed is None and (epoch is not None or indices is not None) and hasattr(child, "sample_params"):
                raise ValueError("epoch and indices key the draws to a seed: pass seed as well")
            params[str(k)] = keyed.child_params(child, k, n, seed=seed, epoch=epoch, indices=indices)
        return params

    @property
    def samples_independent(self) -> bool:
        """Each sample mapped on its own when every module of the chain does (:func:`gpupipe.keyed.samples_independent`)."""
        return all(keyed.samples_independent(t) for t in self._children())

    def forward(self, *inputs: Any, params: Optional[dict] = None) -> Any:
        """Applies the chain; ``params=None`` lets each child draw (or not, in ``eval()``) itself.

        ``chain(images)`` returns the images; ``chain(images, labels, ...)`` returns every input, as
        torchvision's v2 ``Compose``: a child whose ``forward`` takes all the inputs (``MixUp``,
        ``CutMix``, ``RandomChoice``, a ``Compose``) gets them all and returns them all, a child
        that takes the images alone (``BatchAugment``, the policies, ``RandomErasing``, a callable
        of one argument) gets the images and the other inputs pass by it.
        """
        children = self._children()
        if not inputs:
            raise TypeError("Compose takes the batch: chain(images) or chain(images, labels), params= by keyword")
        if params is not None:
            if not isinstance(params, dict) or set(params) != {str(k) for k in range(len(children))}:
                raise ValueError(f"params must be a dict with keys '0'..'{len(children) - 1}' "
                                 f"(from sample_params), got {type(params).__name__}")
        if any(isinstance(v, dict) for v in inputs[1:]):
            raise TypeError("params is keyword-only: chain(images, params=p) (or chain(images, labels, params=p))")
        drawn = {}
        for k, child in enumerate(children):
            p = None if params is None else params[str(k)]
            kwargs = {} if p is None else {"params": p}
            if len(inputs) == 1:
                inputs = (child(*inputs, **kwargs),)
            elif _takes(child, len(inputs)):
                out = child(*inputs, **kwargs)
                if not isinstance(out, (tuple, list)) or len(out) != len(inputs):
                    raise TypeError(f"transform {k} ({type(child).__name__}) took the {len(inputs)} inputs but "
                                    f"did not return {len(inputs)} outputs")
                inputs = tuple(out)
            elif _takes(child, 1):
                inputs = (child(inputs[0], **kwargs), *inputs[1:])
            else:
                raise TypeError(f"transform {k} ({type(child).__name__}) takes neither the images alone nor "
                                f"the {len(inputs)} inputs chain(images, labels, ...) passes")
            drawn[str(k)] = getattr(child, "last_params", None) if params is None else p
        self.last_params = drawn
        return inputs[0] if len(inputs) == 1 else inputs


def _takes(child: Any, count: int) -> bool:
    """Whether ``child`` is called with ``count`` positional inputs (``params`` not among them): its
    ``forward`` (a compiled module's: the module it compiles) or its signature binds them; True
    where Python cannot tell (a builtin), as torchvision hands every input to every transform."""
    fn = getattr(child, "_orig_mod", child)
    if isinstance(fn, nn.Module):  # its class's forward, self first: one answer per class (cached)
        fn, count = type(fn).forward, count + 1
    try:
        return _binds(fn, count)
    except TypeError:  # (an unhashable callable: asked each time)
        return _binds.__wrapped__(fn, count)


@functools.lru_cache(maxsize=256)
def _binds(fn: Any, count: int) -> bool:
    """:func:`_takes` of a function: inspect.signature costs tens of microseconds, every batch."""
    try:
        bound = inspect.signature(fn).bind(*range(count))
    except TypeError:
        return False
    except ValueError:
        return True
    return "params" not in bound.arguments
