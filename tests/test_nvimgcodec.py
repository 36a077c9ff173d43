"""nvImageCodec's GPU decoders as gpupipe engines (gpupipe/_backends/nvimgcodec.py) and backend
nvjpeg on them.

On the CPU: the availability messages, the engine's logic with a stand-in decoder (the crop
kernel's table built from decoded images, declined and mismatched samples, device errors naming the
engine, ROI regions), the frame that hands declined samples to the CPU core, and the nvjpeg
backend's torchvision path where nvImageCodec is absent. Where nvImageCodec is installed, the
arguments gpupipe builds are checked against its real classes (they construct without a GPU).

On a GPU (skipped elsewhere, with the reason): both engines against the CPU core on photos and
every JPEG variant, gray, what goes to the CPU core, batches of 1 and 256, a corrupt file among
good ones, a non-default stream, and nothing printed. The tolerance (max 6 levels, mean < 1 on
every variant; measured on an H200 on 4:2:0 photos: max 1 hardware, 3 CUDA decoder) is in
docs/semantics.md.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import types

import numpy as np
import pytest
import torch

import gpupipe
from gpupipe._backends import gpu_fallback, nvimgcodec, nvjpeg
from gpupipe.decode_types import DecodeOptions, Route, read_infos
from helpers import encode, make_variants, photo, photo_jpegs, run_child

# Every variant the GPU decoders are given, against the CPU core (docs/semantics.md). Measured on an
# H200 on 4:2:0 photos: max 1 (hardware) / 3 (CUDA decoder); gray mode, every variant: within this.
MAX_DIFF, MEAN_DIFF = 6, 1.0


def _real_library():
    try:
        return nvimgcodec._library()
    except Exception as e:  # noqa: BLE001 - any failure means: not usable here
        pytest.skip(f"nvImageCodec not importable here ({type(e).__name__}: {e})")


# --- availability ------------------------------------------------------------------------------


def test_unavailable_when_not_installed(monkeypatch):
    monkeypatch.setitem(sys.modules, "nvidia.nvimgcodec", None)  # import_module raises ModuleNotFoundError
    reason = nvimgcodec.unavailable_reason()
    assert "not installed" in reason and "pip install 'torch-gpupipe[gpu]'" in reason
    monkeypatch.setitem(sys.modules, "nvidia", None)
    assert "pip install 'torch-gpupipe[gpu]'" in nvimgcodec.unavailable_reason(torch.device("cuda"))


def test_unavailable_reason_gives_the_import_error(monkeypatch):
    def broken():
        raise OSError("libcudart.so.13: cannot open shared object file")

    monkeypatch.setattr(nvimgcodec, "_library", broken)
    reason = nvimgcodec.unavailable_reason()
    assert "not importable" in reason and "libcudart.so.13" in reason and "OSError" in reason


def test_unavailable_without_a_cuda_device(monkeypatch):
    monkeypatch.setattr(nvimgcodec, "_engines", {})  # engines a GPU machine's earlier tests started
    monkeypatch.setattr(nvimgcodec, "_library", lambda: types.SimpleNamespace())
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert nvimgcodec.unavailable_reason() == "no CUDA device (torch.cuda.is_available() is False)"
    assert "pass device='cuda'" in nvimgcodec.unavailable_reason(torch.device("cpu"))
    assert not nvimgcodec.hardware_decoder_available(torch.device("cuda"))
    with pytest.raises(RuntimeError, match="no CUDA device"):
        nvimgcodec.engine("cuda", torch.device("cuda", 0))
    with pytest.raises(ValueError, match="kind must be one of"):
        nvimgcodec.engine("tpu", torch.device("cuda", 0))


def test_backends_available_reports_nvimgcodec():
    info = gpupipe.backends_available()["nvimgcodec"]
    assert set(info) == {"available", "devices", "reason", "hardware_decoder"}
    assert isinstance(info["reason"], str) and info["reason"]
    if not torch.cuda.is_available():
        assert not info["available"] and not info["hardware_decoder"] and info["devices"] == []
    from gpupipe.bench.report import info as report

    assert "| nvimgcodec |" in report()


def test_the_arguments_fit_the_real_library():
    """What gpupipe passes to nvImageCodec, built with its real classes (no GPU needed for these)."""
    lib = _real_library()
    for name in ("device_id", "max_num_cpu_threads", "backends", "options"):
        assert name in lib.Decoder.__init__.__doc__
    for name in ("cuda_stream", "params", "None"):
        assert name in lib.Decoder.decode.__doc__
    hw = nvimgcodec._decoder_args(lib, "hardware", 2, False)
    assert [b.backend_kind for b in hw["backends"]] == [lib.BackendKind.HW_GPU_ONLY]
    assert hw["options"].split() == [":fancy_upsampling=1", "nvjpeg_hw_decoder:preallocate_batch_size=256"]
    cuda = nvimgcodec._decoder_args(lib, "cuda", 3, True)
    assert [b.backend_kind for b in cuda["backends"]] == [lib.BackendKind.GPU_ONLY, lib.BackendKind.HYBRID_CPU_GPU]
    assert cuda["max_num_cpu_threads"] == 3 and ":enable_roi_fancy_upsampling=1" in cuda["options"].split()
    assert f"nvjpeg_cuda_decoder:hybrid_huffman_threshold={nvimgcodec.CUDA_HUFFMAN_ON_GPU_ABOVE}" in cuda["options"].split()
    gray, rgb = nvimgcodec._decode_params(lib, "gray"), nvimgcodec._decode_params(lib, "rgb")
    assert (gray.color_spec, rgb.color_spec) == (lib.ColorSpec.GRAY, lib.ColorSpec.SRGB)
    assert not gray.apply_exif_orientation and not rgb.allow_any_depth
    data = encode(photo(37, 53))
    cs = lib.CodeStream(data)
    assert (cs.height, cs.width) == (37, 53)
    sub = cs.get_sub_code_stream(region=lib.Region(1, 2, 30, 40))
    assert tuple(sub.view.region.start) == (1, 2) and tuple(sub.view.region.end) == (30, 40)


def test_what_the_real_parser_refuses_is_declined_not_raised():
    lib = _real_library()
    good = encode(photo(37, 53))
    streams, unparsed = nvimgcodec._code_streams(lib, [good, b"garbage", b"", b"\xff\xd8\xff"])
    assert streams[0].height == 37 and set(unparsed) == {1, 2, 3} and "Failed to get image info" in unparsed[1]


def test_the_verbosity_is_set_for_the_import_only(monkeypatch):
    monkeypatch.delenv("PYNVIMGCODEC_VERBOSITY", raising=False)
    seen = []
    monkeypatch.setattr(nvimgcodec.importlib, "import_module", lambda name: seen.append(dict(nvimgcodec.os.environ)))
    monkeypatch.delitem(sys.modules, "nvidia.nvimgcodec", raising=False)
    nvimgcodec._library()
    assert seen[0]["PYNVIMGCODEC_VERBOSITY"] == "0" and "PYNVIMGCODEC_VERBOSITY" not in nvimgcodec.os.environ
    monkeypatch.setenv("PYNVIMGCODEC_VERBOSITY", "3")  # the user's own setting is left alone
    nvimgcodec._library()
    assert seen[1]["PYNVIMGCODEC_VERBOSITY"] == "3"


def test_the_engines_need_the_crop_kernel(monkeypatch):
    from gpupipe.augment import _kernels

    built = nvimgcodec.crop_kernel_reason()
    assert built is None or "without its CUDA kernels" in built
    monkeypatch.setattr(_kernels, "_C_cuda", None)
    assert "rebuild with nvcc" in nvimgcodec.crop_kernel_reason()
    monkeypatch.setattr(nvimgcodec, "_library", lambda: types.SimpleNamespace())
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert "rebuild with nvcc" in nvimgcodec.unavailable_reason(torch.device("cuda"))


# --- the engine's logic, with a stand-in decoder --------------------------------------------------


class FakeImage:
    """What nvImageCodec's decoded Image exposes to the engine: its CUDA array interface."""

    def __init__(self, ptr, h, w, c=3, pitch=None, typestr="|u1"):
        self.cai = {"shape": (h, w, c), "strides": None if pitch is None else (pitch, c, 1), "data": (ptr, False),
                    "typestr": typestr, "version": 3, "stream": 1}

    @property
    def __cuda_array_interface__(self):
        return self.cai


