"""The keyed protocol as a type (gpupipe.keyed.Keyed) and what every keyed augmentation module shares:
its stream, its identity parameters in eval() mode, replay from last_params."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gpupipe import keyed
from gpupipe.augment import (AutoAugment, BatchAugment, Compose, CutMix, MixUp, RandAugment, RandomChoice,
                             RandomErasing, TrivialAugmentWide)


class ForeignKeyed:
    """Another library's keyed module: the protocol by its sample_params' signature."""

    def sample_params(self, n, *, seed=None, epoch=None, indices=None):
        return {}


class FirstProtocol(torch.nn.Module):
    """``sample_params(n)`` alone: drawn from its own generator, never keyed."""

    def sample_params(self, n):
        return {}


def modules():
    return [BatchAugment(brightness=0.2), TrivialAugmentWide(), RandAugment(), AutoAugment(), RandomErasing(p=1.0),
            MixUp(num_classes=4), CutMix(num_classes=4)]


def test_the_protocol_is_a_type():
    keyed_ones = [*modules(), Compose([TrivialAugmentWide()]), RandomChoice([MixUp(num_classes=2)]), ForeignKeyed()]
    for m in keyed_ones:
        assert isinstance(m, keyed.Keyed) and keyed.takes_keys(m), type(m).__name__
    for m in (FirstProtocol(), object(), torch.nn.Identity(), None):
        assert not isinstance(m, keyed.Keyed) and not keyed.takes_keys(m), type(m).__name__
    chain = Compose([FirstProtocol(), TrivialAugmentWide()])  # a first-protocol child draws unkeyed
    p = chain.sample_params(2, seed=1)
    assert p["0"] == {} and torch.equal(
        p["1"]["op"], TrivialAugmentWide().sample_params(2, seed=keyed.derive_seed(1, 1))["op"])


@pytest.mark.parametrize("module", modules(), ids=lambda m: type(m).__name__)
def test_each_module_draws_on_its_own_named_stream(module):
    assert module.stream == keyed.stream_of(type(module).__name__)


def inputs_of(module):
    g = torch.Generator().manual_seed(0)
    if isinstance(module, (MixUp, CutMix)):
        return torch.rand(4, 3, 12, 14, generator=g), torch.tensor([0, 1, 3, 2])
    if isinstance(module, RandomErasing):
        return (torch.rand(4, 3, 12, 14, generator=g),)
    return (torch.randint(0, 256, (4, 3, 12, 14), dtype=torch.uint8, generator=g),)


@pytest.mark.parametrize("module", modules(), ids=lambda m: type(m).__name__)
def test_eval_keeps_the_identity_params_and_replays(module):
    x = inputs_of(module)
    drawn = module(*x)
    replayed = module(*x, params=module.last_params)
    if isinstance(drawn, torch.Tensor):
        drawn, replayed = (drawn,), (replayed,)
    assert all(torch.equal(a, b) for a, b in zip(drawn, replayed))
    module.eval()
    out = module(*x)
    identity = module.identity_params(4)
    if identity is None:  # the batch transforms: nothing mixed, labels as soft labels
        assert module.last_params is None and torch.equal(out[0], x[0])
        return
    assert sorted(module.last_params) == sorted(identity)
    assert all(torch.equal(module.last_params[k], v) for k, v in identity.items())
    assert torch.equal(module(*x, params=identity), out)  # the identity parameters are what eval() applies


@pytest.mark.parametrize("module", modules(), ids=lambda m: type(m).__name__)
def test_each_module_moves_and_copies_as_an_nn_module(module):
    """nn.Module's own methods still work on every keyed module, alone and inside a container
    (.to / .cpu / .float go through nn.Module._apply, which a subclass must not shadow)."""
    import copy

    chain = Compose([module])
    for m in (module, chain):
        assert m.to("cpu") is m and m.cpu() is m and m.float() is m and m.train(False) is m
        m.train()
    twin = copy.deepcopy(module)
    assert type(twin) is type(module) and twin.stream == module.stream


def _numpy_uniforms(seed, epoch, indices, count, stream=0):
    """keyed.uniforms' definition in numpy (SplitMix64 on uint64 arrays): the native hash's reference."""
    golden, mask = np.uint64(0x9E3779B97F4A7C15), 2**64 - 1

    def mix(x):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))

    idx = np.asarray(indices, dtype=np.int64).astype(np.uint64)
    with np.errstate(over="ignore"):
        key = mix(np.array([seed & mask], dtype=np.uint64) + golden)
        key = mix(key ^ (np.array([epoch & mask], dtype=np.uint64) * golden))
        if stream & mask:  # stream 0 modulo 2**64: the crop samplers' (no stream mixed in)
            key = mix(key ^ mix(np.array([stream & mask], dtype=np.uint64) + golden))
        keys = mix(key ^ mix(idx + golden))
        counters = keys[:, None] + (np.arange(1, count + 1, dtype=np.uint64) * golden)[None, :]
        return (mix(counters) >> np.uint64(11)).astype(np.float64) * (1.0 / 2**53)


@pytest.mark.parametrize("seed, epoch, stream", [(0, 0, 0), (11, 3, keyed.stream_of("BatchAugment")),
                                                 (-1, 2**70 + 5, 7), (2**63, -3, 2**40), (5, 1, 2**64),
                                                 (5, 1, -2**64 + 3)])
def test_native_uniforms_equal_their_numpy_definition(seed, epoch, stream):
    indices = np.array([0, 1, 2, 1000, 2**40, -7, 2**63 - 1], dtype=np.int64)
    got = keyed.uniforms(seed, epoch, indices, 17, stream=stream)
    assert got.dtype == np.float64 and got.shape == (7, 17)
    assert np.array_equal(got, _numpy_uniforms(seed, epoch, indices, 17, stream))
    assert np.array_equal(keyed.uniforms(seed, epoch, indices[3:5], 5, stream=stream), got[3:5, :5])  # no batch effect


def test_indices_of_any_size_and_sign_are_taken_modulo_2_64():
    """Like seeds: [-1, 2**63] (which numpy holds as float64) was "indices must be integers, got
    float64", while [2**63, ...] alone (uint64) was taken modulo 2**64."""
    module, mix = TrivialAugmentWide(), MixUp(num_classes=2)
    want = module.sample_params(4, seed=0, indices=np.array([-1, -2**63, 0, 1], dtype=np.int64))
    for idx in ([-1, 2**63, 0, 1], [2**64 - 1, 2**63, 2**64, 2**64 + 1],
                np.array([-1, 2**63, 0, 2**128 + 1], dtype=object)):
        got = module.sample_params(4, seed=0, indices=idx)
        assert all(torch.equal(got[k], v) for k, v in want.items()), idx
    lam = mix.sample_params(2, seed=0, indices=[-1, 2**63])["lam"]  # keyed by the first index
    assert lam == mix.sample_params(2, seed=0, indices=[2**64 - 1, 0])["lam"]
    for bad in ([-1, 2**63, 0.5, 1], [-1, 2**63, "0", 1]):
        with pytest.raises(TypeError, match="indices must be integers"):
            module.sample_params(4, seed=0, indices=bad)



