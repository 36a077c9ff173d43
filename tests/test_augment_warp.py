"""warp_affine / affine_matrices against torchvision.transforms.v2.functional.affine / rotate on
real photos (uint8 tensors), per sample with the same parameters.

Tolerances (stated, and why):
- nearest: equal, except pixels whose exact source coordinate lies within 2^-21 * max(H, W) of a
  half-integer (augment_helpers.near_rounding_boundary: float32 rounding of the coordinate decides
  the neighbour there, in torchvision as here);
- bilinear, uint8 output: within 1 level, and equal on >= 99.5% of the values (a float value within
  rounding of .5 may round either way);
- bilinear, float output: within 2 * 255 * 2^-21 * max(H, W) levels of torchvision's float result
  (the same coordinate error times the steepest possible gradient, 255 levels per pixel, per axis).
"""

import math

import numpy as np
import pytest
import torch
import torchvision.transforms.v2.functional as F

from augment_helpers import near_rounding_boundary
from gpupipe import _C
from gpupipe.augment import _kernels, affine_matrices, warp_affine
from helpers import DEVICES, photo_batch

SIZES = [(157, 203), (256, 256), (96, 331)]
MODES = {"nearest": F.InterpolationMode.NEAREST, "bilinear": F.InterpolationMode.BILINEAR}


def random_affine(n, seed):
    g = torch.Generator().manual_seed(seed)
    u = lambda *shape: torch.rand(*shape, generator=g, dtype=torch.float64)  # noqa: E731
    return dict(angle=u(n) * 360 - 180, translate=((u(n, 2) - 0.5) * 40).round(), scale=0.6 + u(n) * 0.8,
                shear=(u(n, 2) - 0.5) * 40, center=torch.stack([u(n) * 100, u(n) * 80], 1))


def per_sample(p, i):
    return dict(angle=float(p["angle"][i]), translate=[float(t) for t in p["translate"][i]], scale=float(p["scale"][i]),
                shear=[float(s) for s in p["shear"][i]])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("with_center", [False, True])
def test_nearest_equals_torchvision_affine(device, size, with_center):
    h, w = size
    x = photo_batch(6, h, w, seed=1, device=device)
    p = random_affine(6, seed=h + with_center)
    center = p["center"] if with_center else None
    m = affine_matrices(p["angle"], p["translate"], p["scale"], p["shear"], center, size=size)
    out = warp_affine(x, m).cpu()
    excluded = near_rounding_boundary(m, h, w)
    assert excluded.float().mean() < 0.01
    for i in range(6):
        c = [float(v) for v in center[i]] if with_center else None
        ref = F.affine(x[i].cpu(), **per_sample(p, i), center=c)
        differ = (out[i] != ref).any(0)
        assert not (differ & ~excluded[i]).any(), f"sample {i}: {int((differ & ~excluded[i]).sum())} pixels differ"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("fill", [None, 0, (10, 200, 77)])
