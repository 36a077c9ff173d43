"""The hybrid backend's scheduler, on the CPU: engine shares, keyed routes, the split of a batch
between the CPU pool and the GPU engines, declined samples, failing engines, the Loader's epoch
re-tuning and its resume. The GPU engines are stood in for by host engines that decode as a GPU
decoder does (the whole image, then an exact resize: the CPU core without DCT scaling); the real
engines' pixels are tested on a GPU (tests/test_nvimgcodec.py)."""

from __future__ import annotations

import dataclasses
import textwrap
import threading
import time

import numpy as np
import pytest
import torch

import gpupipe
from gpupipe import _C, backends, routing
from gpupipe._backends import cpu, hybrid
from gpupipe.decode_types import DecodeOptions, Route, read_infos
from helpers import PHOTOS, encode, photo, photo_jpegs, run_child
from loader_data import index_of, make_image_folder

SIZE = (24, 32)


class HostEngine:
    """A GPU decoder's stand-in: whole-image decode + exact resize (the CPU core, no DCT scaling)
    into ``out[slots]``; declines the samples ``decline(data)`` picks; raises when ``fail``. With
    ``gated``, its first call sets ``held`` and waits for ``gate`` (a test orders events by them,
    never by sleeps: a loaded machine runs threads late)."""

    def __init__(self, kind: str, decline=None, fail: bool = False, delay: float = 0.0, gated: bool = False):
        self.kind, self.decline, self.fail, self.delay = kind, decline, fail, delay
        self.calls = []
        self.threads = set()
        self.held, self.gate = threading.Event(), threading.Event()
        if not gated:
            self.gate.set()

    def decode(self, buffers, boxes, out, slots, options, *, sizes):
        assert np.array_equal(sizes, [[b.column("height")[0], b.column("width")[0]] for b in map(read_infos, ([x] for x in buffers))])
        self.calls.append(np.asarray(slots).copy())
        self.threads.add(threading.get_ident())
        if not self.held.is_set():
            self.held.set()
            assert self.gate.wait(60)
        if self.fail:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        time.sleep(self.delay * len(buffers))
        declined = {k: "refused by the stand-in" for k, b in enumerate(buffers) if self.decline and self.decline(b)}
        take = [k for k in range(len(buffers)) if k not in declined]
        if take:
            sub = torch.empty((len(take), *out.shape[1:]), dtype=torch.uint8)
            status = cpu.decode([buffers[k] for k in take], np.ascontiguousarray(boxes[take]), sub,
                                dataclasses.replace(options, dct_scaling=False), read_infos([buffers[k] for k in take]))
            assert status.ok.all()
            out[torch.from_numpy(np.asarray(slots)[take])] = sub
        return declined


class MergingHostEngine(HostEngine):
    """A HostEngine that takes several batches' shares in one call (as nvImageCodec's engines do)."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.groups = []

    def decode_jobs(self, jobs):
        self.groups.append([len(j[0]) for j in jobs])
        return [self.decode(b, x, out, slots, options, sizes=sizes) for b, x, out, slots, options, sizes in jobs]


def engines(**kw):
    return {"hardware": HostEngine("hardware", **kw.get("hardware", {})), "cuda": HostEngine("cuda", **kw.get("cuda", {}))}


def expected_routes(seed, epoch, indices, shares, infos) -> list:
    """The routes :func:`hybrid.assign` gives, with the progressive files it sends to the hardware
    decoder (which declines them) on the CPU core instead."""
    e = hybrid.assign(seed, epoch, indices, shares, np.ones(len(indices), bool))
    routes = np.array([Route.CPU, Route.GPU_HARDWARE, Route.GPU_CUDA])[e]
    routes[(e == 1) & (infos.column("progressive") == 1)] = Route.CPU_FALLBACK
    return routes.tolist()


def batch(n: int = 24):
    datas = photo_jpegs([PHOTOS[i % 4] for i in range(n)], [{"quality": 90}, {"quality": 85, "progressive": True}])
    infos = read_infos(datas)
    rng = np.random.default_rng(0)
    h, w = infos.column("height"), infos.column("width")
    bh = rng.integers(20, h + 1)
    bw = rng.integers(20, w + 1)
    boxes = np.stack([rng.integers(0, h - bh + 1), rng.integers(0, w - bw + 1), bh, bw], axis=1).astype(np.int64)
    return datas, infos, boxes


def options(**kw):
    return DecodeOptions(**{"size": SIZE, "resize": True, "num_threads": 2, "backend": "hybrid", **kw})


# --- shares and routes ------------------------------------------------------------------------------

def test_shares_follow_the_rates_and_keep_every_engine_measured():
    s = hybrid.Shares.from_rates({"cpu": 2000, "hardware": 6000, "cuda": 2000}, ["cpu", "hardware"])
    assert s.as_dict() == pytest.approx({"cpu": 0.25, "hardware": 0.75, "cuda": 0})
    s = hybrid.Shares.from_rates({"cpu": 1, "hardware": 10000, "cuda": 10000}, ["cpu", "hardware"])
    assert s.cpu == pytest.approx(0.02) and sum(s.as_dict().values()) == pytest.approx(1)
    s = hybrid.Shares.from_rates({"cpu": 1000, "hardware": 5000, "cuda": 1000}, ["cpu", "cuda"])
    assert s.hardware == 0 and s.cpu == pytest.approx(0.5)  # an engine that is not there gets nothing
    s = hybrid.Shares.from_rates({"cpu": 1, "hardware": 5000, "cuda": 10000}, ["cpu", "cuda"])
    assert s.cpu == pytest.approx(0.02) and s.cuda == pytest.approx(0.98)
    prior = hybrid.Shares.prior(["cpu", "cuda"])
    assert prior.hardware == 0 and prior.cpu == pytest.approx(8700 / 9950)


def test_beside_a_hardware_decoder_the_cuda_decoder_gets_no_share():
    """It only takes the hardware's declines: measured on an H200, a 2% share of it set the pace."""
    assert hybrid.sharing(["cpu", "hardware", "cuda"]) == ["cpu", "hardware"]
    assert hybrid.sharing(["cpu", "cuda"]) == ["cpu", "cuda"]
    s = hybrid.Shares.from_rates({"cpu": 1000, "hardware": 1000, "cuda": 10 ** 6}, ["cpu", "hardware", "cuda"])
    assert s.as_dict() == pytest.approx({"cpu": 0.5, "hardware": 0.5, "cuda": 0})
    assert hybrid.Shares.prior(["cpu", "hardware", "cuda"]).cuda == 0
    t = s.retuned({"cpu": (300, 300, 8.0), "hardware": (300, 300, 0.5), "cuda": (300, 300, 0.01)},
                  ["cpu", "hardware", "cuda"], 4)
    assert t.cuda == 0 and t.hardware == pytest.approx(600 / 750)


def test_retuned_shares_make_the_engines_finish_together():
    s = hybrid.Shares(cpu=0.5, hardware=0.5, cuda=0)
    # cpu: 300 images in 8 thread-seconds on 4 threads (150/s); hardware 300 in 0.5 s (600/s)
    t = s.retuned({"cpu": (300, 300, 8.0), "hardware": (300, 300, 0.5)}, ["cpu", "hardware", "cuda"], 4)
    assert t.as_dict() == pytest.approx({"cpu": 150 / 750, "hardware": 600 / 750, "cuda": 0})
    assert s.retuned({}, ["cpu", "hardware", "cuda"], 4) == s  # nothing measured: unchanged
    # an engine that declines most of what it is given decodes few images per second: less work
    v = s.retuned({"cpu": (300, 300, 8.0), "hardware": (30, 300, 0.5)}, ["cpu", "hardware", "cuda"], 4)
    assert v.hardware == pytest.approx(60 / 210)
    # without a hardware decoder: the CPU and the CUDA decoder; one that decoded nothing keeps its share
    w = hybrid.Shares(cpu=0.5, hardware=0, cuda=0.5)
    assert w.retuned({"cpu": (300, 300, 8.0), "cuda": (300, 300, 1.0)}, ["cpu", "cuda"], 4).as_dict() == \
        pytest.approx({"cpu": 150 / 450, "hardware": 0, "cuda": 300 / 450})
    u = hybrid.Shares(cpu=1 / 3, hardware=1 / 3, cuda=1 / 3).retuned({"cpu": (300, 300, 8.0)}, ["cpu", "cuda"], 4)
    assert u.cpu == pytest.approx(0.5) and u.cuda == pytest.approx(0.5) and u.hardware == 0


@pytest.mark.parametrize("rates", [{"cpu": float("nan"), "hardware": 5000.0}, {"cpu": 1000.0, "hardware": float("inf")},
                                   {"cpu": float("inf"), "hardware": float("inf")}, {"cpu": 1e308, "hardware": 1e308},
                                   {"cpu": -5.0, "hardware": float("-inf")}, {"cpu": float("nan"), "hardware": float("nan")}])
def test_shares_from_rates_that_are_not_finite_are_valid_shares(rates):
    """A rate NaN or negative counts as unmeasured (0); infinite ones share the batch; huge ones do not overflow."""
    s = hybrid.Shares.from_rates(rates, ["cpu", "hardware", "cuda"])
    assert hybrid.Shares.from_dict(s.as_dict()) == s and sum(s.as_dict().values()) == pytest.approx(1)
    assert min(s.cpu, s.hardware) >= 0.02 - 1e-12 and s.cuda == 0
    t = s.retuned({"cpu": (float("nan"), 300, 8.0), "hardware": (300, 300, 1e-320)}, ["cpu", "hardware", "cuda"], 4)
    assert hybrid.Shares.from_dict(t.as_dict()) == t


@pytest.mark.parametrize("bad", [None, {"cpu": 1}, {"cpu": 0.5, "hardware": 0.5, "cuda": 0.5},
                                 {"cpu": True, "hardware": 0, "cuda": 0}, {"cpu": "1", "hardware": 0, "cuda": 0},
                                 {"cpu": -0.5, "hardware": 1.5, "cuda": 0}])
def test_shares_from_a_damaged_state_are_refused(bad):
    with pytest.raises(ValueError, match="decode share"):
        hybrid.Shares.from_dict(bad)
    if isinstance(bad, dict) and len(bad) == 3:  # made directly (decode_into(shares=...)) as well
        with pytest.raises(ValueError, match="decode share"):
            hybrid.Shares(**bad)


@pytest.mark.parametrize("bad", [(float("nan"), 0.5, 0.5), (0.3, 0.3, 0.0), (-1.0, 2.0, 0.0)])
def test_shares_made_directly_are_checked(bad):
    """Unchecked, NaN sent every sample to the CUDA decoder, and shares summing to 0.6 gave it 41%
    although its share was 0 (the native routes give it the rest)."""
    with pytest.raises(ValueError, match="decode share"):
        hybrid.Shares(*bad)


def test_routes_are_a_function_of_seed_epoch_index_and_shares():
    shares = hybrid.Shares(cpu=0.3, hardware=0.5, cuda=0.2)
    idx = np.arange(20000, dtype=np.int64)
    route = hybrid.assign(7, 3, idx, shares, np.ones(len(idx), bool))
    assert np.bincount(route, minlength=3) / len(idx) == pytest.approx([0.3, 0.5, 0.2], abs=0.015)
    perm = np.random.default_rng(1).permutation(len(idx))[:500]  # another batch composition
    assert np.array_equal(hybrid.assign(7, 3, idx[perm], shares, np.ones(500, bool)), route[perm])
    assert not np.array_equal(hybrid.assign(7, 4, idx, shares, np.ones(len(idx), bool)), route)
    eligible = idx % 3 != 0
    assert (hybrid.assign(7, 3, idx, shares, eligible)[~eligible] == 0).all()  # the CPU core takes the rest
    only_cpu = hybrid.assign(7, 3, idx, hybrid.Shares(1.0, 0.0, 0.0), np.ones(len(idx), bool))
    assert (only_cpu == 0).all()



