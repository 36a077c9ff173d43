"""``python -m gpupipe bench``: the images per second your recipe gets on your data, on this
machine, with the gpupipe Loader and with ``torch.utils.data.DataLoader`` (and DALI), side by side.

- :mod:`gpupipe.bench.dataset`: ``--data`` as a gpupipe source, the embedded default set, and the
  same files as a PIL dataset for the DataLoader.
- :mod:`gpupipe.bench.recipes`: the recipes (train, eval, forum, ...), one function each.
- :mod:`gpupipe.bench.run`: the command line and the timing.
- :mod:`gpupipe.bench.report`: environment, ``python -m gpupipe info``, table, JSON, plot.

The peer micro-benchmarks (decoders, augmentation engines) live in the source checkout's
``benchmarks/`` (``bash .ci/bench``).
"""

from gpupipe.bench.run import main

__all__ = ["main"]
