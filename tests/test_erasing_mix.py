"""RandomErasing, MixUp, CutMix, RandomChoice and Compose against torchvision.transforms.v2: the same
result for the same draws, the draws distributed as torchvision's, keyed and replayable, bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F

from gpupipe.augment import (AutoAugment, BatchAugment, Compose, CutMix, MixUp, RandAugment, RandomChoice,
                             RandomErasing, TrivialAugmentWide)
from helpers import DEVICES


@pytest.fixture(scope="module")
def images() -> torch.Tensor:
    return torch.randn(16, 3, 61, 87, generator=torch.Generator().manual_seed(0))


def ks_same(a, b) -> None:
    from scipy.stats import ks_2samp

    p = ks_2samp(np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)).pvalue
    assert p > 1e-3, p


# --- RandomErasing ---------------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("value", [0.0, -1.5, (0.5, -0.25, 2.0)])
def test_erasing_equals_torchvision_erase_with_the_same_box(images, device, value):
    erase = RandomErasing(p=0.7, value=value)
    x = images.to(device)
    params = erase.sample_params(16, seed=1, epoch=0, indices=range(16))
    out = erase(x, params=params)
    erased, boxes = erase.boxes(params, 61, 87)
    assert 4 <= int(erased.sum()) < 16
    v = torch.tensor(value if isinstance(value, tuple) else [value])[:, None, None].to(device)
    for i in range(16):
        top, left, h, w = boxes[i].tolist()
        ref = F.erase(x[i], top, left, h, w, v) if erased[i] else x[i]
        assert torch.equal(out[i], ref), i
    assert not torch.equal(out, x) and torch.equal(x, images.to(device))  # a copy, input untouched


def test_erasing_inplace_and_uint8(images):
    erase = RandomErasing(p=1.0, value=7, inplace=True)
    x = (images * 40 + 128).clamp(0, 255).to(torch.uint8)
    y = x.clone()
    params = erase.sample_params(16, seed=2)
    out = erase(y, params=params)
    assert out is y and (out == 7).sum() > (x == 7).sum()
    erased, boxes = erase.boxes(params, 61, 87)
    for i in torch.nonzero(erased)[:, 0].tolist():
        top, left, h, w = boxes[i].tolist()
        assert torch.equal(out[i], F.erase(x[i], top, left, h, w, torch.tensor([7.0])[:, None, None]))


def torchvision_boxes(module: v2.RandomErasing, height: int, width: int, calls: int) -> list:
    torch.manual_seed(0)
    img = torch.zeros(3, height, width)
    boxes = []
    for _ in range(calls):
        if torch.rand(1) >= module.p:  # _RandomApplyTransform.forward's draw
            boxes.append(None)
            continue
        p = module.make_params([img])
        boxes.append(None if p["v"] is None else (p["i"], p["j"], p["h"], p["w"]))
    return boxes


@pytest.mark.parametrize("height, width, scale, ratio", [(224, 224, (0.02, 0.33), (0.3, 3.3)),
                                                         (40, 300, (0.1, 0.9), (0.5, 4.0))])
def test_erasing_boxes_are_distributed_as_torchvisions(height, width, scale, ratio):
    ours_module = RandomErasing(p=0.5, scale=scale, ratio=ratio)
    erased, boxes = ours_module.boxes(ours_module.sample_params(40000, seed=3), height, width)
    theirs = torchvision_boxes(v2.RandomErasing(p=0.5, scale=scale, ratio=ratio), height, width, 6000)
    found = [b for b in theirs if b is not None]
    assert abs(float(erased.float().mean()) - len(found) / len(theirs)) < 0.03
    ours = boxes[erased].numpy()
    found = np.array(found)
    for k in range(4):  # top, left, height, width
        ks_same(ours[:, k], found[:, k])
    ks_same(ours[:, 2] * ours[:, 3], found[:, 2] * found[:, 3])


def test_erasing_random_noise_is_keyed_normal_and_inside_the_box(images):
    erase = RandomErasing(p=1.0, scale=(0.2, 0.3), value="random")
    x = torch.full((16, 3, 61, 87), 100.0)
    params = erase.sample_params(16, seed=4, epoch=1, indices=range(16))
    out = erase(x, params=params)
    erased, boxes = erase.boxes(params, 61, 87)
    noise = []
    for i in range(16):
        top, left, h, w = boxes[i].tolist()
        inside = out[i, :, top : top + h, left : left + w]
        if erased[i]:
            noise.append(inside.flatten())
        outside = out[i].clone()
        outside[:, top : top + h, left : left + w] = 100.0
        assert torch.equal(outside, x[i])
    noise = torch.cat(noise)
    assert noise.numel() > 10000
    from scipy.stats import kstest

    assert kstest(noise.numpy().astype(np.float64), "norm").pvalue > 1e-3
    assert torch.equal(erase(x, params=params), out)  # replay
    part = erase.sample_params(2, seed=4, epoch=1, indices=[5, 6])  # a sample's noise is its own
    assert torch.equal(erase(x[5:7], params=part), out[5:7])


def test_erasing_eval_keyed_and_errors(images):
    erase = RandomErasing(p=1.0)
    assert erase.eval()(images) is images
    assert not erase.last_params["erase"].any()
    erase.train()
    a = erase.sample_params(8, seed=0, epoch=0, indices=range(8))
    b = erase.sample_params(3, seed=0, epoch=0, indices=[2, 3, 4])
    assert all(torch.equal(a[k][2:5], b[k]) for k in a)
    with pytest.raises(ValueError, match="p must"):
        RandomErasing(p=1.5)
    with pytest.raises(ValueError, match="scale"):
        RandomErasing(scale=(0.5, 0.1))
    with pytest.raises(ValueError, match="ratio"):
        RandomErasing(ratio=(0, 1))
    with pytest.raises(ValueError, match="value"):
        RandomErasing(value="noise")
    with pytest.raises(ValueError, match="value has 2 entries"):
        RandomErasing(value=(1, 2))(images)
    with pytest.raises(TypeError, match="floating"):
        RandomErasing(value="random")(images.to(torch.uint8))
    with pytest.raises(ValueError, match="another batch size"):
        erase(images, params=erase.sample_params(4, seed=0))


# --- MixUp / CutMix ---------------------------------------------------------------------------------


def torchvision_with(module, **params):
    """torchvision's transform with make_params returning the given draws."""
    module.make_params = lambda flat_inputs: params
    return module


