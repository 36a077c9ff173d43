"""BatchAugment: the per-sample PIL chain (flip, rotation, color jitter, grayscale, ToTensor,
Normalize) as one batched ``nn.Module`` on the device."""

from __future__ import annotations

import math
from typing import Optional, Sequence, Union

import torch
from torch import nn

from gpupipe.augment.color_matrix import color_matrices
from gpupipe.augment.fused import OUT_DTYPES, OutputCache, channel_means, fused_color_affine, fused_color_affine_torch

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

Range = Union[float, Sequence[float]]
PARAM_KEYS = ("hflip", "vflip", "angle", "brightness", "contrast", "saturation", "hue", "grayscale")


def _factor_range(value: Range, name: str) -> tuple[float, float]:
    """torchvision's ColorJitter convention: a float v means [max(0, 1 - v), 1 + v]."""
    if isinstance(value, (int, float)):
        if value < 0:
            raise ValueError(f"{name} must be non-negative, got {value}")
        return (max(0.0, 1.0 - value), 1.0 + value)
    lo, hi = (float(v) for v in value)
    if not 0 <= lo <= hi:
        raise ValueError(f"{name} range must satisfy 0 <= min <= max, got {value}")
    return (lo, hi)


def _symmetric_range(value: Range, name: str, bound: Optional[float] = None) -> tuple[float, float]:
    if isinstance(value, (int, float)):
        if value < 0:
            raise ValueError(f"{name} must be non-negative, got {value}")
        lo, hi = -float(value), float(value)
    else:
        lo, hi = (float(v) for v in value)
    if lo > hi or (bound is not None and (lo < -bound or hi > bound)):
        raise ValueError(f"{name} must be within [-{bound}, {bound}] with min <= max, got {value}")
    return (lo, hi)


def _probability(p: float, name: str) -> float:
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"{name} must be a probability in [0, 1], got {p}")
    return float(p)