def test_image_table_rows_are_exact():
    images = [FakeImage(0x7000, 10, 20), FakeImage(0x9000, 5, 7, pitch=32), FakeImage(0xA000, 3, 4, c=1)]
    table, declined = nvimgcodec.image_table(images[:2], np.array([10, 5]), np.array([20, 7]), 3)
    assert table.dtype == np.int64 and not declined
    assert table.tolist() == [[0x7000, 10, 20, 60], [0x9000, 5, 7, 32]]
    table, declined = nvimgcodec.image_table(images[2:], np.array([3]), np.array([4]), 1)
    assert table.tolist() == [[0xA000, 3, 4, 4]] and not declined
    table, declined = nvimgcodec.image_table([], np.zeros(0), np.zeros(0), 3)
    assert table.shape == (0, 4) and not declined


def test_image_table_declines_none_and_mismatches():
    images = [None, FakeImage(1, 10, 21), FakeImage(2, 10, 20, c=1), FakeImage(3, 10, 20, typestr="<u2"),
              FakeImage(4, 10, 20, pitch=40), FakeImage(5, 10, 20)]
    table, declined = nvimgcodec.image_table(images, np.full(6, 10), np.full(6, 20), 3)
    assert sorted(declined) == [0, 1, 2, 3, 4]
    assert "returned no image" in declined[0]
    assert "decoded as 10x21x3" in declined[1] and "header says 10x20x3" in declined[1]
    assert "10x20x1" in declined[2] and "<u2" in declined[3] and "pitch 40" in declined[4]
    assert table[:5].tolist() == [[0, 0, 0, 0]] * 5 and table[5].tolist() == [5, 10, 20, 60]


def test_roi_regions_grow_and_clip():
    boxes = np.array([[0, 0, 10, 10], [20, 30, 5, 6], [90, 95, 10, 5]], dtype=np.float64)
    regions = nvimgcodec.roi_regions(boxes, np.array([100, 100, 100]), np.array([100, 100, 100]), margin=8)
    assert regions.tolist() == [[0, 0, 18, 18], [12, 22, 33, 44], [82, 87, 100, 100]]


class FakeDecoder:
    def __init__(self, **kwargs):
        self.kwargs, self.calls, self.result = kwargs, [], None

    def decode(self, streams, *, params=None, cuda_stream=0):
        self.calls.append((streams, params, cuda_stream))
        return self.result(streams) if callable(self.result) else self.result


