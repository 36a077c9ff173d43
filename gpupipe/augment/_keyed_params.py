"""Drawing and checking the per-sample parameters of the keyed augmentation modules.

Every module draws its parameters from uniforms in [0, 1): with a ``seed``, from
:func:`gpupipe.keyed.uniforms` on the module's own stream (a pure function of (seed, epoch, sample
index)); without, from the module's ``generator``. The mapping from uniforms to parameters is the
same either way.
"""

from __future__ import annotations

import itertools
import weakref
from typing import Any, Mapping, Optional, Union

import numpy as np
import torch

from gpupipe import keyed
from gpupipe._args import is_int
from gpupipe.keyed import key_indices, key_int

GeneratorLike = Union[torch.Generator, int, None]


def as_generator(generator: GeneratorLike) -> Optional[torch.Generator]:
    """A CPU ``torch.Generator`` from a generator, an int seed or None (torch's global generator)."""
    if generator is None or isinstance(generator, torch.Generator):
        return generator
    if isinstance(generator, int) and not isinstance(generator, bool):
        return torch.Generator().manual_seed(generator)
    raise TypeError(f"generator must be a torch.Generator, an int seed or None, got {type(generator).__name__}")


def check_count(n: Any) -> int:
    if not is_int(n) or n < 0:
        raise ValueError(f"n must be a non-negative int, got {n!r}")
    return int(n)


# The generators of live modules, by slot: the draw op (opaque to torch.compile, which cannot trace
# a call with a torch.Generator, so the graph stays whole) finds its module's generator here. A plain
# dict emptied by a finalizer of the module: torch.Generator takes no weak references in some torch
# versions (2.11).
_GENERATORS: "dict[int, torch.Generator]" = {}
_SLOTS = itertools.count()


@torch.library.custom_op("gpupipe::augment_uniforms", mutates_args=())
def _uniforms_op(n: int, count: int, slot: int) -> torch.Tensor:
    """float64 ``[n, count]`` uniforms in [0, 1) from a module's generator (slot < 0: torch's default)."""
    g = _GENERATORS.get(slot) if slot >= 0 else None
    return torch.rand(n, count, generator=g, dtype=torch.float64)


@_uniforms_op.register_fake
def _(n, count, slot):
    return torch.empty(n, count, dtype=torch.float64)


class GeneratorOwner:
    """Mixin of the modules with a ``generator``: sets it (:func:`as_generator`) and gives it a slot
    the draw op finds it by under torch.compile; copies (pickle, deepcopy) get their own slot."""

    generator: Optional[torch.Generator]
    _slot: int

    def _set_generator(self, generator: GeneratorLike) -> None:
        self.generator = as_generator(generator)
        self._register_generator()

    def _register_generator(self) -> None:
        self._slot = -1
        if self.generator is not None:
            self._slot = next(_SLOTS)
            _GENERATORS[self._slot] = self.generator
            weakref.finalize(self, _GENERATORS.pop, self._slot, None)

    def __setstate__(self, state):
        super().__setstate__(state)  # type: ignore[misc]
        self._register_generator()

    def _generator_uniforms(self, n: int, count: int) -> torch.Tensor:
        """float64 ``[n, count]`` uniforms in [0, 1) from the module's generator."""
        if torch.compiler.is_compiling():
            return torch.ops.gpupipe.augment_uniforms(n, count, self._slot)
        return torch.rand((n, count), generator=self.generator, dtype=torch.float64)


def draw_uniforms(n: int, count: int, *, stream: int, owner: GeneratorOwner, seed: Optional[int],
                  epoch: Optional[int], indices: Any) -> torch.Tensor:
    """float64 ``[n, count]`` uniforms in [0, 1) on the CPU (see the module docstring); unkeyed
    draws come from ``owner``'s generator."""
    n = check_count(n)
    if seed is None:
        if epoch is not None or indices is not None:
            raise ValueError("epoch and indices key the draws to a seed: pass seed as well")
        return owner._generator_uniforms(n, count)
    seed, epoch = key_int(seed, "seed"), 0 if epoch is None else key_int(epoch, "epoch")
    if indices is None:
        idx = np.arange(n, dtype=np.int64)
    else:
        idx = key_indices(indices)
        if idx.shape != (n,):
            raise ValueError(f"indices must have {n} entries (one per sample), got shape {tuple(idx.shape)}")
    u = keyed.uniforms(seed, epoch, idx, count, stream=stream)
    return torch.from_numpy(u)


def check_params(params: Any, n: int, shapes: Mapping[str, tuple], dtypes: Mapping[str, torch.dtype]) -> dict:
    """``params`` as a dict holding every key of ``shapes`` with shape ``(n, *shapes[key])`` and the
    dtype of ``dtypes[key]``; a clear ValueError otherwise (e.g. params from another batch size)."""
    if not isinstance(params, Mapping):
        raise TypeError(f"params must be a dict of tensors (a module's last_params), got {type(params).__name__}")
    missing = [k for k in shapes if k not in params]
    if missing:
        raise ValueError(f"params lack {missing} (expected the keys {list(shapes)})")
    for k, tail in shapes.items():
        v = params[k]
        if not isinstance(v, torch.Tensor):
            raise TypeError(f"params[{k!r}] must be a tensor, got {type(v).__name__}")
        if tuple(v.shape) != (n, *tail):
            raise ValueError(f"params[{k!r}] has shape {tuple(v.shape)}, expected {(n, *tail)}: params from "
                             f"another batch size or module?")
        if v.dtype != dtypes[k]:
            raise ValueError(f"params[{k!r}] must be {dtypes[k]}, got {v.dtype}")
    return dict(params)
