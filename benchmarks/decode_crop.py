"""Random 256x256 crops, one thread, every peer in the same process run.

gpupipe.decode_crop_jpeg (ROI decode) vs Pillow (open + convert + crop), torchvision.io.decode_jpeg
+ slice, simplejpeg + slice, and DALI CPU decoders.image_slice (when installed).
"""

from __future__ import annotations

import numpy as np
import torch

import gpupipe
from benchmarks import peers
from benchmarks.harness import run_side_by_side


def random_boxes(datas, crop: int, seed: int = 0) -> np.ndarray:
    """One fixed random crop x crop box per image (the same boxes for every method)."""
    sizes = np.array([gpupipe.read_header(d)[:2] for d in datas])
    u = gpupipe.crops.uniforms(seed, 0, np.arange(len(datas)), 2)
    top = (u[:, 0] * (sizes[:, 0] - crop + 1)).astype(np.int64)
    left = (u[:, 1] * (sizes[:, 1] - crop + 1)).astype(np.int64)
    return np.stack([top, left, np.full_like(top, crop), np.full_like(top, crop)], axis=1)


def run(sets: dict[str, list[bytes]], crop: int = 256, repeats: int = 7) -> list:
    torch.set_num_threads(1)
    rows = []
    for name, datas in sets.items():
        boxes = [tuple(int(v) for v in b) for b in random_boxes(datas, crop)]
        methods, skipped = {}, {}

        def gp():
            return [gpupipe.decode_crop_jpeg(d, *b) for d, b in zip(datas, boxes)]

        methods["gpupipe"] = gp
        for label, module, make in (
            ("PIL", "PIL", peers.pil_crop),
            ("torchvision", "torchvision", peers.torchvision_crop),
            ("simplejpeg", "simplejpeg", peers.simplejpeg_crop),
        ):
            reason = peers.unavailable(module)
            if reason:
                skipped[label] = reason
            else:
                methods[label] = make(datas, boxes)
        reason = peers.unavailable("nvidia.dali")
        if reason:
            skipped["DALI CPU"] = reason
        else:
            methods["DALI CPU"] = peers.DaliCpu(len(datas), 1).runner(datas, boxes)
        w, h = gpupipe.read_header(datas[0])[1], gpupipe.read_header(datas[0])[0]
        rows += run_side_by_side(f"decode+crop {crop}: {name} {w}x{h}, 1 thread", methods, len(datas), repeats=repeats, skipped=skipped)
    return rows


def restart_markers(datas: list[bytes], crop: int = 256, repeats: int = 7, label: str = "hd 1920x1280") -> list:
    """256 crops on files prepared with restart markers (gpupipe.prepare) vs the same files
    unprepared (our normal ROI path) vs DALI CPU on the unprepared files; 1 thread, same boxes."""
    from gpupipe.prepare import prepare_bytes

    torch.set_num_threads(1)
    prepared = [prepare_bytes(d) for d in datas]
    overhead = sum(map(len, prepared)) / sum(map(len, datas)) - 1
    boxes = [tuple(int(v) for v in b) for b in random_boxes(datas, crop, seed=4)]
    methods = {
        "gpupipe, prepared files": lambda: [gpupipe.decode_crop_jpeg(d, *b) for d, b in zip(prepared, boxes)],
        "gpupipe, original files": lambda: [gpupipe.decode_crop_jpeg(d, *b) for d, b in zip(datas, boxes)],
    }
    skipped = {}
    reason = peers.unavailable("nvidia.dali")
    if reason:
        skipped["DALI CPU, original files"] = reason
    else:
        methods["DALI CPU, original files"] = peers.DaliCpu(len(datas), 1).runner(datas, boxes)
    notes = {"gpupipe, prepared files": f"restart markers, size {100 * overhead:+.2f}%"}
    return run_side_by_side(f"restart-marker crops {crop}: {label}, 1 thread", methods, len(datas), repeats=repeats,
                            skipped=skipped, notes=notes)