@pytest.mark.parametrize("soft", [False, True])
def test_mixup_equals_torchvision(images, soft):
    labels = torch.randint(0, 10, (16,), generator=torch.Generator().manual_seed(1))
    if soft:
        labels = torch.softmax(torch.randn(16, 10), dim=1)
    mix = MixUp(alpha=0.2, num_classes=10)
    params = mix.sample_params(16, seed=0, epoch=5, indices=range(32, 48))
    out, soft_labels = mix(images, labels, params=params)
    tv = torchvision_with(v2.MixUp(alpha=0.2, num_classes=10), lam=float(params["lam"]))
    ref, ref_labels = tv(images, labels)
    assert torch.equal(out, ref) and torch.equal(soft_labels, ref_labels)
    assert soft_labels.shape == (16, 10) and torch.allclose(soft_labels.sum(1), torch.ones(16))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.uint8])
def test_cutmix_equals_torchvision(images, device, dtype):
    x = (images * 50 + 100).clamp(0, 255).to(dtype).to(device)
    labels = torch.arange(16).to(device) % 10
    cut = CutMix(alpha=1.0, num_classes=10)
    for seed in range(5):
        params = cut.sample_params(16, seed=seed)
        out, soft = cut(x, labels, params=params)
        box, lam = cut.box(params, 61, 87)
        tv = torchvision_with(v2.CutMix(alpha=1.0, num_classes=10), box=box, lam_adjusted=lam)
        ref, ref_labels = tv(x, labels)
        assert torch.equal(out, ref) and torch.equal(soft, ref_labels)


