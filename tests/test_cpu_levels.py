"""The CPU kernels at every instruction set level this CPU runs (csrc/common/multiversion.h): each level
gives the bytes of the baseline x86-64 build, on shapes that reach the vector loops' tails, the
explicit AVX-512 kernels' edges (a table lookup's last partial block, the gather's last column) and
every layout (planar, channels-last, a cropped view with padded rows); the resampler stays Pillow's
at each level. GPUPIPE_CPU_CAPABILITY lowers the level at import; a wrong value warns."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import gpupipe
from gpupipe.augment import AutoAugment, BatchAugment, CutMix, MixUp, RandAugment, RandomErasing, TrivialAugmentWide
from gpupipe.augment._policy_kernels import KINDS, INTERPOLATIONS, _policy_apply_cpu
from helpers import encode, full_decode, photo, photo_batch, run_child
from test_resize import pil_resize


def levels_here() -> list[str]:
    """The levels this CPU runs, narrowest first (a level above the CPU's runs as the CPU's)."""
    supported = gpupipe.cpu_capability()["supported"]
    names = gpupipe.limits.CPU_CAPABILITIES
    return list(names[: names.index(supported) + 1])


wider = pytest.mark.skipif(len(levels_here()) < 2, reason="this CPU runs only the baseline level")


@pytest.fixture(autouse=True)
def restore_level():
    before = gpupipe.cpu_capability()["active"]
    yield
    gpupipe.set_cpu_capability(before)


def at_every_level(fn):
    """{level: fn()} for every level this CPU runs."""
    out = {}
    for name in levels_here():
        assert gpupipe.set_cpu_capability(name) == name
        out[name] = fn()
    return out


def assert_levels_equal(results: dict, what: str = ""):
    base = results["default"]
    for name, got in results.items():
        for a, b in zip(base if isinstance(base, tuple) else (base,), got if isinstance(got, tuple) else (got,)):
            assert torch.equal(a, b), f"{what}: level {name} differs from the baseline build"


def test_the_level_api():
    cap = gpupipe.cpu_capability()
    assert cap["supported"] in gpupipe.limits.CPU_CAPABILITIES and cap["active"] in gpupipe.limits.CPU_CAPABILITIES
    assert gpupipe.set_cpu_capability("default") == "default"
    assert gpupipe.cpu_capability()["active"] == "default"
    assert gpupipe.set_cpu_capability("avx512_vbmi") == cap["supported"]  # capped at the CPU's
    with pytest.raises(ValueError, match="unknown CPU capability 'sse9'"):
        gpupipe.set_cpu_capability("sse9")


def test_the_environment_variable_lowers_the_level_at_import():
    code = "import gpupipe; print(gpupipe.cpu_capability()['active'])"
    assert run_child(code, env={"GPUPIPE_CPU_CAPABILITY": "default"}).stdout.strip() == "default"
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                           env=dict(os.environ, GPUPIPE_CPU_CAPABILITY="avx1024"))
    supported = gpupipe.cpu_capability()["supported"]
    assert child.returncode == 0 and child.stdout.strip() == supported  # ignored, as torch ignores a wrong value
    assert f"RuntimeWarning: GPUPIPE_CPU_CAPABILITY='avx1024' is not one of" in child.stderr


def test_each_level_runs_its_own_build():
    """The wider paths do run: a dispatched kernel reports the level it was built for."""
    for name in levels_here():
        gpupipe.set_cpu_capability(name)
        assert gpupipe._C._dispatch_level() == name


# Widths around the 64-byte blocks of the table lookup (3 * w bytes) and the 16-pixel gather steps.
SHAPES = [(7, 5), (9, 21), (13, 22), (16, 64), (11, 85), (33, 224)]


@wider
@pytest.mark.parametrize("h, w", SHAPES)
@pytest.mark.parametrize("layout", ["channels_last", "planar", "cropped"])
def test_every_policy_op_is_the_same_at_every_level(h, w, layout):
    n = 6
    if layout == "cropped":  # a channels-last view with padded rows (row stride 3 * (w + 5))
        x = photo_batch(n, h + 3, w + 5, seed=h * w)[:, :, 1 : h + 1, 2 : w + 2]
    else:
        x = photo_batch(n, h, w, seed=h * w, channels_last=layout == "channels_last")
    c, s = math.cos(0.4), math.sin(0.4)
    cx, cy = (w - 1) / 2, (h - 1) / 2
    matrices = {
        "rotate": [c, -s, cx - c * cx + s * cy, s, c, cy - s * cx - c * cy],
        "shear": [1.0, 0.3, -0.3 * cy, 0.0, 1.0, 0.0],
        "translate": [1.0, 0.0, 3.0, 0.0, 1.0, -2.0],
        "mirror-ish": [-1.0, 0.0, w - 0.5, 0.0, 1.0, 0.0],
    }
    cases = [(k, p, None) for k, p in [("identity", 0), ("brightness", 1.7), ("color", 0.3), ("contrast", 1.6),
                                        ("sharpness", 1.9), ("posterize", 3), ("solarize", 100),
                                        ("autocontrast", 0), ("equalize", 0), ("invert", 0)]]
    cases += [("affine", 0, m) for m in matrices.values()]
    for kind, param, matrix in cases:
        for interpolation in ("nearest", "bilinear"):
            for fill in (None, [12.0, 200.0, 99.0]):
                if kind != "affine" and (interpolation, fill) != ("nearest", None):
                    continue
                kinds = torch.full((n, 2), KINDS[kind], dtype=torch.int64)
                kinds[::2, 1] = KINDS["equalize"]  # a two-op run on half the samples: folded tables
                params = torch.full((n, 2), float(param), dtype=torch.float64)
                mats = torch.zeros((n, 2, 6))
                mats[..., 0] = mats[..., 4] = 1.0
                if matrix is not None:
                    mats[:, 0] = torch.tensor(matrix)
                got = at_every_level(lambda: _policy_apply_cpu(x, kinds, params, mats, INTERPOLATIONS[interpolation],
                                                               fill))
                assert_levels_equal(got, f"{kind} {interpolation} fill={fill} {h}x{w}")


@wider
@pytest.mark.parametrize("cls", [TrivialAugmentWide, RandAugment, AutoAugment])
def test_policies_are_the_same_at_every_level(cls):
    x = photo_batch(24, 45, 67, seed=3)
    got = at_every_level(lambda: cls(generator=0)(x))
    assert_levels_equal(got, cls.__name__)


@wider
@pytest.mark.parametrize("rotation, interpolation", [(25, "bilinear"), (40, "nearest"), (0, "bilinear")])
@pytest.mark.parametrize("color", ["torchvision", "linear"])
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_batch_augment_is_the_same_at_every_level(rotation, interpolation, color, out_dtype):
    x = photo_batch(5, 37, 53, seed=1)
    module = dict(hflip=0.5, vflip=0.5, rotation=rotation, interpolation=interpolation, fill=[0.2, 0.5, 0.9],
                  brightness=0.4, contrast=0.4, saturation=0.4, hue=0.1, grayscale=0.2, color=color,
                  out_dtype=out_dtype, generator=0)
    got = at_every_level(lambda: BatchAugment(**module)(x))
    assert_levels_equal(got, f"BatchAugment {rotation} {interpolation} {color} {out_dtype}")


@wider
@pytest.mark.parametrize("interpolation", ["nearest", "bilinear"])
def test_warp_affine_is_the_same_at_every_level(interpolation):
    x = photo_batch(4, 29, 71, seed=2)
    m = torch.tensor([[0.9, -0.4, 12.0, 0.4, 0.9, -9.0]]).repeat(4, 1).view(4, 2, 3)
    for out_dtype in (torch.uint8, torch.float32):
        got = at_every_level(lambda: gpupipe.augment.warp_affine(x, m, interpolation=interpolation,
                                                                 fill=[3.0, 7.0, 250.0], out_dtype=out_dtype))
        assert_levels_equal(got, f"warp_affine {interpolation} {out_dtype}")


@wider
def test_mix_and_erasing_are_the_same_at_every_level():
    x = photo_batch(6, 33, 47, seed=4).float().div(255).contiguous()
    labels = torch.arange(6) % 3

    def run():
        mixed, soft = MixUp(alpha=0.4, num_classes=3, generator=0)(x, labels)
        cut, cut_soft = CutMix(alpha=1.0, num_classes=3, generator=0)(x, labels)
        erased = RandomErasing(p=1.0, value=0.5, generator=0)(x)
        return mixed, soft, cut, cut_soft, erased

    assert_levels_equal(at_every_level(run), "MixUp / CutMix / RandomErasing")


@wider
def test_the_resampler_is_pillows_at_every_level():
    jpeg = encode(photo(), quality=90)
    full = full_decode(jpeg)
    rng = np.random.default_rng(5)
    for _ in range(12):
        t, l = (int(v) for v in rng.integers(0, 50, 2))
        h, w = int(rng.integers(1, full.shape[0] - t + 1)), int(rng.integers(1, full.shape[1] - l + 1))
        size = tuple(int(v) for v in rng.integers(1, 200, 2))
        ref = pil_resize(np.ascontiguousarray(full[t:t + h, l:l + w]), size)
        for name in levels_here():
            gpupipe.set_cpu_capability(name)
            got = gpupipe.decode_crop_jpeg(jpeg, t, l, h, w, size=size, dct_scaling=False).permute(1, 2, 0).numpy()
            np.testing.assert_array_equal(got, ref, err_msg=f"level {name}, box {(t, l, h, w)} -> {size}")