def refusal_reference(table: np.ndarray, boxes: np.ndarray, window: bool, strict: bool, colorspaces: tuple,
                      max_pixels: int, max_scans: int, box_height: int = 0, box_width: int = 0) -> np.ndarray:
    """_C.gpu_refusals' definition in numpy: each sample's first refusal (gpu_fallback.REFUSALS), 0 for none."""
    col = {c: table[:, k] for k, c in enumerate(_C.INFO_COLUMNS)}
    if window or strict:
        return np.ones(len(boxes), np.int8)
    h, w = col["height"], col["width"]
    t, l, bh, bw = np.asarray(boxes, dtype=np.float64).T
    inside = (t >= 0) & (l >= 0) & (bh >= 1) & (bw >= 1) & (t + bh <= h) & (l + bw <= w)
    whole = (np.floor(boxes) == boxes).all(axis=1)
    if box_height > 0:  # no resize: only boxes of the output's size
        inside &= (bh == box_height) & (bw == box_width)
    checks = [(2, (h > 0) & (w > 0)), (3, np.isin(col["colorspace"], colorspaces)),
              (4, h.astype(np.float64) * w <= max_pixels), (5, (col["scans"] >= 0) & (col["scans"] <= max_scans)),
              (8, (col["malformed"] >= 0) & ((col["malformed"] & _C.MALFORMED_LAYOUT) == 0)),
              (9, (col["malformed"] & _C.FINER_CHROMA) == 0), (6, col["trailing"] >= 0), (7, inside & whole)]
    codes = np.zeros(len(boxes), np.int8)
    for code, passed in reversed(checks):  # the first that fails wins
        codes[~passed] = code
    return codes


def eligible_reference(*args) -> np.ndarray:
    """gpu_fallback.gpu_eligible's definition in numpy (the native pass is tested against it)."""
    return refusal_reference(*args) == 0


@pytest.mark.parametrize("dtype", [np.int64, np.float64])
def test_the_native_routes_equal_their_numpy_definition(dtype):
    """_C.hybrid_routes (eligibility, keyed draw, missing engines, the hardware decoder's known
    declines) against gpu_eligible's numpy definition and hybrid.assign, on random header tables
    with every field at and around its edges."""
    rng = np.random.default_rng(5)
    n = 4000
    col = {c: k for k, c in enumerate(_C.INFO_COLUMNS)}
    table, boxes, indices = random_route_inputs(rng, n, dtype)
    for shares in (hybrid.Shares(0.3, 0.5, 0.2), hybrid.Shares(1.0, 0.0, 0.0), hybrid.Shares(0.0, 1.0, 0.0),
                   hybrid.Shares(0.1, 0.0, 0.9)):
        for engines in (("hardware", "cuda"), ("hardware",), ("cuda",), ()):
            for window, strict, cs, max_pixels, max_scans, box_h, box_w in ELIGIBILITY_CASES:
                mask = sum(1 << c for c in cs)
                route, reason = _C.hybrid_routes(table, boxes, indices, 11, 2**64 - 3, hybrid.ROUTE_STREAM,
                                                 shares.cpu, shares.hardware, "hardware" in engines, "cuda" in engines,
                                                 window, strict, mask, max_pixels, max_scans, box_h, box_w)
                eligible = eligible_reference(table, boxes, window, strict, cs, max_pixels, max_scans, box_h, box_w)
                assert window or strict or box_h or 0.2 < eligible.mean() < 0.7  # both kinds of rows, plenty of each
                assert not box_h or 0 < eligible.sum() < (boxes[:, 2] == box_h).sum()
                refusals = _C.gpu_refusals(table, boxes, window, strict, mask, max_pixels, max_scans, box_h, box_w)
                assert np.array_equal(refusals, refusal_reference(table, boxes, window, strict, cs, max_pixels,
                                                                  max_scans, box_h, box_w))
                assert window or strict or set(np.unique(refusals)) == set(range(10)) - {1}  # each reason met
                expected = hybrid.assign(11, -3, indices, shares, eligible)
                for k, kind in enumerate(hybrid.ENGINES[1:], 1):
                    if kind not in engines:
                        expected[expected == k] = 0
                declines = (expected == 1) & (table[:, col["progressive"]] == 1)
                expected[declines] = 0
                assert np.array_equal(route, expected)
                assert np.array_equal(reason, np.where(~eligible, 1, np.where(declines, 2, 0)))
    with pytest.raises(ValueError, match="table"):
        _C.gpu_refusals(table[:, :4], boxes, False, False, 3, 10, 10)
    with pytest.raises(ValueError, match="indices"):
        _C.hybrid_routes(table, boxes, indices[:3], 0, 0, 0, 0.5, 0.5, True, True, False, False, 3, 10, 10)


ELIGIBILITY_CASES = ((False, False, (0, 1), 10**6, 100, 0, 0), (False, False, (0, 1, 2), 89_478_485, 100, 0, 0),
                     (True, False, (0, 1), 10**6, 100, 0, 0), (False, True, (0, 1), 10**6, 100, 0, 0),
                     (False, False, (0, 1), 10**6, 100, 7, 9))  # (the last: no resize, boxes of 7x9 only)


def random_route_inputs(rng, n: int, dtype):
    """(header table, boxes, indices) of n random samples with every field at and around its edges."""
    col = {c: k for k, c in enumerate(_C.INFO_COLUMNS)}

    def mostly(valid, edges):  # a valid value, or one of the edges in 1 row of 16 (so many rows are eligible)
        return np.where(rng.random(n) < 1 / 16, rng.choice(edges, n), valid)

    table = np.zeros((n, len(_C.INFO_COLUMNS)), np.int64)
    table[:, col["height"]] = mostly(rng.integers(64, 1200, n), [-1, 0, 1, 7])
    table[:, col["width"]] = mostly(rng.integers(64, 1200, n), [-1, 0, 1, 9])
    table[:, col["colorspace"]] = mostly(rng.integers(0, 2, n), [-1, 2, 3, 4, 5, 40])
    table[:, col["channels"]] = 3
    table[:, col["orientation"]] = 1
    table[:, col["progressive"]] = rng.integers(0, 2, n)
    table[:, col["scans"]] = mostly(rng.integers(1, 10, n), [-1, 0, 99, 100, 101])
    table[:, col["trailing"]] = mostly(rng.integers(0, 3, n), [-1, -2])
    table[:, col["malformed"]] = mostly(0, [1, 2, 3, -1])
    h, w = table[:, col["height"]], table[:, col["width"]]
    bh, bw = rng.integers(1, 65, n), rng.integers(1, 65, n)
    bh[::5], bw[::5] = 7, 9  # the output's size in ELIGIBILITY_CASES' case without a resize
    fractions = dtype == np.float64  # (int64 boxes: whole edges only)
    boxes = np.stack([mostly(rng.integers(0, np.maximum(h - bh, 0) + 1), [-1, 3.5 if fractions else 3, 10**4]),
                      mostly(rng.integers(0, np.maximum(w - bw, 0) + 1), [-2, 0.25 if fractions else 0, 10**4]),
                      mostly(bh, [0, 0.5 if fractions else 1, 7.5 if fractions else 7, 10**5]),
                      mostly(bw, [0, 2.25 if fractions else 2, 10**5])], axis=1).astype(dtype)
    table[::97, col["height"]] = 2**40  # a crafted table: h * w past int64 is refused, not undefined
    table[::97, col["width"]] = 2**40
    indices = rng.integers(-(2**40), 2**40, n)
    return table, boxes, indices


# --- the ranked split -------------------------------------------------------------------------------