def test_cutmix_box_is_torchvisions_make_params(monkeypatch):
    """Our box from (lam, centre) is torchvision's make_params for the same lam and centre pixel."""
    cut = CutMix(alpha=1.0, num_classes=3)
    for seed in range(50):
        params = cut.sample_params(4, seed=seed)
        height, width = 37 + seed, 91 - seed
        tv = v2.CutMix(alpha=1.0, num_classes=3)
        tv._dist = type("Fixed", (), {"sample": lambda self, shape: torch.tensor([float(params["lam"])])})()
        centre = [int(float(params["center"][0]) * width), int(float(params["center"][1]) * height)]
        draws = iter(centre)
        monkeypatch.setattr(torch, "randint", lambda high, size: torch.tensor([next(draws)]))
        ref = tv.make_params([torch.zeros(1, 3, height, width)])
        monkeypatch.undo()
        box, lam = cut.box(params, height, width)
        assert box == ref["box"] and lam == ref["lam_adjusted"]


@pytest.mark.parametrize("cls", [MixUp, CutMix])
def test_lambda_is_beta_distributed_and_keyed(cls):
    module = cls(alpha=0.4, num_classes=5)
    lams = [float(module.sample_params(8, seed=s, epoch=0, indices=range(8))["lam"]) for s in range(3000)]
    torch.manual_seed(0)  # torchvision's draw: Beta(alpha, alpha) through torch.distributions
    ref = torch.distributions.Beta(torch.tensor([0.4]), torch.tensor([0.4])).sample((3000,)).flatten()
    ks_same(lams, ref.numpy())
    a = module.sample_params(8, seed=1, epoch=2, indices=range(16, 24))
    assert all(torch.equal(a[k], module.sample_params(8, seed=1, epoch=2, indices=range(16, 24))[k]) for k in a)
    b = module.sample_params(8, seed=1, epoch=3, indices=range(16, 24))
    assert float(a["lam"]) != float(b["lam"])
    c = MixUp(alpha=0.4, num_classes=5) if cls is CutMix else CutMix(alpha=0.4, num_classes=5)
    assert float(c.sample_params(8, seed=1, epoch=2, indices=range(16, 24))["lam"]) != float(a["lam"])


def test_batch_transform_eval_and_errors(images):
    labels = torch.arange(16) % 4
    mix = MixUp(alpha=1.0, num_classes=4).eval()
    out, soft = mix(images, labels)
    assert out is images and torch.equal(soft, torch.nn.functional.one_hot(labels, 4).float())
    mix.train()
    with pytest.raises(ValueError, match="num_classes=4 is smaller than a label"):
        mix(images, labels + 1)
    with pytest.raises(ValueError, match="non-negative"):
        mix(images, labels - 1)
    with pytest.raises(ValueError, match=r"params lack \['lam'\]"):
        mix(images, labels, params={"n": torch.tensor(16)})
    with pytest.raises(ValueError, match=r"params lack \['center'\]"):
        CutMix(num_classes=4)(images, labels, params={"n": torch.tensor(16), "lam": torch.tensor(0.5)})
    for alpha in (0.0, float("inf"), float("nan"), "1"):
        for cls in (MixUp, CutMix):
            with pytest.raises(ValueError, match="alpha must be a positive finite number"):
                cls(alpha=alpha, num_classes=4)
    with pytest.raises(ValueError, match="num_classes"):
        CutMix(num_classes=0)
    with pytest.raises(ValueError, match="num_classes must be given"):
        MixUp()(images, labels)
    with pytest.raises(ValueError, match="labels"):
        mix(images, labels[:5])
    with pytest.raises(ValueError, match="num_classes = 4"):
        mix(images, torch.rand(16, 5))
    with pytest.raises(TypeError, match="floating point"):
        mix(images.to(torch.uint8), labels)
    with pytest.raises(ValueError, match="images"):
        mix(images[0], labels)
    with pytest.raises(ValueError, match="batch of 8"):
        mix(images, labels, params=mix.sample_params(8, seed=0))