def test_bilinear_matches_torchvision_affine(device, size, fill):
    h, w = size
    x = photo_batch(6, h, w, seed=2, device=device)
    p = random_affine(6, seed=w)
    m = affine_matrices(p["angle"], p["translate"], p["scale"], p["shear"], size=size)
    out8 = warp_affine(x, m, interpolation="bilinear", fill=fill).cpu()
    outf = warp_affine(x, m, interpolation="bilinear", fill=fill, out_dtype=torch.float32).cpu()
    assert torch.equal(outf.round().to(torch.uint8), out8)
    fill_arg = list(fill) if isinstance(fill, tuple) else fill
    bound = 2 * 255 * 2.0**-21 * max(h, w)
    same = 0
    for i in range(6):
        kw = dict(per_sample(p, i), interpolation=F.InterpolationMode.BILINEAR, fill=fill_arg)
        ref_f = F.affine(x[i].cpu().float(), **kw)
        assert (outf[i] - ref_f).abs().max() <= bound
        d = (out8[i].int() - F.affine(x[i].cpu(), **kw).int()).abs()
        assert d.max() <= 1
        same += (d == 0).sum().item()
    assert same / out8.numel() >= 0.995


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("interpolation", ["nearest", "bilinear"])
@pytest.mark.parametrize("fill", [None, 0, 77, (77, 77, 77)])
@pytest.mark.parametrize("channels_last", [False, True])
def test_grayscale_images_warp_as_torchvision_warps_them(device, interpolation, fill, channels_last):
    """[N, 1, H, W]: each output equals the 3-channel warp of the image repeated, channel for
    channel (uint8 and float), and torchvision's affine of the 1-channel image as the 3-channel
    tests state it."""
    h, w = 157, 203
    x = photo_batch(6, h, w, seed=12, device=device)[:, 1:2].contiguous()
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    p = random_affine(6, seed=12)
    m = affine_matrices(p["angle"], p["translate"], p["scale"], p["shear"], size=(h, w))
    three = x.expand(-1, 3, -1, -1).contiguous()
    for out_dtype in (torch.uint8, torch.float32):
        out = warp_affine(x, m, interpolation=interpolation, fill=fill, out_dtype=out_dtype)
        assert out.shape == (6, 1, h, w) and out.dtype == out_dtype and out.device == x.device
        whole = warp_affine(three, m, interpolation=interpolation, fill=fill, out_dtype=out_dtype)
        assert torch.equal(out.expand(-1, 3, -1, -1), whole)
    fill_arg = None if fill is None else [77 if isinstance(fill, tuple) else fill]
    excluded = near_rounding_boundary(m, h, w)
    same = 0
    for i in range(6):
        ref = F.affine(x[i].cpu(), **per_sample(p, i), interpolation=MODES[interpolation], fill=fill_arg)
        d = (out.round().to(torch.uint8)[i].cpu().int() - ref.int()).abs()
        if interpolation == "nearest":
            assert not ((d[0] > 0) & ~excluded[i]).any()
        else:
            assert d.max() <= 1
        same += int((d == 0).sum())
    assert same / out.numel() >= 0.995


@pytest.mark.parametrize("interpolation", ["nearest", "bilinear"])
def test_rotate_is_affine_with_negated_angle(interpolation):
    h, w = 157, 203
    x = photo_batch(4, h, w, seed=3)
    angles = torch.tensor([25.0, -13.5, 90.0, 181.0], dtype=torch.float64)
    m = affine_matrices(-angles, (0, 0), 1.0, (0, 0), size=(h, w))
    out = warp_affine(x, m, interpolation=interpolation, fill=(0, 0, 0))
    excluded = near_rounding_boundary(m, h, w)
    for i in range(4):
        ref = F.rotate(x[i], float(angles[i]), interpolation=MODES[interpolation], fill=0)
        d = (out[i].int() - ref.int()).abs()
        if interpolation == "nearest":
            assert not ((d > 0).any(0) & ~excluded[i]).any()
        else:
            assert d.max() <= 1 and (d == 0).float().mean() >= 0.995


@pytest.mark.parametrize("device", DEVICES)
def test_flips_fold_into_the_matrix(device):
    h, w = 96, 131
    x = photo_batch(4, h, w, seed=4, device=device)
    p = random_affine(4, seed=5)
    hflip = torch.tensor([True, False, True, False])
    vflip = torch.tensor([True, True, False, False])
    m = affine_matrices(p["angle"], p["translate"], p["scale"], p["shear"], hflip=hflip, vflip=vflip, size=(h, w))
    out = warp_affine(x, m).cpu()
    excluded = near_rounding_boundary(m, h, w)
    for i in range(4):
        ref = F.affine(x[i].cpu(), **per_sample(p, i))
        ref = F.horizontal_flip(ref) if hflip[i] else ref
        ref = F.vertical_flip(ref) if vflip[i] else ref
        assert not (((out[i] != ref).any(0)) & ~excluded[i]).any()
    # identity geometry with flips only: exact, no boundary case
    m = affine_matrices(torch.zeros(4), (0, 0), 1.0, (0, 0), hflip=hflip, vflip=vflip, size=(h, w))
    out = warp_affine(x, m, interpolation="bilinear").cpu()
    for i in range(4):
        ref = x[i].cpu().flip(-1) if hflip[i] else x[i].cpu()
        assert torch.equal(out[i], ref.flip(-2) if vflip[i] else ref)


