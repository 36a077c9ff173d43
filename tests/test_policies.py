"""TrivialAugmentWide, RandAugment and AutoAugment against torchvision.transforms.v2: the op tables,
every op at several magnitudes on real photos (per sample, same op and magnitude), the draws'
distributions, the keyed protocol, and bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import DEVICES, photos
from torchvision.transforms import v2

from gpupipe import _C, keyed
from gpupipe.augment import AutoAugment, RandAugment, TrivialAugmentWide
from gpupipe.augment import _auto_augment_ops as ops
from gpupipe.augment import _policy_kernels
from gpupipe.augment.auto_augment import POLICIES

GEOMETRIC = ("ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate")
FACTOR_OPS = ("Brightness", "Color", "Contrast", "Sharpness")  # float blends: rounding as torch's float path


@pytest.fixture(scope="module")
def batch() -> torch.Tensor:
    return photos(157, 203)  # neither side a multiple of 8


def torchvision_module(module):
    if isinstance(module, TrivialAugmentWide):
        return v2.TrivialAugmentWide(module.num_magnitude_bins, interpolation=module.interpolation, fill=module.fill)
    if isinstance(module, RandAugment):
        return v2.RandAugment(module.num_ops, module.magnitude, module.num_magnitude_bins,
                              interpolation=module.interpolation, fill=module.fill)
    return v2.AutoAugment(v2.AutoAugmentPolicy(module.policy), interpolation=module.interpolation, fill=module.fill)


def reference(tv, x: torch.Tensor, steps: list) -> torch.Tensor:
    """torchvision applied per sample: steps[i] is the list of (op name, magnitude) of sample i."""
    out = []
    for i in range(x.shape[0]):
        img = x[i]
        for name, magnitude in steps[i]:
            img = tv._apply_image_or_video_transform(img, name, magnitude, interpolation=tv.interpolation,
                                                     fill=tv._fill)
        out.append(img)
    return torch.stack(out)


def steps_of(module, params: dict, height: int, width: int) -> list:
    """The (op name, magnitude) sequence each sample undergoes, read from the module's parameters as
    its docstring defines them, with torchvision's op lists, sub-policies and magnitudes (not the
    module's tables): an op index is an index into torchvision's list, a bin into its magnitudes, a
    signed op's magnitude is negated where ``negate``; an AutoAugment step that does not apply is
    the identity."""
    tv = torchvision_module(module)
    space = tv._AUGMENTATION_SPACE
    names = list(space)

    def step(name: str, bin_: int, negate: bool, num_bins: int) -> tuple:
        magnitudes, signed = space[name]
        m = magnitudes(num_bins, height, width)
        value = 0.0 if m is None else float(m[bin_])
        return name, -value if signed and negate else value

    if isinstance(module, TrivialAugmentWide):
        return [[step(names[op], bin_, negate, module.num_magnitude_bins)]
                for op, bin_, negate in zip(params["op"].tolist(), params["bin"].tolist(), params["negate"].tolist())]
    if isinstance(module, RandAugment):
        bins = module.num_magnitude_bins
        return [[step(names[op], module.magnitude, negate, bins) for op, negate in zip(ops_, negates)]
                for ops_, negates in zip(params["op"].tolist(), params["negate"].tolist())]
    sub_policies = tv._policies
    return [[step(name, bin_ or 0, negate, 10) if applied else ("Identity", 0.0)
             for (name, _, bin_), applied, negate in zip(sub_policies[policy], apply, negates)]
            for policy, apply, negates in zip(params["policy"].tolist(), params["apply"].tolist(),
                                              params["negate"].tolist())]


def slot_tensors(steps: list) -> list:
    """Per slot, (op ids int64 [N] into ops.OP_NAMES, signed magnitudes float64 [N]) of steps_of's steps."""
    return [(torch.tensor([ops.OP_NAMES.index(s[k][0]) for s in steps]),
             torch.tensor([s[k][1] for s in steps], dtype=torch.float64)) for k in range(len(steps[0]))]


def fill_levels(fill):
    """A policy's ``fill`` as its kernel takes it: None (zeros), or 3 values on the 0..255 scale."""
    return None if fill is None else torch.tensor(fill, dtype=torch.float64).expand(3).tolist()


def level_diff(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a.int() - b.int()).abs()


# --- the tables ------------------------------------------------------------------------------------


@pytest.mark.parametrize("ours, theirs", [(ops.TRIVIAL_AUGMENT_WIDE_SPACE, v2.TrivialAugmentWide),
                                          (ops.RAND_AUGMENT_SPACE, v2.RandAugment),
                                          (ops.AUTO_AUGMENT_SPACE, v2.AutoAugment)])
def test_magnitude_spaces_are_torchvisions(ours, theirs):
    space = theirs._AUGMENTATION_SPACE
    assert list(ours) == list(space)  # the order decides which op a uniform draw picks
    for name, (fn, signed) in space.items():
        assert ours[name][1] == signed, name
        for bins, h, w in ((31, 157, 203), (10, 224, 224), (7, 33, 500)):
            a, b = ours[name][0](bins, h, w), fn(bins, h, w)
            assert (a is None) == (b is None), name
            if a is not None:
                assert a.dtype == b.dtype and torch.equal(a, b), name


