"""BatchAugment: the fused engine against a float64 reference of its own definition and against
the Kornia engine where the semantics coincide; the Kornia engine against kornia.augmentation."""

import math
import shutil

import pytest
import torch

from gpupipe.augment import IMAGENET_MEAN, IMAGENET_STD, BatchAugment, color_matrices, fused_color_affine
from gpupipe.augment import fused as fused_mod

DEVICES = [pytest.param("cpu")] + [pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"))]


def images(n=8, h=24, w=36, lo=0, hi=256, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(lo, hi, (n, 3, h, w), generator=g, dtype=torch.uint8)
    return x.contiguous(memory_format=torch.channels_last).to(device)


FULL = dict(hflip=0.5, vflip=0.3, brightness=0.4, contrast=0.4, saturation=0.4, hue=0.1, grayscale=0.25)


def reference_float64(x_u8: torch.Tensor, p: dict, mean=IMAGENET_MEAN, std=IMAGENET_STD) -> torch.Tensor:
    """The fused engine's definition applied op by op in float64 (no matrix folding, no clamps)."""
    x = x_u8.to(torch.float64).cpu() / 255
    x = torch.where(p["hflip"][:, None, None, None], x.flip(-1), x)
    x = torch.where(p["vflip"][:, None, None, None], x.flip(-2), x)
    w = torch.tensor([0.299, 0.587, 0.114], dtype=torch.float64)
    gray = lambda t: torch.einsum("c,nchw->nhw", w, t)[:, None]  # noqa: E731
    b, c, s = (p[k].double()[:, None, None, None] for k in ("brightness", "contrast", "saturation"))
    x = x * b
    x = c * x + (1 - c) * gray(x).mean(dim=(2, 3), keepdim=True)
    x = s * x + (1 - s) * gray(x)
    yiq = torch.tensor([[0.299, 0.587, 0.114], [0.595716, -0.274453, -0.321263], [0.211456, -0.522591, 0.311135]], dtype=torch.float64)
    y = torch.einsum("kc,nchw->nkhw", yiq, x)
    th = -2 * math.pi * p["hue"].double()[:, None, None]
    i, q = y[:, 1], y[:, 2]
    y = torch.stack([y[:, 0], torch.cos(th) * i - torch.sin(th) * q, torch.sin(th) * i + torch.cos(th) * q], dim=1)
    x = torch.einsum("ck,nkhw->nchw", torch.linalg.inv(yiq), y)
    x = torch.where(p["grayscale"][:, None, None, None], gray(x).expand_as(x), x)
    m = torch.tensor(mean, dtype=torch.float64)[None, :, None, None]
    sd = torch.tensor(std, dtype=torch.float64)[None, :, None, None]
    return (x - m) / sd


@pytest.mark.parametrize("device", DEVICES)
def test_fused_matches_float64_reference(device):
    x = images(16, device=device)
    aug = BatchAugment(**FULL, generator=1)
    out = aug(x)
    ref = reference_float64(x, aug.last_params)
    # float32 math on normalised values of magnitude <= ~3: 2e-5 absolute
    torch.testing.assert_close(out.double().cpu(), ref, rtol=0, atol=2e-5)
    assert aug.last_path == f"{device}-kernel"  # the fast path really ran


def test_fused_kernel_equals_torch_path():
    x = images(8)
    aug = BatchAugment(**FULL, generator=2)
    aug(x)
    p = aug.last_params
    m = color_matrices(p, IMAGENET_MEAN, IMAGENET_STD, input_scale=1 / 255,
                       channel_means=x.sum(dim=(2, 3), dtype=torch.float64) / (24 * 36)).float()
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        k = fused_color_affine(x, m, p["hflip"], p["vflip"], dtype)
        t = fused_mod.fused_color_affine_torch(x, m, p["hflip"], p["vflip"], dtype)
        assert k.dtype == dtype and k.is_contiguous()
        assert torch.equal(k, t), dtype


def test_half_and_bfloat16_conversion_is_torchs():
    special = [0.0, -0.0, 1.0, -1.0, 65504.0, 65519.9, 65520.0, 1e6, -1e6, 6.1e-5, 6.0e-8, 2.98e-8, 3.0e-8, 5.96e-8,
               1e-10, 1.00048828125, 1.000244140625, 3.14159, float("inf"), float("-inf"), float("nan")]
    vals = torch.tensor(special + torch.randn(3 * 64 - len(special), generator=torch.Generator().manual_seed(0)).mul(1000).tolist())
    x = torch.cat([vals, torch.logspace(-30, 5, 3 * 64, base=2), -torch.logspace(-30, 5, 3 * 64, base=2)]).reshape(3, 3, 8, 8).float()
    eye = torch.zeros(3, 3, 4)
    eye[:, :, :3] = torch.eye(3)
    no = torch.zeros(3, dtype=torch.bool)
    as_f32 = fused_color_affine(x, eye, no, no, torch.float32)  # the values the kernel converts
    assert torch.isinf(as_f32).any() and (as_f32.abs() < 6e-5).any()  # overflow and subnormal cases
    for dtype in (torch.float16, torch.bfloat16):
        out = fused_color_affine(x, eye, no, no, dtype)
        expected = as_f32.to(dtype)
        same = out.view(torch.int16) == expected.view(torch.int16)
        both_nan = torch.isnan(out) & torch.isnan(expected)
        assert (same | both_nan).all(), (dtype, as_f32[~(same | both_nan)][:5])


@pytest.mark.parametrize("device", DEVICES)
def test_fused_matches_kornia_where_semantics_coincide(device):
    # hue = 0 and mid-range pixels with mild factors: no clamp is ever active.
    x = images(16, lo=90, hi=166, device=device)
    opts = dict(hflip=0.5, vflip=0.5, brightness=0.15, contrast=0.15, saturation=0.15, grayscale=0.3)
    fused = BatchAugment(**opts, generator=3)
    out = fused(x)
    kornia_out = BatchAugment(**opts, engine="kornia")(x, params=fused.last_params)
    torch.testing.assert_close(out, kornia_out, rtol=0, atol=1e-5)


def test_fused_with_rotation_matches_kornia_engine():
    x = images(6, lo=90, hi=166)
    opts = dict(hflip=0.5, rotation=30, brightness=0.1, contrast=0.1)
    fused = BatchAugment(**opts, generator=4)
    out = fused(x)
    assert (fused.last_params["angle"] != 0).all()
    torch.testing.assert_close(out, BatchAugment(**opts, engine="kornia")(x, params=fused.last_params), rtol=0, atol=1e-5)


def test_fused_hue_is_close_to_kornia_hsv_hue():
    """YIQ rotation approximates HSV hue: bounded mean difference for hue in [-0.05, 0.05] turns."""
    x = images(16, lo=40, hi=216)
    fused = BatchAugment(hflip=0, hue=0.05, generator=5)
    out = fused(x)
    ref = BatchAugment(hflip=0, hue=0.05, engine="kornia")(x, params=fused.last_params)
    diff = (out - ref).abs().mean().item() * 0.226  # back to the [0, 1] scale (mean std)
    assert diff < 0.03


def test_kornia_engine_is_kornia_augmentation():
    import kornia.augmentation as K

    x = images(8)
    aug = BatchAugment(hflip=0, brightness=0.4, contrast=0.4, saturation=0.4, hue=0.1, engine="kornia", generator=6)
    out = aug(x)
    p = aug.last_params
    jitter = K.ColorJitter(0.4, 0.4, 0.4, 0.1, p=1.0, order=(0, 1, 2, 3))
    xf = x.float() / 255
    jitter(xf)
    kp = dict(jitter._params)
    for name in ("brightness", "contrast", "saturation", "hue"):
        kp[f"{name}_factor"] = p[name].float()
    normalize = K.Normalize(torch.tensor(IMAGENET_MEAN), torch.tensor(IMAGENET_STD), p=1.0)
    ref = normalize(jitter(xf, params=kp))
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-5)


@pytest.mark.parametrize("engine", ["fused", "kornia"])
def test_replay_gives_identical_output(engine):
    x = images(8)
    aug = BatchAugment(**FULL, rotation=10, engine=engine, generator=7)
    a = aug(x)
    p = aug.last_params
    b = aug(x)  # new draw
    assert not torch.equal(a, b)
    assert torch.equal(aug(x, params=p), a)


@pytest.mark.parametrize("engine", ["fused", "kornia"])
def test_eval_mode_only_normalises(engine):
    x = images(4)
    aug = BatchAugment(**FULL, rotation=20, engine=engine).eval()
    expected = (x.float() / 255 - torch.tensor(IMAGENET_MEAN)[:, None, None]) / torch.tensor(IMAGENET_STD)[:, None, None]
    torch.testing.assert_close(aug(x), expected, rtol=0, atol=1e-5)


def test_per_sample_params_really_differ():
    aug = BatchAugment(**FULL, rotation=15, generator=8)
    aug(images(64))
    p = aug.last_params
    for k in ("angle", "brightness", "contrast", "saturation", "hue"):
        assert p[k].std() > 0.01 and p[k].shape == (64,), k
    for k in ("hflip", "vflip", "grayscale"):
        assert 0 < p[k].sum() < 64, k
    assert p["brightness"].min() >= 0.6 and p["brightness"].max() <= 1.4
    assert p["hue"].abs().max() <= 0.1


def test_generator_makes_it_reproducible():
    x = images(8)
    torch.testing.assert_close(BatchAugment(**FULL, generator=9)(x), BatchAugment(**FULL, generator=9)(x), rtol=0, atol=0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("engine", ["fused", "kornia"])
def test_output_dtype_device_shape(device, out_dtype, engine):
    x = images(4, h=17, w=23, device=device)
    out = BatchAugment(**FULL, out_dtype=out_dtype, engine=engine, generator=10)(x)
    assert out.shape == (4, 3, 17, 23) and out.dtype == out_dtype and out.device.type == device
    assert out.is_contiguous()


def test_memory_format_and_float_input_agree():
    x = images(6)
    aug = BatchAugment(**FULL, generator=11)
    a = aug(x)
    p = aug.last_params
    torch.testing.assert_close(aug(x.contiguous(), params=p), a, rtol=0, atol=0)
    torch.testing.assert_close(aug(x.float() / 255, params=p), a, rtol=0, atol=2e-5)


def test_torch_compile_of_the_module():
    x = images(4)
    aug = BatchAugment(**FULL, generator=12)
    eager = aug(x)
    p = aug.last_params
    compiled = torch.compile(aug, backend="aot_eager", fullgraph=False)
    torch.testing.assert_close(compiled(x, params=p), eager, rtol=0, atol=1e-6)


def test_fused_op_opcheck():
    x = images(2)
    m = torch.randn(2, 3, 4)
    flips = torch.tensor([True, False])
    torch.library.opcheck(torch.ops.gpupipe.fused_color_affine.default, (x, m, flips, ~flips, 0))


def test_bad_inputs():
    aug = BatchAugment()
    with pytest.raises(ValueError, match=r"\[N, 3, H, W\]"):
        aug(torch.zeros(2, 1, 8, 8, dtype=torch.uint8))
    with pytest.raises(ValueError, match="uint8 or floating"):
        aug(torch.zeros(2, 3, 8, 8, dtype=torch.int32))
    with pytest.raises(ValueError, match="params lack"):
        aug(images(2), params={"hflip": torch.zeros(2, dtype=torch.bool)})
    with pytest.raises(ValueError, match="engine"):
        BatchAugment(engine="dali")
    with pytest.raises(ValueError, match="hue"):
        BatchAugment(hue=0.7)
    with pytest.raises(ValueError, match="probability"):
        BatchAugment(hflip=1.5)
    with pytest.raises(ValueError, match="matrices"):
        fused_color_affine(images(2), torch.zeros(2, 3, 3), torch.zeros(2, dtype=torch.bool), torch.zeros(2, dtype=torch.bool))


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no CUDA compiler on this machine")
def test_cuda_kernel_was_built_for_sm80_and_sm90():
    """CI has nvcc: the .cu must have compiled into gpupipe._C_cuda for A100 and H100."""
    import subprocess

    assert fused_mod.cuda_kernel_available()
    cuobjdump = shutil.which("cuobjdump")
    if cuobjdump:
        listing = subprocess.run([cuobjdump, "--list-elf", fused_mod._C_cuda.__file__], capture_output=True, text=True).stdout
    else:  # the fat binary names its cubins' architectures
        with open(fused_mod._C_cuda.__file__, "rb") as f:
            blob = f.read()
        assert b".nv_fatbin" in blob
        listing = " ".join(a for a in ("sm_80", "sm_90") if a.encode() in blob)
    assert "sm_80" in listing and "sm_90" in listing, listing


def test_output_buffers_are_reused_only_when_unreferenced():
    import torch.utils.dlpack

    x = images(4)
    aug = BatchAugment(**FULL, generator=13)
    p = aug.sample_params(4)
    a = aug(x, params=p)
    expected = a.clone()
    b = aug(x, params=p)  # `a` is held: not reused
    assert b.data_ptr() != a.data_ptr()
    ptr_a, ptr_b = a.data_ptr(), b.data_ptr()
    view = a[1:]  # only a view of `a` survives
    capsule = torch.utils.dlpack.to_dlpack(b)  # only a DLPack export of `b` survives
    del a, b
    c = aug(x, params=p)
    assert c.data_ptr() not in (ptr_a, ptr_b)
    assert torch.equal(view, expected[1:])
    ptr_c = c.data_ptr()
    del view, capsule, c
    d = aug(x, params=p)  # everything dropped: a cached buffer comes back, correctly refilled
    assert d.data_ptr() in (ptr_a, ptr_b, ptr_c) and torch.equal(d, expected)
    assert BatchAugment(reuse_outputs=False)(x, params=p).data_ptr() != d.data_ptr()