@pytest.fixture
def fake(monkeypatch):
    """An engine module whose library, device calls and crop kernel are stand-ins: returns a
    namespace with the crop calls, and a function making an Engine."""
    lib = types.SimpleNamespace(
        Backend=lambda kind, load_hint=1.0: ("backend", kind, load_hint),
        BackendKind=types.SimpleNamespace(HW_GPU_ONLY="hw", GPU_ONLY="gpu", HYBRID_CPU_GPU="hybrid"),
        ColorSpec=types.SimpleNamespace(SRGB="srgb", GRAY="gray"),
        DecodeParams=lambda **kw: ("params", kw["color_spec"]),
        CodeStream=lambda data: types.SimpleNamespace(data=bytes(data), region=None, height=1,
                                                     get_sub_code_stream=lambda region, d=bytes(data):
                                                     types.SimpleNamespace(data=d, region=region)),
        Region=lambda *a: a,
        Decoder=FakeDecoder)
    state = types.SimpleNamespace(crops=[], synced=[], stream=types.SimpleNamespace(cuda_stream=4242))
    monkeypatch.setattr(nvimgcodec, "NATIVE", False)  # the Python API's path (the C API's: `native` below)
    monkeypatch.setattr(nvimgcodec, "_library", lambda: lib)
    monkeypatch.setattr(nvimgcodec, "_device_context", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(nvimgcodec, "_current_stream", lambda device: state.stream)
    monkeypatch.setattr(nvimgcodec, "_synchronize", lambda stream: state.synced.append(stream))
    monkeypatch.setattr(nvimgcodec, "_check_out", lambda *a: None)

    def crop(images, boxes, out, slots, *, resize, window=False):
        state.crops.append((images.copy(), boxes.copy(), slots.copy(), resize, window))

    monkeypatch.setattr(nvimgcodec, "_crop_resize", lambda: crop)
    state.make = lambda kind="cuda", **kw: nvimgcodec.Engine(kind, torch.device("cuda", 0), **kw)
    return state


def test_engine_builds_its_decoder(fake):
    eng = fake.make("hardware", cpu_threads=3)
    assert eng.route == Route.GPU_HARDWARE and eng.name == "nvImageCodec's hardware decoder on cuda:0"
    assert eng._decoder.kwargs["device_id"] == 0 and eng._decoder.kwargs["max_num_cpu_threads"] == 3
    assert eng._decoder.kwargs["backends"] == [("backend", "hw", 1.0)]
    assert fake.make("cuda").route == Route.GPU_CUDA
    with pytest.raises(ValueError, match="kind must be"):
        fake.make("cpu")


def test_engine_crops_decoded_samples_and_declines_the_rest(fake):
    datas = [encode(photo(30 + k, 40 + k)) for k in range(5)]
    eng = fake.make()
    eng._decoder.result = [FakeImage(100, 30, 40), None, FakeImage(300, 32, 42), FakeImage(400, 99, 43),
                           FakeImage(500, 34, 44, pitch=256)]
    boxes = np.array([[1, 2, 8, 8], [0, 0, 8, 8], [3, 3, 8, 8], [0, 0, 8, 8], [5, 6, 8, 8]], dtype=np.float64)
    slots = np.array([9, 7, 5, 3, 1])
    out = torch.zeros(10, 8, 8, 3, dtype=torch.uint8)
    declined = eng.decode(datas, boxes, out, slots, DecodeOptions(size=(8, 8)))  # sizes read from the headers
    assert sorted(declined) == [1, 3] and "no image" in declined[1] and "99x43x3" in declined[3]
    (images, cboxes, cslots, resize, window), = fake.crops  # ONE kernel call for the batch
    assert images.tolist() == [[100, 30, 40, 120], [300, 32, 42, 126], [500, 34, 44, 256]]
    assert cboxes.tolist() == boxes[[0, 2, 4]].tolist() and cslots.tolist() == [9, 5, 1]
    assert (resize, window) == (False, False)
    streams, params, cuda_stream = eng._decoder.calls[0]
    assert [s.data for s in streams] == datas and params == ("params", "srgb") and cuda_stream == 4242


def test_a_file_the_parser_refuses_is_declined_and_the_rest_decode(fake):
    datas = [encode(photo(30, 40)), b"not a jpeg", encode(photo(32, 42))]
    lib = nvimgcodec._library()
    make = lib.CodeStream

    def strict(data):
        if not bytes(data).startswith(b"\xff\xd8"):
            raise RuntimeError("Failed to get image info")
        return make(data)

    lib.CodeStream = strict
    eng = fake.make()
    eng._decoder.result = [FakeImage(100, 30, 40), FakeImage(300, 32, 42)]
    out = torch.zeros(3, 8, 8, 3, dtype=torch.uint8)
    declined = eng.decode(datas, np.array([[0, 0, 8, 8]] * 3, dtype=np.float64), out, np.array([0, 1, 2]),
                          DecodeOptions(size=(8, 8)), sizes=np.array([[30, 40], [1, 1], [32, 42]]))
    assert list(declined) == [1] and "cannot parse" in declined[1]
    (images, _, cslots, _, _), = fake.crops
    assert cslots.tolist() == [0, 2] and images[:, 0].tolist() == [100, 300]


def test_shares_of_several_batches_decode_in_one_call_and_crop_into_their_own_outputs(fake):
    datas = [encode(photo(30 + k, 40)) for k in range(3)]
    lib = nvimgcodec._library()
    make = lib.CodeStream
    lib.CodeStream = lambda data: make(data) if bytes(data).startswith(b"\xff\xd8") else (_ for _ in ()).throw(
        RuntimeError("Failed to get image info"))
    eng = fake.make("hardware")
    eng._decoder.result = [FakeImage(100, 30, 40), None, FakeImage(300, 32, 40)]
    outs = [torch.zeros(4, 8, 8, 3, dtype=torch.uint8) for _ in range(2)]
    options = DecodeOptions(size=(8, 8))
    jobs = [(datas[:2], np.array([[0, 0, 8, 8]] * 2, dtype=np.float64), outs[0], np.array([3, 1]), options,
             np.array([[30, 40], [31, 40]])),
            ([b"not a jpeg", datas[2]], np.array([[0, 0, 8, 8]] * 2, dtype=np.float64), outs[1], np.array([0, 2]),
             options, np.array([[1, 1], [32, 40]]))]
    first, second = eng.decode_jobs(jobs)
    assert len(eng._decoder.calls) == 1 and [s.data for s in eng._decoder.calls[0][0]] == datas  # ONE call
    assert list(first) == [1] and "no image" in first[1]  # positions within each share
    assert list(second) == [0] and "cannot parse" in second[0]
    assert [c[2].tolist() for c in fake.crops] == [[3], [2]]  # a kernel per share, into its own out
    assert [c[0][0, 0] for c in fake.crops] == [100, 300]


def test_engine_gray_resize_and_given_sizes(fake):
    eng = fake.make()
    eng._decoder.result = [FakeImage(7, 50, 60, c=1)]
    declined = eng.decode([b"x"], np.array([[0, 0, 20, 30]]), torch.zeros(2, 8, 8, 1, dtype=torch.uint8), np.array([1]),
                          DecodeOptions(size=(8, 8), resize=True, mode="gray"), sizes=np.array([[50, 60]]))
    assert not declined and eng._decoder.calls[0][1] == ("params", "gray")
    assert fake.crops[0][0].tolist() == [[7, 50, 60, 60]] and fake.crops[0][3] is True
    assert eng.decode([], np.zeros((0, 4)), torch.zeros(1, 8, 8, 1, dtype=torch.uint8), np.zeros(0, np.int64),
                      DecodeOptions(size=(8, 8), mode="gray")) == {}
    assert len(eng._decoder.calls) == 1  # an empty batch calls nothing


def test_engine_roi_decodes_regions_and_shifts_boxes(fake):
    eng = fake.make(roi=True)
    args = ([b"x"], np.array([[20, 30, 10, 15]]), torch.zeros(1, 10, 15, 3, dtype=torch.uint8), np.array([0]),
            DecodeOptions(size=(10, 15)))
    eng._decoder.result = [FakeImage(1, 26, 28)]
    assert not eng.decode(*args, sizes=np.array([[100, 50]]))
    assert eng._decoder.calls[0][0][0].region == (12, 22, 38, 50)  # grown by 8, clipped at the right edge
    assert fake.crops[0][0].tolist() == [[1, 26, 28, 84]] and fake.crops[0][1].tolist() == [[8, 8, 10, 15]]
    eng._decoder.result = [FakeImage(1, 26, 31)]  # not the region's size: declined, not cropped
    assert "header says 26x28x3" in eng.decode(*args, sizes=np.array([[100, 50]]))[0] and len(fake.crops) == 1


def test_a_decode_error_names_the_engine(fake):
    eng = fake.make("hardware")

    def oom(streams):
        raise RuntimeError("CUDA error: out of memory")

    eng._decoder.result = oom
    with pytest.raises(RuntimeError, match="nvImageCodec's hardware decoder on cuda:0: decode failed .*out of memory"):
        eng.decode([b"x"], np.array([[0, 0, 8, 8]]), torch.zeros(1, 8, 8, 3, dtype=torch.uint8), np.array([0]),
                   DecodeOptions(size=(8, 8)), sizes=np.array([[8, 8]]))


def test_all_declined_checks_the_device(fake, monkeypatch):
    eng = fake.make()
    eng._decoder.result = [None, None]
    args = ([b"x", b"y"], np.array([[0, 0, 8, 8]] * 2), torch.zeros(2, 8, 8, 3, dtype=torch.uint8), np.array([0, 1]),
            DecodeOptions(size=(8, 8)))
    assert sorted(eng.decode(*args, sizes=np.array([[8, 8]] * 2))) == [0, 1] and fake.synced and not fake.crops

    def sticky(stream):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(nvimgcodec, "_synchronize", sticky)
    with pytest.raises(RuntimeError, match="nvImageCodec's cuda decoder on cuda:0: .*illegal memory access"):
        eng.decode(*args, sizes=np.array([[8, 8]] * 2))


def test_a_kernel_error_names_the_engine(fake, monkeypatch):
    eng = fake.make()
    eng._decoder.result = [FakeImage(1, 8, 8)]

    def crop(*a, **k):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(nvimgcodec, "_crop_resize", lambda: crop)
    with pytest.raises(torch.OutOfMemoryError, match="cuda decoder on cuda:0: crop and resize failed .*OutOfMemoryError") as e:
        eng.decode([b"x"], np.array([[0, 0, 8, 8]]), torch.zeros(1, 8, 8, 3, dtype=torch.uint8), np.array([0]),
                   DecodeOptions(size=(8, 8)), sizes=np.array([[8, 8]]))
    # through the hybrid backend it is still one (both wrappers keep the kind)
    from gpupipe._backends import hybrid

    assert isinstance(hybrid._engine_failure("cuda", e.value), torch.OutOfMemoryError)


def test_engine_start_failure_is_a_clear_error(fake):
    def refuse(**kw):
        raise RuntimeError("Internal error - Could not create decoder. Code: 8")

    nvimgcodec._library().Decoder = refuse
    with pytest.raises(RuntimeError, match="hardware decoder on cuda:0 could not start .*Code: 8"):
        fake.make("hardware")


def test_an_out_of_memory_at_an_engines_start_is_not_taken_for_good(monkeypatch):
    """The first decode (the probe) failing for want of device memory is the device's state now,
    not the engine's: raised as torch.OutOfMemoryError and not cached (a cached failure made the
    engine unavailable for the process's life, and its RuntimeError escaped `except
    torch.OutOfMemoryError`). Other failures are cached as before."""
    monkeypatch.setattr(nvimgcodec, "unavailable_reason", lambda device=None: None)
    monkeypatch.setattr(nvimgcodec, "_engines", {})
    outcomes = [torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 64.00 MiB"), "started",
                RuntimeError("no JPEG engines"), "started"]

    def started(kind, device):
        outcome = outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    monkeypatch.setattr(nvimgcodec, "_started", started)
    with pytest.raises(torch.OutOfMemoryError, match="64.00 MiB"):
        nvimgcodec.engine("cuda", torch.device("cuda", 0))
    assert nvimgcodec.engine("cuda", torch.device("cuda", 0)) == "started"
    for _ in range(2):  # (another failure: cached, the next call does not start it again)
        with pytest.raises(RuntimeError, match="no JPEG engines"):
            nvimgcodec.engine("hardware", torch.device("cuda", 0))
    assert outcomes == ["started"]


def test_probe_declined_means_not_available(fake):
    eng = fake.make("hardware")
    eng._decoder.result = [None]
    fake.stream.synchronize = lambda: None
    with pytest.raises(RuntimeError, match="not available: .*no JPEG engines"):
        eng.probe()
    eng._decoder.result = [FakeImage(1, 96, 128)]
    eng.probe()


# --- the C API's path on the CPU: nvImageCodec's own libjpeg-turbo decoder into host memory ---------


def _c_api_reason():
    if reason := nvimgcodec.native_reason():
        return reason
    try:
        nvimgcodec._library()
    except Exception as e:  # noqa: BLE001 - any failure means: not usable here
        return f"nvImageCodec not importable here ({type(e).__name__}: {e})"
    return None


C_API_REASON = _c_api_reason()
needs_c_api = pytest.mark.skipif(C_API_REASON is not None, reason=C_API_REASON or "")


@pytest.fixture
def native(monkeypatch):
    """Engines whose C-API decoder is the real one of kind "cpu" (host memory, no GPU): the whole
    path (parse, checks, one decode call, statuses, the crop kernel's table) runs as on a GPU, with
    the host build of the crop kernel."""
    lib = nvimgcodec._library()
    made = []

    def cpu_decoder(lib_, kind, device_index, cpu_threads, options):
        made.append((kind, options))
        dec = _cpu_decoder(lib_, cpu_threads, options)
        return CountingDecoder(dec)

    monkeypatch.setattr(nvimgcodec, "_native_decoder", cpu_decoder)
    monkeypatch.setattr(nvimgcodec, "_device_context", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(nvimgcodec, "_current_stream", lambda device: types.SimpleNamespace(cuda_stream=0))
    monkeypatch.setattr(nvimgcodec, "_synchronize", lambda stream: None)
    monkeypatch.setattr(nvimgcodec, "_check_out", lambda *a: None)
    monkeypatch.setattr(nvimgcodec, "_scratch", lambda nbytes, device: torch.zeros(max(int(nbytes), 1), dtype=torch.uint8))
    state = types.SimpleNamespace(lib=lib, made=made)
    state.make = lambda kind="hardware", **kw: nvimgcodec.Engine(kind, torch.device("cuda", 0), **kw)
    return state


def _cpu_decoder(lib, cpu_threads, options, kind="cpu"):
    from gpupipe.augment._kernels import _C_cuda

    return _C_cuda.NvimgcodecDecoder(os.path.dirname(lib.__file__), kind, 0, cpu_threads, options)


def pillow_png(pixels):
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "PNG")
    return buf.getvalue()


class CountingDecoder:
    def __init__(self, dec):
        self.dec, self.calls = dec, []

    def decode(self, buffers, *args):
        self.calls.append(len(buffers))
        return self.dec.decode(buffers, *args)


def _host_core(datas, boxes, size, mode="rgb", resize=False):
    return gpupipe.decode_crop_jpegs(datas, boxes, size=size if resize else None, backend="cpu", mode=mode,
                                     dct_scaling=False).images.permute(0, 2, 3, 1)


def _host_decode(eng, datas, boxes, size, mode="rgb", resize=False, slots=None):
    opts = DecodeOptions(size=tuple(size), resize=resize, mode=mode)
    out = torch.zeros(len(datas), *size, opts.channels, dtype=torch.uint8)
    slots = np.arange(len(datas)) if slots is None else slots
    return out, eng.decode(datas, np.asarray(boxes, dtype=np.float64), out, slots, opts)


@needs_c_api
@pytest.mark.parametrize("mode", ["rgb", "gray"])
def test_c_api_crops_equal_the_cpu_core(native, mode):
    """The C API's path end to end: every variant nvImageCodec's libjpeg-turbo takes, cropped by the
    crop kernel from its packed buffer, equals the CPU core (the same libjpeg algorithms) bit for bit."""
    eng = native.make()
    assert eng.api == "C" and native.made == [("hardware", nvimgcodec._decoder_options("hardware", False))]
    variants = {n: v for n, v in make_variants(photo(77, 103)).items()
                if not n.startswith(("cmyk", "ycck", "rgb")) and "arithmetic" not in n}
    datas = list(variants.values())
    boxes = np.array([[3 + k, 5, 48, 64] for k in range(len(datas))], dtype=np.float64)
    got, declined = _host_decode(eng, datas, boxes, (48, 64), mode)
    assert not declined, {list(variants)[k]: why for k, why in declined.items()}
    ref = _host_core(datas, boxes, (48, 64), mode)
    for k, name in enumerate(variants):
        assert torch.equal(got[k], ref[k]), f"{name}: max |diff| {int((got[k].int() - ref[k].int()).abs().max())}"
    assert eng._native.calls == [len(datas)]  # ONE call for the batch


@needs_c_api
def test_c_api_declines_what_it_cannot_take_and_decodes_the_rest(native):
    good = photo_jpegs(["astronaut", "coffee"], [{}], size=(60, 80))
    png = pillow_png(photo(60, 80))
    datas = [good[0], b"garbage" * 9, b"", png, good[1], good[1]]
    (h0, w0), (h1, w1) = (gpupipe.read_header(d)[:2] for d in good)
    sizes = np.array([[h0, w0], [1, 1], [1, 1], [60, 80], [h1, w1], [h1 + 1, w1]])  # the last: another header size
    boxes = np.array([[4, 5, 32, 40]] * 6, dtype=np.float64)
    eng = native.make("cuda")
    out = torch.zeros(6, 32, 40, 3, dtype=torch.uint8)
    declined = eng.decode(datas, boxes, out, np.arange(6), DecodeOptions(size=(32, 40)), sizes=sizes)
    assert sorted(declined) == [1, 2, 3, 5], declined
    assert "cannot parse" in declined[1] and "cannot parse" in declined[2]
    assert "another format than JPEG" in declined[3] and "another size than its header" in declined[5]
    ref = _host_core([good[0], good[1]], boxes[:2], (32, 40))
    assert torch.equal(out[0], ref[0]) and torch.equal(out[4], ref[1])
    assert not out[[1, 2, 3, 5]].any()  # declined slots untouched


@needs_c_api
def test_c_api_shares_of_several_batches_in_one_call(native):
    datas = photo_jpegs(["astronaut", "coffee", "chelsea"], [{}], size=(70, 90))
    eng = native.make()
    outs = [torch.zeros(4, 16, 16, 3, dtype=torch.uint8) for _ in range(2)]
    options = DecodeOptions(size=(16, 16), resize=True)
    boxes = np.array([[0, 0, 70, 90], [10, 10, 40, 50]], dtype=np.float64)
    first, second = eng.decode_jobs([(datas[:2], boxes, outs[0], np.array([3, 1]), options, None),
                                     ([b"nope", datas[2]], boxes, outs[1], np.array([0, 2]), options, None)])
    assert eng._native.calls == [4] and not first and list(second) == [0]
    ref = _host_core(datas, np.concatenate([boxes, boxes[1:]]), (16, 16), resize=True)
    assert torch.equal(outs[0][3], ref[0]) and torch.equal(outs[0][1], ref[1]) and torch.equal(outs[1][2], ref[2])


@needs_c_api
def test_c_api_roi_decodes_regions_with_the_same_pixels(native):
    datas = photo_jpegs(["astronaut", "rocket", "coffee", "chelsea"], [{}, {"h_samp": 2, "v_samp": 1}], size=(120, 160))
    boxes = np.array([[10, 20, 50, 60], [60, 90, 60, 70], [0, 0, 120, 160], [33, 47, 20, 30]], dtype=np.float64)
    whole, _ = _host_decode(native.make(), datas, boxes, (24, 24), resize=True)
    roi, declined = _host_decode(native.make(roi=True), datas, boxes, (24, 24), resize=True)
    assert not declined
    ref = _host_core(datas, boxes, (24, 24), resize=True)
    assert torch.equal(whole, ref)
    assert (roi.int() - ref.int()).abs().max() <= 1  # libjpeg's region decode: the margin keeps the edge


@needs_c_api
def test_c_api_argument_checks(native):
    dec = _cpu_decoder(native.lib, 1, "")
    data = photo_jpegs(["coffee"], [{}], size=(20, 30))[0]
    out = torch.zeros(20 * 30 * 3, dtype=torch.uint8)
    one = np.array([[20, 30]], np.int64)
    assert dec.decode([data], one, None, 3, out.data_ptr(), out.numel(), np.zeros(1, np.int64), 0).tolist() == [1]
    with pytest.raises(ValueError, match="outside the out buffer"):
        dec.decode([data], one, None, 3, out.data_ptr(), out.numel() - 1, np.zeros(1, np.int64), 0)
    with pytest.raises(ValueError, match="outside the out buffer"):
        dec.decode([data], one, None, 3, out.data_ptr(), out.numel(), np.array([1], np.int64), 0)
    with pytest.raises(ValueError, match="sizes must be"):
        dec.decode([data, data], one, None, 3, out.data_ptr(), out.numel(), np.zeros(2, np.int64), 0)
    zero = np.zeros(1, np.int64)
    assert dec.decode([data], one, np.array([[0, 0, 21, 30]]), 3, out.data_ptr(), out.numel(), zero, 0).tolist() == [-4]
    assert dec.decode([data], np.array([[0, 30]]), None, 3, out.data_ptr(), out.numel(), zero, 0).tolist() == [-5]
    assert dec.decode([data], np.array([[20, 29]]), None, 3, out.data_ptr(), out.numel(), zero, 0).tolist() == [-2]
    with pytest.raises(ValueError, match="channels must be 1 or 3"):
        dec.decode([data], one, None, 4, out.data_ptr(), out.numel(), np.zeros(1, np.int64), 0)
    with pytest.raises(TypeError):
        dec.decode([12], one, None, 3, out.data_ptr(), out.numel(), np.zeros(1, np.int64), 0)
    with pytest.raises(ValueError, match="kind must be"):
        _cpu_decoder(native.lib, 1, "", kind="tpu")


@needs_c_api
def test_c_api_failures_fall_back_to_the_python_api(native, monkeypatch):
    assert native.make().api == "C"

    def broken(*a):
        raise RuntimeError("cannot load libnvimgcodec.so.0")

    monkeypatch.setattr(nvimgcodec, "_native_decoder", broken)
    monkeypatch.setattr(native.lib, "Decoder", FakeDecoder)  # the Python API's decoder, a stand-in here
    eng = native.make(native=None)
    assert eng.api == "Python" and "cannot load libnvimgcodec" in eng.native_reason
    with pytest.raises(RuntimeError, match="could not start: .*cannot load libnvimgcodec"):
        native.make(native=True)
    monkeypatch.setattr(nvimgcodec, "NATIVE", False)
    assert native.make().api == "Python" and native.make().native_reason is None


def _sof_precision(data: bytes, bits: int) -> bytes:
    """The JPEG with its frame header's sample precision byte set to ``bits`` (a fake 12-bit file)."""
    k = data.index(b"\xff\xc0")
    return data[:k + 4] + bytes([bits]) + data[k + 5:]


def _guarded_hostile_decode(dec, device: str, stream: int = 0) -> None:
    """Decodes hostile files with ``dec`` (a C-API decoder writing to ``device`` memory) into slots
    with guard bytes around each: declined with their reason, nothing written outside the slots."""
    good = photo_jpegs(["astronaut", "coffee"], [{}], size=(40, 56))
    (h, w) = gpupipe.read_header(good[0])[:2]
    datas = [good[0], good[0][:len(good[0]) // 2], bytes(300), pillow_png(photo(h, w)), _sof_precision(good[0], 12),
             good[0], good[0], good[0][:-2] + b"\x00" * 200]
    sizes = np.array([[h, w]] * len(datas))
    sizes[5] = [h - 1, w]  # smaller than the file: never decoded into a slot that is too small
    guard, slot = 256, h * w * 3
    step = slot + 2 * guard
    buf = torch.full((len(datas) * step,), 0xAB, dtype=torch.uint8, device=device)
    offsets = np.arange(len(datas), dtype=np.int64) * step + guard
    statuses = dec.decode(datas, sizes, None, 3, buf.data_ptr(), buf.numel(), offsets, stream).tolist()
    assert statuses[0] == 1 and statuses[6] == 1 and statuses[5] == -2 and statuses[4] == -6, statuses
    assert statuses[2] == -1 and statuses[3] == -3 and statuses[1] not in (-2, -6), statuses
    if device != "cpu":
        torch.cuda.synchronize()
    b = buf.cpu().numpy()
    for k in range(len(datas)):
        before, after = b[k * step:k * step + guard], b[k * step + guard + slot:(k + 1) * step]
        assert (before == 0xAB).all() and (after == 0xAB).all(), f"sample {k} wrote outside its slot"
        if statuses[k] < 0:
            assert (b[offsets[k]:offsets[k] + slot] == 0xAB).all(), f"sample {k} was declined but written"
    with pytest.raises(ValueError, match="samples 0 and 1 have overlapping outputs"):
        dec.decode(good[:1] * 2, sizes[:2], None, 3, buf.data_ptr(), buf.numel(), np.array([0, slot - 1]), stream)


@needs_c_api
def test_c_api_hostile_files_never_write_outside_their_slots(native):
    """Truncated, garbage, other formats, a fake 12-bit file, a header table that says another size,
    no EOI: with guard bytes around every slot (nvImageCodec's libjpeg-turbo, host memory)."""
    _guarded_hostile_decode(_cpu_decoder(native.lib, 2, ":fancy_upsampling=1"), "cpu")


@needs_c_api
def test_c_api_a_box_outside_its_image_takes_no_room(native):
    """roi=True with a box outside its image: its region is refused (declined), and the next sample
    keeps its own slot (no overlap, the same pixels as the CPU core)."""
    datas = photo_jpegs(["astronaut", "coffee", "rocket"], [{}], size=(120, 160), step=(0, 0))
    boxes = np.array([[0, 0, 120, 160], [200, 0, 10, 100], [0, 0, 120, 160]], dtype=np.float64)
    eng = native.make(roi=True)
    out, declined = _host_decode(eng, datas, boxes, (24, 24), resize=True)
    assert list(declined) == [1] and "region" in declined[1]
    ref = _host_core([datas[0], datas[2]], boxes[[0, 2]], (24, 24), resize=True)
    assert (out[0].int() - ref[0].int()).abs().max() <= 1 and (out[2].int() - ref[1].int()).abs().max() <= 1


@needs_c_api
def test_c_api_no_memory_for_the_decode_buffer_declines_to_the_cpu_core(native, monkeypatch):
    def oom(nbytes, device):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB")

    monkeypatch.setattr(nvimgcodec, "_scratch", oom)
    datas = photo_jpegs(["astronaut", "coffee"], [{}], size=(60, 80))
    out, declined = _host_decode(native.make(), datas, [[0, 0, 16, 16]] * 2, (16, 16))
    assert sorted(declined) == [0, 1] and "no GPU memory for the decode buffer" in declined[0] and not out.any()


class _DecliningDecoder:
    """A C-API decoder that declines everything (a library whose first decode fails)."""

    def decode(self, buffers, sizes, regions, channels, address, nbytes, offsets, stream):
        return np.full(len(buffers), 0x13, np.int32)


def test_an_engine_whose_c_api_fails_its_probe_uses_the_python_api(fake, monkeypatch):
    monkeypatch.setattr(nvimgcodec, "NATIVE", True)
    monkeypatch.setattr(nvimgcodec, "native_reason", lambda: None)
    monkeypatch.setattr(nvimgcodec, "_native_decoder", lambda *a: _DecliningDecoder())
    monkeypatch.setattr(nvimgcodec, "_scratch", lambda n, d: torch.zeros(max(int(n), 1), dtype=torch.uint8))
    made = []

    class Probed(FakeDecoder):
        def __init__(self, **kw):
            super().__init__(**kw)
            self.result = [FakeImage(0x1000, 96, 128)]
            made.append(self)

    monkeypatch.setattr(nvimgcodec._library(), "Decoder", Probed)
    fake.stream.synchronize = lambda: None
    eng = nvimgcodec._started("hardware", torch.device("cuda", 0))
    assert eng.api == "Python" and len(made) == 1
    assert eng.native_reason.startswith("its C API failed the probe") and "no allowed backend" in eng.native_reason
    from gpupipe.bench import report

    monkeypatch.setattr(nvimgcodec, "started_engines", lambda: [eng])
    assert report._engine_apis().startswith("; nvImageCodec's API: hardware Python (its C API failed the probe")


def test_the_c_api_is_built_where_the_header_is():
    """Where gpupipe's CUDA module is built and nvImageCodec 0.9's header is installed, the C-API engine
    is in it (a build that silently left it out would skip every test of it)."""
    from gpupipe.augment._kernels import _C_cuda
    import importlib.util

    spec = importlib.util.find_spec("nvidia.nvimgcodec")
    header = spec and os.path.join(list(spec.submodule_search_locations)[0], "include", "nvimgcodec_version.h")
    if _C_cuda is None or not header or not os.path.exists(header):
        pytest.skip("gpupipe's CUDA module or nvImageCodec's header is not here")
    with open(header) as f:
        version = f.read()
    if "NVIMGCODEC_VER_MINOR 9" not in version:
        pytest.skip("another nvImageCodec than 0.9: its engines use the Python API")
    assert hasattr(_C_cuda, "NvimgcodecDecoder") and nvimgcodec.native_reason() is None


def test_status_reasons():
    assert nvimgcodec.status_reason(0x13).startswith("nvImageCodec declined it: no allowed backend")
    assert nvimgcodec.status_reason(0x13).endswith("(status 0x13)")
    assert nvimgcodec.status_reason(-2) == "nvImageCodec parses another size than its header says"
    assert nvimgcodec.status_reason(0x25) == ("nvImageCodec declined it: color spec unsupported, chroma subsampling "
                                              "unsupported (status 0x25)")  # two reasons of one mask
    assert nvimgcodec.status_reason(0x17).startswith("nvImageCodec declined it: the file is corrupt, no allowed backend")
    assert "declined (status 0x40001)" in nvimgcodec.status_reason(0x40001)
    assert nvimgcodec.status_reason(-6) == "its samples are not 8-bit"


def test_without_the_c_api_the_engines_use_the_python_api(fake, monkeypatch):
    monkeypatch.setattr(nvimgcodec, "NATIVE", True)
    monkeypatch.setattr(nvimgcodec, "native_reason", lambda: "gpupipe was built without nvImageCodec's header")
    eng = fake.make()
    assert eng.api == "Python" and "without nvImageCodec's header" in eng.native_reason
    with pytest.raises(RuntimeError, match="could not start: gpupipe was built without"):
        fake.make(native=True)


# --- the frame and backend nvjpeg -----------------------------------------------------------------


@pytest.fixture(scope="module")
def jpegs():
    return photo_jpegs(["astronaut", "coffee", "chelsea", "rocket", "astronaut", "coffee"],
                       [{}, {"h_samp": 1, "v_samp": 1}, {"progressive": True}, {"colorspace": "gray"}],
                       size=(60, 80), step=(3, 5))


def _core(datas, boxes, size, mode="rgb"):
    out = torch.empty(len(datas), *size, 3 if mode == "rgb" else 1, dtype=torch.uint8)
    from gpupipe._backends import cpu

    opts = DecodeOptions(size=size, mode=mode)
    cpu.decode(datas, boxes, out, opts, read_infos(datas))
    return out, opts


class HostEngine:
    """A host stand-in for an engine: decodes with the CPU core, declines the samples it is told to."""

    def __init__(self, route, declines):
        self.route, self.declines, self.name, self.calls = route, declines, f"stand-in {route.label}", []

    def decode(self, buffers, boxes, out, slots, options, *, sizes=None):
        self.calls.append(list(buffers))
        keep = [k for k, b in enumerate(buffers) if bytes(b) not in self.declines]
        if keep:
            sub, _ = _core([buffers[k] for k in keep], boxes[keep], tuple(out.shape[1:3]), options.mode)
            out[torch.from_numpy(slots[keep])] = sub
        return {k: "declined in the test" for k in range(len(buffers)) if k not in keep}


def test_nvjpeg_chains_the_engines_then_the_cpu_core(jpegs, monkeypatch):
    datas = jpegs + [encode(np.concatenate([photo(50, 50), np.full((50, 50, 1), 40, np.uint8)], axis=2), colorspace="cmyk")]
    boxes = np.array([[2, 3, 32, 40]] * len(datas), dtype=np.float64)
    ref, opts = _core(datas, boxes, (32, 40))
    hw = HostEngine(Route.GPU_HARDWARE, {jpegs[2], jpegs[4]})  # e.g. progressive: declined by the hardware
    cuda = HostEngine(Route.GPU_CUDA, {jpegs[4]})
    monkeypatch.setattr(nvjpeg, "unavailable_reason", lambda device=None: None)
    monkeypatch.setattr(nvjpeg, "engines", lambda device: [hw, cuda])
    out = torch.zeros_like(ref)
    status = nvjpeg.decode(datas, boxes, out, opts, read_infos(datas))
    assert torch.equal(out, ref) and status.ok.all()
    assert status.route.tolist() == [Route.GPU_HARDWARE, Route.GPU_HARDWARE, Route.GPU_CUDA, Route.GPU_HARDWARE,
                                     Route.CPU_FALLBACK, Route.GPU_HARDWARE, Route.CPU_FALLBACK]
    assert sorted(status.fallback) == [4, 6] and "declined by stand-in gpu-cuda (declined in the test)" in status.fallback[4]
    assert "not decodable by nvJPEG with gpupipe's semantics: its color space" in status.fallback[6]  # CMYK: no engine
    assert len(cuda.calls[0]) == 2  # only what the hardware declined


def test_engine_errors_fail_the_batch_torchvision_errors_fall_back(jpegs):
    boxes = np.array([[0, 0, 16, 16]] * len(jpegs), dtype=np.float64)
    ref, opts = _core(jpegs, boxes, (16, 16))

    def device_error(idx, datas):
        raise RuntimeError("nvImageCodec's cuda decoder on cuda:0: decode failed (CUDA error)")

    with pytest.raises(RuntimeError, match="cuda decoder on cuda:0"):
        gpu_fallback.decode_with_fallback("nvJPEG", device_error, jpegs, boxes, torch.zeros_like(ref), opts,
                                          read_infos(jpegs), device_errors="raise")
    out = torch.zeros_like(ref)
    status = gpu_fallback.decode_with_fallback("nvJPEG", device_error, jpegs, boxes, out, opts, read_infos(jpegs))
    assert torch.equal(out, ref) and (status.route == Route.CPU_FALLBACK).all()
    assert "nvJPEG failed on the batch" in status.fallback[0]


def test_rgb_coded_files_stay_on_the_cpu():
    """The GPU decoders convert RGB-coded files as YCbCr (measured on an H200: 245 levels off)."""
    datas = [encode(photo(40, 40)), encode(photo(40, 40), colorspace="rgb"), encode(photo(40, 40), colorspace="gray")]
    boxes = np.array([[0, 0, 8, 8]] * 3, dtype=np.float64)
    infos = read_infos(datas)
    for mode in ("rgb", "gray"):
        cuda = DecodeOptions(size=(8, 8), mode=mode, device=torch.device("cuda"))
        assert gpu_fallback.gpu_eligible(infos, boxes, cuda).tolist() == [True, False, True]
    # DALI's CPU operators decode them right (libjpeg-turbo), in RGB mode
    assert gpu_fallback.gpu_eligible(infos, boxes, DecodeOptions(size=(8, 8))).tolist() == [True, True, True]
    assert gpu_fallback.gpu_eligible(infos, boxes, DecodeOptions(size=(8, 8), mode="gray")).tolist() == [True, False, True]


def test_nvjpeg_without_nvimgcodec_keeps_torchvision(jpegs, monkeypatch):
    monkeypatch.setattr(nvimgcodec, "_engines", {})  # engines a GPU machine's earlier tests started
    monkeypatch.setattr(nvimgcodec, "unavailable_reason", lambda device=None: "nvImageCodec is not installed: ...")
    assert nvjpeg.engines(torch.device("cuda", 0)) == []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    pytest.importorskip("torchvision")
    assert nvjpeg.unavailable_reason(torch.device("cuda", 0)) is None
    called = []
    monkeypatch.setattr(nvjpeg, "_decode_with_torchvision", lambda *a: called.append(a) or "torchvision's status")
    boxes = np.array([[0, 0, 16, 16]] * len(jpegs), dtype=np.float64)
    out = torch.zeros(len(jpegs), 16, 16, 3, dtype=torch.uint8)
    assert nvjpeg.decode(jpegs, boxes, out, DecodeOptions(size=(16, 16)), read_infos(jpegs)) == "torchvision's status"
    assert len(called) == 1


# --- on a GPU ---------------------------------------------------------------------------------------

NV_REASON = nvimgcodec.unavailable_reason(torch.device("cuda")) if torch.cuda.is_available() else "no CUDA device"


def _crop_kernel_reason():
    try:
        nvimgcodec._crop_resize()
    except ImportError as e:
        return f"the ragged crop kernel (gpupipe/_backends/crop_resize.py, branch crop-resize) is not here: {e}"
    return None


_PYTHON_API_ENGINES: dict = {}


def _gpu_engine(kind, api="C"):
    """The engine of ``kind`` calling nvImageCodec's C API (the default; a fallback to the Python API
    fails the test) or its Python API."""
    if NV_REASON:
        pytest.skip(NV_REASON)
    if reason := _crop_kernel_reason():
        pytest.skip(reason)
    try:
        if api == "C":
            if reason := nvimgcodec.native_reason():
                pytest.skip(reason)
            eng = nvimgcodec.engine(kind, torch.device("cuda"))
            assert eng.api == "C", f"the {kind} engine fell back to the Python API: {eng.native_reason}"
            return eng
        if kind not in _PYTHON_API_ENGINES:
            eng = nvimgcodec.Engine(kind, torch.device("cuda"), native=False)
            eng.probe()
            _PYTHON_API_ENGINES[kind] = eng
        return _PYTHON_API_ENGINES[kind]
    except RuntimeError as e:
        pytest.skip(str(e))


APIS = ["C", "Python"]


KINDS = [pytest.param(k, marks=pytest.mark.skipif(NV_REASON is not None, reason=NV_REASON or "")) for k in nvimgcodec.KINDS]


def _engine_vs_core(eng, datas, boxes, size, mode="rgb", resize=False):
    """(engine's crops, the CPU core's (dct_scaling=False), declined): uint8 [N, C, H, W] on the host."""
    ref = gpupipe.decode_crop_jpegs(datas, boxes, size=size if resize else None, backend="cpu", mode=mode,
                                    dct_scaling=False).images
    opts = DecodeOptions(size=tuple(size), resize=resize, mode=mode, device=torch.device("cuda"))
    infos = read_infos(datas)
    sizes = np.stack([infos.column("height"), infos.column("width")], axis=1)
    out = torch.zeros(len(datas), *size, opts.channels, dtype=torch.uint8, device="cuda")
    declined = eng.decode(datas, boxes, out, np.arange(len(datas)), opts, sizes=sizes)
    torch.cuda.synchronize()
    return out.permute(0, 3, 1, 2).cpu(), ref, declined


def _assert_close(got, ref, where):
    diff = (got.int() - ref.int()).abs()
    assert diff.max() <= MAX_DIFF and diff.float().mean() < MEAN_DIFF, \
        f"{where}: max |diff| {int(diff.max())}, mean {diff.float().mean():.3f}, share > 2: {(diff > 2).float().mean():.4f}"


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("mode", ["rgb", "gray"])
def test_gpu_engine_crops_match_the_cpu_core(kind, mode, api):
    """Every variant the GPU decoders are given (gpu_eligible: not CMYK/YCCK, not coded as RGB, ...)
    within the tolerance, each reported; the rest never reach them."""
    eng = _gpu_engine(kind, api)
    variants = make_variants(photo(157, 203))
    boxes = np.array([[5, 7, 96, 120]] * len(variants), dtype=np.float64)
    opts = DecodeOptions(size=(96, 120), mode=mode, device=torch.device("cuda"))
    eligible = gpu_fallback.gpu_eligible(read_infos(list(variants.values())), boxes, opts)
    assert not eligible[[k for k, n in enumerate(variants) if n.startswith(("cmyk", "ycck", "rgb"))]].any()
    variants = {n: v for (n, v), ok in zip(variants.items(), eligible) if ok}
    datas = list(variants.values())
    got, ref, declined = _engine_vs_core(eng, datas, boxes[:len(datas)], (96, 120), mode)
    names = list(variants)
    print(f"{kind} {mode} ({api} API): declined {[names[k] for k in declined]}")
    failed = []
    for k, name in enumerate(names):
        if k not in declined:
            diff = (got[k].int() - ref[k].int()).abs()
            print(f"  {name}: max |diff| {int(diff.max())}, mean {diff.float().mean():.3f}")
            try:
                _assert_close(got[k], ref[k], f"{kind} {mode} {name}")
            except AssertionError as e:
                failed.append(str(e).splitlines()[0])
    assert not failed, failed
    baseline = [k for k, n in enumerate(names) if "progressive" not in n and "arithmetic" not in n and "4:1" not in n]
    assert not set(baseline) & set(declined), f"{kind} declined baseline files: {[names[k] for k in declined]}"


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("batch", [1, 256])
def test_gpu_engine_resized_crops_on_photos(kind, batch, api):
    eng = _gpu_engine(kind, api)
    photos = photo_jpegs(["astronaut", "coffee", "chelsea", "rocket"], [{}, {"h_samp": 2, "v_samp": 1}],
                         size=(300, 400), step=(17, 23))
    datas = [photos[i % len(photos)] for i in range(batch)]
    sizes = np.array([gpupipe.read_header(d)[:2] for d in datas])
    boxes = gpupipe.crops.RandomResizedCrop(64).boxes(sizes[:, 0], sizes[:, 1], seed=0)
    got, ref, declined = _engine_vs_core(eng, datas, boxes, (64, 64), resize=True)
    assert not declined
    _assert_close(got, ref, f"{kind} ({api} API) RandomResizedCrop 64, batch {batch}")


@pytest.mark.parametrize("kind", KINDS)
def test_gpu_c_api_hostile_files_never_write_outside_their_slots(kind):
    """The same hostile files as on the CPU, through the GPU decoder's C API into device memory."""
    eng = _gpu_engine(kind)
    _guarded_hostile_decode(eng._native, "cuda", torch.cuda.current_stream().cuda_stream)


@pytest.mark.parametrize("kind", KINDS)
def test_gpu_c_api_roi_matches_the_cpu_core(kind):
    _gpu_engine(kind)  # the skips
    try:
        eng = nvimgcodec.Engine(kind, torch.device("cuda"), roi=True, native=True)
        eng.probe()
    except RuntimeError as e:
        pytest.skip(f"ROI on the {kind} decoder: {e}")
    photos = photo_jpegs(["astronaut", "coffee", "chelsea", "rocket"], [{}, {"h_samp": 2, "v_samp": 1}],
                         size=(300, 400), step=(17, 23))
    sizes = np.array([gpupipe.read_header(d)[:2] for d in photos])
    boxes = gpupipe.crops.RandomResizedCrop(64).boxes(sizes[:, 0], sizes[:, 1], seed=1)
    got, ref, declined = _engine_vs_core(eng, photos, boxes, (64, 64), resize=True)
    assert not declined, declined
    _assert_close(got, ref, f"{kind} ROI (C API)")


@pytest.mark.skipif(NV_REASON is not None, reason=NV_REASON or "")
def test_gpu_nvjpeg_backend_routes_and_fallbacks():
    _gpu_engine("cuda")
    good = photo_jpegs(["astronaut", "coffee", "chelsea"], [{}, {"progressive": True}, {"h_samp": 1, "v_samp": 1}],
                       size=(120, 160))
    cmyk = encode(np.concatenate([photo(120, 160), np.full((120, 160, 1), 40, np.uint8)], axis=2), colorspace="cmyk")
    no_eoi = good[0][:-2]
    datas = good + [cmyk, no_eoi]
    boxes = np.array([[10, 10, 64, 64]] * len(datas), dtype=np.float64)
    ref = gpupipe.decode_crop_jpegs(datas, boxes, backend="cpu", dct_scaling=False, on_error="skip")
    got = gpupipe.decode_crop_jpegs(datas, boxes, backend="nvjpeg", device="cuda", on_error="skip")
    gpu = (Route.GPU_HARDWARE.label, Route.GPU_CUDA.label)
    assert all(r in gpu for r in got.routes[:3]), got.routes
    assert got.routes[3] == Route.CPU_FALLBACK.label and torch.equal(got.images[3].cpu(), ref.images[3])  # CMYK
    assert got.routes[4] in (Route.CPU_FALLBACK.label, Route.NONE.label)  # no EOI: the CPU core's warning or error
    if nvimgcodec.hardware_decoder_available(torch.device("cuda")):
        assert got.routes[0] == Route.GPU_HARDWARE.label
    _assert_close(got.images[:3].cpu(), ref.images[:3], "backend nvjpeg")


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("kind", KINDS)
def test_gpu_a_corrupt_file_does_not_fail_the_others(kind, api):
    eng = _gpu_engine(kind, api)
    good = photo_jpegs(["astronaut", "coffee", "rocket"], [{}], size=(100, 140))
    corrupt = good[1][:len(good[1]) // 2] + b"\x00" * 64 + good[1][-2:]  # entropy data cut, EOI kept
    datas = [good[0], b"not a jpeg at all" * 8, corrupt, good[2]]
    boxes = np.array([[0, 0, 64, 64]] * 4, dtype=np.float64)
    out = torch.zeros(4, 64, 64, 3, dtype=torch.uint8, device="cuda")
    sizes = np.array([gpupipe.read_header(good[0])[:2], (1, 1), gpupipe.read_header(good[1])[:2],
                      gpupipe.read_header(good[2])[:2]])
    declined = eng.decode(datas, boxes, out, np.arange(4), DecodeOptions(size=(64, 64)), sizes=sizes)
    assert 1 in declined  # not a JPEG: nothing decoded, nothing written
    ref = gpupipe.decode_crop_jpegs([good[0], good[2]], boxes[:2], backend="cpu").images
    _assert_close(out[[0, 3]].permute(0, 3, 1, 2).cpu(), ref, f"{kind}: the good files beside a corrupt one")


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("kind", KINDS)
def test_gpu_engine_on_a_side_stream(kind, api):
    eng = _gpu_engine(kind, api)
    datas = photo_jpegs(["astronaut", "chelsea"], [{}], size=(200, 300))
    boxes = np.array([[0, 0, 128, 128]] * 2, dtype=np.float64)
    ref = gpupipe.decode_crop_jpegs(datas, boxes, backend="cpu").images
    side = torch.cuda.Stream()
    out = torch.zeros(2, 128, 128, 3, dtype=torch.uint8, device="cuda")
    with torch.cuda.stream(side):
        assert not eng.decode(datas, boxes, out, np.arange(2), DecodeOptions(size=(128, 128)))
    side.synchronize()  # all the work was queued on the side stream
    _assert_close(out.permute(0, 3, 1, 2).cpu(), ref, f"{kind} on a side stream")


@pytest.mark.skipif(NV_REASON is not None, reason=NV_REASON or "")
def test_gpu_nothing_reaches_stderr():
    if reason := _crop_kernel_reason():
        pytest.skip(reason)
    run_child("""
        import numpy as np, torch, gpupipe
        from gpupipe._backends import nvimgcodec
        from gpupipe.decode_types import DecodeOptions
        from helpers import photo_jpegs
        datas = photo_jpegs(["astronaut", "coffee"], [{"progressive": True}, {}], size=(100, 140))
        datas.append(b"garbage" * 20)
        for kind in nvimgcodec.KINDS:
            if kind == "hardware" and not nvimgcodec.hardware_decoder_available(torch.device("cuda")):
                continue
            out = torch.zeros(3, 32, 32, 3, dtype=torch.uint8, device="cuda")
            nvimgcodec.engine(kind, torch.device("cuda")).decode(
                datas, np.array([[0, 0, 32, 32]] * 3, dtype=np.float64), out, np.arange(3), DecodeOptions(size=(32, 32)),
                sizes=np.array([[100, 140], [103, 147], [1, 1]]))
        torch.cuda.synchronize()
        gpupipe.decode_crop_jpegs(datas, np.array([[0, 0, 32, 32]] * 3), backend="nvjpeg", device="cuda", on_error="skip")
        print("ok")
    """)