def test_fill_per_channel_and_none_vs_zero():
    h, w = 64, 80
    x = photo_batch(2, h, w, seed=6)
    m = affine_matrices(torch.tensor([30.0, -40.0]), (0, 0), 0.7, (0, 0), size=(h, w))  # zoom out: borders
    filled = warp_affine(x, m, fill=(255, 0, 128))
    corner = filled[:, :, 0, 0]
    assert corner.tolist() == [[255, 0, 128], [255, 0, 128]]
    # bilinear: fill=0 weighs edge pixels by the in-image share twice (torchvision), fill=None once
    none = warp_affine(x, m, interpolation="bilinear", out_dtype=torch.float32)
    zero = warp_affine(x, m, interpolation="bilinear", fill=0, out_dtype=torch.float32)
    assert (zero <= none + 1e-4).all() and (zero < none - 0.5).any()
    for i, angle in enumerate((30.0, -40.0)):
        kw = dict(angle=angle, translate=[0, 0], scale=0.7, shear=[0.0, 0.0], interpolation=F.InterpolationMode.BILINEAR)
        torch.testing.assert_close(none[i], F.affine(x[i].float(), **kw, fill=None), rtol=0, atol=0.05)
        torch.testing.assert_close(zero[i], F.affine(x[i].float(), **kw, fill=0), rtol=0, atol=0.05)


@pytest.mark.parametrize("device", DEVICES)
def test_any_strides_same_result(device):
    h, w = 60, 70
    base = photo_batch(3, 2 * h, w + 5, seed=7, device=device)
    views = {
        "channels_last": base[:, :, :h, :w].contiguous(memory_format=torch.channels_last),
        "contiguous": base[:, :, :h, :w].contiguous(),
        "strided": base[:, :, ::2, 5:],
        "permuted NHWC": base[:, :, :h, :w].permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2),
    }
    m = affine_matrices(torch.tensor([12.0, -70.0, 150.0]), (3, -2), 1.1, (5, -4), size=(h, w))
    ref = None
    for name, v in views.items():
        if name == "strided":
            v_ref = base[:, :, ::2, 5:].contiguous()
            assert torch.equal(warp_affine(v, m, interpolation="bilinear"), warp_affine(v_ref, m, interpolation="bilinear"))
            continue
        out = warp_affine(v, m, interpolation="bilinear")
        assert out.is_contiguous(memory_format=torch.channels_last) == (name != "contiguous")
        ref = out if ref is None else ref
        assert torch.equal(out, ref), name


def test_far_outside_and_nan_matrices_fill():
    x = photo_batch(3, 20, 30, seed=8)
    m = torch.zeros(3, 2, 3)
    m[0, :, 2] = 1e30
    m[1, :, 2] = -1e30
    m[2] = float("nan")
    for interpolation in ("nearest", "bilinear"):
        out = warp_affine(x, m, interpolation=interpolation, fill=(1, 2, 3))
        assert (out == torch.tensor([1, 2, 3], dtype=torch.uint8)[None, :, None, None]).all()


def test_compile_and_opcheck():
    x = photo_batch(2, 16, 24, seed=9)
    m = affine_matrices(torch.tensor([10.0, 20.0]), (1, 2), 1.0, (0, 0), size=(16, 24)).float()
    torch.library.opcheck(torch.ops.gpupipe.warp_affine.default, (x, m, 1, [1.0, 2.0, 3.0], torch.uint8))
    torch.library.opcheck(torch.ops.gpupipe.warp_affine.default, (x, m, 0, None, torch.float32))
    f = torch.compile(lambda x, m: warp_affine(x, m, interpolation="bilinear"), fullgraph=True, backend="aot_eager")
    assert torch.equal(f(x, m), warp_affine(x, m, interpolation="bilinear"))


def test_affine_matrices_equal_torchvisions_inverse_to_the_bit():
    """The linear part of each map is torchvision's _get_inverse_affine_matrix (scaled, the same
    libm cos / sin / tan its math module calls), bit for bit, rotation, scale and shear together."""
    from torchvision.transforms.v2.functional._geometry import _get_inverse_affine_matrix

    g = torch.Generator().manual_seed(3)
    n = 500
    angle = torch.rand(n, generator=g, dtype=torch.float64) * 720 - 360
    scale = torch.rand(n, generator=g, dtype=torch.float64) + 0.5
    shear = (torch.rand(n, 2, generator=g, dtype=torch.float64) * 80 - 40) * (torch.rand(n, 2, generator=g) < 0.7)
    m = affine_matrices(angle, (0, 0), scale, shear, (0, 0))
    for i in range(n):
        ref = _get_inverse_affine_matrix([0.0, 0.0], float(angle[i]), [0.0, 0.0], float(scale[i]), shear[i].tolist())
        assert m[i, :, :2].flatten().tolist() == [ref[0], ref[1], ref[3], ref[4]], i