@pytest.mark.parametrize("draw", ["uniforms", "crops"])
def test_the_crop_samplers_and_keyed_uniforms_take_indices_as_the_modules_do(draw):
    """keyed.uniforms and the crop samplers truncated a float index to another sample's draws
    ([1.7] drew sample 1's) and overflowed on [-1, 2**63]."""
    from gpupipe import crops

    sampler = crops.RandomResizedCrop(16)
    size = np.full(4, 100)

    def drawn(indices):
        if draw == "uniforms":
            return keyed.uniforms(3, 1, indices, 5)
        return sampler.boxes(size, size, seed=3, epoch=1, indices=indices)

    want = drawn(np.array([-1, -2**63, 0, 1], dtype=np.int64))
    for idx in ([-1, 2**63, 0, 1], [2**64 - 1, 2**63, 2**64, 2**64 + 1], torch.tensor([-1, -2**63, 0, 1])):
        assert np.array_equal(drawn(idx), want)
    for bad in ([1.7, 0, 1, 2], np.array([0.0, 1, 2, 3]), ["0", "1", "2", "3"]):
        with pytest.raises(TypeError, match="indices must be integers"):
            drawn(bad)


def test_a_subclass_forwarding_sample_params_stays_keyed():
    """sample_params(self, n, **kw) that forwards to the base class takes keys: the Loader keys it."""

    class Forwarding(BatchAugment):
        def sample_params(self, n, **kw):
            return super().sample_params(n, **kw)

    class FirstProtocolChild(BatchAugment):
        def sample_params(self, n):
            return super().sample_params(n)

    assert keyed.takes_keys(Forwarding()) and not keyed.takes_keys(FirstProtocolChild())