@pytest.mark.parametrize("policy", ["imagenet", "cifar10", "svhn"])
def test_autoaugment_policies_are_torchvisions(policy):
    assert POLICIES[policy] == v2.AutoAugment(v2.AutoAugmentPolicy(policy))._policies


def test_kinds_come_from_the_kernel():
    kinds = _C.policy_kinds()
    assert len(set(kinds.values())) == len(kinds)
    n = len(ops.OP_NAMES)
    op_kinds, _, _ = ops.slot_arguments(torch.arange(n), torch.zeros(n, dtype=torch.float64), 8, 8)
    for name, kind in zip(ops.OP_NAMES, op_kinds.tolist()):  # each op runs as the kernel's kind of its name
        assert kind == kinds["affine" if name in GEOMETRIC else name.lower()], name


# --- every op against torchvision, per sample --------------------------------------------------------

# Tolerance per op (levels, and the fraction of values allowed to differ); docs/semantics.md "Policies".
# Integer ops are exact. The float blends are torch's float32 steps, fused multiply-adds included
# where torch's vector kernels use them (AVX2, AVX-512); its baseline kernels (a CPU without AVX2,
# or ATEN_CPU_CAPABILITY=default) round those steps separately, and the uint8 truncation after the
# blend turns that last-bit difference into 1 level on up to ~1% of values (measured 0.98%). Hence
# 1 level allowed on 2% of values: a wrong op differs by more than a level.
EXACT = (0, 0.0)
TOLERANCE = {name: (1, 2e-2) for name in FACTOR_OPS}
BILINEAR_TOLERANCE = (1, 2e-2)  # the interpolated value within float rounding of a rounding boundary


def near_pixel_boundary(matrix: torch.Tensor, height: int, width: int, eps: float = 1e-3) -> torch.Tensor:
    """bool [H, W]: output pixels whose exact sample coordinate (float64, from the float32 map) lies
    within eps of a pixel boundary (a half-integer), where nearest sampling is a tie that float
    rounding decides (torchvision's float32 grid and ours round differently there)."""
    m = matrix.double()
    ys, xs = torch.meshgrid(torch.arange(height, dtype=torch.float64), torch.arange(width, dtype=torch.float64),
                            indexing="ij")
    sx, sy = m[0] * xs + m[1] * ys + m[2], m[3] * xs + m[4] * ys + m[5]
    return (((sx - sx.floor()) - 0.5).abs() < eps) | (((sy - sy.floor()) - 0.5).abs() < eps)


def bilinear_half_levels(image: torch.Tensor, matrix: torch.Tensor, fill, eps: float = 2e-2) -> torch.Tensor:
    """bool [3, H, W]: values whose exact bilinear interpolation (float64, torchvision's fill
    blend) lies within eps of a half level, where rounding to uint8 is a tie float rounding decides
    (eps: float32 coordinates are off by ~1e-5 px, times up to 255 levels per pixel, plus margin)."""
    _, height, width = image.shape
    m = matrix.double()
    ys, xs = torch.meshgrid(torch.arange(height, dtype=torch.float64), torch.arange(width, dtype=torch.float64),
                            indexing="ij")
    sx, sy = m[0] * xs + m[1] * ys + m[2], m[3] * xs + m[4] * ys + m[5]
    x0, y0 = sx.floor(), sy.floor()
    value = torch.zeros(3, height, width, dtype=torch.float64)
    mask = torch.zeros(height, width, dtype=torch.float64)
    img = image.double()
    for dy in (0, 1):
        for dx in (0, 1):
            xx, yy = x0 + dx, y0 + dy
            weight = (1 - (sx - x0 - dx).abs()) * (1 - (sy - y0 - dy).abs())
            inside = (xx >= 0) & (xx < width) & (yy >= 0) & (yy < height)
            weight = torch.where(inside, weight, 0.0)
            pix = img[:, yy.clamp(0, height - 1).long(), xx.clamp(0, width - 1).long()]
            value += weight * pix
            mask += weight
    if fill is not None:
        f = torch.tensor(fill, dtype=torch.float64)[:, None, None]
        value = (value - f) * mask + f
    return ((value - value.floor()) - 0.5).abs() < eps


def assert_op_matches(out: torch.Tensor, ref: torch.Tensor, name: str, matrix: torch.Tensor, interpolation: str,
                      context, image=None, fill=None) -> float:
    """One sample against torchvision, within its op's tolerance; returns the fraction that differs.
    Geometric ops differ only at ties: nearest where the sample coordinate is on a pixel boundary
    (near_pixel_boundary), bilinear by 1 level where the exact value is a half level."""
    d = level_diff(out, ref)
    frac = float((d > 0).float().mean())
    if name in GEOMETRIC and interpolation == "nearest":
        off_ties = (d.amax(0) > 0) & ~near_pixel_boundary(matrix, out.shape[1], out.shape[2])
        assert not off_ties.any(), (context, int(off_ties.sum()))
        return frac
    if name in GEOMETRIC and image is not None:
        off_ties = (d > 0) & ~bilinear_half_levels(image, matrix, fill)
        assert d.max() <= 1 and not off_ties.any(), (context, int(d.max()), int(off_ties.sum()))
        return frac
    worst, max_frac = BILINEAR_TOLERANCE if name in GEOMETRIC else TOLERANCE.get(name, EXACT)
    assert d.max() <= worst and frac <= max_frac, (context, int(d.max()), frac)
    return frac


