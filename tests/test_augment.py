"""BatchAugment against torchvision.transforms.v2.functional applied per sample with the same
parameters, on real photos; keyed parameters, replay, compile, layouts and bad input.

Stated tolerance (color="torchvision", both engines, nearest and bilinear): in 0..255 units
(|difference of the normalised outputs| * std * 255), mean <= 0.5 and >= 99.5% of the values
within 2. (Measured: mean ~2e-4 levels for the fused engine; the rest are nearest-neighbour
rounding-boundary pixels, tests/test_augment_warp.py.)"""

import collections
import io
import math
import shutil

import numpy as np
import pytest
import torch

from augment_helpers import levels, torchvision_chain
from gpupipe import _C, keyed
from gpupipe.augment import IMAGENET_MEAN, IMAGENET_STD, BatchAugment, affine_matrices, warp_affine
from gpupipe.augment import fused as fused_mod
from helpers import DEVICES, photo_batch

FULL = dict(hflip=0.5, vflip=0.5, rotation=25, translate=(0.1, 0.05), scale=(0.8, 1.2), shear=(-10, 10, -5, 5),
            brightness=0.4, contrast=0.4, saturation=0.4, hue=0.1, grayscale=0.2)
JITTER = dict(brightness=0.4, contrast=0.4, saturation=0.4, hue=0.1)


def assert_within_tolerance(out, ref, std=IMAGENET_STD):
    d = levels(out, ref, std)
    assert d.mean() <= 0.5, f"mean |diff| {d.mean():.4f} levels"
    assert (d <= 2).double().mean() >= 0.995, f"{(d <= 2).double().mean():.5f} within 2 levels"
    return d


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("engine", ["fused", "kornia"])
@pytest.mark.parametrize("interpolation", ["nearest", "bilinear"])
@pytest.mark.parametrize("fill", [0, None, (30, 200, 90)])
def test_matches_torchvision_per_sample(device, engine, interpolation, fill):
    x = photo_batch(16, 157, 203, seed=1, device=device)
    aug = BatchAugment(**FULL, interpolation=interpolation, fill=fill, engine=engine)
    p = aug.sample_params(16, seed=2)
    out = aug(x, params=p)
    assert aug.last_path == ("kornia" if engine == "kornia" else f"{device}-kernel")  # the fast path really ran
    ref = torchvision_chain(x, p, interpolation=interpolation, fill=fill, mean=aug.mean, std=aug.std)
    assert_within_tolerance(out, ref)


@pytest.mark.parametrize("older_kornia", [False, True], ids=["align_corners=False", "older-kornia-padded"])
@pytest.mark.parametrize("interpolation", ["nearest", "bilinear"])
def test_kornia_engine_on_images_one_pixel_high_or_wide(monkeypatch, older_kornia, interpolation):
    """align_corners=True collapses an axis of one pixel (every coordinate lands on that pixel, none
    outside): ~170 levels off torchvision with a rotation. A Kornia whose warp normalises for
    align_corners=True only gets that axis zero-padded to 2 instead."""
    pytest.importorskip("kornia", reason="engine='kornia' needs kornia")
    from gpupipe.augment import kornia_engine

    if older_kornia:
        monkeypatch.setattr(kornia_engine, "_honours_align_corners", lambda normalize_homography: False)
    g = torch.Generator().manual_seed(0)
    for h, w in ((1, 7), (6, 1), (1, 1), (5, 7)):
        x = torch.randint(0, 256, (8, 3, h, w), dtype=torch.uint8, generator=g)
        for fill in (0, None, (30, 200, 90)):
            aug = BatchAugment(**FULL, interpolation=interpolation, fill=fill, engine="kornia")
            p = aug.sample_params(8, seed=h * 10 + w)
            ref = torchvision_chain(x, p, interpolation=interpolation, fill=fill, mean=aug.mean, std=aug.std)
            assert levels(aug(x, params=p), ref, aug.std).max() < 0.05, (h, w, fill)


def test_kornia_engine_computes_in_float32_under_autocast():
    """Under torch.autocast Kornia's warp ran in bfloat16 (mean 4.9, max 110 levels off torchvision)."""
    pytest.importorskip("kornia", reason="engine='kornia' needs kornia")
    x = photo_batch(4, 33, 41, seed=40)
    aug = BatchAugment(**FULL, interpolation="bilinear", engine="kornia")
    p = aug.sample_params(4, seed=41)
    plain = aug(x, params=p)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        under = aug(x, params=p)
    assert under.dtype == torch.float32 and torch.equal(under, plain)


@pytest.mark.parametrize("device", DEVICES)
def test_matches_torchvision_at_the_benchmark_size(device):
    """The benchmark's chain (rotation 25 bilinear, both flips, jitter with hue) at 256x256."""
    x = photo_batch(8, 256, 256, seed=3, device=device)
    aug = BatchAugment(hflip=0.5, vflip=0.5, rotation=25, interpolation="bilinear", **JITTER)
    p = aug.sample_params(8, seed=4)
    ref = torchvision_chain(x, p, interpolation="bilinear", fill=0, mean=aug.mean, std=aug.std)
    d = assert_within_tolerance(aug(x, params=p), ref)
    assert d.max() < 0.05  # bilinear: no rounding-boundary case, float rounding only


def test_each_color_op_alone_and_every_order():
    """Each op alone (factor at the range ends), then all 24 orders: the order is per sample, and
    it matters (torchvision's ColorJitter)."""
    x = photo_batch(24, 40, 50, seed=5)
    for name in ("brightness", "contrast", "saturation", "hue"):
        aug = BatchAugment(hflip=0, **{name: 0.5 if name == "hue" else 0.9})
        p = aug.sample_params(24, seed=6)
        ref = torchvision_chain(x, p, interpolation="nearest", fill=0, mean=aug.mean, std=aug.std)
        assert levels(aug(x, params=p), ref, aug.std).max() < 0.01, name
    aug = BatchAugment(hflip=0, **JITTER)
    p = aug.sample_params(24, seed=7)
    import itertools

    p["order"] = torch.tensor(list(itertools.permutations(range(4))))
    out = aug(x, params=p)
    ref = torchvision_chain(x, p, interpolation="nearest", fill=0, mean=aug.mean, std=aug.std)
    assert levels(out, ref, aug.std).max() < 0.01
    q = dict(p, order=p["order"].flip(1))
    assert (levels(aug(x, params=q), out, aug.std).amax(dim=(1, 2, 3)) > 1).sum() >= 20


def test_grayscale_and_normalisation():
    x = photo_batch(4, 30, 40, seed=8)
    aug = BatchAugment(hflip=0, grayscale=1.0, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))
    out = aug(x)
    assert torch.equal(out[:, 0], out[:, 1]) and torch.equal(out[:, 1], out[:, 2])
    ref = torchvision_chain(x, aug.last_params, interpolation="nearest", fill=0, mean=aug.mean, std=aug.std)
    assert levels(out, ref, aug.std).max() < 0.01


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("memory_format", [torch.contiguous_format, torch.channels_last])
def test_output_dtype_memory_format_device(device, out_dtype, memory_format):
    x = photo_batch(4, 17, 23, seed=9, device=device)
    aug = BatchAugment(**FULL, out_dtype=out_dtype, out_memory_format=memory_format)
    p = aug.sample_params(4, seed=10)
    out = aug(x, params=p)
    assert out.shape == (4, 3, 17, 23) and out.dtype == out_dtype and out.device.type == device
    assert out.is_contiguous(memory_format=memory_format)
    ref32 = BatchAugment(**FULL)(x, params=p)
    assert torch.equal(out.contiguous(), ref32.to(out_dtype))  # the float32 values, converted as torch does


