"""The entries of the containers (:class:`~gpupipe.augment.Compose`, :class:`~gpupipe.augment.RandomChoice`).

A container keeps its transforms in one registered ``nn.ModuleList`` and runs what that list holds,
so a child replaced through it (``chain.transforms[1] = other``, a tool that swaps submodules by
name) is the child that runs, and ``repr`` / ``modules()`` show what runs. A plain callable is held
by a :class:`CallableEntry` that adds no parameters, buffers or state-dict keys.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from torch import nn


class CallableEntry(nn.Module):
    """A plain callable as an entry of a container's ``ModuleList``; ``repr`` is the callable's."""

    def __init__(self, fn: Callable):
        super().__init__()
        self.fn = fn

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return repr(self.fn)


def container_entries(transforms: Sequence[Any], what: str) -> nn.ModuleList:
    """The checked transforms as one ``ModuleList``, plain callables wrapped in :class:`CallableEntry`."""
    if isinstance(transforms, nn.Module) or not isinstance(transforms, Sequence) or not transforms:
        raise ValueError(f"transforms must be a non-empty sequence of {what}")
    if not all(callable(t) for t in transforms):
        raise TypeError("every entry of transforms must be callable")
    return nn.ModuleList([t if isinstance(t, nn.Module) else CallableEntry(t) for t in transforms])


def unwrap(entry: nn.Module) -> Any:
    """What an entry runs: the module itself, or the callable a :class:`CallableEntry` holds (whose
    ``sample_params`` / ``last_params`` / ``samples_independent`` the container reads)."""
    return entry.fn if isinstance(entry, CallableEntry) else entry