def check_op(module, x, name: str, bin_: int, negate: bool):
    """TrivialAugmentWide's op ``name`` (its index in torchvision's list) on every sample of x."""
    n, height, width = x.shape[0], x.shape[2], x.shape[3]
    op_index = list(v2.TrivialAugmentWide._AUGMENTATION_SPACE).index(name)
    params = {"op": torch.full((n,), op_index), "bin": torch.full((n,), bin_), "negate": torch.full((n,), negate)}
    out = module(x, params=params)
    steps = steps_of(module, params, height, width)
    ref = reference(torchvision_module(module), x, steps)
    (op, magnitude), = slot_tensors(steps)
    matrices = ops.geometric_matrices(op, magnitude, height, width)
    return [assert_op_matches(out[i], ref[i], name, matrices[i], module.interpolation, (name, bin_, negate, i), x[i],
                              fill_levels(module.fill)) for i in range(n)]


@pytest.mark.parametrize("name", list(v2.TrivialAugmentWide._AUGMENTATION_SPACE))
def test_trivial_augment_ops_equal_torchvision(batch, name):
    module = TrivialAugmentWide()
    for bin_ in (0, 1, 13, 20, 30):  # bin 20 of Rotate is 90 degrees
        for negate in (False, True):
            check_op(module, batch, name, bin_, negate)


@pytest.mark.parametrize("name", ["ShearX", "TranslateY", "Rotate"])
def test_geometric_ops_on_a_square_image(name):
    """Square images take torchvision's rot90 fast path at 90 degrees: the warp must agree."""
    x = photos(120, 120)
    module = TrivialAugmentWide()
    for bin_ in (7, 20, 30):
        for negate in (False, True):
            check_op(module, x, name, bin_, negate)


@pytest.mark.parametrize("name", GEOMETRIC)
def test_geometric_ops_bilinear_with_fill(batch, name):
    module = TrivialAugmentWide(interpolation="bilinear", fill=[10, 128, 250])
    for bin_ in (5, 30):
        check_op(module, batch, name, bin_, True)


@pytest.mark.parametrize("policy", ["imagenet", "svhn"])
def test_auto_augment_bilinear_with_fill(policy):
    """AutoAugment's magnitudes (shear 0.1 k) put whole columns on half pixels: the bilinear ties."""
    x = photos(89, 117).repeat(7, 1, 1, 1)
    module = AutoAugment(policy, interpolation="bilinear", fill=(0, 90, 255))
    params = module.sample_params(28, seed=2, epoch=0, indices=range(28))
    params["policy"] = torch.arange(28) % 25
    params["apply"][:] = True
    check_steps(module, x, params)


@pytest.mark.parametrize("name", GEOMETRIC)
def test_geometric_ops_nearest_with_fill(batch, name):
    module = TrivialAugmentWide(fill=77)
    check_op(module, batch, name, 17, False)


def test_a_mixed_batch_gives_each_sample_its_own_op():
    """A realistic batch: every sample a different op and magnitude, one kernel call."""
    x = photos(101, 133).repeat(4, 1, 1, 1)  # 16 samples
    module = TrivialAugmentWide()
    params = module.sample_params(16, seed=5, epoch=0, indices=range(16))
    params["op"] = torch.arange(16) % 14  # every op once at least
    out = module(x, params=params)
    steps = steps_of(module, params, 101, 133)
    ref = reference(torchvision_module(module), x, steps)
    (op, magnitude), = slot_tensors(steps)
    matrices = ops.geometric_matrices(op, magnitude, 101, 133)
    names = list(v2.TrivialAugmentWide._AUGMENTATION_SPACE)
    for i, name in enumerate(names[k] for k in params["op"].tolist()):
        assert_op_matches(out[i], ref[i], name, matrices[i], "nearest", (i, name))


def check_steps(module, x: torch.Tensor, params: dict) -> None:
    """A sequence of ops, step by step: each slot's output against torchvision's op applied per
    sample to the previous slot's output, within that op's tolerance; the module's output is the last."""
    height, width = x.shape[2], x.shape[3]
    tv = torchvision_module(module)
    fill = fill_levels(module.fill)
    current = x
    for op, magnitude in slot_tensors(steps_of(module, params, height, width)):
        kinds, p, matrices = ops.slot_arguments(op, magnitude, height, width)
        step = ops.policy_apply(current, kinds[:, None], p[:, None], matrices[:, None], module.interpolation, fill)
        names = [ops.OP_NAMES[int(k)] for k in op]
        ref = reference(tv, current, [[(names[i], float(magnitude[i]))] for i in range(x.shape[0])])
        for i, name in enumerate(names):
            assert_op_matches(step[i], ref[i], name, matrices[i], module.interpolation, (i, name, float(magnitude[i])),
                              current[i], fill)
        current = step
    assert torch.equal(module(x, params=params), current)


# --- grayscale [N, 1, H, W] images ----------------------------------------------------------------


@pytest.fixture(scope="module")
def gray() -> torch.Tensor:
    return photos(157, 203)[:, 1:2].contiguous()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(v2.TrivialAugmentWide._AUGMENTATION_SPACE))