def scale_num_reference(bh: np.ndarray, bw: np.ndarray, out_h: int, out_w: int) -> np.ndarray:
    """The CPU core's DCT scale M (of M/8) per box, in numpy: the smallest M in 1..4 with box * M / 8
    >= out on both sides for boxes at least twice the output, else 8."""
    m = np.full(len(bh), 8, np.int64)
    if out_h < 1 or out_w < 1:
        return m
    big = (bh >= 2 * out_h) & (bw >= 2 * out_w)
    for k in (4, 3, 2, 1):  # the smallest that fits wins
        m = np.where(big & (bh >= (8 * out_h + k - 1) // k) & (bw >= (8 * out_w + k - 1) // k), k, m)
    return m


def cost_reference(table, boxes, nbytes, out_h: int, out_w: int, dct_scaling: bool) -> np.ndarray:
    """The ranked split's cost estimates (ms on a CPU-core thread, on a GPU decoder) in numpy, the
    native arithmetic's order kept."""
    col = {c: k for k, c in enumerate(_C.INFO_COLUMNS)}
    h, w = table[:, col["height"]].astype(np.float64), table[:, col["width"]].astype(np.float64)
    top, _, bh, bw = np.asarray(boxes, dtype=np.float64).T
    mb, mpx = nbytes.astype(np.float64) * 1e-6, h * w * 1e-6
    above = (top + bh) / h
    m = scale_num_reference(bh.astype(np.int64), bw.astype(np.int64), out_h, out_w) if dct_scaling else 8
    scale = m / 8.0
    cpu_ms = 0.17 + above * (4.5 * mb + 0.35 * mpx) + 2.2 * (bh * bw * scale * scale * 1e-6)
    gpu_ms = 0.018 + 0.594 * (nbytes.astype(np.float64) * 1e-6)
    return np.stack([cpu_ms, gpu_ms], axis=1)


@pytest.mark.parametrize("dtype", [np.int64, np.float64])
def test_the_native_ranked_routes_equal_their_numpy_definition(dtype):
    """_C.hybrid_ranked_routes against gpu_eligible's and the cost estimates' numpy definitions and
    hybrid.assign_ranked, on random header tables (edges included), file sizes, batches of 1 to
    ~120 samples and rows repeated whole (equal ratios: the keyed tie-break)."""
    rng = np.random.default_rng(6)
    n = 3000
    col = {c: k for k, c in enumerate(_C.INFO_COLUMNS)}
    table, boxes, indices = random_route_inputs(rng, n, dtype)
    h, w = table[:, col["height"]], table[:, col["width"]]
    big = (rng.random(n) < 0.5) & (h > 0) & (w > 0) & (h < 2**20) & (w < 2**20)  # boxes for the DCT scales 1-4
    top, left = rng.integers(0, h[big] // 4 + 1), rng.integers(0, w[big] // 4 + 1)
    boxes[big] = np.stack([top, left, h[big] - top, w[big] - left], axis=1)
    nbytes = rng.integers(0, 3_000_000, n)
    table[200:400], boxes[200:400], nbytes[200:400] = table[:200], boxes[:200], nbytes[:200]  # ties
    groups = np.cumsum(rng.random(n) < 1 / 40)
    groups[-1] = groups[-2] + 1  # a batch of one
    whole = memoryview(bytes(int(nbytes.max())))  # the files: views of one buffer, of each sample's size
    datas = [whole[:k] for k in nbytes.tolist()]
    for shares in (hybrid.Shares(0.3, 0.7, 0.0), hybrid.Shares(0.3, 0.5, 0.2), hybrid.Shares(1.0, 0.0, 0.0),
                   hybrid.Shares(0.0, 1.0, 0.0), hybrid.Shares(0.45, 0.0, 0.55)):
        for engines in (("hardware", "cuda"), ("hardware",), ("cuda",), ()):
            for (window, strict, cs, max_pixels, max_scans, box_h, box_w), (out_h, out_w, dct) in zip(
                    ELIGIBILITY_CASES, ((224, 224, True), (24, 32, True), (224, 224, True), (0, 0, False),
                                        (0, 0, False))):
                mask = sum(1 << c for c in cs)
                route, reason = _C.hybrid_ranked_routes(
                    datas, table, boxes, indices, groups, 11, 2**64 - 3, hybrid.ROUTE_STREAM, shares.cpu,
                    shares.hardware, "hardware" in engines, "cuda" in engines, out_h, out_w, dct, window, strict,
                    mask, max_pixels, max_scans, box_h, box_w)
                eligible = eligible_reference(table, boxes, window, strict, cs, max_pixels, max_scans, box_h, box_w)
                assert window or strict or box_h or 0.15 < eligible.mean() < 0.85  # both kinds of rows
                declines = eligible & (table[:, col["progressive"]] == 1) & ("hardware" in engines) & (shares.hardware > 0)
                rankable = eligible & ~declines
                with np.errstate(all="ignore"):  # (the rows no GPU decoder may take have no costs)
                    costs = cost_reference(table, boxes, nbytes, out_h, out_w, dct)
                    ratio = costs[:, 0] / costs[:, 1]
                native_costs = _C.hybrid_cost_estimates(table, boxes, nbytes, out_h, out_w, dct)
                assert np.array_equal(native_costs[eligible], costs[eligible])
                expected = hybrid.assign_ranked(11, -3, indices, shares, rankable, ratio, groups, engines)
                assert np.array_equal(route, expected)
                assert np.array_equal(reason, np.where(~eligible, 1, np.where(declines, 2, 0)))
                if shares.cpu == 0.3 and "hardware" in engines and not (window or strict):
                    assert 0 < (route == 0).sum() and 0 < (route > 0).sum()  # both sides of the split
    with pytest.raises(ValueError, match="one entry per sample"):
        _C.hybrid_ranked_routes(datas[:3], table, boxes, indices, groups, 0, 0, 0, 0.5, 0.5, True, True, 224, 224,
                                True, False, False, 3, 10, 10)
    with pytest.raises(TypeError):  # a file that is not bytes-like
        _C.hybrid_ranked_routes([1] * n, table, boxes, indices, groups, 0, 0, 0, 0.5, 0.5, True, True, 224, 224,
                                True, False, False, 3, 10, 10)


def test_the_ranked_split_gives_the_cpu_core_its_share_of_each_batch_from_the_cheapest():
    rng = np.random.default_rng(8)
    sizes = rng.integers(1, 300, 400)
    groups = np.repeat(np.arange(len(sizes)), sizes)
    n = len(groups)
    indices = rng.permutation(10 * n)[:n]
    rankable = rng.random(n) < 0.9
    ratio = rng.choice(rng.random(50) * 10, n)  # many ties
    shares = hybrid.Shares(0.3, 0.6, 0.1)
    engine = hybrid.assign_ranked(4, 2, indices, shares, rankable, ratio, groups, ("hardware", "cuda"))
    assert (engine[~rankable] == 0).all()
    cpu_taken = total = 0
    bounds = np.r_[0, np.cumsum(sizes)]
    for g, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])):
        rows = a + np.flatnonzero(rankable[a:b])
        k = int((engine[rows] == 0).sum())
        assert np.floor(0.3 * len(rows)) <= k <= np.ceil(0.3 * len(rows))  # its share, rounded either way
        if 0 < k < len(rows):
            assert ratio[rows][engine[rows] == 0].max() <= ratio[rows][engine[rows] > 0].min()  # the cheapest
        alone = hybrid.assign_ranked(4, 2, indices[a:b], shares, rankable[a:b], ratio[a:b], groups[a:b],
                                     ("hardware", "cuda"))
        assert np.array_equal(alone, engine[a:b])  # a batch's routes are its own, whatever its chunk
        cpu_taken, total = cpu_taken + k, total + len(rows)
    assert cpu_taken / total == pytest.approx(0.3, abs=0.01)
    # a sample that drops out of its batch (it failed to read) moves at most one other
    for a, b in zip(bounds[:-1], bounds[1:]):
        rows = a + np.flatnonzero(rankable[a:b])
        if len(rows) < 2:
            continue
        fewer = rankable.copy()
        fewer[rows[0]] = False
        moved = hybrid.assign_ranked(4, 2, indices, shares, fewer, ratio, groups, ("hardware", "cuda"))[rows[1:]]
        assert ((moved == 0) != (engine[rows[1:]] == 0)).sum() <= 1
    gpu = engine[rankable & (engine > 0)]
    assert (gpu == 1).mean() == pytest.approx(0.6 / 0.7, abs=0.03)
    # another epoch: the shares rounded another way, the same ranks
    assert not np.array_equal(hybrid.assign_ranked(4, 3, indices, shares, rankable, ratio, groups,
                                                   ("hardware", "cuda")), engine)
    only_cpu = hybrid.assign_ranked(4, 2, indices, shares, rankable, ratio, groups, ())
    assert (only_cpu == 0).all()