def test_half_and_bfloat16_conversion_is_torchs():
    """Overflow, subnormals and rounding ties of the kernels' own float16 / bfloat16 conversion, against
    torch's: extreme normalisations push the float32 values there."""
    x = torch.arange(256, dtype=torch.uint8).reshape(1, 1, 16, 16).expand(2, 3, 16, 16).contiguous()
    for std in ((1e-6, 3e-5, 0.01), (1e5, 3e4, 7e2), (1 / 255, 2 / 255, 1 / 1024)):
        for mean in ((0.0, 0.5, 0.25), (0.3, 0.0, 1.0)):
            f32 = BatchAugment(hflip=0, mean=mean, std=std)(x)
            for dtype in (torch.float16, torch.bfloat16):
                out = BatchAugment(hflip=0, mean=mean, std=std, out_dtype=dtype)(x)
                expected = f32.to(dtype)
                assert torch.equal(out.view(torch.int16), expected.view(torch.int16)), (dtype, std, mean)
    assert torch.isinf(BatchAugment(hflip=0, std=(1e-6,) * 3, out_dtype=torch.float16)(x)).any()


def test_linear_color_model_is_its_float64_definition():
    """color="linear" against its own definition in float64 (no clamps, YIQ hue, BT.601 luma, fixed
    order), on an axis-aligned geometry (flips) so that sampling is exact."""
    import math

    x = photo_batch(8, 24, 36, seed=11)
    aug = BatchAugment(hflip=0.5, vflip=0.5, grayscale=0.3, color="linear", **JITTER)
    p = aug.sample_params(8, seed=12)
    out = aug(x, params=p)
    xf = x.double() / 255
    xf = torch.where(p["hflip"][:, None, None, None], xf.flip(-1), xf)
    xf = torch.where(p["vflip"][:, None, None, None], xf.flip(-2), xf)
    w = torch.tensor([0.299, 0.587, 0.114], dtype=torch.float64)
    gray = lambda t: torch.einsum("c,nchw->nhw", w, t)[:, None]  # noqa: E731
    b, c, s = (p[k].double()[:, None, None, None] for k in ("brightness", "contrast", "saturation"))
    xf = xf * b
    xf = c * xf + (1 - c) * gray(xf).mean(dim=(2, 3), keepdim=True)
    xf = s * xf + (1 - s) * gray(xf)
    yiq = torch.tensor([[0.299, 0.587, 0.114], [0.595716, -0.274453, -0.321263], [0.211456, -0.522591, 0.311135]], dtype=torch.float64)
    y = torch.einsum("kc,nchw->nkhw", yiq, xf)
    th = -2 * math.pi * p["hue"].double()[:, None, None]
    i, q = y[:, 1], y[:, 2]
    y = torch.stack([y[:, 0], torch.cos(th) * i - torch.sin(th) * q, torch.sin(th) * i + torch.cos(th) * q], dim=1)
    xf = torch.einsum("ck,nkhw->nchw", torch.linalg.inv(yiq), y)
    xf = torch.where(p["grayscale"][:, None, None, None], gray(xf).expand_as(xf), xf)
    ref = (xf - torch.tensor(IMAGENET_MEAN, dtype=torch.float64)[:, None, None]) / torch.tensor(IMAGENET_STD, dtype=torch.float64)[:, None, None]
    torch.testing.assert_close(out.double(), ref, rtol=0, atol=3e-5)  # float32 math on values of magnitude <= ~5


def test_linear_differs_from_torchvision_as_documented():
    """docs/semantics.md quotes the measured difference of color="linear" to torchvision's chain
    (64 photos of 256x256: 2.8 levels in mean for b/c/s 0.4, 13 with hue 0.1; photo-dependent, the
    clamps bite on bright photos); this holds a smaller batch to that order."""
    x = photo_batch(16, 96, 128, seed=13)
    for hue, lo, hi in ((0.0, 0.3, 8.0), (0.1, 6.0, 25.0)):
        aug = BatchAugment(hflip=0.5, color="linear", brightness=0.4, contrast=0.4, saturation=0.4, hue=hue)
        p = aug.sample_params(16, seed=14)
        d = levels(aug(x, params=p), torchvision_chain(x, p, interpolation="nearest", fill=0, mean=aug.mean, std=aug.std), aug.std)
        assert lo < d.mean() < hi, (hue, float(d.mean()))


# --- parameters ------------------------------------------------------------------------------------

def test_last_params_keys_shapes_dtypes():
    aug = BatchAugment(**FULL, generator=0)
    aug(photo_batch(5, 16, 16))
    p = aug.last_params
    assert list(p) == ["hflip", "vflip", "angle", "translate", "scale", "shear", "brightness", "contrast", "saturation",
                       "hue", "order", "grayscale"]
    for k, v in p.items():
        shape = (5, 2) if k in ("translate", "shear") else (5, 4) if k == "order" else (5,)
        assert v.shape == shape and v.device.type == "cpu", k
    assert p["order"].dtype == torch.int64 and p["hflip"].dtype == torch.bool
    assert (p["order"].sort(1).values == torch.arange(4)).all()


@pytest.mark.parametrize("kw", [FULL, {}, {"hflip": 1.0, "vflip": 0.0, "grayscale": 1.0, "translate": (0.5, 0.0),
                                        "shear": (-10, 20, 5, 5), "scale": (0.5, 2.0), "hue": 0.5}])
def test_the_native_parameter_mapping_equals_its_numpy_definition(kw):
    """Eager sample_params maps its draws natively (csrc/augment/augment_params.h): equal, bit for
    bit, to BatchAugment._params_from with numpy, and to the torch mapping torch.compile traces, on
    draws at their edges (0, just below 1, ties in ColorJitter's order)."""
    aug = BatchAugment(**kw)
    rng = np.random.default_rng(3)
    u = rng.random((3000, 17))
    u[::7] = 0.0
    u[1::7] = np.nextafter(1.0, 0.0)
    u[2::7, 12:16] = 0.25  # four equal ranks: the stable order keeps 0, 1, 2, 3
    u[3::7, 13:15] = u[3::7, 12:13]
    u[4::7, 0] = aug.hflip  # the flip's threshold itself: no flip (u < p)
    native = aug._params_from_uniforms(torch.from_numpy(u))
    reference = aug._params_from(u, np)
    traced = aug._params_from(torch.from_numpy(u), torch)
    assert list(native) == list(reference)
    for k in native:
        assert native[k].dtype == traced[k].dtype and native[k].numpy().dtype == reference[k].dtype, k
        assert np.array_equal(native[k].numpy(), reference[k]), k
        assert torch.equal(native[k], traced[k]), k
    assert (native["order"][2::7] == torch.arange(4)).all()
    with pytest.raises(ValueError, match="draws"):
        _C.augment_params_from_uniforms(u[:, :16], 0.5, 0, 0, (0, 0), (0, 0), (1, 1), (0, 0, 0, 0), (1, 1), (1, 1),
                                        (1, 1), (0, 0))