def test_grayscale_ops_equal_torchvision(gray, device, name):
    """torchvision's ops on a 1-channel image, each within its tolerance: Color leaves it as it is,
    Contrast blends with the mean of its own levels (the 3-channel gray level, 0.9999 of it
    floored, puts 81-97% of the values 1 level off), the rest act per channel."""
    n = gray.shape[0]
    names = list(v2.TrivialAugmentWide._AUGMENTATION_SPACE)
    for interpolation, fill in (("nearest", None), ("bilinear", 77)):
        module = TrivialAugmentWide(interpolation=interpolation, fill=fill)
        for bin_ in (1, 13, 20, 30):
            for negate in (False, True):
                params = {"op": torch.full((n,), names.index(name)), "bin": torch.full((n,), bin_),
                          "negate": torch.full((n,), negate)}
                out = module(gray.to(device), params=params).cpu()
                assert out.shape == gray.shape and out.dtype == torch.uint8
                steps = steps_of(module, params, *gray.shape[2:])
                ref = reference(torchvision_module(module), gray, steps)
                (op, magnitude), = slot_tensors(steps)
                matrices = ops.geometric_matrices(op, magnitude, *gray.shape[2:])
                for i in range(n):
                    assert_op_matches(out[i], ref[i], name, matrices[i], interpolation, (name, bin_, negate, i))
            if name not in GEOMETRIC:
                break  # (the interpolation and fill only matter to the warps)


@pytest.mark.parametrize("pairs", [[("Brightness", "Contrast"), ("Equalize", "Contrast"), ("Contrast", "Equalize"),
                                    ("Posterize", "Contrast")],
                                   [("Contrast", "Contrast"), ("Color", "Contrast"), ("AutoContrast", "Contrast"),
                                    ("Contrast", "Solarize")]])
def test_grayscale_sequences_equal_torchvision(gray, pairs):
    """Two ops a sample in one call: Contrast folds into a run of table ops after another one (the
    mean of its input from the histogram the ops before it remapped)."""
    module = RandAugment(num_ops=2, magnitude=17)
    names = list(v2.RandAugment._AUGMENTATION_SPACE)
    params = module.sample_params(4, seed=3)
    params["op"] = torch.tensor([[names.index(a), names.index(b)] for a, b in pairs])
    out = module(gray, params=params)
    ref = reference(torchvision_module(module), gray, steps_of(module, params, *gray.shape[2:]))
    d = level_diff(out, ref)
    assert d.max() <= 1 and (d > 0).float().mean() <= 0.02, (int(d.max()), float((d > 0).float().mean()))


@pytest.mark.parametrize("module", [RandAugment(num_ops=2, magnitude=9), AutoAugment("cifar10")], ids=type)
def test_grayscale_policies_equal_torchvision(gray, module):
    x = gray.repeat(7, 1, 1, 1)  # AutoAugment: every sub-policy
    params = module.sample_params(28, seed=4, epoch=0, indices=range(28))
    if isinstance(module, AutoAugment):
        params["policy"] = torch.arange(28) % 25
    out = module(x, params=params)
    ref = reference(torchvision_module(module), x, steps_of(module, params, *x.shape[2:]))
    # (a warp's nearest-neighbour ties, then the ops after it, differ: a few values in a million;
    # a wrong Color or Contrast puts most values of its samples off)
    assert (level_diff(out, ref) > 0).float().mean() <= 1e-3
    assert torch.equal(module(x.contiguous(memory_format=torch.channels_last), params=params), out)
    module.eval()
    assert module(x) is x


@pytest.mark.parametrize("magnitude", [0, 5, 9, 30])
def test_rand_augment_sequences_equal_torchvision(magnitude):
    x = photos(97, 141).repeat(3, 1, 1, 1)
    module = RandAugment(num_ops=2, magnitude=magnitude)
    check_steps(module, x, module.sample_params(12, seed=magnitude, epoch=3, indices=range(100, 112)))


@pytest.mark.parametrize("policy", ["imagenet", "cifar10", "svhn"])
def test_auto_augment_sub_policies_equal_torchvision(policy):
    x = photos(89, 117).repeat(7, 1, 1, 1)  # 28 samples
    module = AutoAugment(policy)
    params = module.sample_params(28, seed=1, epoch=0, indices=range(28))
    params["policy"] = torch.arange(28) % 25  # every sub-policy
    params["apply"][:25] = True
    check_steps(module, x, params)


def test_not_applied_steps_are_identity():
    x = photos(64, 80)
    module = AutoAugment()
    params = module.sample_params(4, seed=0)
    params["apply"][:] = False
    assert torch.equal(module(x, params=params), x)


# --- the draws' distributions ----------------------------------------------------------------------


def torchvision_draws(tv, calls: int, seed: int = 0) -> list:
    """What torchvision's forward draws: per call, the (op, magnitude) steps it applies."""
    seen, current = [], []

    def record(image, transform_id, magnitude, interpolation, fill):
        current.append((transform_id, magnitude))
        return image

    tv._apply_image_or_video_transform = record
    torch.manual_seed(seed)
    img = torch.zeros(3, 16, 16, dtype=torch.uint8)
    for _ in range(calls):
        current = []
        tv(img)
        seen.append(current)
    return seen