# --- RandomChoice -----------------------------------------------------------------------------------


def test_random_choice_frequencies_keys_and_replay(images):
    labels = torch.arange(16) % 10
    choose = RandomChoice([MixUp(0.2, num_classes=10), CutMix(1.0, num_classes=10)], p=[1, 3])
    choices = [int(choose.sample_params(16, seed=0, epoch=e, indices=range(16))["choice"]) for e in range(4000)]
    assert abs(np.mean(choices) - 0.75) < 0.03
    params = choose.sample_params(16, seed=0, epoch=7, indices=range(16))
    out, soft = choose(images, labels, params=params)
    again, soft_again = choose(images, labels, params=choose.last_params)
    assert torch.equal(out, again) and torch.equal(soft, soft_again)
    child = choose.transforms[int(params["choice"])]
    direct, _ = child(images, labels, params=params["params"])
    assert torch.equal(out, direct)
    with pytest.raises(ValueError, match="p has"):
        RandomChoice([MixUp(num_classes=2)], p=[0.5, 0.5])
    with pytest.raises(ValueError, match="transforms"):
        RandomChoice([])


def test_random_choice_in_eval_records_what_it_applied():
    """eval() recorded parameters drawn for the chosen child but never applied: replaying
    last_params did not give the eval output. Now the child's own record (its identity), in
    either mode."""
    x = torch.randint(0, 256, (8, 3, 24, 24), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    choose = RandomChoice([TrivialAugmentWide(), RandomErasing(p=1.0, value=0)], generator=0).eval()
    seen = set()
    for _ in range(8):
        out = choose(x)
        p = choose.last_params
        seen.add(int(p["choice"]))
        assert torch.equal(out, x) and int(p["n"]) == 8
        assert torch.equal(choose(x, params=p), out)
        assert torch.equal(choose.train()(x, params=p), out)
        choose.eval()
    assert seen == {0, 1}


# --- Compose ----------------------------------------------------------------------------------------


class UnkeyedFlip(torch.nn.Module):
    """A module of the first protocol: ``sample_params(n)`` from its own generator, no keys."""

    def __init__(self):
        super().__init__()
        self.generator = torch.Generator().manual_seed(0)
        self.last_params = None

    def sample_params(self, n):
        return {"flip": torch.rand(n, generator=self.generator) < 0.5}

    def forward(self, x, params=None):
        params = self.sample_params(x.shape[0]) if params is None else params
        self.last_params = params
        return torch.where(params["flip"][:, None, None, None], x.flip(-1), x)


def test_compose_is_keyed_and_replays():
    x = torch.randint(0, 256, (6, 3, 45, 53), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    chain = Compose([TrivialAugmentWide(), RandAugment(num_ops=1), UnkeyedFlip(),
                     BatchAugment(hflip=0.5, brightness=0.3, generator=0), RandomErasing(p=0.5)])
    p = chain.sample_params(6, seed=9, epoch=1, indices=range(60, 66))
    assert sorted(p) == ["0", "1", "2", "3", "4"]
    # keyed children draw from derived seeds; the first-protocol child from its generator
    assert torch.equal(p["0"]["op"], TrivialAugmentWide().sample_params(6, seed=_derive(9, 0), epoch=1,
                                                                         indices=range(60, 66))["op"])
    assert all(torch.equal(a, b) for a, b in zip(
        p["3"].values(), BatchAugment(hflip=0.5, brightness=0.3).sample_params(6, seed=_derive(9, 3), epoch=1,
                                                                                indices=range(60, 66)).values()))
    y = chain(x, params=p)
    assert y.dtype == torch.float32 and y.shape == (6, 3, 45, 53)
    assert torch.equal(chain(x, params=chain.last_params), y)
    free = chain(x)  # each child draws for itself; last_params replays that too
    assert torch.equal(chain(x, params=chain.last_params), free)
    with pytest.raises(ValueError, match="keys"):
        chain(x, params={"0": None})


def _derive(seed: int, k: int) -> int:
    from gpupipe import keyed

    return keyed.derive_seed(seed, k)


def test_compose_calls_plain_callables():
    chain = Compose([lambda t: t + 1, RandomErasing(p=1.0, value=0)])
    x = torch.ones(2, 3, 20, 20)
    p = chain.sample_params(2, seed=0)
    assert p["0"] is None
    y = chain(x, params=p)
    assert ((y == 2) | (y == 0)).all() and (y == 0).any()


def test_containers_run_the_children_they_hold():
    """One list: a child replaced through ``transforms`` (by index, or by name as tools that swap
    submodules do) is the child that runs, not a stale private copy; a plain callable is an entry
    shown as itself that adds no state."""
    x = torch.randint(0, 256, (2, 3, 8, 8), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    chain = Compose([TrivialAugmentWide(), BatchAugment(hflip=0.0)]).eval()
    unnormalised = BatchAugment(hflip=0.0, mean=(0, 0, 0), std=(1, 1, 1))
    chain.transforms[1] = unnormalised
    assert torch.equal(chain(x), unnormalised.eval()(x))
    setattr(chain.transforms, "1", torch.nn.Identity())
    assert torch.equal(chain(x), x) and "Identity" in repr(chain)
    choose = RandomChoice([TrivialAugmentWide(), AutoAugment()])
    choose.transforms[0] = choose.transforms[1] = torch.nn.Identity()
    assert torch.equal(choose(x), x)
    plain = Compose([lambda t: t + 1, TrivialAugmentWide()])
    assert "(0): <function" in repr(plain) and "(1): TrivialAugmentWide" in repr(plain)
    assert plain.state_dict() == {} and len(plain.transforms) == 2
    plain.transforms[0] = torch.nn.Identity()
    assert torch.equal(plain.eval()(x), x)


def test_compose_passes_several_inputs_through_as_torchvision():
    """Compose(images, labels) took labels for params ("params must be a dict ... got Tensor"):
    torchvision's v2 Compose passes every input on; a child that takes the images alone gets those."""
    g = torch.Generator().manual_seed(2)
    images, labels = torch.rand(4, 3, 8, 8, generator=g), torch.tensor([0, 1, 2, 0])
    chain = Compose([RandomErasing(p=1.0, value=0), lambda t: t * 2, MixUp(num_classes=3)])
    p = chain.sample_params(4, seed=5)
    out, soft = chain(images, labels, params=p)
    want, want_soft = MixUp(num_classes=3)(RandomErasing(p=1.0, value=0)(images, params=p["0"]) * 2, labels,
                                           params=p["2"])
    assert torch.equal(out, want) and torch.equal(soft, want_soft)
    drawn = chain(images, labels)
    assert all(torch.equal(a, b) for a, b in zip(chain(images, labels, params=chain.last_params), drawn))
    with pytest.raises(TypeError, match="params is keyword-only"):
        chain(images, p)
    with pytest.raises(TypeError, match="takes neither the images alone nor the 2 inputs"):
        Compose([lambda a, b, c: a])(images, labels)
    with pytest.raises(TypeError, match="did not return 2 outputs"):
        Compose([lambda a, b: a])(images, labels)


def test_containers_read_one_shot_indices_once():
    """indices given as a generator went whole to the first child, the next got none."""
    for container in (Compose([TrivialAugmentWide(), RandomErasing()]),
                      RandomChoice([Compose([TrivialAugmentWide(), RandomErasing()])])):
        want = container.sample_params(4, seed=0, epoch=2, indices=[10, 11, 12, 13])
        got = container.sample_params(4, seed=0, epoch=2, indices=(i for i in range(10, 14)))
        inner = (lambda p: p) if isinstance(container, Compose) else (lambda p: p["params"])
        for k in ("0", "1"):
            assert all(torch.equal(inner(got)[k][key], v) for key, v in inner(want)[k].items()), k


def test_numpy_numbers_are_numbers():
    """RandomErasing(p=np.float32(0.5)) and MixUp(alpha=np.float32(0.2)) were refused; torchvision
    takes them (bools stay refused: not numbers in gpupipe's arguments)."""
    assert RandomErasing(p=np.float32(0.5)).p == 0.5
    assert RandomErasing(value=np.float32(0.5))._values == [0.5]
    for cls in (MixUp, CutMix):
        module = cls(alpha=np.float32(0.25), num_classes=np.int64(3))
        assert module.alpha == 0.25 and module.num_classes == 3 and type(module.num_classes) is int
    with pytest.raises(ValueError, match="probability"):
        RandomErasing(p=True)
    with pytest.raises(ValueError, match="alpha"):
        MixUp(alpha=np.float32("nan"))


def test_erasing_select_path_equals_the_kernel(images):
    """Other devices and torch.compile take a select over the batch; the CPU takes the box kernel."""
    erase = RandomErasing(p=0.8, value=(1.0, -2.0, 0.5))
    params = erase.sample_params(16, seed=6)
    eager = erase(images, params=params)
    compiled = torch.compile(erase, fullgraph=True, backend="eager")(images, params=params)
    assert torch.equal(compiled, eager)
    drawing = torch.compile(RandomErasing(p=0.8, generator=2), fullgraph=True, backend="eager")  # its generator:
    assert torch.equal(drawing(images), RandomErasing(p=0.8, generator=2)(images))                # an opaque op
    as_int16 = erase((images * 10).to(torch.int16), params=params)  # no kernel for int16: the select
    assert torch.equal(as_int16, erase((images * 10).to(torch.float32), params=params).to(torch.int16))


def test_mixup_host_kernel_is_torchvisions_expression_bit_for_bit():
    """The one-pass blend (csrc/augment/mix_cpu.cpp) rounds as roll().mul_(1 - lam).add_(images.mul(lam))."""
    from gpupipe.augment import MixUp

    g = torch.Generator().manual_seed(0)
    for shape in ((5, 3, 17, 23), (64, 3, 40, 40), (1, 1, 1, 1)):
        x = torch.randn(shape, generator=g) * 3
        for lam in (0.0, 0.123456789, 0.5, 0.987654321, 1.0):
            out, _ = MixUp(alpha=1.0, num_classes=4)(x, torch.zeros(shape[0], dtype=torch.int64),
                                                     params={"n": torch.tensor(shape[0]), "lam": torch.tensor(lam, dtype=torch.float64)})
            assert torch.equal(out, x.roll(1, 0).mul_(1.0 - lam).add_(x.mul(lam))), (shape, lam)


@pytest.mark.parametrize("cls", [MixUp, CutMix])
@pytest.mark.parametrize("layout", ["contiguous", "channels_last", "float64"])
def test_inplace_mix_writes_the_same_values_over_the_input(cls, layout):
    """inplace=True (the host kernel over the batch, or torch ops where it does not apply): the
    out-of-place result bit for bit, in the input's own storage; one sample, and samples larger than
    the kernel's 16384-float spans, included."""
    g = torch.Generator().manual_seed(3)
    for shape in ((7, 3, 100, 100), (1, 3, 9, 11), (4, 1, 5, 5)):
        x = torch.randn(shape, generator=g) * 3
        if layout == "channels_last":
            x = x.contiguous(memory_format=torch.channels_last)
        elif layout == "float64":
            x = x.double()
        labels = torch.arange(shape[0]) % 4
        for seed in range(3):
            params = cls(alpha=1.0, num_classes=4).sample_params(shape[0], seed=seed)
            ref, ref_labels = cls(alpha=1.0, num_classes=4)(x, labels, params=params)
            y = x.clone(memory_format=torch.preserve_format)
            out, soft = cls(alpha=1.0, num_classes=4, inplace=True)(y, labels, params=params)
            assert out.data_ptr() == y.data_ptr() and out.stride() == y.stride()
            assert torch.equal(out, ref) and torch.equal(soft, ref_labels), (shape, seed)
    assert "inplace=True" in repr(cls(alpha=1.0, num_classes=4, inplace=True))


# --- found by the augmentation audit: compile, autograd, layouts, values --------------------------


def test_random_noise_erasing_compiles_and_equals_eager(images):
    """The keyed noise is an opaque op under torch.compile (numpy's uint64 hash cannot be traced)."""
    erase = RandomErasing(p=0.9, value="random")
    params = erase.sample_params(16, seed=4)
    eager = erase(images, params=params)
    assert torch.equal(torch.compile(erase, backend="eager")(images, params=params), eager)
    drawing = torch.compile(RandomErasing(p=0.9, value="random", generator=5), backend="eager")
    assert torch.equal(drawing(images), RandomErasing(p=0.9, value="random", generator=5)(images))


@pytest.mark.parametrize("value", [0.5, "random"])
def test_erasing_and_mixup_keep_autograd_as_torchvision(images, value):
    erase = RandomErasing(p=1.0, value=value)
    params = erase.sample_params(16, seed=1)
    x = images.clone().requires_grad_()
    erase(x, params=params).sum().backward()
    erased, boxes = erase.boxes(params, 61, 87)
    expected = torch.ones_like(images)
    for i, (t, l, h, w) in enumerate(boxes.tolist()):
        expected[i, :, t:t + h, l:l + w] = 0  # F.erase: no gradient flows from the erased pixels
    assert bool(erased.any()) and torch.equal(x.grad, expected)
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        RandomErasing(p=1.0, value=0.5, inplace=True)(images.clone().requires_grad_(), params=params)
    with torch.no_grad():  # grad mode off: the kernel, the same values
        assert torch.equal(erase(x, params=params), erase(images, params=params))
    mix = MixUp(num_classes=4)
    labels = torch.arange(16) % 4
    p = mix.sample_params(16, seed=2)
    y = images.clone().requires_grad_()
    out, _ = mix(y, labels, params=p)
    assert out.requires_grad and torch.equal(out.detach(), mix(images, labels, params=p)[0])
    out.sum().backward()
    assert torch.allclose(y.grad, torch.ones_like(images))  # lam + (1 - lam), each sample's weight twice


@pytest.mark.parametrize("module", ["erasing", "mixup", "cutmix"])
def test_inplace_changes_after_autograd_saved_the_batch_make_backward_refuse(images, module):
    """The in-place kernels wrote without a version bump: backward then computed a gradient from
    the changed batch, silently, where torch's own in-place ops make it raise."""
    labels = torch.arange(16) % 4
    apply = {"erasing": lambda x: RandomErasing(p=1.0, inplace=True)(x),
             "mixup": lambda x: MixUp(num_classes=4, inplace=True)(x, labels),
             "cutmix": lambda x: CutMix(num_classes=4, inplace=True)(x, labels)}[module]
    x = images.clone()
    w = torch.ones_like(x, requires_grad=True)
    loss = (x * w).sum()  # autograd saves x
    apply(x)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_an_erase_value_set_after_construction_is_used_and_checked(images):
    erase = RandomErasing(p=1.0)
    params = erase.sample_params(16, seed=3)
    erase.value = 5  # (was ignored: the boxes stayed 0)
    assert torch.equal(erase(images, params=params), RandomErasing(p=1.0, value=5)(images, params=params))
    erase.value = "random"
    assert torch.equal(erase(images, params=params), RandomErasing(p=1.0, value="random")(images, params=params))
    with pytest.raises(ValueError, match="value must be"):
        erase.value = "noise"
    assert erase.value == "random"


def test_inplace_erasing_refuses_a_batch_whose_samples_share_memory(images):
    base = images[:1].clone()
    params = RandomErasing(p=1.0).sample_params(4, seed=0)
    for value in (0.0, "random"):
        with pytest.raises(RuntimeError, match="single memory location"):  # as torch's in-place ops
            RandomErasing(p=1.0, value=value, inplace=True)(base.expand(4, -1, -1, -1), params=params)
    assert torch.equal(base, images[:1])


@pytest.mark.parametrize("dtype", [torch.int64, torch.float64, torch.float16, torch.bfloat16, torch.uint8])
def test_erasing_writes_torchvisions_values_in_every_dtype(images, dtype):
    """torchvision makes the value a float32 tensor, then casts it to the image's dtype."""
    erase = RandomErasing(p=1.0, value=(0.1, 2.7, 3.3))
    params = erase.sample_params(16, seed=3)
    x = (images * 40).to(dtype)
    out = erase(x, params=params)
    erased, boxes = erase.boxes(params, 61, 87)
    v = torch.tensor([0.1, 2.7, 3.3])[:, None, None]
    for i, (t, l, h, w) in enumerate(boxes.tolist()):
        want = F.erase(x[i], t, l, h, w, v) if erased[i] else x[i]
        assert torch.equal(out[i], want), i


def test_replayed_mixing_and_erasing_values_are_checked(images):
    labels = torch.arange(16) % 4
    mix, cut = MixUp(num_classes=4), CutMix(num_classes=4)
    for layout in (images, images.to(memory_format=torch.channels_last), images.half()):
        for lam in (2.0, -0.1, float("nan")):
            for module in (mix, cut):
                p = {**module.sample_params(16, seed=0), "lam": torch.tensor(lam, dtype=torch.float64)}
                with pytest.raises(ValueError, match=r"params\['lam'\] must be within \[0, 1\]"):
                    module(layout, labels, params=p)
    for center in ((1.5, -0.5), (0.5, float("nan")), (0.5,)):
        p = {**cut.sample_params(16, seed=0), "center": torch.tensor(center, dtype=torch.float64)}
        with pytest.raises(ValueError, match=r"params\['center'\] must be"):
            cut(images, labels, params=p)
    erase = RandomErasing(p=1.0, value="random")
    for key, bad in (("top", -3.0), ("left", 1.5), ("area", float("nan")), ("log_ratio", float("inf"))):
        p = erase.sample_params(16, seed=0)
        p[key] = p[key].clone()
        p[key][3, 0] = bad
        with pytest.raises(ValueError, match=rf"params\['{key}'\] must be"):
            erase(images, params=p)


def test_keys_must_be_integers():
    """A float seed or index would silently key another sample's draws."""
    for module in (RandomErasing(), MixUp(num_classes=4), TrivialAugmentWide()):
        for bad in (1.7, "3", True):
            with pytest.raises(TypeError, match="seed must be an int"):
                module.sample_params(2, seed=bad)
        with pytest.raises(TypeError, match="epoch must be an int"):
            module.sample_params(2, seed=0, epoch=1.5)
        with pytest.raises(TypeError, match="indices must be integers"):
            module.sample_params(2, seed=0, indices=[1.5, 2.7])
        module.sample_params(2, seed=np.int64(3), epoch=np.uint32(1), indices=torch.tensor([4, 5], dtype=torch.int32))


def test_random_choice_refuses_weights_that_are_not_finite():
    for p in ([float("inf"), 1.0], [float("nan"), 1.0], [1e308, 1e308]):
        with pytest.raises(ValueError, match="finite non-negative weights"):
            RandomChoice([MixUp(num_classes=4), CutMix(num_classes=4)], p=p)