def test_keyed_params_are_a_function_of_seed_epoch_index():
    aug = BatchAugment(**FULL)
    a = aug.sample_params(8, seed=3, epoch=1, indices=range(100, 108))
    b = aug.sample_params(4, seed=3, epoch=1, indices=[105, 103, 107, 100])  # another batch, another order
    for k in a:
        assert torch.equal(b[k], a[k][[5, 3, 7, 0]]), k
    c = aug.sample_params(8, seed=3, epoch=2, indices=range(100, 108))
    assert not torch.equal(a["angle"], c["angle"])
    d = aug.sample_params(8, seed=4, epoch=1, indices=range(100, 108))
    assert not torch.equal(a["brightness"], d["brightness"])
    # the draws are keyed.uniforms on this module's own stream
    u = keyed.uniforms(3, 1, range(100, 108), 17, stream=keyed.stream_of("BatchAugment"))
    assert torch.equal(a["hflip"], torch.from_numpy(u[:, 0] < 0.5))
    assert torch.allclose(a["angle"], torch.from_numpy(-25 + 50 * u[:, 2]))
    # per-sample values really differ, and stay in their ranges
    p = aug.sample_params(256, seed=0)
    for k in ("angle", "brightness", "contrast", "saturation", "hue", "scale"):
        assert p[k].std() > 0.01, k
    assert p["brightness"].min() >= 0.6 and p["brightness"].max() <= 1.4 and p["hue"].abs().max() <= 0.1
    assert p["translate"][:, 0].abs().max() <= 0.1 and p["shear"][:, 1].abs().max() <= 5
    assert len({tuple(o) for o in p["order"].tolist()}) == 24  # every permutation occurs


def test_generator_draws_are_reproducible_and_replay_is_exact():
    x = photo_batch(8, 32, 40, seed=15)
    a, b = BatchAugment(**FULL, generator=9), BatchAugment(**FULL, generator=9)
    first = a(x)
    assert torch.equal(first, b(x))
    p = a.last_params
    second = a(x)  # a new draw
    assert not torch.equal(first, second)
    assert torch.equal(a(x, params=p), first)


def test_copies_draw_from_their_own_generator():
    """deepcopy / pickle give the copy its own generator, also inside torch.compile (where the draws
    go through an op that finds the generator by the module's slot)."""
    import copy
    import pickle

    aug = BatchAugment(**FULL, generator=3)
    twin = copy.deepcopy(aug)
    assert twin._slot != aug._slot and pickle.loads(pickle.dumps(aug))._slot not in (aug._slot, twin._slot)
    assert torch.equal(twin.sample_params(6)["angle"], aug.sample_params(6)["angle"])  # the same state, copied
    before = aug.generator.get_state()
    x = photo_batch(6, 16, 16, seed=30)
    torch.compile(twin, fullgraph=True, backend="aot_eager")(x)
    assert torch.equal(aug.generator.get_state(), before)  # the twin's compiled draws left aug's generator alone
    assert not torch.equal(twin.generator.get_state(), before)


def test_a_model_holding_batch_augment_saves_loads_and_copies_without_its_buffers():
    """torch.save (pickle protocol 2) could not store the memory format; the output cache's buffers
    travelled with every pickle and deepcopy (74 MiB after 4 calls at 32x3x224x224)."""
    import copy
    import pickle

    aug = BatchAugment(**FULL, out_memory_format=torch.channels_last)
    x = photo_batch(4, 64, 64, seed=33)
    p = aug.sample_params(4, seed=8)
    kept = [aug(x, params=p) for _ in range(3)]
    model = torch.nn.Sequential(aug, torch.nn.Identity())
    saved = io.BytesIO()
    torch.save(model, saved)
    assert saved.tell() < 64 * 1024
    loaded = torch.load(io.BytesIO(saved.getvalue()), weights_only=False)
    for twin in (loaded[0], copy.deepcopy(aug), pickle.loads(pickle.dumps(aug))):
        assert twin._outputs.buffers == [] and twin.out_memory_format == torch.channels_last
        y = twin(x, params=p)
        assert torch.equal(y, kept[0]) and y.is_contiguous(memory_format=torch.channels_last)


def test_settings_changed_after_construction_are_checked_as_at_construction():
    """A schedule setting `aug.rotation = 30` hit a raw pybind error at the next call; `hflip = 2.0`
    and a reversed range were taken silently."""
    aug = BatchAugment()
    x = photo_batch(2, 16, 16, seed=34)
    aug.rotation, aug.brightness, aug.fill, aug.interpolation = 30, 0.4, 128, "bilinear"
    assert aug.rotation == (-30.0, 30.0) and aug.brightness == (0.6, 1.4) and aug.interpolation == "bilinear"
    fresh = BatchAugment(rotation=30, brightness=0.4, fill=128, interpolation="bilinear")
    assert aug.fill == fresh.fill and repr(aug) == repr(fresh)
    p = aug.sample_params(2, seed=1)
    assert torch.equal(aug(x, params=p), fresh(x, params=p))
    for name, bad, match in [("hflip", 2.0, "hflip"), ("brightness", (1.5, 0.5), "brightness"),
                             ("rotation", "a", "rotation"), ("hue", 0.7, "hue"), ("std", (1, 0, 1), "std"),
                             ("mean", (0.5, 0.5), "mean"), ("interpolation", "cubic", "interpolation"),
                             ("out_dtype", torch.int32, "out_dtype"), ("color", "hsv", "color"),
                             ("engine", "dali", "engine"), ("out_memory_format", torch.preserve_format,
                                                            "out_memory_format")]:
        with pytest.raises(ValueError, match=match):
            setattr(aug, name, bad)
    assert torch.equal(aug(x, params=p), fresh(x, params=p))  # (a refused value changes nothing)


def test_output_does_not_depend_on_the_thread_count():
    x = photo_batch(16, 64, 80, seed=16)
    aug = BatchAugment(**FULL, interpolation="bilinear")
    p = aug.sample_params(16, seed=17)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = aug(x, params=p).clone()
        torch.set_num_threads(2)
        two = aug(x, params=p).clone()
        torch.set_num_threads(3)
        three = aug(x, params=p)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, two) and torch.equal(one, three)
    # few samples for the threads: the host kernel splits rows instead of samples (two sampling
    # passes instead of one kept plane), with the same bits
    few = {k: v[:2] for k, v in p.items()}
    try:
        torch.set_num_threads(1)
        by_samples = aug(x[:2], params=few).clone()
        torch.set_num_threads(3)
        by_rows = aug(x[:2], params=few)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(by_samples, by_rows) and torch.equal(by_rows, one[:2])


@pytest.mark.parametrize("engine", ["fused", "kornia"])
def test_eval_mode_only_normalises(engine):
    x = photo_batch(4, 20, 30, seed=18)
    aug = BatchAugment(**FULL, engine=engine).eval()
    expected = (x.float() / 255 - torch.tensor(IMAGENET_MEAN)[:, None, None]) / torch.tensor(IMAGENET_STD)[:, None, None]
    torch.testing.assert_close(aug(x), expected, rtol=0, atol=2e-6)


