"""What GPU backends share: routing samples they cannot take to the CPU core inside the same batch."""

from __future__ import annotations

import numpy as np
import torch

from gpupipe import _C
from gpupipe._backends import cpu
from gpupipe.limits import get_limits

# read_header_infos color space codes (_C.COLORSPACES)
GRAY, YCBCR, RGB, CMYK, YCCK, OTHER = range(6)


def header_infos(datas) -> np.ndarray:
    """int64 [N, len(_C.INFO_COLUMNS)]: height, width, color space code, components, EXIF
    orientation, progressive, scans, error kind; -1 (and the kind) where unreadable."""
    out = np.empty((len(datas), len(_C.INFO_COLUMNS)), dtype=np.int64)
    if len(datas):
        _C.read_header_infos(datas, out.ctypes.data, out.nbytes)
    return out


def gpu_eligible(infos: np.ndarray, boxes: np.ndarray, datas=None) -> np.ndarray:
    """bool [N]: samples a GPU decoder can take with our semantics. The rest (unreadable headers,
    CMYK/YCCK, images over max_pixels or with more scans than max_scans, boxes outside the image)
    go to the CPU core, which gives each its exact result or its exact error message: gpupipe's
    limits hold whatever the backend."""
    h, w, cs = infos[:, 0], infos[:, 1], infos[:, 2]
    t, l, bh, bw = boxes.T
    inside = (t >= 0) & (l >= 0) & (bh >= 1) & (bw >= 1) & (t + bh <= h) & (l + bw <= w)
    limits = get_limits()
    ok = (h > 0) & np.isin(cs, (GRAY, YCBCR, RGB)) & (h * w <= limits.max_pixels) & inside
    ok &= infos[:, 6] <= limits.max_scans  # a scan bomb has thousands of SOS markers
    return ok


def cpu_subset(datas, boxes, indices, out_nhwc: torch.Tensor, *, resize, mode, strict, dct_scaling, num_threads):
    """Decodes datas[indices] with the CPU core and copies them into out_nhwc[indices] (any device).

    Returns ({original index: (class, message)}, {original index: warning})."""
    if len(indices) == 0:
        return {}, {}
    idx = np.asarray(indices, dtype=np.int64)
    tmp = torch.empty((len(idx), *out_nhwc.shape[1:]), dtype=torch.uint8, pin_memory=out_nhwc.is_cuda)
    failures, warns = cpu.decode_batch_nhwc([datas[i] for i in idx], np.ascontiguousarray(boxes[idx]), tmp,
                                            resize=resize, mode=mode, strict=strict, dct_scaling=dct_scaling,
                                            num_threads=num_threads)
    out_nhwc[torch.from_numpy(idx).to(out_nhwc.device)] = tmp.to(out_nhwc.device, non_blocking=True)
    return ({int(idx[i]): f for i, f in failures.items()}, {int(idx[i]): m for i, m in warns.items()})


def decode_with_fallback(name: str, gpu_decode, datas, boxes: np.ndarray, out_nhwc: torch.Tensor, *, resize, mode,
                         strict, dct_scaling, num_threads):
    """The frame every GPU backend shares: samples it cannot take (see gpu_eligible) and, when
    ``gpu_decode(indices)`` raises, the whole batch go to the CPU core inside the same batch.

    Returns (failures, warnings, fallback) dicts by index; ``fallback`` names what the CPU core
    decoded and why."""
    eligible = gpu_eligible(header_infos(datas), boxes, datas)
    fallback = {int(i): f"not decodable by {name} with gpupipe's semantics (header, color space, a limit or the box)"
                for i in np.flatnonzero(~eligible)}
    gpu_idx = np.flatnonzero(eligible)
    if len(gpu_idx):
        try:
            gpu_decode(gpu_idx)
        except Exception as e:  # GPU decoders fail a whole batch for one bad sample
            msg = f"{name} failed on the batch ({type(e).__name__}: {' '.join(str(e).split())[:240]}); decoded by the CPU core"
            fallback.update({int(i): msg for i in gpu_idx})
    failures, warns = cpu_subset(datas, boxes, sorted(fallback), out_nhwc, resize=resize, mode=mode, strict=strict,
                                 dct_scaling=dct_scaling, num_threads=num_threads or 0)
    return failures, warns, {i: m for i, m in fallback.items() if i not in failures}
