"""Peer decoders, each behind the same small interface, imported lazily; unavailable ones report why."""

from __future__ import annotations

import io
from typing import Callable, Optional

import numpy as np


def unavailable(module: str) -> Optional[str]:
    try:
        __import__(module)
        return None
    except Exception as e:  # ImportError, or a broken install
        return f"{module} not importable ({type(e).__name__})"


def pil_crop(datas, boxes) -> Callable[[], list]:
    from PIL import Image

    def run():
        return [
            Image.open(io.BytesIO(d)).convert("RGB").crop((l, t, l + w, t + h))
            for d, (t, l, h, w) in zip(datas, boxes)
        ]

    return run


def torchvision_crop(datas, boxes) -> Callable[[], list]:
    import torch
    from torchvision.io import decode_jpeg

    tensors = [torch.frombuffer(bytearray(d), dtype=torch.uint8) for d in datas]

    def run():
        return [decode_jpeg(x)[:, t : t + h, l : l + w] for x, (t, l, h, w) in zip(tensors, boxes)]

    return run


def simplejpeg_crop(datas, boxes) -> Callable[[], list]:
    import simplejpeg

    def run():
        return [simplejpeg.decode_jpeg(d)[t : t + h, l : l + w] for d, (t, l, h, w) in zip(datas, boxes)]

    return run


class DaliCpu:
    """A DALI CPU pipeline (device_id=None) over one batch: decoders.image_slice with absolute
    anchors, optionally followed by an antialiased resize. Built once, fed per call."""

    def __init__(self, batch_size: int, num_threads: int, resize: Optional[tuple[int, int]] = None):
        import nvidia.dali.fn as fn
        import nvidia.dali.types as types
        from nvidia.dali import pipeline_def

        @pipeline_def(batch_size=batch_size, num_threads=num_threads, device_id=None, exec_dynamic=True, prefetch_queue_depth=1)
        def pipe():
            data = fn.external_source(name="data", dtype=types.UINT8)
            anchor = fn.external_source(name="anchor", dtype=types.INT64)
            shape = fn.external_source(name="shape", dtype=types.INT64)
            img = fn.decoders.image_slice(data, anchor, shape, normalized_anchor=False, normalized_shape=False, device="cpu")
            if resize is not None:
                img = fn.resize(img, resize_x=resize[1], resize_y=resize[0], antialias=True, interp_type=types.INTERP_LINEAR)
            return img

        self.pipe = pipe()
        self.pipe.build()

    def runner(self, datas, boxes) -> Callable[[], object]:
        arrays = [np.frombuffer(d, dtype=np.uint8) for d in datas]
        anchors = [np.array([l, t], dtype=np.int64) for (t, l, h, w) in boxes]  # DALI: (x, y)
        shapes = [np.array([w, h], dtype=np.int64) for (t, l, h, w) in boxes]

        def run():
            self.pipe.feed_input("data", arrays)
            self.pipe.feed_input("anchor", anchors)
            self.pipe.feed_input("shape", shapes)
            (out,) = self.pipe.run()
            return out

        return run
