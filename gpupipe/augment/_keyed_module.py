"""KeyedModule: the base class of gpupipe's augmentation modules with keyed, replayable parameters
(:class:`~gpupipe.augment.BatchAugment`, the policies, :class:`~gpupipe.augment.RandomErasing`,
:class:`~gpupipe.augment.MixUp`, :class:`~gpupipe.augment.CutMix`).

Kornia's shape (``augmentation/base.py``: ``forward_parameters`` then ``apply_transform``): the
base owns the stream, the draw, the identity parameters and ``forward``; a module says how its
parameters come from uniforms and how they apply.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import nn

from gpupipe import keyed
from gpupipe.augment._keyed_params import GeneratorOwner, check_params, draw_uniforms


def like_input(out: Any, x: Any) -> Any:
    """``out`` as a ``tv_tensors.Image`` when ``x`` is one (torchvision v2's transforms keep it), else as is."""
    if type(x) is torch.Tensor or type(out) is not torch.Tensor:  # (the usual case: one check)
        return out
    from torchvision import tv_tensors

    return tv_tensors.wrap(out, like=x) if isinstance(x, tv_tensors.Image) else out


class KeyedModule(GeneratorOwner, nn.Module):
    """A module whose per-sample parameters are drawn, kept and replayed.

    ``forward(x, params=None)`` is :meth:`_forward`: in ``train()`` mode, draws
    :meth:`sample_params` for the batch; in ``eval()`` mode, takes :meth:`identity_params`; a
    caller's ``params`` are checked first (only those: drawn ones are valid by construction). The
    parameters go to ``last_params``, then apply.

    A subclass sets ``_stream_name`` (its stream is ``keyed.stream_of(_stream_name)``) and
    ``_draws`` (uniforms per sample), calls ``_set_generator(generator)``, and writes:

    - ``forward(x, params=None)``: ``return self._forward((x,), params)``, with its docstring. Each
      family of modules writes its own: torch.compile keeps its compiled graphs per code object of
      the frame it compiles, at most 8 (``recompile_limit``; ``fullgraph=True`` fails beyond), so
      one ``forward`` shared by every module would make a process that compiles a few modules
      fail;
    - ``_check_inputs(x)``: checks the inputs and returns the batch size;
    - ``_params_from_uniforms(u)``: the parameters from float64 uniforms ``[n, _draws]``;
    - ``_param_spec()``: ``(shapes, dtypes)``, the per-sample shape and the dtype of each key
      (the default check of a caller's parameters, and the identity: zeros);
    - ``_transform(x, params)``: the output (not ``_apply``: that name is nn.Module's own, behind
      ``.to()`` and ``.cuda()``);

    ``_transform_identity(x, params)`` says what ``eval()`` mode returns (default: ``x`` itself).
    """

    _stream_name: str
    _draws: int

    def __init__(self) -> None:
        super().__init__()
        self._stream = keyed.stream_of(self._stream_name)  # computed once: torch.compile cannot trace crc32
        self.last_params: Optional[dict] = None

    @property
    def stream(self) -> int:
        """This module's stream of :func:`gpupipe.keyed.uniforms`."""
        return self._stream

    def sample_params(self, n: int, *, seed: Optional[int] = None, epoch: Optional[int] = None,
                      indices: Any = None) -> dict:
        """Per-sample parameters for a batch of ``n``: a dict of CPU tensors with leading dim ``n``.

        With ``seed``, a pure function of (seed, epoch, sample index) (``epoch`` defaults to 0,
        ``indices``, the samples' dataset indices, to ``0..n-1``) through
        :func:`gpupipe.keyed.uniforms` on this module's :attr:`stream`, so a sample's parameters
        never depend on the batch it is in, the thread count or what ran before; without, drawn
        from the module's ``generator``. The keys are listed in the class's docstring.
        """
        u = draw_uniforms(n, self._draws, stream=self.stream, owner=self, seed=seed, epoch=epoch, indices=indices)
        return self._params_from_uniforms(u)

    def identity_params(self, n: int) -> Optional[dict]:
        """Parameters that change nothing, for a batch of ``n`` (what ``eval()`` mode keeps)."""
        shapes, dtypes = self._param_spec()
        return {k: torch.zeros((n, *shape), dtype=dtypes[k]) for k, shape in shapes.items()}

    def _forward(self, inputs: tuple, params: Optional[dict]) -> Any:
        """The forward template (see the class docstring); ``inputs``: forward's, without params."""
        n = self._check_inputs(*inputs)
        if params is None:
            if not self.training:
                self.last_params = self.identity_params(n)
                return like_input(self._transform_identity(*inputs, self.last_params), inputs[0])
            params = self.sample_params(n)
        else:
            params = self._checked_params(params, n)
        self.last_params = params
        return like_input(self._transform(*inputs, params), inputs[0])

    def _checked_params(self, params: Any, n: int) -> dict:
        """A caller's ``params`` checked against :meth:`_param_spec` (a clear error otherwise)."""
        return check_params(params, n, *self._param_spec())

    def _transform_identity(self, x: torch.Tensor, params: Optional[dict]) -> Any:
        return x

    # --- written by the subclasses ----------------------------------------------------------------

    def _check_inputs(self, *inputs: Any) -> int:
        raise NotImplementedError

    def _params_from_uniforms(self, u: torch.Tensor) -> dict:
        raise NotImplementedError

    def _param_spec(self) -> tuple[dict, dict]:
        raise NotImplementedError

    def _transform(self, *inputs: Any) -> Any:
        raise NotImplementedError