def test_input_layouts_agree():
    base = photo_batch(6, 50, 60, seed=19)
    aug = BatchAugment(**FULL, interpolation="bilinear")
    p = aug.sample_params(6, seed=20)
    out = aug(base, params=p)
    assert torch.equal(aug(base.contiguous(), params=p), out)  # planar input: the generic sampling route
    wide = photo_batch(6, 50, 70, seed=19)[:, :, :, 5:65]
    assert torch.equal(aug(wide, params=p), aug(wide.contiguous(memory_format=torch.channels_last), params=p))


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_torch_compile_fullgraph(mode):
    x = photo_batch(4, 24, 32, seed=21)

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.aug = BatchAugment(**FULL, interpolation="bilinear", generator=5)
            self.conv = torch.nn.Conv2d(3, 2, 3)

        def forward(self, images):
            return self.conv(self.aug(images))

    model = Model().train(mode == "train")
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    y = compiled(x)
    assert y.shape == (4, 2, 22, 30)
    if mode == "train":  # the draws ran inside the graph, from the module's generator
        p = model.aug.last_params
        assert p is not None and p["angle"].shape == (4,)
        torch.testing.assert_close(model.conv(BatchAugment(**FULL, interpolation="bilinear")(x, params=p)), y, rtol=0, atol=1e-5)
    else:
        torch.testing.assert_close(model(x), y, rtol=0, atol=1e-5)
    p = BatchAugment(**FULL).sample_params(4, seed=1)
    f = torch.compile(lambda t: model.aug(t, params=p), fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(f(x), model.aug(x, params=p), rtol=0, atol=0)


def _rows_by_torch_ops(p: dict, height: int, width: int) -> torch.Tensor:
    """An independent formulation of the engine's rows: torchvision's inverse affine written as torch
    float64 ops on the batch (the implementation before the native one), the color columns as is."""
    f64, n = torch.float64, p["angle"].shape[0]
    rot = -p["angle"] * (math.pi / 180)
    sx, sy = p["shear"][:, 0] * (math.pi / 180), p["shear"][:, 1] * (math.pi / 180)
    a = torch.cos(rot - sy) / torch.cos(sy)
    b = -(a * torch.tan(sx) + torch.sin(rot))
    c = torch.sin(rot - sy) / torch.cos(sy)
    d = torch.cos(rot) - c * torch.tan(sx)
    A = torch.stack([torch.stack([d, -b], -1), torch.stack([-c, a], -1)], -2) / p["scale"][:, None, None]
    centre = torch.tensor([width / 2 - 0.5, height / 2 - 0.5], dtype=f64)
    shift = torch.round(p["translate"] * torch.tensor([width, height], dtype=f64))
    sign = torch.stack([torch.where(p["hflip"], -1.0, 1.0), torch.where(p["vflip"], -1.0, 1.0)], 1).to(f64)
    flip_shift = torch.stack([torch.where(p["hflip"], width - 1.0, 0.0), torch.where(p["vflip"], height - 1.0, 0.0)], 1)
    offset = -centre - shift + flip_shift.to(f64)
    t = (A @ offset[:, :, None])[:, :, 0] + centre
    m = torch.cat([A * sign[:, None, :], t[:, :, None]], 2).reshape(n, 6)
    color = torch.cat([torch.stack([p[k] for k in ("brightness", "contrast", "saturation", "hue")], 1),
                       p["order"].to(f64), p["grayscale"].to(f64)[:, None]], 1)
    return torch.nn.functional.pad(torch.cat([m, color], 1), (0, 24 - 15)).float()


def test_packed_rows_equal_the_torch_formulation():
    aug = BatchAugment(**dict(FULL, shear=(-20, 20, -10, 10), translate=(0.2, 0.1), scale=(0.7, 1.3)))
    p = aug.sample_params(4096, seed=7, epoch=2)
    for height, width in ((224, 224), (37, 101)):
        got, ref = aug.pack_params(p, height, width), _rows_by_torch_ops(p, height, width)
        torch.testing.assert_close(got, ref, rtol=2e-7, atol=2e-5)  # float64 libm vs torch's trig: an ulp
        assert torch.equal(got[:, 6:], ref[:, 6:])


def _general_rows(aug, p, height, width):
    """pack_params through the general path (a plain dict: every tensor converted and checked)."""
    return aug.pack_params(dict(p), height, width)


def test_drawn_params_pack_from_their_blocks_in_one_call(monkeypatch):
    """sample_params' tensors are views of three native blocks (DrawnParams); packing them is one call
    over the blocks, equal bit for bit to the general path, and it really is that call: with the
    general packing broken, drawn parameters still pack and a plain dict does not."""
    from gpupipe.augment import batch_augment

    aug = BatchAugment(**dict(FULL, shear=(-20, 20, -10, 10), translate=(0.2, 0.1), scale=(0.7, 1.3)))
    for p in (aug.sample_params(300, seed=7, epoch=2), aug.sample_params(5), aug.sample_params(0, seed=1)):
        assert type(p) is batch_augment.DrawnParams and p.intact_blocks() is not None
        for k in p:
            assert p[k].is_contiguous(), k
        for height, width in ((224, 224), (37, 101), (1, 1)):
            assert torch.equal(aug.pack_params(p, height, width), _general_rows(aug, p, height, width))
    x = photo_batch(6, 20, 24, seed=4)
    p = aug.sample_params(6, seed=3)
    expected = aug(x, params=dict(p))
    monkeypatch.setattr(batch_augment._C, "pack_augment_params", None, raising=True)
    assert torch.equal(aug(x, params=p), expected)
    with pytest.raises(TypeError):
        aug(x, params=dict(p))


def test_a_replayed_call_checks_drawn_params_once_as_the_template_would(monkeypatch):
    """forward's path for drawn parameters: the blocks checked once (the template checks them in
    check_params and again in pack_params), with the template's results, last_params and errors."""
    from gpupipe.augment import batch_augment

    aug = BatchAugment(**FULL)
    x = photo_batch(6, 20, 24, seed=4)
    p = aug.sample_params(6, seed=3)
    expected = aug._forward((x,), dict(p))
    checks = []
    intact = batch_augment.DrawnParams.intact_blocks
    monkeypatch.setattr(batch_augment.DrawnParams, "intact_blocks", lambda self: checks.append(1) or intact(self))
    assert torch.equal(aug(x, params=p), expected) and len(checks) == 1
    assert aug.last_params is p and aug.last_path == "cpu-kernel"
    with pytest.raises(ValueError, match="for a batch of 5"):
        aug(x[:5], params=p)
    for other in (BatchAugment(**FULL, engine="kornia"), BatchAugment(**FULL, color="linear")):
        assert other(x, params=p).shape == expected.shape  # the template, its own checks


def test_drawn_params_changed_in_place_replaced_or_repointed():
    """A tensor changed in place (values or metadata), replaced or re-pointed takes the general
    path and its checks, with the results of a plain dict of the same tensors; copies are plain
    dicts."""
    import copy
    import pickle

    aug = BatchAugment(**FULL)
    x = photo_batch(4, 16, 20, seed=5)
    p = aug.sample_params(4, seed=2)
    p["angle"] += 10.0
    p["order"][0] = torch.tensor([3, 2, 1, 0])
    p["hflip"][:] = True
    assert p.intact_blocks() is None
    assert torch.equal(aug.pack_params(p, 16, 20), _general_rows(aug, p, 16, 20))
    assert torch.equal(aug(x, params=p), aug(x, params=dict(p)))
    p["hue"][1] = 0.7
    with pytest.raises(ValueError, match=r"params\['hue'\]"):
        aug(x, params=p)
    p = aug.sample_params(4, seed=2)
    p["scale"] = torch.full((4,), 1.5, dtype=torch.float64)  # replaced: the new tensor is packed
    assert p.intact_blocks() is None
    assert torch.equal(aug.pack_params(p, 16, 20)[:, 0], _general_rows(aug, dict(p), 16, 20)[:, 0])
    p["scale"] = torch.ones(3, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"params\['scale'\] must have shape \[4\]"):
        aug(x, params=p)
    p = aug.sample_params(4, seed=2)
    p["brightness"].set_(torch.ones(3, dtype=torch.float64))  # the same tensor, other memory
    assert p.intact_blocks() is None
    with pytest.raises(ValueError, match=r"params\['brightness'\] must have shape \[4\]"):
        aug(x, params=p)
    for change, error, match in ((lambda q: q["translate"].t_(), ValueError, r"params\['translate'\] must have shape"),
                                 (lambda q: q["shear"].transpose_(0, 1), ValueError, r"params\['shear'\] must have shape"),
                                 (lambda q: q["angle"].resize_(3), ValueError, r"params\['angle'\] must have shape"),
                                 (lambda q: q["order"].unsqueeze_(0), ValueError, r"params\['order'\] must have shape"),
                                 (lambda q: setattr(q["angle"], "data", q["angle"].view(torch.int64)), TypeError,
                                  r"params\['angle'\] must be floating point")):
        p = aug.sample_params(4, seed=2)
        change(p)
        assert p.intact_blocks() is None
        with pytest.raises(error, match=match):
            aug(x, params=p)
    p = aug.sample_params(4, seed=2)
    p["angle"].as_strided_((4,), (0,))  # the same memory, another view of it: what a plain dict gives
    assert p.intact_blocks() is None and torch.equal(aug(x, params=p), aug(x, params=dict(p)))
    p = aug.sample_params(4, seed=2)
    saved = io.BytesIO()
    torch.save(p, saved)
    for c in (copy.deepcopy(p), pickle.loads(pickle.dumps(p)), copy.copy(p), p.copy(),
              torch.load(io.BytesIO(saved.getvalue()))):  # (weights_only=True: no global but OrderedDict)
        assert type(c) in (dict, collections.OrderedDict) and list(c.keys()) == list(p.keys())
        assert all(torch.equal(c[k], p[k]) for k in p)
        assert torch.equal(aug(x, params=c), aug(x, params=p))


def test_identity_params_drawn_natively_equal_their_traced_definition():
    """eval()'s parameters come from the native mapping in eager mode (mid-range draws of empty
    ranges) and from torch ops under torch.compile: the same keys, dtypes and values, signs of zero
    included, and they change nothing."""
    from gpupipe.augment import batch_augment

    for n in (0, 1, 7):
        native, traced = BatchAugment.identity_params(n), BatchAugment._traced_identity_params(n)
        assert type(native) is batch_augment.DrawnParams and list(native) == list(traced)
        for k in traced:
            assert native[k].dtype == traced[k].dtype and native[k].shape == traced[k].shape, k
            assert torch.equal(native[k], traced[k]), k
            if native[k].is_floating_point():
                assert torch.equal(torch.signbit(native[k]), torch.signbit(traced[k])), k
    aug = BatchAugment(**FULL)
    x = photo_batch(3, 10, 12, seed=6)
    rows = aug.pack_params(BatchAugment.identity_params(3), 10, 12)
    assert torch.equal(rows, aug.pack_params(BatchAugment._traced_identity_params(3), 10, 12))
    assert torch.equal(aug.eval()(x), BatchAugment(hflip=0.0)(x))  # convert and normalise only


def test_drawn_blocks_refuse_the_wrong_size_or_kind():
    aug = BatchAugment(**FULL)
    floats, flags, order = aug.sample_params(3, seed=1).blocks
    _C.pack_drawn_augment_params(floats, flags, order, 8, 8)
    for bad in ((floats[:-1], flags, order), (floats, flags[:-1], order), (floats, flags, order[:2]),
                (floats, flags, np.concatenate([order.ravel(), order.ravel()[:1]]))):
        with pytest.raises(ValueError, match="must have"):
            _C.pack_drawn_augment_params(*bad, 8, 8)
    for bad in ((floats, flags.astype(np.float64), order), (floats, flags, order.astype(np.float64))):
        with pytest.raises(TypeError):  # a float where a flag or an op index belongs: refused, not cast
            _C.pack_drawn_augment_params(*bad, 8, 8)


def test_ops_opcheck():
    x = photo_batch(2, 12, 16, seed=22)
    aug = BatchAugment(**FULL)
    packed = aug.pack_params(aug.sample_params(2, seed=1), 12, 16)
    args = (x, packed, 1, [0.0, 0.0, 0.0], 0, list(aug.mean), list(aug.std))
    torch.library.opcheck(torch.ops.gpupipe.augment_batch.default, args + (torch.float32, False))
    rows = [aug.sample_params(2, seed=1)[k] for k in ("hflip", "vflip", "angle", "translate", "scale", "shear",
                                                      "brightness", "contrast", "saturation", "hue", "order", "grayscale")]
    torch.library.opcheck(torch.ops.gpupipe.augment_pack_params.default, (rows, 12, 16))
    assert torch.equal(torch.ops.gpupipe.augment_pack_params(rows, 12, 16), packed)
    torch.library.opcheck(torch.ops.gpupipe.augment_batch_out.default, args + (torch.empty(2, 3, 12, 16),))


def test_params_are_packed_by_the_exported_layout():
    """The rows' layout is C++'s (_C.PARAM_LAYOUT): each color model's parameters lie side by side
    inside the row without overlapping, and pack_params writes each into its named columns."""
    layout, count = fused_mod.PARAM_LAYOUT, fused_mod.PARAM_COUNT
    torchvision, linear = ("matrix", "factors", "order", "grayscale"), ("matrix", "linear_a", "linear_t", "linear_u",
                                                                        "linear_mean")
    for names in (torchvision, linear):
        spans = sorted(layout[k] for k in names)
        assert spans[0][0] == 0 and all(a + w == b for (a, w), (b, _) in zip(spans, spans[1:])), spans
        assert spans[-1][0] + spans[-1][1] <= count
    aug = BatchAugment(**FULL)
    p = aug.sample_params(5, seed=3)
    rows = aug.pack_params(p, 12, 16)
    assert rows.shape == (5, count) and rows.dtype == torch.float32

    def cols(name):
        first, width = layout[name]
        return rows[:, first : first + width]

    assert torch.equal(cols("order"), p["order"].float())
    assert torch.equal(cols("grayscale")[:, 0], p["grayscale"].float())
    assert torch.equal(cols("factors")[:, 1], p["contrast"].float())
    used = sum(layout[k][1] for k in torchvision)
    assert not rows[:, used:].any()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.filterwarnings("ignore:Synchronization debug mode is a prototype feature")  # torch 2.11 says so
@pytest.mark.parametrize("path", ["auto", "two_pass"])
def test_cuda_one_transfer_at_most_two_kernels_no_sync(path, monkeypatch):
    """A forward is one host-to-device copy and at most two kernels (one where the fused kernel runs:
    sm_90 and later), and never syncs the host."""
    if path == "two_pass":
        monkeypatch.setenv("GPUPIPE_CUDA_AUGMENT", "two_pass")
    x = photo_batch(8, 64, 64, seed=23, device="cuda")
    aug = BatchAugment(**FULL, interpolation="bilinear")
    p = aug.sample_params(8, seed=24)
    aug(x, params=p)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            aug(x, params=p)
            torch.cuda.synchronize()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    kernels = [n for n in names if "Memcpy" not in n and "Memset" not in n]
    copies = [n for n in names if "Memcpy" in n]
    fused = path == "auto" and torch.cuda.get_device_capability()[0] >= 9
    assert len(kernels) == (1 if fused else 2) and len(copies) == 1, names
    assert not any("Memset" in n for n in names), names


def _cuda_kernels_run(fn) -> list:
    """Names of the gpupipe augment kernels that fn() launches."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA and "augment_" in e.name]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("path", ["auto", "two_pass"])
@pytest.mark.parametrize("h, w", [(61, 83), (224, 224), (301, 97), (6, 3000), (352, 352), (700, 700)])
def test_cuda_equals_host_build(path, h, w, monkeypatch):
    """The CUDA kernels and their host build share augment_pixel.h and round alike: 0 ULP. On sm_90
    the sizes take the fused kernel with clusters of 1, 8 and 4 blocks (6 x 3000: 4 blocks, the last
    without rows), 16 blocks where the device schedules them (352 x 352; an H100 does), and its
    fallback (700 x 700: the state does not fit a cluster's shared memory). Every other sample has
    no contrast mean, so both kinds of sample share the kernels."""
    if path == "two_pass":
        monkeypatch.setenv("GPUPIPE_CUDA_AUGMENT", "two_pass")
    x = photo_batch(6, h, w, seed=25)
    for color in ("torchvision", "linear"):
        for interpolation in ("nearest", "bilinear"):
            aug = BatchAugment(**FULL, interpolation=interpolation, color=color)
            p = aug.sample_params(6, seed=26)
            p["contrast"][::2] = 1.0
            assert torch.equal(aug(x.cuda(), params=p).cpu(), aug(x, params=p)), (color, interpolation)
    names = _cuda_kernels_run(lambda: aug(x.cuda(), params=p))
    fused = any("augment_fused" in n for n in names)
    capability = torch.cuda.get_device_capability()
    if (h, w) == (352, 352) and capability != (9, 0):
        return  # 16-block clusters: the device decides (the H100, sm_90, schedules them)
    assert fused == (path == "auto" and capability[0] >= 9 and (h, w) != (700, 700)), names


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_batch_of_more_than_65535_samples_is_refused():
    """The kernels' grid has a row per sample (at most 65535): a larger batch is a clear error."""
    n = 65536
    x = torch.zeros(n, 3, 2, 2, dtype=torch.uint8, device="cuda")
    aug = BatchAugment(**FULL)
    with pytest.raises(ValueError, match="at most 65535 samples"):
        aug(x, params=aug.sample_params(n, seed=27))


# --- bad input -------------------------------------------------------------------------------------

def test_bad_inputs_name_the_argument():
    aug = BatchAugment(**FULL)
    x = photo_batch(2, 8, 8, seed=27)
    p = aug.sample_params(2, seed=1)
    with pytest.raises(ValueError, match=r"x must be \[N, 3, H, W\] or \[N, 1, H, W\]"):
        aug(torch.zeros(2, 2, 8, 8, dtype=torch.uint8))
    with pytest.raises(ValueError, match="fill has 3 different values"):
        BatchAugment(**FULL, fill=(1, 2, 3))(torch.zeros(2, 1, 8, 8, dtype=torch.uint8))
    with pytest.raises(ValueError, match=r"x must be \[N, 3, H, W\]"):
        aug(torch.zeros(3, 8, 8, dtype=torch.uint8))
    with pytest.raises(TypeError, match="x must be uint8"):
        aug(torch.zeros(2, 3, 8, 8))
    with pytest.raises(TypeError, match="x must be a tensor"):
        aug([1, 2, 3])
    with pytest.raises(ValueError, match="params lack"):
        aug(x, params={"hflip": torch.zeros(2, dtype=torch.bool)})
    with pytest.raises(ValueError, match=r"params\['hflip'\] must have shape \[2\] for a batch of 2, got \[3\]"):
        aug(x, params=aug.sample_params(3, seed=1))
    for key, value, match in (("hue", 0.7, "hue"), ("brightness", -1.0, "brightness"), ("scale", 0.0, "scale"),
                              ("shear", 95.0, "shear"), ("angle", float("nan"), "angle")):
        bad = {k: v.clone() for k, v in p.items()}
        bad[key][0] = value
        with pytest.raises(ValueError, match=match):
            aug(x, params=bad)
    bad = dict(p, order=torch.tensor([[0, 1, 2, 2], [0, 1, 2, 3]]))
    with pytest.raises(ValueError, match="order"):
        aug(x, params=bad)
    with pytest.raises(TypeError, match="hflip"):
        aug(x, params=dict(p, hflip=p["hflip"].float()))
    with pytest.raises(TypeError, match="order"):
        aug(x, params=dict(p, order=p["order"].int()))
    with pytest.raises(ValueError, match="indices"):
        aug.sample_params(3, seed=1, indices=[1, 2])
    for kwargs, match in ((dict(engine="dali"), "engine"), (dict(color="yiq"), "color"), (dict(hue=0.7), "hue"),
                          (dict(hflip=1.5), "probability"), (dict(interpolation="bicubic"), "interpolation"),
                          (dict(fill=(1, 2)), "fill"), (dict(fill=300), "fill"), (dict(scale=(0, 1)), "scale"),
                          (dict(translate=(2, 0)), "translate"), (dict(shear=(1, 2, 3)), "shear"),
                          (dict(out_dtype=torch.int32), "out_dtype"), (dict(out_memory_format=torch.preserve_format), "out_memory_format"),
                          (dict(std=(1, 0, 1)), "std")):
        with pytest.raises(ValueError, match=match):
            BatchAugment(**kwargs)
    nan, inf = float("nan"), float("inf")
    for kwargs, match in ((dict(brightness=nan), "brightness must be finite"), (dict(hue=nan), "hue must be finite"),
                          (dict(contrast=inf), "contrast must be finite"), (dict(rotation=inf), "rotation must be finite"),
                          (dict(shear=nan), "shear must be finite"), (dict(scale=(1, inf)), "scale must be finite"),
                          (dict(mean=(0.5, nan, 0.5)), "mean must be finite"), (dict(brightness=(1, 2, 3)), "brightness"),
                          (dict(rotation=(5,)), "rotation"), (dict(hflip="a"), "hflip"), (dict(vflip=None), "vflip"),
                          (dict(translate=0.1), "translate"), (dict(scale=1.0), "scale"), (dict(mean=0.5), "mean"),
                          (dict(fill="a"), "fill"), (dict(rotation=(10, 5)), "rotation must be a .min, max. range")):
        with pytest.raises(ValueError, match=match):
            BatchAugment(**kwargs)
    for generator in ("a", 1.5):
        with pytest.raises(TypeError, match="generator"):
            BatchAugment(generator=generator)
    with pytest.raises(ValueError, match="pass seed as well"):
        aug.sample_params(2, epoch=1)
    with pytest.raises(ValueError, match="n must be"):
        aug.sample_params(-1)
    from torchvision.transforms import InterpolationMode

    assert BatchAugment(interpolation=InterpolationMode.BILINEAR).interpolation == "bilinear"


def test_numpy_fill_and_an_interpolation_that_is_no_mode():
    """fill=np.uint8(7) was "fill must be a number"; interpolation=[...] an "unhashable type"."""
    for fill in (np.uint8(7), np.float32(7.0), np.int64(7)):
        assert BatchAugment(fill=fill).fill == [7.0, 7.0, 7.0]
    for bad in (["nearest"], {"bilinear": 1}):
        with pytest.raises(ValueError, match="interpolation must be 'nearest' or 'bilinear'"):
            BatchAugment(interpolation=bad)


def test_pillow_interpolation_codes_and_a_negative_std_as_torchvision_takes_them():
    """torchvision takes Pillow's integer codes for interpolation (0 nearest, 2 bilinear) and any
    nonzero std; both were refused."""
    from PIL import Image
    from torchvision.transforms.v2 import functional as F

    for code, name in ((0, "nearest"), (2, "bilinear"), (np.int64(2), "bilinear"), (Image.Resampling.BILINEAR, "bilinear")):
        assert BatchAugment(interpolation=code).interpolation == name
    x = torch.randint(0, 256, (2, 3, 8, 8), dtype=torch.uint8)
    m = affine_matrices(torch.tensor([30.0, -20.0]), (0, 0), 1.0, (0, 0), size=(8, 8))
    assert torch.equal(warp_affine(x, m, interpolation=2), warp_affine(x, m, interpolation="bilinear"))
    for bad in (1, 3, True, "bicubic"):
        with pytest.raises(ValueError, match="interpolation must be 'nearest' or 'bilinear'"):
            warp_affine(x, m, interpolation=bad)
    mean, std = (0.5, 0.4, 0.3), (0.25, -0.5, 1.0)
    got = BatchAugment(hflip=0, mean=mean, std=std)(x)
    torch.testing.assert_close(got, F.normalize(x.float() / 255, list(mean), list(std)), atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="std must not be 0"):
        BatchAugment(std=(0.2, 0.0, 0.2))


def test_binding_validates_buffers():
    """The C++ binding refuses bad buffers before any kernel runs (what bypassing Python could pass)."""
    from gpupipe import _C
    from gpupipe.augment import _kernels

    x = photo_batch(2, 8, 8, seed=28)
    aug = BatchAugment(**FULL)
    packed = aug.pack_params(aug.sample_params(2, seed=1), 8, 8)
    out = torch.empty(2, 3, 8, 8)
    b, f32 = _kernels.buffer, _kernels.ELEM_TYPES[torch.float32]
    common = (0, None, 0, list(aug.mean), list(aug.std), 1)
    _C.augment(b(x), b(packed), b(out), f32, *common)
    storage = torch.empty(48 + 384)
    shared_params = storage[:48].view(2, 24).copy_(packed)
    with pytest.raises(ValueError, match="out overlaps params"):
        _C.augment(b(x), b(shared_params), b(storage[10:394].view(2, 3, 8, 8)), f32, *common)
    raw = torch.zeros(4 * 384, dtype=torch.uint8)  # x and an output sharing bytes
    with pytest.raises(ValueError, match="out overlaps x"):
        _C.augment(b(raw[:384].view(2, 3, 8, 8)), b(packed), b(raw.view(torch.float32).view(2, 3, 8, 8)), f32, *common)
    with pytest.raises(ValueError, match="out overlaps x"):  # also through the out= op
        torch.ops.gpupipe.augment_batch_out(raw[:384].view(2, 3, 8, 8), packed, 0, None, 0, list(aug.mean), list(aug.std),
                                            raw.view(torch.float32).view(2, 3, 8, 8))
    with pytest.raises(ValueError, match="params: dimension 1 must be 24"):
        _C.augment(b(x), b(packed[:, :20]), b(out), f32, *common)
    bad = packed.clone()
    bad[1, 12] = 7.0
    with pytest.raises(ValueError, match="order of sample 1 is not a permutation"):
        _C.augment(b(x), b(bad), b(out), f32, *common)
    with pytest.raises(ValueError, match="out: must be float32"):
        _C.augment(b(x), b(packed), b(out.half()), f32, *common)
    with pytest.raises(ValueError, match="std"):
        _C.augment(b(x), b(packed), b(out), f32, 0, None, 0, [0, 0, 0], [1, 0, 1], 1)
    with pytest.raises(ValueError, match="out_dtype"):
        _C.augment(b(x), b(packed), b(x), _kernels.ELEM_TYPES[torch.uint8], *common)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no CUDA compiler on this machine")
def test_cuda_kernel_was_built_for_sm80_and_sm90():
    """CI has nvcc: the .cu must have compiled into gpupipe._C_cuda for A100 and H100."""
    import subprocess

    from gpupipe.augment import _kernels

    assert fused_mod.cuda_kernel_available()
    cuobjdump = shutil.which("cuobjdump")
    if cuobjdump:
        listing = subprocess.run([cuobjdump, "--list-elf", _kernels._C_cuda.__file__], capture_output=True, text=True).stdout
    else:  # the fat binary names its cubins' architectures
        with open(_kernels._C_cuda.__file__, "rb") as f:
            blob = f.read()
        assert b".nv_fatbin" in blob
        listing = " ".join(a for a in ("sm_80", "sm_90") if a.encode() in blob)
    assert "sm_80" in listing and "sm_90" in listing, listing


def test_output_buffers_are_reused_only_when_unreferenced():
    import torch.utils.dlpack

    x = photo_batch(4, 16, 16, seed=29)
    aug = BatchAugment(**FULL)
    p = aug.sample_params(4, seed=13)
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
    storage = d.untyped_storage()  # only its storage's Python object survives
    ptr_d = d.data_ptr()
    del d
    e = aug(x, params=p)
    assert e.data_ptr() != ptr_d and torch.equal(torch.tensor([], dtype=e.dtype).set_(storage).view_as(e), expected)
    del storage
    e.share_memory_()  # sent to another process (a DataLoader worker's collate_fn): never reused
    ptr_e = e.data_ptr()
    del e
    assert aug(x, params=p).data_ptr() != ptr_e
    for _ in range(2 * aug._outputs.capacity):  # every output sent: the moved buffers give their places
        aug(x, params=p).share_memory_()
    assert sum(b.is_shared() for b in aug._outputs.buffers) == 1  # (the latest, still referenced when made)
    f = aug(x, params=p)
    ptr_f = f.data_ptr()
    del f
    assert aug(x, params=p).data_ptr() == ptr_f  # and the cache still reuses what is free


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_batch_augment_runs_under_inference_mode(mode):
    """An eval loop under torch.inference_mode with the module in the model: its drawn parameters
    were inference tensors, whose missing version counter the replay check read."""
    x = photo_batch(4, 16, 16, seed=31)
    aug = getattr(BatchAugment(**FULL), mode)()
    p = aug.sample_params(4, seed=5)
    with torch.no_grad():
        expected = aug(x, params=p)
    with torch.inference_mode():
        assert torch.equal(aug(x, params=p), expected)
        drawn = aug.sample_params(4, seed=5)
        aug(x)
        drawn["hflip"].logical_not_()  # changed in place inside inference mode: still seen
        changed = aug(x, params=drawn)
    assert torch.equal(aug(x, params=drawn), changed)  # (replayed outside)
    assert mode == "eval" or not torch.equal(changed, expected)


def test_outputs_of_a_collate_fn_in_a_dataloader_worker_are_never_overwritten():
    """A batch a worker sends moves its storage to shared memory and the worker drops its own
    reference: the cache refilled memory the main process held (every batch became the last)."""
    aug = BatchAugment(mean=(0.0,) * 3, std=(1.0,) * 3)

    def collate(samples):
        return aug(torch.stack(samples))

    data = [torch.full((3, 4, 4), 8 * k, dtype=torch.uint8) for k in range(8)]
    loader = torch.utils.data.DataLoader(data, batch_size=1, collate_fn=collate, num_workers=1)
    assert [round(float(b[0, 0, 0, 0]) * 255) for b in loader] == [8 * k for k in range(8)]


def test_replay_takes_parameters_of_any_floating_dtype():
    """check_params accepts any floating dtype: float16 / bfloat16 / float32 copies of drawn
    parameters replay as their float64 values would (numpy has no bfloat16: converted first)."""
    aug = BatchAugment(**FULL)
    x = photo_batch(3, 16, 20, seed=5)
    p = aug.sample_params(3, seed=2)
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        low = {k: v.to(dtype) if v.is_floating_point() else v for k, v in p.items()}
        exact = {k: v.double() if v.is_floating_point() else v for k, v in low.items()}
        assert torch.equal(aug(x, params=low), aug(x, params=exact))


def test_an_empty_batch_augments_to_an_empty_batch():
    aug = BatchAugment(**FULL)
    x = torch.zeros(0, 3, 8, 8, dtype=torch.uint8)
    assert aug(x).shape == (0, 3, 8, 8) and aug(x, params=aug.sample_params(0, seed=1)).shape == (0, 3, 8, 8)
    assert aug.eval()(x).shape == (0, 3, 8, 8)


def test_packed_rows_round_the_shift_half_to_even():
    """translate * (W, H) on a tie rounds half to even (torch.round, and torchvision's int(round())):
    0.125 * 4 = 0.5 -> 0 and 0.375 * 4 = 1.5 -> 2 pixels."""
    aug = BatchAugment(hflip=0.0, translate=(0.4, 0.4))
    p = aug.identity_params(2)
    p["translate"] = torch.tensor([[0.125, 0.0], [0.375, 0.0]], dtype=torch.float64)
    rows = aug.pack_params(p, 4, 4)
    assert rows[:, 2].tolist() == [0.0, -2.0]  # the map reads x - shift
    torch.testing.assert_close(rows, _rows_by_torch_ops(p, 4, 4), rtol=0, atol=0)


def test_native_rows_refuse_arrays_of_the_wrong_size_or_kind():
    import numpy as np

    from gpupipe import _C

    aug = BatchAugment(**FULL)
    rows = [v.numpy() for v in (aug.sample_params(3, seed=1)[k] for k in ("hflip", "vflip", "angle", "translate",
                                "scale", "shear", "brightness", "contrast", "saturation", "hue", "order", "grayscale"))]
    _C.pack_augment_params(*rows, 8, 8)
    for i in range(1, 12):
        bad = list(rows)
        bad[i] = np.concatenate([rows[i], rows[i][:1]])
        with pytest.raises(ValueError, match="must have"):
            _C.pack_augment_params(*bad, 8, 8)
    for i, wrong in ((0, rows[0].astype(np.float64) + 0.5), (10, rows[10].astype(np.float64) + 0.7)):
        bad = list(rows)
        bad[i] = wrong  # a float where a flag or an op index belongs: refused, not cast
        with pytest.raises(TypeError):
            _C.pack_augment_params(*bad, 8, 8)


def test_a_tv_tensors_image_comes_back_an_image_as_from_torchvision():
    from torchvision import tv_tensors

    from gpupipe.augment import RandomErasing, TrivialAugmentWide

    x = photo_batch(4, 16, 16, seed=35)
    image = tv_tensors.Image(x)
    for module in (BatchAugment(**FULL), TrivialAugmentWide(), RandomErasing(p=1.0)):
        p = module.sample_params(4, seed=2)
        for mode in ("train", "eval"):
            getattr(module, mode)()
            got = module(image, params=p) if mode == "train" else module(image)
            want = module(x, params=p) if mode == "train" else module(x)
            assert type(got) is tv_tensors.Image and torch.equal(got.as_subclass(torch.Tensor), want)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("engine", ["fused", "kornia"])
@pytest.mark.parametrize("interpolation", ["nearest", "bilinear"])
@pytest.mark.parametrize("normalize", [((0.5,), (0.25,)), (IMAGENET_MEAN, IMAGENET_STD)], ids=["1-value", "3-values"])
def test_grayscale_images_as_torchvision_takes_them(device, engine, interpolation, normalize):
    """[N, 1, H, W] against torchvision per sample (its ColorJitter leaves a 1-channel image's
    saturation and hue, RandomGrayscale keeps it, contrast blends with its own mean), within the
    stated tolerance; normalised with one value each it stays 1 channel, with 3 it is broadcast to
    3 (torchvision's Normalize); replay, eval, out_dtype and the memory format as for 3 channels."""
    if engine == "kornia":
        pytest.importorskip("kornia", reason="engine='kornia' needs kornia")
    mean, std = normalize
    x = photo_batch(12, 91, 117, seed=44, device=device)[:, 1:2].contiguous()
    aug = BatchAugment(**FULL, interpolation=interpolation, engine=engine, fill=90, mean=mean, std=std)
    p = aug.sample_params(12, seed=45)
    out = aug(x, params=p)
    channels = aug.out_channels(1)
    assert channels == len(mean) and out.shape == (12, channels, 91, 117) and out.device == x.device
    assert f"mean={tuple(mean)}, std={tuple(std)}" in repr(aug)  # (as given: what decides the channels)
    assert out.is_contiguous()
    ref = torchvision_chain(x, p, interpolation=interpolation, fill=90, mean=mean, std=std)
    assert ref.shape == out.shape
    d = assert_within_tolerance(out, ref, std=aug.std[:channels])
    if interpolation == "bilinear":
        assert d.max() < 0.05  # the contrast's mean: 0.9999 of it (the three gray weights), at most 0.026 levels
    # saturation, hue and grayscale draws change nothing; the others do
    same = dict(p, saturation=p["saturation"] * 0 + 1.3, hue=p["hue"] * 0 + 0.2, grayscale=~p["grayscale"])
    assert torch.equal(aug(x, params=same), out)
    assert torch.equal(aug(x.contiguous(memory_format=torch.channels_last), params=p), out)
    assert torch.equal(aug(x, params=aug.last_params), out)
    half = BatchAugment(**FULL, interpolation=interpolation, engine=engine, fill=90, mean=mean, std=std,
                        out_dtype=torch.bfloat16, out_memory_format=torch.channels_last)(x, params=p)
    assert half.dtype == torch.bfloat16 and half.is_contiguous(memory_format=torch.channels_last)
    assert (half.float() - out).abs().max() <= 0.02 * out.abs().max()
    aug.eval()
    want = ((x.float() / 255).expand(-1, channels, -1, -1) - torch.tensor(mean, device=x.device)[:, None, None]) / \
        torch.tensor(std, device=x.device)[:, None, None]
    torch.testing.assert_close(aug(x), want, rtol=0, atol=1e-4)  # (Kornia's float order: 3e-5)


def test_one_mean_and_std_for_every_channel_as_torchvision_normalize():
    from torchvision.transforms import v2

    x = photo_batch(2, 8, 8, seed=36)
    aug = BatchAugment(hflip=0.0, mean=[0.5], std=[0.25])
    assert aug.mean == (0.5,) * 3 and aug.std == (0.25,) * 3
    want = v2.Normalize(mean=[0.5], std=[0.25])(x.float() / 255)
    assert torch.allclose(aug(x), want, atol=1e-5)


def test_grayscale_images_under_torch_compile_fullgraph():
    x = photo_batch(4, 24, 32, seed=46)[:, :1].contiguous()
    for mode in ("train", "eval"):
        aug = BatchAugment(**FULL, mean=[0.5], std=[0.5], generator=5).train(mode == "train")
        y = torch.compile(aug, fullgraph=True, backend="aot_eager")(x)
        assert y.shape == (4, 1, 24, 32)
        want = aug(x, params=aug.last_params) if mode == "train" else aug(x)
        assert torch.equal(y, want)