def test_affine_matrices_compile_to_the_same_maps():
    angle, shear = torch.tensor([10.0, -33.0, 0.0]), torch.tensor([[5.0, -2.0], [0.0, 0.0], [0.0, 12.0]])
    flips = torch.tensor([True, False, True]), torch.tensor([False, True, True])
    eager = affine_matrices(angle, (1, 2), 1.25, shear, None, *flips, size=(16, 24))
    f = torch.compile(lambda a, s: affine_matrices(a, (1, 2), 1.25, s, None, *flips, size=(16, 24)),
                      fullgraph=True, backend="aot_eager")
    assert torch.equal(f(angle, shear), eager)
    args = (angle, torch.tensor([[1.0, 2.0]]).expand(3, 2), torch.full((3,), 1.25, dtype=torch.float64),
            shear.double(), torch.tensor([[12.0, 8.0]]).expand(3, 2), *flips, 16, 24)
    args = tuple(a.double() if a.is_floating_point() else a for a in args[:7]) + args[7:]
    torch.library.opcheck(torch.ops.gpupipe.affine_matrices.default, args)


def test_native_maps_refuse_rows_of_the_wrong_size():
    """The binding reads exactly n (or 2n) values of each row array: others are refused, not read."""
    import numpy as np

    from gpupipe import _C

    one, two, no = np.zeros(1), np.zeros(2), np.zeros(1, dtype=bool)
    _C.inverse_affine(one, two, np.ones(1), two, two, no, no, 4, 4)
    for bad in range(1, 7):
        args = [one, two, np.ones(1), two, two, no, no]
        args[bad] = np.zeros(7, dtype=args[bad].dtype)
        with pytest.raises(ValueError, match="must have"):
            _C.inverse_affine(*args, 4, 4)


def test_affine_matrices_docstring_conventions():
    # a pure translation moves content by +t: the output pixel (x, y) reads (x - tx, y - ty)
    m = affine_matrices(torch.zeros(1), torch.tensor([[3.0, -2.0]]), 1.0, (0, 0), size=(10, 10))
    torch.testing.assert_close(m, torch.tensor([[[1.0, 0.0, -3.0], [0.0, 1.0, 2.0]]], dtype=torch.float64))
    # scale 2 about the centre (index 4.5 of 10): output 0 reads 4.5 + (0 - 4.5) / 2
    m = affine_matrices(torch.zeros(1), (0, 0), 2.0, (0, 0), size=(10, 10))
    assert math.isclose(float(m[0, 0, 2]), 2.25)


def test_bad_inputs_name_the_argument():
    x = photo_batch(2, 8, 8, seed=10)
    m = torch.zeros(2, 2, 3)
    with pytest.raises(TypeError, match="x must be uint8"):
        warp_affine(x.float(), m)
    with pytest.raises(ValueError, match=r"x must be \[N, 3, H, W\] or \[N, 1, H, W\]"):
        warp_affine(x[:, :2], m)
    with pytest.raises(ValueError, match="fill has 3 different values"):
        warp_affine(x[:, :1], m, fill=(1, 2, 3))
    with pytest.raises(ValueError, match="matrix must be"):
        warp_affine(x, torch.zeros(3, 2, 3))
    with pytest.raises(TypeError, match="matrix must be a float"):
        warp_affine(x, torch.zeros(2, 2, 3, dtype=torch.int64))
    with pytest.raises(ValueError, match="interpolation"):
        warp_affine(x, m, interpolation="bicubic")
    with pytest.raises(ValueError, match="fill"):
        warp_affine(x, m, fill=(1, 2))
    with pytest.raises(ValueError, match="fill"):
        warp_affine(x, m, fill=300)
    with pytest.raises(TypeError, match="out_dtype"):
        warp_affine(x, m, out_dtype=torch.float16)
    with pytest.raises(ValueError, match="scale must be > 0"):
        affine_matrices(torch.zeros(2), (0, 0), torch.tensor([1.0, 0.0]), (0, 0), size=(8, 8))
    with pytest.raises(ValueError, match="size"):
        affine_matrices(torch.zeros(2), (0, 0), 1.0, (0, 0))
    with pytest.raises(ValueError, match="translate must broadcast"):
        affine_matrices(torch.zeros(2), torch.zeros(3, 2), 1.0, (0, 0), size=(8, 8))