def frequencies(draws: list, key) -> dict:
    counts: dict = {}
    for d in draws:
        k = key(d)
        counts[k] = counts.get(k, 0) + 1
    return counts


def assert_same_distribution(ours: dict, theirs: dict, n_ours: int, n_theirs: int):
    """Two-sample chi-square over the union of categories (deterministic draws: no flakiness)."""
    from scipy.stats import chi2_contingency

    keys = sorted(set(ours) | set(theirs), key=repr)
    table = np.array([[ours.get(k, 0) for k in keys], [theirs.get(k, 0) for k in keys]])
    assert table[0].sum() == n_ours and table[1].sum() == n_theirs
    p = chi2_contingency(table)[1]
    assert p > 1e-3, (p, dict(zip(map(repr, keys), table.T.tolist())))


@pytest.mark.parametrize("module", [TrivialAugmentWide(), RandAugment(num_ops=2, magnitude=9),
                                    RandAugment(num_ops=1, magnitude=30, num_magnitude_bins=31), AutoAugment("imagenet"),
                                    AutoAugment("svhn")], ids=["trivial", "rand2", "rand1", "auto-imagenet", "auto-svhn"])
def test_draws_are_distributed_as_torchvisions(module):
    n_ours, n_theirs = 40000, 6000
    params = module.sample_params(n_ours, seed=11, epoch=0)
    ours = steps_of(module, params, 16, 16)
    if isinstance(module, AutoAugment):  # torchvision skips steps that do not apply
        ours = [[s for s, applied in zip(steps, params["apply"][i].tolist()) if applied] for i, steps in enumerate(ours)]
    theirs = torchvision_draws(torchvision_module(module), n_theirs)
    # the op and the signed magnitude of each step, and the number of steps per call
    for slot in range(2):
        key = (lambda d, s=slot: (d[s][0], round(d[s][1], 5)) if len(d) > s else None)
        assert_same_distribution(frequencies(ours, key), frequencies(theirs, key), n_ours, n_theirs)
    assert_same_distribution(frequencies(ours, len), frequencies(theirs, len), n_ours, n_theirs)


def test_trivial_augment_draws_are_uniform():
    module = TrivialAugmentWide()
    p = module.sample_params(140000, seed=2)
    assert torch.bincount(p["op"], minlength=14).float().div(140000 / 14).sub(1).abs().max() < 0.03
    assert torch.bincount(p["bin"], minlength=31).float().div(140000 / 31).sub(1).abs().max() < 0.05
    assert abs(p["negate"].float().mean() - 0.5) < 0.005


# --- the keyed protocol ----------------------------------------------------------------------------


@pytest.mark.parametrize("cls", [TrivialAugmentWide, RandAugment, AutoAugment])
def test_keyed_params_depend_only_on_seed_epoch_index(cls, monkeypatch):
    module = cls()
    whole = module.sample_params(8, seed=7, epoch=2, indices=range(10, 18))
    part = module.sample_params(3, seed=7, epoch=2, indices=[13, 14, 15])
    for k in whole:
        assert torch.equal(whole[k][3:6], part[k]), k
    other_epoch = module.sample_params(8, seed=7, epoch=3, indices=range(10, 18))
    assert any(not torch.equal(whole[k], other_epoch[k]) for k in whole)
    # the draws are keyed.uniforms of (seed, epoch, index) on the documented stream, and nothing else
    assert module.stream == keyed.stream_of(cls.__name__)
    calls, uniforms = [], keyed.uniforms

    def spy(seed, epoch, indices, count, *, stream=0):
        calls.append((seed, epoch, list(indices), stream))
        return uniforms(seed, epoch, indices, count, stream=stream)

    monkeypatch.setattr(keyed, "uniforms", spy)
    again = module.sample_params(8, seed=7, epoch=2, indices=range(10, 18))
    assert calls == [(7, 2, list(range(10, 18)), keyed.stream_of(cls.__name__))]
    assert all(torch.equal(whole[k], again[k]) for k in whole)


def test_modules_draw_from_their_own_streams():
    a = TrivialAugmentWide().sample_params(64, seed=0)["op"]
    b = RandAugment(num_ops=1).sample_params(64, seed=0)["op"][:, 0]
    assert not torch.equal(a, b)


@pytest.mark.parametrize("cls", [TrivialAugmentWide, RandAugment, AutoAugment])
def test_replay_is_exact_and_generator_reproducible(batch, cls):
    module = cls(generator=3)
    y = module(batch)
    assert torch.equal(module(batch, params=module.last_params), y)
    assert all(torch.equal(a, b) for a, b in zip(cls(generator=3).sample_params(4).values(),
                                                  cls(generator=3).sample_params(4).values()))


def test_eval_mode_is_identity(batch):
    module = TrivialAugmentWide().eval()
    assert module(batch) is batch
    assert torch.equal(module.last_params["op"], torch.zeros(4, dtype=torch.int64))


def test_memory_format_and_threads(batch):
    module = RandAugment(num_ops=3, magnitude=20)
    params = module.sample_params(4, seed=0)
    cl = module(batch, params=params)
    assert cl.is_contiguous(memory_format=torch.channels_last)
    planar = module(batch.contiguous(), params=params)
    assert planar.is_contiguous() and torch.equal(planar, cl)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(module(batch, params=params), cl)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("device", DEVICES)