def independent_modules():
    """Every module that declares its samples independent, with its input."""
    u8 = torch.randint(0, 256, (11, 3, 20, 24), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    f32 = u8.float() / 255
    return [
        (BatchAugment(hflip=0.5, vflip=0.5, rotation=20, translate=(0.1, 0.1), brightness=0.4, contrast=0.4,
                      saturation=0.4, hue=0.1, grayscale=0.2), u8),
        (BatchAugment(hflip=0.5, brightness=0.3, color="linear"), u8),
        (TrivialAugmentWide(), u8), (RandAugment(), u8), (AutoAugment(), u8),
        (RandomErasing(p=0.7), f32), (RandomErasing(p=0.7, value=(0.1, 0.2, 0.3)), f32),
        (RandomErasing(p=0.7, value=9), u8),
        (Compose([TrivialAugmentWide(), BatchAugment(hflip=0.5, saturation=0.4), RandomErasing(0.5)]), u8),
    ]


@pytest.mark.parametrize("module, x", independent_modules(), ids=lambda v: type(v).__name__)
@pytest.mark.parametrize("training", [True, False])
def test_a_samples_independent_module_gives_a_batch_the_outputs_of_its_parts(module, x, training):
    """The declaration the Loader relies on to augment a chunk's batches in one call
    (``keyed.samples_independent``): the batch's output, with its keyed parameters (or in eval()
    mode without), is its parts' outputs with their rows, concatenated, bit for bit."""
    assert keyed.samples_independent(module)
    module.train(training)
    indices = torch.arange(100, 100 + len(x))
    whole_params = module.sample_params(len(x), seed=4, epoch=2, indices=indices) if training else None
    call = (lambda x, idx: module(x, params=module.sample_params(len(x), seed=4, epoch=2, indices=idx))) \
        if training else (lambda x, idx: module(x))
    whole = module(x.clone(), params=whole_params) if training else module(x.clone())
    parts = torch.cat([call(x[a:b].clone(), indices[a:b]) for a, b in ((0, 4), (4, 5), (5, 11))])
    assert torch.equal(whole, parts)


def test_modules_that_draw_per_batch_are_not_samples_independent():
    assert not keyed.samples_independent(RandomChoice([TrivialAugmentWide(), AutoAugment()]))
    assert not keyed.samples_independent(MixUp(0.2, num_classes=3)) and not keyed.samples_independent(CutMix(1.0))
    assert not keyed.samples_independent(BatchAugment(hflip=0.5, engine="kornia"))
    assert not keyed.samples_independent(Compose([TrivialAugmentWide(), RandomChoice([AutoAugment()])]))
    assert not keyed.samples_independent(torch.nn.Identity()) and not keyed.samples_independent(None)


def test_a_subclass_that_changes_the_draws_is_not_vouched_for_unless_it_declares_again():
    """The declaration is not inherited by a subclass that overrides how parameters are drawn or
    applied (one angle per batch would make a chunk's batches differ from batches alone)."""

    class OneAnglePerBatch(BatchAugment):
        def sample_params(self, n, **kw):
            p = super().sample_params(n, **kw)
            p["angle"][:] = p["angle"][0]
            return p

    class Declared(OneAnglePerBatch):
        samples_independent = True

    class Renamed(BatchAugment):  # no override: still the same draws and kernel
        pass

    assert keyed.samples_independent(BatchAugment(rotation=10)) and keyed.samples_independent(Renamed(rotation=10))
    assert not keyed.samples_independent(OneAnglePerBatch(rotation=10))
    assert keyed.samples_independent(Declared(rotation=10))
    assert not keyed.samples_independent(Compose([TrivialAugmentWide(), OneAnglePerBatch(rotation=10)]))
    plain = torch.nn.Identity()
    plain.samples_independent = True  # an instance's own declaration
    assert keyed.samples_independent(plain)
    assert keyed.samples_independent(torch.compile(BatchAugment(hflip=0.5)))  # the module it compiles
    assert not keyed.samples_independent(torch.compile(OneAnglePerBatch(hflip=0.5)))