def test_a_numpy_fill_is_a_number():
    """fill=np.uint8(7) was refused as "fill must be a number" (numpy numbers only passed inside a sequence)."""
    x = photo_batch(2, 8, 8, seed=12)
    m = torch.tensor([[1.0, 0.0, 3.0], [0.0, 1.0, 0.0]]).expand(2, 2, 3)  # a shift: 3 columns of fill
    want = warp_affine(x, m, fill=7)
    for fill in (np.uint8(7), np.float32(7.0), np.int64(7)):
        assert torch.equal(warp_affine(x, m, fill=fill), want)


def test_binding_validates_buffers():
    """The C++ binding refuses, before any kernel runs, buffers the Python layer would never pass."""
    x = photo_batch(2, 8, 8, seed=11).contiguous()
    m = torch.zeros(2, 2, 3)
    out = torch.empty(2, 3, 8, 8, dtype=torch.uint8)
    b = _kernels.buffer
    u8 = _kernels.ELEM_TYPES[torch.uint8]
    _C.warp_affine(b(x), b(m), b(out), u8, 0, None, 1)  # valid
    with pytest.raises(ValueError, match="out overlaps x"):
        _C.warp_affine(b(x), b(m), b(x), u8, 0, None, 1)
    shared = torch.zeros(2 * x.numel(), dtype=torch.uint8)
    with pytest.raises(ValueError, match="out overlaps x"):  # a partial overlap
        _C.warp_affine(b(shared[:x.numel()].view(x.shape)), b(m), b(shared[100:100 + x.numel()].view(x.shape)), u8, 0, None, 1)
    short = b(x)
    short[1] -= 1  # the storage ends one byte early
    with pytest.raises(ValueError, match="x: sizes and strides reach"):
        _C.warp_affine(short, b(m), b(out), u8, 0, None, 1)
    huge = b(x)
    huge[4 + 4] = 2**63 - 1  # an N stride whose offsets overflow int64
    with pytest.raises(ValueError, match="x: sizes and strides overflow"):
        _C.warp_affine(huge, b(m), b(out), u8, 0, None, 1)
    with pytest.raises(ValueError, match="matrix: must be float32"):
        _C.warp_affine(b(x), b(m.double()), b(out), u8, 0, None, 1)
    with pytest.raises(ValueError, match="x: dimension 1 must be 3"):
        _C.warp_affine(b(x[:, :2]), b(m), b(out), u8, 0, None, 1)
    f32 = torch.empty(2 * 3 * 8 * 8 * 4 + 1, dtype=torch.uint8)[1:]
    bad = b(torch.empty(2, 3, 8, 8))
    bad[0] = f32.data_ptr()  # a float32 output at an odd address
    with pytest.raises(ValueError, match="out: address is not aligned"):
        _C.warp_affine(b(x), b(m), bad, _kernels.ELEM_TYPES[torch.float32], 0, None, 1)
    with pytest.raises(ValueError, match="interpolation"):
        _C.warp_affine(b(x), b(m), b(out), u8, 5, None, 1)


def test_affine_matrices_take_tensors_that_require_grad():
    angle = torch.tensor([30.0, -5.0], requires_grad=True)
    m = affine_matrices(angle, (0, 0), 1.0, (0, 0), size=(8, 8))
    assert not m.requires_grad and torch.equal(m, affine_matrices(angle.detach(), (0, 0), 1.0, (0, 0), size=(8, 8)))


def test_an_empty_batch_warps_to_an_empty_batch():
    x = torch.zeros(0, 3, 8, 8, dtype=torch.uint8)
    m = affine_matrices(torch.zeros(0, dtype=torch.float64), (0, 0), 1.0, (0, 0), size=(8, 8))
    assert m.shape == (0, 2, 3) and warp_affine(x, m).shape == (0, 3, 8, 8)


def test_affine_matrices_of_tensors_that_require_grad_compile():
    angle = torch.tensor([30.0, -5.0], requires_grad=True)
    f = torch.compile(lambda a: affine_matrices(a, (0, 0), 1.0, (0, 0), size=(8, 8)), fullgraph=True,
                      backend="aot_eager")
    assert torch.equal(f(angle), affine_matrices(angle, (0, 0), 1.0, (0, 0), size=(8, 8)))