def test_devices_agree_with_the_cpu(batch, device):
    module = TrivialAugmentWide()
    params = module.sample_params(4, seed=9)
    y = module(batch.to(device), params=params)
    assert y.device.type == device and torch.equal(y.cpu(), module(batch, params=params))


def test_compiles(batch):
    module = TrivialAugmentWide()
    params = module.sample_params(4, seed=4)
    compiled = torch.compile(module, fullgraph=True, backend="eager")
    assert torch.equal(compiled(batch, params=params), module(batch, params=params))


@pytest.mark.parametrize("cls", [TrivialAugmentWide, RandAugment, AutoAugment])
def test_compiles_drawing_from_its_generator(batch, cls):
    """Train mode without params under torch.compile(fullgraph=True): the draw from the module's
    generator is an opaque op, and gives the eager module's draws (a twin seeded alike)."""
    compiled = torch.compile(cls(generator=5), fullgraph=True, backend="eager")
    eager = cls(generator=5)
    for _ in range(2):
        assert torch.equal(compiled(batch), eager(batch))


def test_compiled_policies_take_every_image_size_in_one_or_two_graphs():
    """Progressive resizing under torch.compile(fullgraph=True): a size's SlotTable is built in the
    graph and never stored on the module there (a per-size entry written inside the compiled region
    was state dynamo guards on: two graphs a size, the recompile limit hit at the fifth size)."""
    graphs = []

    def counting(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    module, eager = RandAugment(generator=1), RandAugment(generator=1)
    compiled = torch.compile(module, backend=counting, fullgraph=True)
    for size in (12, 14, 16, 18, 20, 22):
        g = torch.Generator().manual_seed(size)
        x = torch.randint(0, 256, (2, 3, size, size + 3), dtype=torch.uint8, generator=g)
        assert torch.equal(compiled(x), eager(x)), size
    assert len(graphs) <= 2 and module._tables == {}


def test_each_policy_compiles_as_its_own_code_object():
    """torch.compile keeps a compiled forward's graphs per code object, at most recompile_limit:
    one forward shared by the three policies made the third fail to compile in a process that
    compiles all three (KeyedModule's docstring); here a limit of 1 shows it with one call each."""
    assert len({cls.forward.__code__ for cls in (TrivialAugmentWide, RandAugment, AutoAugment)}) == 3
    x = torch.randint(0, 256, (2, 3, 16, 16), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    torch._dynamo.reset()
    with torch._dynamo.config.patch(recompile_limit=1):
        for cls in (TrivialAugmentWide, RandAugment, AutoAugment):
            compiled = torch.compile(cls(generator=2), fullgraph=True, backend="eager")
            assert torch.equal(compiled(x), cls(generator=2)(x)), cls.__name__


# --- bad input -------------------------------------------------------------------------------------


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="policy"):
        AutoAugment("imagenet21k")
    with pytest.raises(ValueError, match="magnitude"):
        RandAugment(magnitude=31)
    with pytest.raises(ValueError, match="magnitude"):
        RandAugment(magnitude=-1)
    with pytest.raises(ValueError, match="num_ops"):
        RandAugment(num_ops=-1)
    with pytest.raises(ValueError, match="num_magnitude_bins"):
        TrivialAugmentWide(num_magnitude_bins=1)
    with pytest.raises(ValueError, match="interpolation"):
        TrivialAugmentWide(interpolation="bicubic")
    with pytest.raises(ValueError, match="fill"):
        TrivialAugmentWide(fill=300)
    with pytest.raises(ValueError, match="fill"):
        TrivialAugmentWide(fill=[1, 2])
    with pytest.raises(TypeError, match="generator"):
        TrivialAugmentWide(generator="seed")


def test_bad_inputs_are_named(batch):
    module = TrivialAugmentWide()
    with pytest.raises(TypeError, match="x must be uint8"):
        module(batch.float())
    with pytest.raises(ValueError, match=r"\[N, 3, H, W\] or \[N, 1, H, W\]"):
        module(batch[:, :2])
    with pytest.raises(ValueError, match="fill has 3 different values"):
        TrivialAugmentWide(fill=(1, 2, 3))(batch[:, :1])
    with pytest.raises(ValueError, match="another batch size"):
        module(batch, params=module.sample_params(5, seed=0))
    with pytest.raises(ValueError, match="params lack"):
        module(batch, params={"op": torch.zeros(4, dtype=torch.int64)})
    bad = module.sample_params(4, seed=0)
    bad["op"][0] = 14
    with pytest.raises(ValueError, match=r"params\['op'\]"):
        module(batch, params=bad)
    with pytest.raises(ValueError, match="indices"):
        module.sample_params(4, seed=0, indices=[1, 2])
    with pytest.raises(ValueError, match="seed"):
        module.sample_params(4, epoch=1)


def test_binding_checks_buffers(batch):
    from gpupipe.augment._kernels import buffer

    x = batch.contiguous()
    out = torch.empty_like(x)
    kinds, params, matrices = torch.zeros(4, 1, dtype=torch.int64), torch.zeros(4, 1, dtype=torch.float64), torch.zeros(4, 1, 6)

    def call(*tensors, fill=None):
        return _C.policy_apply(*[buffer(t) for t in tensors], 0, fill, 1)

    with pytest.raises(ValueError, match="out overlaps x"):
        call(x, x, kinds, params, matrices)
    with pytest.raises(ValueError, match="kinds: must be int64"):
        call(x, out, params, params, matrices)
    with pytest.raises(ValueError, match="kinds: dimension 0 must be 4"):
        call(x, out, kinds[:3], params, matrices)
    with pytest.raises(ValueError, match="params: dimension 1 must be 1"):
        call(x, out, kinds, torch.zeros(4, 2, dtype=torch.float64), matrices)
    with pytest.raises(ValueError, match="not a policy op"):
        call(x, out, torch.full((4, 1), 99), params, matrices)
    kind = dict(_C.policy_kinds())
    for name in ("brightness", "color", "contrast", "sharpness", "posterize", "solarize"):
        for bad in (float("nan"), float("inf"), -1e6):
            with pytest.raises(ValueError, match=r"params\[2, 0\] = .* must be finite"):
                call(x, out, torch.full((4, 1), kind[name]), torch.tensor([[1.0], [1.0], [bad], [1.0]],
                                                                           dtype=torch.float64), matrices)
    call(x, out, torch.full((4, 1), kind["affine"]), torch.full((4, 1), 1e9, dtype=torch.float64),
         torch.tensor([1.0, 0, 0, 0, 1, 0]).repeat(4, 1, 1))  # the warps read no parameter
    with pytest.raises(ValueError, match="x: must be uint8"):
        call(x.float(), out, kinds, params, matrices)
    with pytest.raises(ValueError, match="fill"):
        call(x, out, kinds, params, matrices, fill=[0.0, 300.0, 0.0])
    short = buffer(out)
    short[1] -= 1  # one byte less storage than the shape needs
    with pytest.raises(ValueError, match="the buffer holds"):
        _C.policy_apply(buffer(x), short, buffer(kinds), buffer(params), buffer(matrices), 0, None, 1)


def test_cuda_kernel_is_built_when_nvcc_was_found():
    """The CUDA kernels must compile wherever nvcc is on PATH (they run only on a GPU machine)."""
    import shutil

    from gpupipe.augment import _kernels

    if shutil.which("nvcc") is None:
        pytest.skip("no nvcc on PATH: the CUDA kernels are not built here")
    assert _kernels.cuda_kernel_available() and hasattr(_kernels._C_cuda, "policy_apply")


def test_table_runs_fold_as_slot_by_slot():
    """Consecutive table ops run as one pass (histograms remapped through the tables before them):
    the result is each slot applied in turn, for every memory format and both thread paths."""
    names = list(v2.RandAugment._AUGMENTATION_SPACE)
    sequences = [("Solarize", "Equalize", "AutoContrast", "Posterize"), ("Posterize", "Contrast", "Equalize", "Identity"),
                 ("Equalize", "Identity", "Equalize", "Brightness"), ("Contrast", "Contrast", "Solarize", "AutoContrast"),
                 ("Rotate", "Equalize", "Color", "AutoContrast"), ("Identity", "Identity", "Identity", "Identity"),
                 ("AutoContrast", "Sharpness", "Equalize", "TranslateX"), ("Brightness", "Posterize", "Solarize", "Equalize"),
                 ("Posterize", "Solarize", "Identity", "Brightness"), ("Solarize", "Brightness", "Color", "Posterize"),
                 ("Posterize", "Posterize", "ShearY", "Brightness"), ("Contrast", "Brightness", "Sharpness", "Solarize")]
    module = RandAugment(num_ops=4, magnitude=17)
    x = photos(61, 83).repeat(3, 1, 1, 1)
    params = {"op": torch.tensor([[names.index(s) for s in seq] for seq in sequences]),
              "negate": torch.rand(12, 4, generator=torch.Generator().manual_seed(0)) < 0.5}
    current = x
    for op, magnitude in slot_tensors(steps_of(module, params, 61, 83)):
        kinds, p, matrices = ops.slot_arguments(op, magnitude, 61, 83)
        current = ops.policy_apply(current, kinds[:, None], p[:, None], matrices[:, None])
    threads = torch.get_num_threads()
    try:
        for n_threads in (1, 2):  # a task per sample; with 2 threads and 4 samples, each pass's rows shared out
            torch.set_num_threads(n_threads)
            for images in (x, x.contiguous()):
                assert torch.equal(module(images, params=params), current)
                half = {k: v[:4] for k, v in params.items()}
                assert torch.equal(module(images[:4], params=half), current[:4])
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("channels_last", [True, False], ids=["direct-loop", "table"])
def test_point_ops_equal_their_float32_definition(channels_last):
    """Brightness, posterize and solarize over every level, at factors, bits and thresholds on and
    between levels: channels-last runs take the per-byte loops, other layouts the tables."""
    levels = torch.arange(256, dtype=torch.uint8).reshape(1, 1, 16, 16).expand(2, 3, 16, 16).clone()
    x = torch.cat([levels, photos(16, 16, channels_last=False)[:2]])
    x = x.contiguous(memory_format=torch.channels_last) if channels_last else x.contiguous()
    kind = dict(_C.policy_kinds())
    identity = torch.tensor([1.0, 0, 0, 0, 1, 0]).repeat(x.shape[0], 1, 1)

    def run(name, param):
        kinds = torch.full((x.shape[0], 1), kind[name])
        return ops.policy_apply(x, kinds, torch.full((x.shape[0], 1), param, dtype=torch.float64), identity)

    f = x.float()
    for factor in (0.0, 0.5, 1.0, 1.37, 1.99, 300.0):
        ref = (f * torch.tensor(factor, dtype=torch.float32)).clamp(0, 255).to(torch.uint8)
        assert torch.equal(run("brightness", factor), ref), factor
    for bits in range(9):
        mask = 255 if bits >= 8 else ((1 << bits) - 1) << (8 - bits)
        assert torch.equal(run("posterize", float(bits)), x & mask), bits
    for threshold in (-3.0, 0.0, 0.2, 127.5, 128.0, 254.9, 255.0, 255.1, 300.0):
        ref = torch.where(f >= torch.tensor(threshold, dtype=torch.float32), 255 - x, x)
        assert torch.equal(run("solarize", threshold), ref), threshold


def test_rand_augment_checks_magnitude_and_num_ops_whenever_they_are_set():
    """A magnitude schedule sets them between epochs: a bin past the last would read another op's row."""
    m = RandAugment(num_ops=1, magnitude=9, num_magnitude_bins=31)
    for bad in (31, -1, 2.0, True):
        with pytest.raises(ValueError, match="magnitude must be an int bin in"):
            m.magnitude = bad
    with pytest.raises(ValueError, match="num_ops must be a non-negative int"):
        m.num_ops = -1
    assert m.magnitude == 9 and m.num_ops == 1
    m.magnitude, m.num_ops = 30, 3
    x = torch.randint(0, 256, (4, 3, 16, 16), dtype=torch.uint8)
    assert m(x).shape == x.shape and m.last_params["op"].shape == (4, 3)
    assert m.sample_params(4, seed=0)["op"].shape == (4, 3) and m._draws == 6


def test_a_fill_that_is_not_a_number_is_named():
    for fill in (True, "white", [True], ["5"]):
        with pytest.raises(ValueError, match="fill must be None, a number or a sequence"):
            TrivialAugmentWide(fill=fill)


def test_numpy_numbers_and_bad_interpolations():
    """A numpy number is a number (torchvision's check takes it as one), alone or in a sequence; an
    interpolation that is not a mode is named (a list was an "unhashable type" TypeError)."""
    for fill in (np.uint8(7), np.float32(7.0), np.int64(7), [np.float32(7.0)], (np.uint8(7), 7, 7.0)):
        assert TrivialAugmentWide(fill=fill)._fill == [7.0, 7.0, 7.0], fill
    for bad in (["nearest"], {"nearest": 1}, 3, True, 2.0):  # (3 is Pillow's bicubic)
        with pytest.raises(ValueError, match="interpolation must be 'nearest' or 'bilinear'"):
            RandAugment(interpolation=bad)
    assert RandAugment(interpolation=2).interpolation == "bilinear"  # Pillow's code, as torchvision takes it


@pytest.mark.parametrize("cls", [TrivialAugmentWide, RandAugment, AutoAugment])
def test_a_fill_set_after_construction_is_used_and_checked(cls):
    """`policy.fill = 128` was ignored (the parsed fill stayed the constructor's)."""
    x = torch.randint(0, 256, (8, 3, 24, 24), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    policy = cls()
    params = policy.sample_params(8, seed=4)
    policy.fill = 128
    assert torch.equal(policy(x, params=params), cls(fill=128)(x, params=params))
    with pytest.raises(ValueError, match="fill"):
        policy.fill = 300
    assert policy.fill == 128


def test_policy_arguments_are_held_while_the_kernel_reads_them(monkeypatch):
    """Non-contiguous kinds / params / matrices are copied for the kernel; the copies must live
    until it returns (a buffer is an address only): memory freed before the call and reused (here
    by same-size garbage) gave the kernel other ops."""
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (6, 3, 20, 24), dtype=torch.uint8, generator=g)
    kinds = torch.tensor([[_policy_kernels.KINDS["invert"]] * 2, [_policy_kernels.KINDS["posterize"]] * 2] * 3)
    params = torch.tensor([[1.0, 1.0], [2.0, 2.0]] * 3, dtype=torch.float64)
    matrices = torch.zeros(6, 2, 6, dtype=torch.float32)
    want = _policy_kernels.policy_apply(x, kinds[:, :1].contiguous(), params[:, :1].contiguous(), matrices[:, :1].contiguous())
    real, garbage = _C.policy_apply, []

    def churn(*args):  # what another thread might allocate meanwhile
        for shape, dtype, value in (((6, 1), torch.int64, 0), ((6, 1), torch.float64, 0.0), ((6, 1, 6), torch.float32, float("nan"))):
            garbage.extend(torch.full(shape, value, dtype=dtype) for _ in range(8))
        return real(*args)

    monkeypatch.setattr(_C, "policy_apply", churn)
    got = _policy_kernels.policy_apply(x, kinds[:, :1], params[:, :1], matrices[:, :1])  # strided views: copies
    assert torch.equal(got, want)