def test_the_ranked_split_sends_small_crops_near_the_top_to_the_cpu_core(monkeypatch):
    """Through hybrid.decode: the same file with a small crop at its top and a large one at its
    bottom: the CPU core takes the first, a GPU decoder the second, and the pixels are each
    route's."""
    monkeypatch.setattr(hybrid, "SPLIT", "ranked")
    data = photo_jpegs([PHOTOS[0]], [{"quality": 90}])[0]
    infos = read_infos([data])
    h, w = int(infos.column("height")[0]), int(infos.column("width")[0])
    datas = [data, data] * 4
    boxes = np.array([[0, 0, 30, 40], [h // 3, 0, h - h // 3, w]] * 4, np.int64)
    eng = engines()
    out = torch.empty((len(datas), *SIZE, 3), dtype=torch.uint8)
    keys = hybrid.RouteKeys(0, 0, np.arange(len(datas)))
    status = hybrid.decode(datas, boxes, out, options(), read_infos(datas), keys=keys,
                           shares=hybrid.Shares(0.5, 0.5, 0.0), engines=eng)
    assert status.ok.all()
    assert status.route.tolist() == [Route.CPU, Route.GPU_HARDWARE] * 4
    ref = torch.empty_like(out)
    cpu.decode(datas[:1], boxes[:1], ref[:1], options(), read_infos(datas[:1]))
    assert torch.equal(out[0], ref[0])


# --- one batch --------------------------------------------------------------------------------------

def test_a_batch_is_split_between_the_engines_with_the_cpu_cores_pixels():
    datas, infos, boxes = batch()
    opts = options(dct_scaling=False)  # every route then gives the CPU core's exact bytes
    ref = torch.empty((len(datas), *SIZE, 3), dtype=torch.uint8)
    cpu.decode(datas, boxes, ref, opts, infos)
    eng = engines()
    shares = hybrid.Shares(cpu=0.4, hardware=0.4, cuda=0.2)
    keys = hybrid.RouteKeys(5, 1, np.arange(100, 100 + len(datas)))
    out = torch.full_like(ref, 77)
    status = hybrid.decode(datas, boxes, out, opts, infos, keys=keys, shares=shares, engines=eng)
    assert status.ok.all() and torch.equal(out, ref)
    expected = np.array(expected_routes(5, 1, keys.indices, shares, infos))
    assert status.route.tolist() == expected.tolist()
    assert set(expected.tolist()) == {Route.CPU, Route.GPU_HARDWARE, Route.GPU_CUDA, Route.CPU_FALLBACK}
    for route, kind in ((Route.GPU_HARDWARE, "hardware"), (Route.GPU_CUDA, "cuda")):
        assert np.array_equal(np.concatenate(eng[kind].calls), np.flatnonzero(expected == route))
        assert status.engine_seconds[kind][:2] == ((expected == route).sum(),) * 2
    assert not (eng["hardware"].threads & {threading.get_ident()})  # the engines run on their own threads


def test_routes_change_pixels_but_replay_exactly():
    datas, infos, boxes = batch()
    shares = hybrid.Shares(cpu=0.5, hardware=0.25, cuda=0.25)
    keys = hybrid.RouteKeys(1, 0, np.arange(len(datas)))
    outs = []
    for threads in (1, 2, 2):
        out = torch.empty((len(datas), *SIZE, 3), dtype=torch.uint8)
        hybrid.decode(datas, boxes, out, options(num_threads=threads), infos, keys=keys, shares=shares, engines=engines())
        outs.append(out)
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[1], outs[2])
    cpu_only = torch.empty_like(outs[0])
    cpu.decode(datas, boxes, cpu_only, options(), infos)
    assert not torch.equal(outs[0], cpu_only)  # the GPU routes skip DCT scaling: the route shows


def test_declined_and_ineligible_samples_go_to_the_cpu_core_and_are_reported():
    datas, _, boxes = batch(12)
    cmyk = encode(np.full((60, 70, 4), 90, np.uint8), colorspace="cmyk")
    datas = datas[:-2] + [cmyk, datas[-1][:-2]]  # CMYK, then a file without its EOI marker
    boxes[-2] = (0, 0, 40, 50)
    infos = read_infos(datas)
    declined_data = datas[2]  # a baseline file (the odd ones are progressive)
    eng = engines(hardware={"decline": lambda b: bytes(b) == declined_data},
                  cuda={"decline": lambda b: bytes(b) == declined_data})
    out = torch.empty((len(datas), *SIZE, 3), dtype=torch.uint8)
    status = hybrid.decode(datas, boxes, out, options(), infos, shares=hybrid.Shares(0.0, 0.5, 0.5), engines=eng)
    assert status.route[-2] == Route.CPU_FALLBACK and status.route[-1] == Route.CPU_FALLBACK  # not eligible
    assert "not decodable by the GPU decoders with gpupipe's semantics: its color space" in status.fallback[10]
    assert "no EOI marker ends the JPEG" in status.fallback[11]
    assert status.route[2] == Route.CPU_FALLBACK and "declined by the GPU's" in status.fallback[2]
    assert set(status.route[:-2].tolist()) - {Route.CPU_FALLBACK} <= {Route.GPU_HARDWARE, Route.GPU_CUDA}
    assert status.ok.all() and list(status.warnings) == [11]  # the CPU core's word for the missing end
    gpu = torch.from_numpy(np.isin(status.route, [Route.GPU_HARDWARE, Route.GPU_CUDA]))
    for rows, dct in ((gpu, False), (~gpu, True)):  # every sample's pixels are its route's
        ref = torch.empty_like(out)
        cpu.decode(datas, boxes, ref, options(dct_scaling=dct), infos)
        assert torch.equal(out[rows], ref[rows])


def test_what_the_hardware_decoder_declines_goes_to_the_cuda_decoder():
    datas, infos, boxes = batch(16)
    baseline = np.flatnonzero(infos.column("progressive") == 0)
    refused = {bytes(datas[i]) for i in baseline[:3]}  # e.g. files its parser refuses
    eng = engines(hardware={"decline": lambda b: bytes(b) in refused})
    out = torch.empty((len(datas), *SIZE, 3), dtype=torch.uint8)
    status = hybrid.decode(datas, boxes, out, options(), infos, shares=hybrid.Shares(0.0, 1.0, 0.0), engines=eng)
    declined = np.array([bytes(d) in refused for d in datas])
    taken = declined | (infos.column("progressive") == 1)
    assert (status.route[declined] == Route.GPU_CUDA).all() and (status.route[~taken] == Route.GPU_HARDWARE).all()
    n_hw = int((infos.column("progressive") == 0).sum())
    assert status.engine_seconds["hardware"][:2] == (n_hw - int(declined.sum()), n_hw)
    assert status.engine_seconds["cuda"][:2] == (int(declined.sum()),) * 2
    assert status.ok.all()


def test_progressive_files_never_wait_for_the_hardware_decoder():
    """The hardware decoder declines progressive JPEGs: those it would get go to the CPU core at
    once (route cpu-fallback, with the reason), not to the CUDA decoder after its share."""
    datas, infos, boxes = batch(16)  # every other file progressive
    progressive = infos.column("progressive") == 1
    assert progressive.any() and (~progressive).any()

    def refuse(b):
        assert read_infos([b]).column("progressive")[0] == 0, "a progressive file reached the hardware decoder"
        return False

    eng = engines(hardware={"decline": refuse}, cuda={"decline": lambda b: pytest.fail("the CUDA decoder got work")})
    out = torch.empty((len(datas), *SIZE, 3), dtype=torch.uint8)
    status = hybrid.decode(datas, boxes, out, options(), infos, shares=hybrid.Shares(0.0, 1.0, 0.0), engines=eng)
    assert (status.route[progressive] == Route.CPU_FALLBACK).all() and (status.route[~progressive] == Route.GPU_HARDWARE).all()
    assert all("progressive" in status.fallback[i] for i in np.flatnonzero(progressive)) and status.ok.all()
    ref = torch.empty_like(out)
    cpu.decode(datas, boxes, ref, options(), infos)
    assert torch.equal(out[torch.from_numpy(progressive)], ref[torch.from_numpy(progressive)])


def test_a_failing_engine_fails_the_batch_with_a_clear_error_and_the_next_batch_decodes():
    datas, infos, boxes = batch(16)
    out = torch.empty((len(datas), *SIZE, 3), dtype=torch.uint8)
    with pytest.raises(RuntimeError, match="hybrid backend's (hardware|cuda) decoder failed the batch .*illegal memory"):
        hybrid.decode(datas, boxes, out, options(), infos, shares=hybrid.Shares(0.2, 0.4, 0.4),
                      engines=engines(hardware={"fail": True}, cuda={"fail": True}))
    status = hybrid.decode(datas, boxes, out, options(), infos, shares=hybrid.Shares(0.2, 0.4, 0.4), engines=engines())
    assert status.ok.all()


def test_a_missing_engine_gives_its_share_to_the_cpu_core():
    datas, infos, boxes = batch(16)
    out = torch.empty((len(datas), *SIZE, 3), dtype=torch.uint8)
    only_cuda = {"cuda": HostEngine("cuda")}
    status = hybrid.decode(datas, boxes, out, options(), infos, shares=hybrid.Shares(0.2, 0.6, 0.2), engines=only_cuda)
    assert Route.GPU_HARDWARE not in status.route.tolist() and status.ok.all()


def test_no_engine_thread_outlives_its_call():
    datas, infos, boxes = batch(8)
    out = torch.empty((len(datas), *SIZE, 3), dtype=torch.uint8)
    hybrid.decode(datas, boxes, out, options(), infos, shares=hybrid.Shares(0.2, 0.4, 0.4), engines=engines())
    deadline = time.time() + 20  # (a loaded machine may end a thread late)
    while any("decoder" in t.name and t.name.startswith("gpupipe-") for t in threading.enumerate()):
        assert time.time() < deadline, [t.name for t in threading.enumerate()]
        time.sleep(0.01)


def test_batches_queued_on_closed_workers_fail_clearly_and_nothing_hangs():
    datas, infos, boxes = batch(8)
    eng = engines(hardware={"gated": True}, cuda={"gated": True})
    workers = hybrid.Workers(["hardware", "cuda"], torch.device("cpu"))
    outs = [torch.empty((len(datas), *SIZE, 3), dtype=torch.uint8) for _ in range(3)]
    started = [hybrid.start(datas, boxes, o, options(), infos, shares=hybrid.Shares(0.0, 0.5, 0.5), engines=eng,
                            workers=workers) for o in outs]
    assert eng["hardware"].held.wait(30) and eng["cuda"].held.wait(30)  # the first shares run, the others queue
    workers.close()  # the epoch ends: the running shares finish, the queued ones are dropped
    for e in eng.values():
        e.gate.set()
    t0 = time.time()
    with pytest.raises(RuntimeError, match="cancelled: the GPU engine.s queue was closed"):
        for p in started:
            hybrid.wait(p)
    assert time.time() - t0 < 30  # (hybrid.ENGINE_TIMEOUT, 120 s, when a cancelled share is waited for)


def test_shares_waiting_for_a_busy_engine_go_in_one_call_with_their_own_pixels_and_seconds(monkeypatch):
    datas, infos, boxes = batch(8)
    hw = MergingHostEngine("hardware", delay=0.02, gated=True)
    eng = {"hardware": hw, "cuda": HostEngine("cuda")}
    shares = hybrid.Shares(0.0, 1.0, 0.0)
    alone = torch.empty((len(datas), *SIZE, 3), dtype=torch.uint8)
    first = hybrid.decode(datas, boxes, alone, options(), infos, shares=shares,
                          engines={"hardware": HostEngine("hardware"), "cuda": HostEngine("cuda")})
    n = int((first.route == Route.GPU_HARDWARE).sum())  # the share (progressive files go to the CPU core)
    monkeypatch.setattr(hybrid, "MERGE_IMAGES", 2 * n)  # room for two batches' shares per call
    workers = hybrid.Workers(["hardware", "cuda"], torch.device("cpu"))
    try:
        outs = [torch.zeros((len(datas), *SIZE, 3), dtype=torch.uint8) for _ in range(5)]
        def start(o):
            return hybrid.start(datas, boxes, o, options(), infos, shares=shares, engines=eng, workers=workers)

        started = [start(outs[0])]  # it runs at once, held until the rest are queued; they go two at a time
        assert hw.held.wait(30)
        started += [start(o) for o in outs[1:]]
        hw.gate.set()
        statuses = [hybrid.wait(p) for p in started]
    finally:
        workers.close()
    assert n > 0 and hw.groups == [[n, n], [n, n]] and len(hw.calls) == 5
    assert all(torch.equal(o, alone) for o in outs) and all(s.ok.all() for s in statuses)
    seconds = [s.engine_seconds["hardware"][2] for s in statuses]
    assert all(s.engine_seconds["hardware"][:2] == (n, n) for s in statuses)
    # the two shares of a call count half its time each: batches (1, 2) and (3, 4)
    assert seconds[1] == seconds[2] and seconds[3] == seconds[4]


class LaneHostEngine(HostEngine):
    """A HostEngine with lanes (``lane(i)``: another instance, as nvImageCodec's engines make one
    decoder per call in flight) that records how many of its instances decode at once and when."""

    def __init__(self, *a, lanes=None, fail_lanes: bool = False, make_seconds: float = 0.0, **kw):
        super().__init__(*a, **kw)
        self.lanes = {} if lanes is None else lanes  # shared by the instances
        self.fail_lanes, self.make_seconds = fail_lanes, make_seconds
        self.active, self.most, self.spans = [0], [0], []
        self.lock = threading.Lock()

    def lane(self, i):
        if self.fail_lanes:
            raise RuntimeError("nvimgcodecDecoderCreate failed (status 5)")
        if i not in self.lanes:
            time.sleep(self.make_seconds)  # (nvImageCodec's: a decoder made and probed)
            twin = LaneHostEngine(self.kind, lanes=self.lanes, delay=self.delay)
            twin.active, twin.most, twin.spans, twin.lock, twin.calls = self.active, self.most, self.spans, self.lock, self.calls
            self.lanes[i] = twin
        return self.lanes[i]

    def decode(self, buffers, boxes, out, slots, options, *, sizes):
        with self.lock:
            self.active[0] += 1
            self.most[0] = max(self.most[0], self.active[0])
        t0 = time.perf_counter()
        try:
            return super().decode(buffers, boxes, out, slots, options, sizes=sizes)
        finally:
            with self.lock:
                self.active[0] -= 1
                self.spans.append((t0, time.perf_counter()))


def union_seconds(spans) -> float:
    total, end = 0.0, -float("inf")
    for a, b in sorted(spans):
        total += max(b - max(a, end), 0.0)
        end = max(end, b)
    return total


def on_lanes(hw, batches: int):
    """``batches`` hybrid batches, every sample for the hardware decoder ``hw`` (its lanes per
    hybrid.CALLS_IN_FLIGHT), started at once then collected in order: (outs, statuses, workers)."""
    datas, infos, boxes = batch(8)
    workers = hybrid.Workers(["hardware", "cuda"], torch.device("cpu"))
    try:
        outs = [torch.zeros((len(datas), *SIZE, 3), dtype=torch.uint8) for _ in range(batches)]
        started = [hybrid.start(datas, boxes, o, options(), infos, shares=hybrid.Shares(0.0, 1.0, 0.0),
                                workers=workers, engines={"hardware": hw, "cuda": HostEngine("cuda")}) for o in outs]
        statuses = [hybrid.wait(p) for p in started]
    finally:
        workers.close()
    return outs, statuses, workers


def test_calls_in_flight_overlap_on_their_own_decoders_and_count_the_engines_time_once(monkeypatch):
    datas, infos, boxes = batch(8)
    alone = torch.empty((len(datas), *SIZE, 3), dtype=torch.uint8)
    hybrid.decode(datas, boxes, alone, options(), infos, shares=hybrid.Shares(0.0, 1.0, 0.0), engines=engines())
    monkeypatch.setattr(hybrid, "CALLS_IN_FLIGHT", {"hardware": 2, "cuda": 1})
    unused = hybrid.Workers(["hardware", "cuda"], torch.device("cpu"))
    unused.close()  # (its threads stop: later tests check that none is left)
    assert unused.calls_in_flight() == {"hardware": 2, "cuda": 1}
    hw = LaneHostEngine("hardware", delay=0.01)
    outs, statuses, workers = on_lanes(hw, 6)
    assert all(torch.equal(o, alone) for o in outs) and all(s.ok.all() for s in statuses)
    # two decoders at once, each a lane's own (lane 1's made on its first call)
    assert hw.most[0] == 2 and set(hw.lanes) == {1} and len(hw.calls) == 6
    counted = sum(s.engine_seconds["hardware"][2] for s in statuses)
    spans = sum(b - a for a, b in hw.spans)
    # the overlapping calls count once: about the union of their spans (each timed a little wider
    # by the scheduler), well under their sum
    assert union_seconds(hw.spans) * 0.95 <= counted <= union_seconds(hw.spans) + 0.05 * len(hw.spans)
    assert counted < 0.8 * spans
    assert workers.lane_failures() == []


def test_a_lanes_first_call_is_timed_after_its_decoder_is_made(monkeypatch):
    """Making a lane's decoder (nvImageCodec's: a decoder and a probe decode) is not the engine's
    work: the calls the other lane ran meanwhile still count."""
    monkeypatch.setattr(hybrid, "CALLS_IN_FLIGHT", {"hardware": 2})
    hw = LaneHostEngine("hardware", delay=0.006, make_seconds=1.0)
    _, statuses, _ = on_lanes(hw, 8)
    counted = sum(s.engine_seconds["hardware"][2] for s in statuses)
    # (counting the decoder's making would add its 1 s; the slack is the scheduler's)
    assert set(hw.lanes) == {1} and union_seconds(hw.spans) * 0.9 <= counted <= union_seconds(hw.spans) + 0.3


def test_a_collector_waiting_for_a_running_call_holds_up_neither_the_lanes_nor_new_batches(monkeypatch):
    """A batch collected while a call that started before its own still runs waits for that call
    to count the engine's time in order; meanwhile new shares are queued and the idle lane decodes.
    The long call is held on a gate until the end (no race with the scheduler's timing)."""
    datas, infos, boxes = batch(8)
    shares = hybrid.Shares(0.0, 1.0, 0.0)
    monkeypatch.setattr(hybrid, "CALLS_IN_FLIGHT", {"hardware": 2})
    gate, held = threading.Event(), threading.Event()
    decode = LaneHostEngine.decode

    def gated(self, buffers, *a, **kw):
        if len(buffers) > 1:
            held.set()
            assert gate.wait(30), "the gate was never opened"
        return decode(self, buffers, *a, **kw)

    monkeypatch.setattr(LaneHostEngine, "decode", gated)
    hw = LaneHostEngine("hardware", delay=0.02)
    workers = hybrid.Workers(["hardware", "cuda"], torch.device("cpu"))
    eng = {"hardware": hw, "cuda": HostEngine("cuda")}
    one = np.flatnonzero(np.array([not gpupipe.read_header(d).progressive for d in datas]))[:1]
    small = ([datas[i] for i in one], infos.select(one), boxes[one])
    opener = threading.Timer(20, gate.set)  # (a hang would otherwise outlive the test)
    opener.start()
    try:
        long = hybrid.start(datas, boxes, torch.zeros((8, *SIZE, 3), dtype=torch.uint8), options(), infos,
                            shares=shares, workers=workers, engines=eng)  # held on lane 0
        assert held.wait(10)  # (the long call has started: the short one starts after it)
        short = hybrid.start(small[0], small[2], torch.zeros((1, *SIZE, 3), dtype=torch.uint8), options(), small[1],
                             shares=shares, workers=workers, engines=eng)  # lane 1
        collector = threading.Thread(target=hybrid.wait, args=(short,))
        collector.start()  # counts the long call first: waits for it
        short.gpu[0][2].result(timeout=10)
        collector.join(timeout=0.2)
        assert collector.is_alive(), "the short batch was collected before the call that started first"
        t0 = time.perf_counter()
        later = hybrid.start(small[0], small[2], torch.zeros((1, *SIZE, 3), dtype=torch.uint8), options(), small[1],
                             shares=shares, workers=workers, engines=eng)
        queued = time.perf_counter() - t0
        later.gpu[0][2].result(timeout=10)  # decoded on the idle lane while the long call is held
        assert not long.gpu[0][2].done() and collector.is_alive()
        gate.set()
        hybrid.wait(long)
        collector.join(timeout=10)
        assert not collector.is_alive()
        hybrid.wait(later)
    finally:
        gate.set()
        opener.cancel()
        workers.close()
    assert queued < 10.0, queued  # (held until the gate opens, 20 s, when the collector blocks the queue)


def test_a_lane_whose_decoder_cannot_start_calls_lane_0s_and_says_why(monkeypatch):
    monkeypatch.setattr(hybrid, "CALLS_IN_FLIGHT", {"hardware": 2})
    hw = LaneHostEngine("hardware", delay=0.005, fail_lanes=True)
    _, statuses, workers = on_lanes(hw, 4)
    failures = workers.lane_failures()
    assert all(s.ok.all() for s in statuses)
    # lane 1 took a call (both lanes wait when the shares come): it called lane 0's decoder, taking
    # turns with lane 0, and said why
    assert hw.lanes == {} and len(hw.calls) == 4 and hw.most[0] == 1
    assert failures == ["hardware decoder lane 1 could not start (RuntimeError: nvimgcodecDecoderCreate failed (status 5))"]
    assert workers.calls_in_flight()["hardware"] == 1


def test_the_busy_clock_counts_overlapping_calls_once_in_the_order_they_started():
    clock = hybrid._BusyClock()
    calls = [clock.started() for _ in range(5)]
    for call, span in zip(calls, [(0.0, 10.0), (5.0, 12.0), (20.0, 25.0), (21.0, 22.0), (None, None)]):
        call.start, call.end = span  # (the last one failed: it counts nothing)
        call.ended.set()
    # collected out of order (an epoch and the one started ahead): counted in the order taken
    assert clock.seconds(calls[3]) == 0.0
    assert [clock.seconds(c) for c in calls] == [10.0, 2.0, 5.0, 0.0, 0.0]
    # one call in flight: each call's whole span
    clock = hybrid._BusyClock()
    calls = [clock.started() for _ in range(3)]
    for call, span in zip(calls, [(0.0, 1.0), (1.5, 2.0), (2.0, 4.0)]):
        call.start, call.end = span
        call.ended.set()
    assert [clock.seconds(c) for c in calls] == [1.0, 0.5, 2.0]


def test_a_call_still_running_is_waited_for_before_a_later_one_is_counted():
    clock = hybrid._BusyClock()
    first, second = clock.started(), clock.started()
    second.start, second.end = 3.0, 5.0
    second.ended.set()

    def finish():
        time.sleep(0.05)
        first.start, first.end = 0.0, 4.0
        first.ended.set()

    t = threading.Thread(target=finish)
    t.start()
    assert clock.seconds(second) == 1.0 and clock.seconds(first) == 4.0
    t.join()


def test_headers_a_cpu_probe_read_get_their_scans_counted(host_engines):
    """The CPU backend's probe does not count scans (-1: it reads each whole file); a hybrid batch
    handed such headers counts them, so its samples still go to the GPU engines by their shares."""
    datas, _, boxes = batch(12)
    cpu_infos = routing.probe(datas, DecodeOptions(size=SIZE, backend="cpu"))
    assert (cpu_infos.column("scans") == -1).all()
    out = torch.empty((len(datas), *SIZE, 3), dtype=torch.uint8)
    status = hybrid.decode(datas, boxes, out, options(), cpu_infos, shares=hybrid.Shares(0.0, 1.0, 0.0),
                           engines=host_engines)
    assert (cpu_infos.column("scans") >= 1).all()
    assert status.ok.all() and (status.route == Route.GPU_HARDWARE).sum() > 0


def test_the_cpu_shares_threads_follow_the_default_when_it_changes(monkeypatch):
    """The CPU pool's threads beside the GPU engines come from the default thread count when it is
    asked for (GPUPIPE_NUM_THREADS, the affinity, the local ranks), not from its first value."""
    shares = hybrid.Shares(0.5, 0.5, 0.0)
    for env, pool in (("8", 6), ("32", 28), ("8", 6)):
        monkeypatch.setenv("GPUPIPE_NUM_THREADS", env)
        assert hybrid._cpu_options(options(num_threads=0), shares, ("hardware",)).num_threads == pool
    opts = dataclasses.replace(options(num_threads=12), size=[*SIZE])  # a list size (a user's sampler's) is fine
    assert hybrid._cpu_options(opts, shares, ("hardware",)).num_threads == 9


def test_the_empty_batch():
    out = torch.empty((0, *SIZE, 3), dtype=torch.uint8)
    status = hybrid.decode([], np.zeros((0, 4), np.int64), out, options(), read_infos([]), engines=engines())
    assert len(status.kind) == 0


# --- through decode_into and the Loader -------------------------------------------------------------

@pytest.fixture
def host_engines(monkeypatch):
    """backend="hybrid" on CPU outputs, its GPU engines stood in for by host engines."""
    made = engines()
    monkeypatch.setattr(hybrid, "gpu_engines", lambda device: made)
    monkeypatch.setattr(hybrid, "unavailable_reason", lambda device=None: None)
    resolve = backends.resolve
    monkeypatch.setattr(backends, "resolve", lambda b, d: "hybrid" if b == "hybrid" else resolve(b, d))
    return made


def test_decode_into_keys_follow_every_sub_batch(host_engines):
    from PIL import Image
    import io

    datas, _, boxes = batch(10)
    png = io.BytesIO()
    Image.fromarray(photo(60, 70)).save(png, "PNG")
    datas = datas[:4] + [png.getvalue(), b"not an image"] + datas[6:]  # a mixed batch: sub-batches
    boxes[4] = (0, 0, 40, 50)
    keys = hybrid.RouteKeys(3, 2, np.arange(50, 60))
    shares = hybrid.Shares(0.2, 0.4, 0.4)
    out = torch.empty((len(datas), *SIZE, 3), dtype=torch.uint8)
    status = routing.decode_into(datas, boxes, out, options(), keys=keys, shares=shares)
    jpeg = [0, 1, 2, 3, 6, 7, 8, 9]
    assert status.route[jpeg].tolist() == expected_routes(3, 2, keys.indices[jpeg], shares, read_infos([datas[i] for i in jpeg]))
    assert status.route[4] == Route.PILLOW and not status.ok[5]


def test_the_gpu_engines_are_given_each_file_up_to_its_eoi(host_engines):
    """A file with bytes after its EOI (a trailer, an appended image) is the GPU decoders' as any
    other, cut at its EOI; one without an EOI (truncated) is the CPU core's, reported."""
    datas, _, boxes = batch(12)
    jpegs = list(datas)
    datas = [d + [b"", b"\0" * 9, jpegs[0], b"\xff\xd9\xff"][k % 4] for k, d in enumerate(jpegs)]
    datas[5] = jpegs[5][:-2]
    given = []
    for eng in host_engines.values():
        def recording(buffers, *a, _decode=eng.decode, **kw):
            given.extend(bytes(b) for b in buffers)
            return _decode(buffers, *a, **kw)
        eng.decode = recording
    shares = hybrid.Shares(0.0, 0.5, 0.5)
    out, ref = (torch.empty((len(datas), *SIZE, 3), dtype=torch.uint8) for _ in range(2))
    status = routing.decode_into(datas, boxes, out, options(), shares=shares)
    routing.decode_into([jpegs[k] if k != 5 else datas[5] for k in range(len(datas))], boxes, ref, options(), shares=shares)
    assert given and all(g in jpegs for g in given) and len(given) >= 8
    assert status.route[5] == Route.CPU_FALLBACK and "no EOI marker ends the JPEG" in status.fallback[5]
    assert torch.equal(out, ref) and status.ok.all()


def test_a_loaders_mixed_batches_run_on_its_engines_threads(tmp_path, host_engines, monkeypatch):
    """Batches that take the general path (EXIF orientation to apply, a PNG, a box to pad) run on
    the Loader's engine threads, as its other batches: threads made per batch vied with them for
    the decoders (and their busy time counted the wait)."""
    make_image_folder(tmp_path, per_class=12)
    made = []
    workers_init = hybrid.Workers.__init__

    def counting(self, *a, **kw):
        made.append(self)
        workers_init(self, *a, **kw)

    monkeypatch.setattr(hybrid.Workers, "__init__", counting)
    ld = loader(tmp_path, apply_exif_orientation=True, lookahead=False)
    seen = [index_of(x[k]) for x, _ in ld for k in range(x.shape[0])]
    assert sorted(seen) == list(range(36))
    assert len(made) == 1  # the Loader's own
    routes = ld.stats()["routes"]
    assert routes["gpu-hardware"] + routes["gpu-cuda"] > 0


def loader(root, **kw):
    return gpupipe.Loader(gpupipe.sources.ImageFolder(root), batch_size=8, backend="hybrid", num_threads=2,
                          crop=gpupipe.crops.RandomResizedCrop(SIZE), seed=3, **kw)


def test_the_loader_splits_batches_reports_routes_and_retunes_between_epochs(tmp_path, host_engines):
    make_image_folder(tmp_path, per_class=12)
    host_engines["hardware"].delay = 0.004  # a slow hardware decoder: it should get less work next epoch
    ld = loader(tmp_path, lookahead=False)  # re-tuned on the whole epoch (lookahead: on what was delivered)
    seen = [index_of(x[k]) for x, _ in ld for k in range(x.shape[0])]
    assert sorted(seen) == list(range(36))
    st = ld.stats()
    first = st["shares"]
    assert sum(st["routes"][r] for r in ("cpu", "gpu-hardware", "gpu-cuda")) == 36
    assert st["engines"]["hardware"]["images_per_s"] > 0 and st["routes"]["gpu-cuda"] == 0 and first["cuda"] == 0
    ld.set_epoch(1)
    list(ld)
    st = ld.stats()
    second = st["shares"]
    assert second != first and second["hardware"] < first["hardware"] and second["cuda"] == 0
    assert ld.state_dict()["decode_shares"]["epochs"] == {0: first, 1: second}
    # every sample went where (seed, epoch, index) and the epoch's shares sent it
    expected = hybrid.assign(3, 1, ld.indices(), hybrid.Shares.from_dict(second), np.ones(36, bool))
    assert np.bincount(expected, minlength=3).tolist() == [st["routes"][r] for r in ("cpu", "gpu-hardware", "gpu-cuda")]


def test_an_epoch_started_ahead_has_its_shares_in_the_state_and_replays_exactly(tmp_path, host_engines):
    make_image_folder(tmp_path, per_class=12)
    host_engines["hardware"].delay = 0.002
    ld = loader(tmp_path)
    list(ld)
    assert ld._ahead is not None and ld._ahead.epoch.epoch_number == 1  # started while epoch 0 drained
    # one thread per GPU engine for both epochs: its batches queue in order, its timing stays its own
    assert ld._ahead.epoch.workers is ld._workers is not None
    state = ld.state_dict()
    ahead_shares = state["decode_shares"]["epochs"][1]  # chosen when epoch 1 started, ahead
    ld.set_epoch(1)
    got = [x.clone() for x, _ in ld]
    st = ld.stats()
    assert st["shares"] == ahead_shares and st["images"] == 36
    expected = hybrid.assign(3, 1, ld.indices(), hybrid.Shares.from_dict(ahead_shares), np.ones(36, bool))
    assert np.bincount(expected, minlength=3).tolist() == [st["routes"][r] for r in ("cpu", "gpu-hardware", "gpu-cuda")]
    again = loader(tmp_path, lookahead=False)  # a restored run: the same routes, the same pixels
    again.load_state_dict(state)
    again.set_epoch(1)
    replay = [x for x, _ in again]
    assert again.stats()["shares"] == ahead_shares
    assert len(replay) == len(got) and all(torch.equal(a, b) for a, b in zip(got, replay))


@pytest.mark.parametrize("lookahead", [False, True])
def test_an_iterator_dropped_mid_epoch_leaves_the_next_one_its_gpu_workers(tmp_path, host_engines, lookahead):
    """it = iter(ld); next(it); it = iter(ld): the first iteration ends after the second started;
    the engines' threads are shared, so they stay until their last epoch is done."""
    make_image_folder(tmp_path, per_class=12)
    ld = loader(tmp_path, lookahead=lookahead, decode_shares={"cpu": 0.5, "hardware": 0.5, "cuda": 0.0})
    it = iter(ld)
    next(it)
    it = iter(ld)
    assert sum(x.shape[0] for x, _ in it) == 36 and ld.stats()["routes"]["gpu-hardware"] > 0


def epoch_with_a_slow_hardware_decoder(root, host_engines, per_class: int):
    """(loader, epoch 0's shares, the decode_shares state after epoch 0) on 3 x per_class files."""
    make_image_folder(root, per_class=per_class)
    host_engines["hardware"].delay = 0.004
    ld = loader(root)
    prior = ld._epoch_shares(0)
    list(ld)
    return ld, prior, ld.state_dict()["decode_shares"]


def test_a_short_epoch_ahead_starts_with_the_last_complete_epochs_tuning(tmp_path, host_engines, monkeypatch):
    """9 batches alone (no chunks), read whole before the first is delivered: the collect stage, held
    back by its queue (prefetch 2), has collected at most 4 when epoch 1 starts ahead."""
    from gpupipe import loader as loader_module

    monkeypatch.setattr(loader_module, "CHUNK_IMAGES", 0)
    ld, prior, state = epoch_with_a_slow_hardware_decoder(tmp_path, host_engines, per_class=24)
    assert state["epochs"][1] == prior.as_dict()  # too little collected when epoch 1 started ahead
    tuned = state["next"]  # epoch 0's complete tuning: the slow hardware decoder gets less
    assert tuned["hardware"] < prior.hardware
    ld.set_epoch(1)
    list(ld)
    assert ld.state_dict()["decode_shares"]["epochs"][2] == tuned


def test_an_epoch_of_one_chunk_starts_the_next_with_its_whole_tuning(tmp_path, host_engines):
    """5 batches of 8 are one chunk (loader.CHUNK_IMAGES): collected whole before its first batch is
    delivered, so the epoch started ahead is re-tuned on all of it, as after the epoch."""
    _, prior, state = epoch_with_a_slow_hardware_decoder(tmp_path, host_engines, per_class=12)
    assert state["epochs"][1] == state["next"] and state["next"]["hardware"] < prior.hardware


def test_the_cpu_pool_leaves_threads_of_the_budget_to_the_gpu_decoders(tmp_path, host_engines, monkeypatch):
    assert hybrid.cpu_pool_threads(16, ["hardware"]) == 16 - hybrid.ENGINE_HOST_THREADS
    assert hybrid.cpu_pool_threads(8, ["hardware"]) == 6  # a small budget leaves a quarter
    assert hybrid.cpu_pool_threads(1, ["hardware", "cuda"]) == 1  # never below one thread
    assert hybrid.cpu_pool_threads(5, []) == 5  # no GPU decoder shares: the whole budget
    assert hybrid.sharing_engines(hybrid.Shares(1.0, 0.0, 0.0), ["hardware", "cuda"]) == []
    assert hybrid.sharing_engines(hybrid.Shares(0.5, 0.5, 0.0), ["hardware", "cuda"]) == ["hardware"]
    started = []  # the pool size each CPU share really went to
    real_start = cpu.start
    monkeypatch.setattr(cpu, "start", lambda b, x, out, options: started.append(options.num_threads)
                        or real_start(b, x, out, options))
    declined = []
    real_fallback = hybrid.gpu_fallback.decode_on_cpu
    monkeypatch.setattr(hybrid.gpu_fallback, "decode_on_cpu", lambda status, reasons, b, x, out, options, infos:
                        declined.append(options.num_threads) or real_fallback(status, reasons, b, x, out, options, infos))
    make_image_folder(tmp_path, per_class=4)
    host_engines["hardware"].decline = lambda data: True  # everything the hardware decoder gets comes back
    host_engines["cuda"].decline = lambda data: True
    for shares, pool in (({"cpu": 0.5, "hardware": 0.5, "cuda": 0}, 8 - 2), ({"cpu": 1, "hardware": 0, "cuda": 0}, 8)):
        started.clear()
        declined.clear()
        ld = gpupipe.Loader(gpupipe.sources.ImageFolder(tmp_path), batch_size=4, backend="hybrid", num_threads=8,
                            crop=gpupipe.crops.RandomResizedCrop(SIZE), decode_shares=shares, lookahead=False)
        list(ld)  # (no epoch started ahead: its decodes would fall into the next configuration's record)
        st = ld.stats()
        assert set(started) == {pool} and set(declined) <= {pool}, (shares, started, declined)
        assert st["decode_pool"]["threads"] == st["threads"]["decode"] == pool
        assert st["routes"]["cpu"] + st["routes"]["cpu-fallback"] == 12
        assert bool(declined) == (shares["hardware"] > 0), "the declined samples' CPU decode was not seen"


@pytest.mark.parametrize("split", ["keyed", "ranked"])
def test_the_loader_resumes_mid_epoch_with_the_same_routes_and_pixels(tmp_path, host_engines, monkeypatch, split):
    """Also with the ranked split, whose routes are each batch's own: the resumed epoch's chunks
    start at another batch."""
    monkeypatch.setattr(hybrid, "SPLIT", split)
    make_image_folder(tmp_path, per_class=12)
    hardware = host_engines["hardware"]
    plain = hardware.decode

    def marked(buffers, boxes, out, slots, options, *, sizes):  # the route shows in the pixels
        declined = plain(buffers, boxes, out, slots, options, sizes=sizes)
        out[torch.from_numpy(np.asarray(slots))] ^= 0x5A
        return declined

    monkeypatch.setattr(hardware, "decode", marked)
    # epoch 0 tunes the shares of epoch 1; fixed even ones, where the stand-ins' timings could give
    # the CPU core nearly everything and every route the same
    fixed = {"decode_shares": {"cpu": 0.5, "hardware": 0.5, "cuda": 0.0}} if split == "ranked" else {}
    ld = loader(tmp_path, **fixed)
    list(ld)
    ld.set_epoch(1)
    it = iter(ld)
    next(it), next(it)
    state = ld.state_dict()
    rest = [x.clone() for x, _ in it]
    routes = ld.stats()["routes"]
    assert state["hybrid_split"] == split

    monkeypatch.setattr(hybrid, "SPLIT", "keyed" if split == "ranked" else "ranked")  # the state's split is kept
    again = loader(tmp_path, **fixed)
    again.load_state_dict(state)
    resumed = [x.clone() for x, _ in again]
    assert len(resumed) == len(rest) and all(torch.equal(a, b) for a, b in zip(rest, resumed))
    if not fixed:
        assert again.stats()["shares"] == state["decode_shares"]["epochs"][1]
    assert sum(again.stats()["routes"].values()) == sum(routes.values()) - 16
    assert 0 < again.stats()["routes"]["gpu-hardware"] < sum(again.stats()["routes"].values())
    with pytest.raises(ValueError, match="hybrid_split"):
        loader(tmp_path, **fixed).load_state_dict({**state, "hybrid_split": "fastest"})


def test_fixed_decode_shares_and_a_set_epoch_during_the_iteration(tmp_path, host_engines):
    make_image_folder(tmp_path, per_class=12)
    fixed = {"cpu": 0.25, "hardware": 0.5, "cuda": 0.25}
    ld = loader(tmp_path, decode_shares=fixed)
    it = iter(ld)
    first = next(it)[0].clone()
    ld.set_epoch(5)  # the epoch being iterated keeps its order, crops and routes
    rest = [x.clone() for x, _ in it]
    st = ld.stats()
    assert st["shares"] == fixed and "decode_shares" not in ld.state_dict()
    expected = hybrid.assign(3, 0, gpupipe.sources.distributed_indices(
        36, epoch=0, seed=3, shuffle=True, rank=0, world_size=1, drop_last=False), hybrid.Shares(**fixed), np.ones(36, bool))
    assert np.bincount(expected, minlength=3).tolist() == [st["routes"][r] for r in ("cpu", "gpu-hardware", "gpu-cuda")]
    ld.set_epoch(0)
    again = [x for x, _ in ld]
    assert torch.equal(again[0], first) and all(torch.equal(a, b) for a, b in zip(again[1:], rest))
    with pytest.raises(ValueError, match="decode_shares splits the hybrid backend"):
        gpupipe.Loader(gpupipe.sources.ImageFolder(tmp_path), batch_size=8, crop=gpupipe.crops.RandomResizedCrop(SIZE),
                       decode_shares=fixed)
    with pytest.raises(ValueError, match="must sum to 1"):
        loader(tmp_path, decode_shares={"cpu": 0.5, "hardware": 0.0, "cuda": 0.0})


def test_the_loader_with_two_calls_in_flight_gives_the_same_batches_and_says_so(tmp_path, host_engines, monkeypatch):
    make_image_folder(tmp_path, per_class=12)
    fixed = {"cpu": 0.25, "hardware": 0.5, "cuda": 0.25}
    one = [x.clone() for x, _ in loader(tmp_path, decode_shares=fixed)]
    monkeypatch.setattr(hybrid, "CALLS_IN_FLIGHT", {"hardware": 2, "cuda": 2})
    ld = loader(tmp_path, decode_shares=fixed)
    two = [x.clone() for x, _ in ld]
    st = ld.stats()
    assert len(one) == len(two) == 5 and all(torch.equal(a, b) for a, b in zip(one, two))
    # the stand-ins have no lanes: the lanes that ran called the one instance, taking turns
    assert all(1 <= v <= 2 for v in st["calls_in_flight"].values()) and st["lane_failures"] == []
    assert st["engines"]["hardware"]["images_per_s"] > 0


def test_a_device_error_fails_the_loader_clearly_and_every_thread_stops(tmp_path, host_engines):
    import gc

    make_image_folder(tmp_path, per_class=12)
    ld = loader(tmp_path)
    host_engines["hardware"].fail = True  # e.g. an illegal memory access, or out of memory
    it = iter(ld)  # (set before: batches are decoded ahead of the consumer)
    with pytest.raises(RuntimeError, match="hybrid backend's hardware decoder failed the batch .*illegal memory access"):
        for _ in it:
            pass
    del it
    gc.collect()
    deadline = time.time() + 20  # (a loaded machine may end a thread late)
    while [t for t in threading.enumerate() if t.name.startswith("gpupipe")]:
        assert time.time() < deadline, [t.name for t in threading.enumerate()]
        time.sleep(0.02)


def test_a_state_stored_as_json_resumes_with_its_shares(tmp_path, host_engines):
    import json

    make_image_folder(tmp_path, per_class=4)
    ld = loader(tmp_path, lookahead=False)
    for epoch in range(2):
        ld.set_epoch(epoch)
        list(ld)
    state = ld.state_dict()
    fresh = loader(tmp_path)
    fresh.load_state_dict(json.loads(json.dumps(state)))  # JSON's keys are text: "0", "1"
    assert fresh.state_dict() == state and fresh._shares == ld._shares
    state["decode_shares"]["epochs"] = {"-1": state["decode_shares"]["epochs"][0]}
    with pytest.raises(ValueError, match="an epoch '-1'"):
        loader(tmp_path).load_state_dict(state)


def test_an_engine_at_the_smallest_share_is_measured_over_epochs_and_gets_its_share_back(tmp_path, host_engines):
    """An epoch gives an engine at the 2% floor fewer samples than a rate needs (hybrid.MIN_MEASURED):
    its samples add up over epochs until they do, so a decoder that became fast is given work again."""
    class Instant(HostEngine):  # pixels aside: a decoder far faster than the CPU pool
        def decode(self, buffers, *a, **kw):
            return {}

    make_image_folder(tmp_path, per_class=30)  # 90 files: 2% is 0-4 samples an epoch
    host_engines["hardware"].delay = 0.02  # slow: pushed to the floor after the first epoch
    ld = loader(tmp_path, lookahead=False)
    list(ld)
    assert ld._next_shares.hardware == pytest.approx(0.02)
    host_engines["hardware"] = Instant("hardware")
    shares = []
    for epoch in range(1, 40):
        ld.set_epoch(epoch)
        list(ld)
        shares.append(ld.stats()["shares"]["hardware"])
        if shares[-1] > 0.5:
            break
    assert shares[-1] > 0.5 and len(shares) < 20, shares


def test_a_damaged_decode_shares_state_is_refused(tmp_path, host_engines):
    make_image_folder(tmp_path, per_class=4)
    ld = loader(tmp_path)
    list(ld)
    state = ld.state_dict()
    for bad, match in (({"epochs": {0: {"cpu": 2.0, "hardware": 0, "cuda": 0}}, "next": None}, "decode share 'cpu'"),
                       ({"epochs": {-1: state["decode_shares"]["epochs"][0]}, "next": None}, "an epoch -1"),
                       ({"epoch": {}, "next": None}, "is not {'epochs'"),
                       ({"epochs": {}, "next": {"cpu": 0.5}}, "decode shares are a dict")):
        state["decode_shares"] = bad
        fresh = loader(tmp_path)
        with pytest.raises(ValueError, match=match):
            fresh.load_state_dict(state)
        assert fresh._shares == {}  # nothing of a damaged state is taken
    del state["decode_shares"]  # a state saved before the hybrid backend: resumes, shares start afresh
    fresh = loader(tmp_path)
    fresh.load_state_dict(state)
    assert len(list(fresh)) == 2


def test_the_hybrid_backend_needs_a_cuda_device():
    with pytest.raises(ValueError, match="hybrid backend decodes on the GPU"):
        backends.resolve("hybrid", torch.device("cpu"))
    assert "hybrid" in gpupipe.backends_available()


# --- on a GPU: the real engines -----------------------------------------------------------------------

HYBRID_REASON = hybrid.unavailable_reason(torch.device("cuda")) if torch.cuda.is_available() else "no CUDA device"
on_gpu = pytest.mark.skipif(HYBRID_REASON is not None, reason=HYBRID_REASON or "")


@on_gpu
def test_gpu_hybrid_batches_match_the_cpu_core_within_the_engines_tolerance():
    from test_nvimgcodec import MAX_DIFF, MEAN_DIFF

    datas = photo_jpegs([PHOTOS[i % 4] for i in range(64)], [{"quality": 90}, {"quality": 85, "h_samp": 1, "v_samp": 1}],
                        size=(300, 400), step=(3, 5))
    boxes = np.array([[10 + i % 7, 20 + i % 11, 200 + i, 250 + i] for i in range(64)], dtype=np.int64)
    ref = gpupipe.decode_crop_jpegs(datas, boxes, size=SIZE, dct_scaling=False)
    got = gpupipe.decode_crop_jpegs(datas, boxes, size=SIZE, dct_scaling=False, backend="hybrid", device="cuda")
    assert got.ok.all() and set(got.routes) <= {"cpu", "gpu-hardware", "gpu-cuda"}
    gpu = [k for k, r in enumerate(got.routes) if r.startswith("gpu-")]
    prior = hybrid.Shares.prior(["cpu", *hybrid.gpu_engines(torch.device("cuda"))])  # decode_crop_jpegs's shares
    assert len(gpu) == (hybrid.assign(0, 0, np.arange(64), prior, np.ones(64, bool)) != 0).sum() > 0, got.routes
    cpu_rows = [k for k, r in enumerate(got.routes) if r == "cpu"]
    assert torch.equal(got.images.cpu()[cpu_rows], ref.images[cpu_rows])  # the CPU core's route: its own bytes
    diff = (got.images.cpu()[gpu].int() - ref.images[gpu].int()).abs()
    assert diff.max() <= MAX_DIFF and diff.float().mean() < MEAN_DIFF, (diff.max(), diff.float().mean())


@on_gpu
def test_gpu_the_loader_tunes_its_shares_and_resumes_exactly(tmp_path):
    make_image_folder(tmp_path, per_class=40)
    ld = gpupipe.Loader(gpupipe.sources.ImageFolder(tmp_path), batch_size=16, backend="hybrid", device="cuda",
                        crop=gpupipe.crops.RandomResizedCrop(SIZE), seed=3)
    seen = [index_of(x[k].cpu()) for x, _ in ld for k in range(x.shape[0])]
    assert sorted(seen) == list(range(120))
    st = ld.stats()
    assert st["routes"]["gpu-cuda"] + st["routes"].get("gpu-hardware", 0) > 0 and st["engines"]
    ld.set_epoch(1)
    it = iter(ld)
    next(it)
    state = ld.state_dict()
    rest = [x.cpu() for x, _ in it]
    again = gpupipe.Loader(gpupipe.sources.ImageFolder(tmp_path), batch_size=16, backend="hybrid", device="cuda",
                           crop=gpupipe.crops.RandomResizedCrop(SIZE), seed=3)
    again.load_state_dict(state)
    assert all(torch.equal(a, b.cpu()) for a, (b, _) in zip(rest, again))


@on_gpu
def test_gpu_two_calls_in_flight_decode_on_two_decoders_with_the_same_pixels(monkeypatch):
    datas = photo_jpegs([PHOTOS[i % 4] for i in range(48)], [{"quality": 90}], size=(300, 400), step=(3, 5))
    boxes = np.array([[10 + i % 7, 20 + i % 11, 200 + i, 250 + i] for i in range(48)], dtype=np.int64)
    device = torch.device("cuda")
    eng = hybrid.gpu_engines(device)
    kind = "hardware" if "hardware" in eng else "cuda"
    shares = hybrid.Shares(0.0, 1.0, 0.0) if kind == "hardware" else hybrid.Shares(0.0, 0.0, 1.0)
    infos = read_infos(datas)

    def batches():
        workers = hybrid.Workers(list(eng), device)
        try:
            outs = [torch.zeros((16, *SIZE, 3), dtype=torch.uint8, device=device) for _ in range(3)]
            started = [hybrid.start(datas[16 * b:16 * b + 16], boxes[16 * b:16 * b + 16], o, options(device=device), infos.select(
                np.arange(16 * b, 16 * b + 16)), shares=shares, engines=eng, workers=workers) for b, o in enumerate(outs)]
            statuses = [hybrid.wait(p) for p in started]
            return torch.cat(outs).cpu(), statuses, workers
        finally:
            workers.close()

    one, _, _ = batches()
    monkeypatch.setattr(hybrid, "CALLS_IN_FLIGHT", {kind: 2})
    two, statuses, workers = batches()
    assert all(s.ok.all() for s in statuses) and workers.lane_failures() == []
    assert workers.calls_in_flight()[kind] == 2 and eng[kind].lane(1) is not eng[kind]  # a decoder of its own
    assert torch.equal(one, two)


def test_an_engine_answering_nonsense_fails_its_batches_and_nothing_waits():
    datas, infos, boxes = batch(8)

    class Nonsense(MergingHostEngine):
        def decode(self, *a, **kw):
            return None  # not {k: reason}

    eng = {"hardware": Nonsense("hardware"), "cuda": HostEngine("cuda")}
    out = torch.empty((len(datas), *SIZE, 3), dtype=torch.uint8)
    t0 = time.time()
    with pytest.raises(RuntimeError, match="hardware decoder failed the batch .*NoneType"):
        hybrid.decode(datas, boxes, out, options(), infos, shares=hybrid.Shares(0.0, 1.0, 0.0), engines=eng)
    assert time.time() - t0 < 5


def test_an_engine_declining_positions_outside_its_share_fails_the_batch_clearly():
    datas, infos, boxes = batch(8)
    for wrong in (-1, 8, 100):
        class Stray(HostEngine):
            def decode(self, buffers, *a, **kw):
                super().decode(buffers, *a, **kw)
                return {len(buffers) if wrong == 8 else wrong: "stray"}

        eng = {"hardware": Stray("hardware"), "cuda": HostEngine("cuda")}
        out = torch.empty((len(datas), *SIZE, 3), dtype=torch.uint8)
        with pytest.raises(RuntimeError, match="hardware decoder failed the batch .*declined positions"):
            hybrid.decode(datas, boxes, out, options(), infos, shares=hybrid.Shares(0.0, 1.0, 0.0), engines=eng)


def test_an_engines_error_is_chained_and_out_of_memory_keeps_its_type():
    datas, infos, boxes = batch(8)

    class OutOfMemory(HostEngine):
        def decode(self, *a, **kw):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    out = torch.empty((len(datas), *SIZE, 3), dtype=torch.uint8)
    with pytest.raises(torch.OutOfMemoryError, match="hybrid backend's hardware decoder failed the batch .*2.00 GiB") as e:
        hybrid.decode(datas, boxes, out, options(), infos, shares=hybrid.Shares(0.5, 0.5, 0.0),
                      engines={"hardware": OutOfMemory("hardware"), "cuda": HostEngine("cuda")})
    assert isinstance(e.value, RuntimeError) and isinstance(e.value.__cause__, torch.OutOfMemoryError)
    with pytest.raises(RuntimeError, match="illegal memory") as e:
        hybrid.decode(datas, boxes, out, options(), infos, shares=hybrid.Shares(0.5, 0.5, 0.0),
                      engines=engines(hardware={"fail": True}))
    assert type(e.value) is RuntimeError and "illegal memory" in str(e.value.__cause__)


class WedgedEngine(HostEngine):
    """A call that does not return until ``release`` is set (a wedged device or driver call)."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.release = threading.Event()

    def decode(self, *a, **kw):
        self.release.wait(60)
        return super().decode(*a, **kw)


def test_a_wedged_engine_fails_its_batch_after_the_timeout_and_the_loader_stops(tmp_path, host_engines, monkeypatch):
    monkeypatch.setattr(hybrid, "ENGINE_TIMEOUT", 0.5)
    datas, infos, boxes = batch(8)
    wedged = WedgedEngine("hardware")
    out = torch.empty((len(datas), *SIZE, 3), dtype=torch.uint8)
    t0 = time.time()
    try:
        with pytest.raises(RuntimeError, match=r"hardware decoder failed the batch \(TimeoutError: no answer within "
                                               r"hybrid.ENGINE_TIMEOUT = 0.5 s") as e:
            hybrid.decode(datas, boxes, out, options(), infos, shares=hybrid.Shares(0.5, 0.5, 0.0),
                          engines={"hardware": wedged, "cuda": HostEngine("cuda")})
        assert isinstance(e.value.__cause__, TimeoutError) and time.time() - t0 < 20  # (wedged for good otherwise)
    finally:
        wedged.release.set()
    # in the Loader: next() raises (it never waits for good), the iterator closes
    make_image_folder(tmp_path, per_class=4)
    wedged = WedgedEngine("hardware")
    monkeypatch.setitem(host_engines, "hardware", wedged)
    ld = loader(tmp_path, decode_shares={"cpu": 0.5, "hardware": 0.5, "cuda": 0.0}, lookahead=False)
    t0 = time.time()
    try:
        with pytest.raises(RuntimeError, match="ENGINE_TIMEOUT"):
            list(ld)
        assert time.time() - t0 < 30
    finally:
        wedged.release.set()
    host_engines["hardware"] = HostEngine("hardware")
    monkeypatch.setattr(hybrid, "ENGINE_TIMEOUT", 120.0)  # (a healthy engine on a loaded machine: no deadline to race)
    assert len(list(ld)) == 2  # the engine answers again: the next iteration decodes


def test_an_epoch_that_cannot_start_gives_its_gpu_workers_back(tmp_path, host_engines, monkeypatch):
    make_image_folder(tmp_path, per_class=4)
    ld = loader(tmp_path, lookahead=False)
    real = gpupipe.loader.Engine
    monkeypatch.setattr(gpupipe.loader, "Engine", lambda *a, **kw: (_ for _ in ()).throw(RuntimeError("no threads")))
    with pytest.raises(RuntimeError, match="no threads"):
        iter(ld)
    assert ld._workers._users == 0 and ld._workers.closed
    monkeypatch.setattr(gpupipe.loader, "Engine", real)
    assert sum(x.shape[0] for x, _ in ld) == 12  # new workers for the next epoch


# --- the interpreter exits with an epoch in flight ------------------------------------------------------

@pytest.mark.parametrize("engines_of", ["host", pytest.param("gpu", marks=on_gpu)])
@pytest.mark.parametrize("leave", ["after-the-epoch", "mid-epoch"])
def test_exit_with_an_epoch_in_flight_never_aborts(tmp_path, engines_of, leave):
    """A training script ends after its last epoch with the Loader's next epoch started ahead (or
    leaves mid-epoch): engine threads and pool decodes are in flight as the interpreter exits. Seen
    once on the H100 (benchmarks/hybrid_probe.py, 11 Loaders left open): "terminate called without
    an active exception". The child must exit 0 with nothing on stderr, each of three times."""
    make_image_folder(tmp_path, per_class=24)
    stand_in = textwrap.dedent("""
        import test_hybrid
        from gpupipe import backends
        from gpupipe._backends import hybrid
        made = test_hybrid.engines()
        made["hardware"].delay = made["cuda"].delay = 0.002  # calls still running at exit
        hybrid.gpu_engines = lambda device: made
        hybrid.unavailable_reason = lambda device=None: None
        resolve = backends.resolve
        backends.resolve = lambda b, d: "hybrid" if b == "hybrid" else resolve(b, d)
        """) if engines_of == "host" else ""
    for _ in range(3):
        out = run_child(stand_in + textwrap.dedent(f"""
            import gpupipe
            ld = gpupipe.Loader(gpupipe.sources.ImageFolder({str(tmp_path)!r}), batch_size=8, backend="hybrid",
                                device={"cpu" if engines_of == "host" else "cuda"!r}, num_threads=2,
                                crop=gpupipe.crops.RandomResizedCrop({SIZE}), seed=3)
            n = 0
            for images, labels in ld:
                n += len(images)
                if {leave == "mid-epoch"} and n >= 16:
                    break
            print("exiting", n)
            """), timeout=120)
        assert out.stdout.split() == ["exiting", "16" if leave == "mid-epoch" else "72"]


@pytest.mark.parametrize("split", ["keyed", "ranked"])
def test_the_split_benchmarks_simulated_decoder_runs_the_loader(tmp_path, monkeypatch, split):
    """benchmarks.hybrid_split's stand-in (it sleeps, writes nothing) through the Loader: every
    image delivered, the shares re-tuned."""
    from benchmarks import hybrid_split

    make_image_folder(tmp_path, per_class=12)
    sim = hybrid_split.SimulatedHardwareDecoder(scale=50.0)
    monkeypatch.setattr(hybrid, "gpu_engines", lambda device: {"hardware": sim})
    monkeypatch.setattr(hybrid, "unavailable_reason", lambda device=None: None)
    resolve = backends.resolve
    monkeypatch.setattr(backends, "resolve", lambda b, d: "hybrid" if b == "hybrid" else resolve(b, d))
    monkeypatch.setattr(hybrid, "SPLIT", split)
    monkeypatch.setattr(hybrid_split, "WARM_EPOCHS", 2)
    rate, shares = hybrid_split.loader_rate(tmp_path, 8, 2, 1)
    assert rate > 0 and shares != hybrid.Shares.prior(["cpu", "hardware"]).as_dict()
    assert sim._seconds([b"x" * 1_000_000]) == pytest.approx(50.0 * 1e-3 * (0.018 + 0.594))
    by_pixels = hybrid_split.SimulatedHardwareDecoder(scale=2.0, model="pixels")
    assert by_pixels._seconds([b"x" * 10, b"y"], [[1000, 1000], [500, 1000]]) == pytest.approx(
        2.0 * 1e-3 * (2 * 0.0576 + 0.0534 * 1.5))


def test_the_split_benchmarks_simulation_favours_the_cheapest_only_when_costs_differ():
    from benchmarks import hybrid_split

    rng = np.random.default_rng(3)
    gpu = np.full(400, 1e-4)
    varied = rng.uniform(0.2e-4, 4e-4, 400)
    keyed, ranked = hybrid_split.simulate(varied, gpu, varied / gpu, 0, rng)
    assert ranked > 1.1 * keyed  # pooled: the cheap CPU samples first beat a random share
    same = np.full(400, 2e-4)
    keyed, ranked = hybrid_split.simulate(same, gpu, same / gpu, 0, rng)
    assert ranked == pytest.approx(keyed, rel=0.02)  # nothing to rank by
    _, by_cost = hybrid_split.simulate(varied, gpu, varied / gpu, 64, np.random.default_rng(4))
    _, by_noise = hybrid_split.simulate(varied, gpu, rng.random(400), 64, np.random.default_rng(4))
    assert by_cost > 1.1 * by_noise  # per batch too, the ranking is what gains


def test_the_probes_decoder_cost_fit_tells_bytes_from_pixels():
    """benchmarks.hybrid_probe --part costs, its fit on the CPU: a stand-in call whose time follows
    the files' bytes alone is fitted as bytes, not pixels, over files of two sizes and qualities."""
    pytest.importorskip("benchmarks.hybrid_probe")
    from benchmarks import hybrid_probe

    datas = [encode(photo(h, w, PHOTOS[k % 4]), quality=q) for k, (h, w, q) in enumerate(
        [(96, 128, 30), (96, 128, 95)] * 4 + [(192, 256, 30), (192, 256, 95)] * 4)]
    groups = hybrid_probe.cost_groups(datas)
    assert [g[0] for g in groups] == ["128x96 smaller files", "128x96 larger files",
                                      "256x192 smaller files", "256x192 larger files"]
    calls = []

    def by_bytes(batch):
        calls.append(len(batch))
        return sum(0.02e-3 + 0.6e-3 * len(d) * 1e-6 for d in batch)

    rows, (a, per_mb, per_mpx, r2) = hybrid_probe.decoder_costs(groups, by_bytes, call=8, reps=3)
    assert set(calls) == {8} and len(rows) == 4
    assert a == pytest.approx(0.02, rel=1e-6) and per_mb == pytest.approx(0.6, rel=1e-6)
    assert per_mpx == pytest.approx(0.0, abs=1e-6) and r2 == pytest.approx(1.0)