class BatchAugment(nn.Module):
    """Batched, per-sample augmentation and normalisation, as one module on the input's device.

    Args:
        hflip, vflip: probability of a horizontal / vertical flip per sample.
        rotation: degrees ``d`` (uniform in [-d, d]) or a (min, max) range; bilinear, zero padding.
        brightness, contrast, saturation: torchvision ColorJitter ranges (``v`` -> [1-v, 1+v]).
        hue: turns, ``v`` -> [-v, v] with v <= 0.5.
        grayscale: probability of converting a sample to gray (three equal channels).
        mean, std: normalisation per channel on the [0, 1] scale.
        out_dtype: float32, bfloat16 or float16.
        engine: ``"fused"``: the color chain, flips and normalisation in one pass (CUDA kernel on
            CUDA tensors, its C++ host build on CPU), see :mod:`gpupipe.augment.color_matrix` for
            the exact math and how it differs from Kornia. Rotation, when enabled, runs first as one
            Kornia warp. ``"kornia"``: Kornia's functional ops with Kornia's (= torchvision's)
            semantics, clamping between ops, HSV hue; the reference.
        generator: a ``torch.Generator`` (CPU) or an int seed, for reproducible parameters.
        reuse_outputs: on the CPU, hand out again output buffers nothing references any more (no
            reference, view or DLPack export left), saving the page faults of a fresh allocation
            per batch. A batch you keep is never overwritten.

    Shapes:
        input: uint8 ``[N, 3, H, W]`` (any memory format; channels-last is gpupipe's decode output)
        or float in [0, 1], on any device. Output: ``out_dtype`` ``[N, 3, H, W]`` contiguous,
        normalised, on the same device.

    ``train()`` samples new per-sample parameters every call, stored in ``last_params`` (a dict of
    ``(N,)`` CPU tensors); ``module(x, params=p)`` replays them. ``eval()`` only converts and
    normalises, so the module can sit in a model's ``forward``.

    Example:
        >>> import torch
        >>> from gpupipe.augment import BatchAugment
        >>> aug = BatchAugment(hflip=0.5, brightness=0.4, contrast=0.4, saturation=0.4, generator=0)
        >>> x = torch.randint(0, 256, (8, 3, 32, 32), dtype=torch.uint8)
        >>> y = aug(x)
        >>> y.shape, y.dtype
        (torch.Size([8, 3, 32, 32]), torch.float32)
        >>> torch.equal(aug(x, params=aug.last_params), y)
        True
    """

    def __init__(
        self,
        *,
        hflip: float = 0.5,
        vflip: float = 0.0,
        rotation: Range = 0.0,
        brightness: Range = 0.0,
        contrast: Range = 0.0,
        saturation: Range = 0.0,
        hue: Range = 0.0,
        grayscale: float = 0.0,
        mean: Sequence[float] = IMAGENET_MEAN,
        std: Sequence[float] = IMAGENET_STD,
        out_dtype: torch.dtype = torch.float32,
        engine: str = "fused",
        generator: Union[torch.Generator, int, None] = None,
        reuse_outputs: bool = True,
    ):
        super().__init__()
        if engine not in ("fused", "kornia"):
            raise ValueError(f"engine must be 'fused' or 'kornia', got {engine!r}")
        if out_dtype not in OUT_DTYPES:
            raise ValueError(f"out_dtype must be one of {list(OUT_DTYPES)}, got {out_dtype}")
        if len(mean) != 3 or len(std) != 3 or min(std) <= 0:
            raise ValueError("mean and std need 3 entries, std > 0")
        self.hflip = _probability(hflip, "hflip")
        self.vflip = _probability(vflip, "vflip")
        self.grayscale = _probability(grayscale, "grayscale")
        self.rotation = _symmetric_range(rotation, "rotation")
        self.brightness = _factor_range(brightness, "brightness")
        self.contrast = _factor_range(contrast, "contrast")
        self.saturation = _factor_range(saturation, "saturation")
        self.hue = _symmetric_range(hue, "hue", bound=0.5)
        self.mean = tuple(float(m) for m in mean)
        self.std = tuple(float(s) for s in std)
        self.out_dtype = out_dtype
        self.engine = engine
        if isinstance(generator, int):
            generator = torch.Generator().manual_seed(generator)
        self.generator = generator
        self.reuse_outputs = reuse_outputs
        self._outputs = OutputCache()
        self.last_params: Optional[dict] = None
        self.last_path: Optional[str] = None  # which implementation ran: "cuda-kernel", "cpu-kernel", "torch", "kornia"

    # --- parameters -------------------------------------------------------------------------------

    def sample_params(self, n: int) -> dict:
        """Per-sample parameters for a batch of n: a dict of ``(n,)`` CPU tensors."""
        g = self.generator

        def uniform(lo, hi):
            return lo + (hi - lo) * torch.rand(n, generator=g, dtype=torch.float64)

        return {
            "hflip": torch.rand(n, generator=g) < self.hflip,
            "vflip": torch.rand(n, generator=g) < self.vflip,
            "angle": uniform(*self.rotation),
            "brightness": uniform(*self.brightness),
            "contrast": uniform(*self.contrast),
            "saturation": uniform(*self.saturation),
            "hue": uniform(*self.hue),
            "grayscale": torch.rand(n, generator=g) < self.grayscale,
        }

    @staticmethod
    def identity_params(n: int) -> dict:
        false = torch.zeros(n, dtype=torch.bool)
        zero = torch.zeros(n, dtype=torch.float64)
        one = torch.ones(n, dtype=torch.float64)
        return {"hflip": false, "vflip": false.clone(), "angle": zero, "brightness": one, "contrast": one.clone(),
                "saturation": one.clone(), "hue": zero.clone(), "grayscale": false.clone()}

    # --- forward ----------------------------------------------------------------------------------

    def forward(self, x: torch.Tensor, params: Optional[dict] = None) -> torch.Tensor:
        if x.dim() != 4 or x.shape[1] != 3:
            raise ValueError(f"expected [N, 3, H, W] images, got shape {tuple(x.shape)}")
        if x.dtype != torch.uint8 and not x.is_floating_point():
            raise ValueError(f"expected uint8 or floating-point images, got {x.dtype}")
        n = x.shape[0]
        if params is None:
            params = self.sample_params(n) if self.training else self.identity_params(n)
        missing = set(PARAM_KEYS) - set(params)
        if missing:
            raise ValueError(f"params lack {sorted(missing)}")
        if any(params[k].shape != (n,) for k in PARAM_KEYS):
            raise ValueError(f"every param must have shape ({n},)")
        self.last_params = params
        p = {k: v.to(x.device) for k, v in params.items()}
        if self.engine == "kornia":
            self.last_path = "kornia"
            return self._kornia(x, p)
        return self._fused(x, p)

    def _to_unit_float(self, x: torch.Tensor) -> torch.Tensor:
        return x.float().div_(255.0) if x.dtype == torch.uint8 else x.float()

    def _fused(self, x: torch.Tensor, p: dict) -> torch.Tensor:
        hflip, vflip = p["hflip"], p["vflip"]
        if bool((p["angle"] != 0).any()):
            # Rotation is a resampling, not a color op: one Kornia warp on [0, 1] floats (after the
            # flips, as the Kornia engine orders them), then the color pass without flips.
            import kornia

            x = self._to_unit_float(x)
            x = torch.where(hflip[:, None, None, None], x.flip(-1), x)
            x = torch.where(vflip[:, None, None, None], x.flip(-2), x)
            x = kornia.geometry.transform.rotate(x, p["angle"].to(x.dtype), padding_mode="zeros")
            hflip = torch.zeros_like(hflip)
            vflip = torch.zeros_like(vflip)
        scale = 1 / 255 if x.dtype == torch.uint8 else 1.0
        if x.dtype not in (torch.uint8, torch.float32):
            x = x.float()
        means = None
        if bool((p["contrast"] != 1).any()):
            means = channel_means(x)
        m = color_matrices(p, self.mean, self.std, input_scale=scale, channel_means=means).to(torch.float32)
        if x.device.type == "cpu" and self.reuse_outputs and not torch.compiler.is_compiling():
            self.last_path = "cpu-kernel"
            out = self._outputs.get((x.shape[0], 3, x.shape[2], x.shape[3]), self.out_dtype)
            torch.ops.gpupipe.fused_color_affine_out(x, m, hflip, vflip, out)
            return out
        if x.device.type in ("cpu", "cuda"):
            self.last_path = f"{x.device.type}-kernel"
            return fused_color_affine(x, m, hflip, vflip, self.out_dtype)
        self.last_path = "torch"
        return fused_color_affine_torch(x, m, hflip, vflip, self.out_dtype)

    def _kornia(self, x: torch.Tensor, p: dict) -> torch.Tensor:
        import kornia
        from kornia.enhance import (adjust_brightness_accumulative, adjust_contrast_with_mean_subtraction,
                                    adjust_hue, adjust_saturation_with_gray_subtraction)

        x = self._to_unit_float(x)
        x = torch.where(p["hflip"][:, None, None, None], x.flip(-1), x)
        x = torch.where(p["vflip"][:, None, None, None], x.flip(-2), x)
        if bool((p["angle"] != 0).any()):
            x = kornia.geometry.transform.rotate(x, p["angle"].to(x.dtype), padding_mode="zeros")
        f = {k: p[k].to(x.dtype) for k in ("brightness", "contrast", "saturation", "hue")}
        # kornia.augmentation.ColorJitter(order=(0, 1, 2, 3)): clamp, then each step; a step whose
        # factors are all neutral is skipped, as Kornia does.
        x = x.clamp(0, 1)
        if bool((f["brightness"] != 1).any()):
            x = adjust_brightness_accumulative(x, f["brightness"]).clamp(0, 1)
        if bool((f["contrast"] != 1).any()):
            x = adjust_contrast_with_mean_subtraction(x, f["contrast"]).clamp(0, 1)
        if bool((f["saturation"] != 1).any()):
            x = adjust_saturation_with_gray_subtraction(x, f["saturation"]).clamp(0, 1)
        if bool((f["hue"] != 0).any()):
            x = adjust_hue(x, f["hue"] * 2 * math.pi)
        x = x.clamp(0, 1)
        if bool(p["grayscale"].any()):
            gray = kornia.color.rgb_to_grayscale(x).expand_as(x)
            x = torch.where(p["grayscale"][:, None, None, None], gray, x)
        mean = torch.tensor(self.mean, dtype=x.dtype, device=x.device)[None, :, None, None]
        std = torch.tensor(self.std, dtype=x.dtype, device=x.device)[None, :, None, None]
        return ((x - mean) / std).to(self.out_dtype).contiguous()

    def extra_repr(self) -> str:
        return (f"engine={self.engine!r}, hflip={self.hflip}, vflip={self.vflip}, rotation={self.rotation}, "
                f"brightness={self.brightness}, contrast={self.contrast}, saturation={self.saturation}, "
                f"hue={self.hue}, grayscale={self.grayscale}, out_dtype={self.out_dtype}")
