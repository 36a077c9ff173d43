"""Which decode backends work here, and picking one for ``backend=`` / ``device=``."""

from __future__ import annotations

import importlib.util

import torch

from gpupipe._backends import cpu, dali, hybrid, nvimgcodec, nvjpeg

BACKENDS = {"cpu": cpu, "hybrid": hybrid, "dali": dali, "nvjpeg": nvjpeg}  #: the one registry: name -> module
BACKEND_NAMES = ("auto", *BACKENDS)  #: what ``backend=`` accepts


def backends_available() -> dict:
    """``{name: {"available": bool, "devices": [...], "reason": str}}`` for cpu, hybrid, dali, nvjpeg
    and the fused augmentation's CUDA kernel. ``reason`` says why something is missing and what to do.

    Example:
        >>> import gpupipe
        >>> gpupipe.backends_available()["cpu"]["available"]
        True
    """
    cuda = torch.cuda.is_available()
    kernels_built = importlib.util.find_spec("gpupipe._C_cuda") is not None  # without importing augment
    no_cuda = "no CUDA device (torch.cuda.is_available() is False)"
    dali_reason = dali.unavailable_reason()
    nv_reason = nvjpeg.unavailable_reason()
    hybrid_reason = hybrid.unavailable_reason()
    return {
        "cpu": {"available": True, "devices": ["cpu"] + (["cuda"] if cuda else []),
                "reason": "" if cuda else "CPU decode; CUDA outputs need a CUDA device"},
        "hybrid": {"available": hybrid_reason is None, "devices": [] if hybrid_reason else ["cuda"],
                   "reason": hybrid_reason or ""},
        "dali": {"available": dali_reason is None,
                 "devices": [] if dali_reason else ["cpu"] + (["cuda"] if cuda else []),
                 "reason": dali_reason or ("" if cuda else f"CPU operators only: {no_cuda}")},
        "nvjpeg": {"available": nv_reason is None, "devices": [] if nv_reason else ["cuda"], "reason": nv_reason or ""},
        "cuda_kernels": {"available": kernels_built and cuda,
                         "devices": ["cuda"] if kernels_built and cuda else [],
                         "reason": "" if kernels_built and cuda else
                         ("built without a CUDA compiler" if not kernels_built else no_cuda)},
        "nvimgcodec": _nvimgcodec_entry(),
    }


def _nvimgcodec_entry() -> dict:
    """nvImageCodec's GPU decoders (the engines of backends nvjpeg and hybrid): the CUDA decoder,
    and ``hardware_decoder``: whether the GPU's JPEG engines work (A100, H100, B200). On a GPU this
    starts both once per process (a first decode each)."""
    reason = nvjpeg.engine_failure(torch.device("cuda")) if torch.cuda.is_available() else nvimgcodec.unavailable_reason()
    hardware = reason is None and nvimgcodec.hardware_decoder_available(torch.device("cuda"))
    return {"available": reason is None, "devices": [] if reason else ["cuda"], "hardware_decoder": hardware,
            "reason": reason or ("CUDA decoder and the GPU's hardware JPEG decoder" if hardware
                                 else "CUDA decoder only: this GPU has no hardware JPEG decoder")}


def resolve(backend: str, device: torch.device) -> str:
    """The backend that runs for (backend, device); raises a clear error when it cannot."""
    if device.type == "cpu" and (backend == "auto" or backend == "cpu"):
        return "cpu"  # the common case, first
    if backend not in BACKEND_NAMES:
        raise ValueError(f"backend must be one of {BACKEND_NAMES}, got {backend!r}")
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or a CUDA device, got {device}")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"device {device} requested but no CUDA device is available")
    if backend == "auto":
        if device.type == "cpu":
            return "cpu"  # the reference; DALI's CPU operators only when asked for
        if hybrid.unavailable_reason(device) is None:  # every engine of the node at once
            return "hybrid"
        if dali.unavailable_reason() is None:
            return "dali"
        return "nvjpeg" if nvjpeg.unavailable_reason() is None else "cpu"
    if backend in ("nvjpeg", "hybrid") and device.type != "cuda":
        raise ValueError(f"the {backend} backend decodes on the GPU: pass device='cuda'")
    if reason := BACKENDS[backend].unavailable_reason(device):
        raise RuntimeError(reason)
    return backend
