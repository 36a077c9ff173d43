"""GPU decode backends behind the same API, checked against the CPU core. In CI the DALI backend
runs with DALI's CPU operators; CUDA rows run where a GPU is present (benchmarks/gpu_check.py)."""

import gc
import threading
import warnings

import numpy as np
import pytest
import torch

import gpupipe
from gpupipe import _C
from gpupipe._backends import dali as dali_backend
from helpers import PHOTOS, BACKEND_DEVICES, assert_close_to_core, encode, patch_sof, photo, photo_jpegs, run_child

AVAILABLE = gpupipe.backends_available()
CASES = [c for c in BACKEND_DEVICES if c.id != "cpu-cpu"]  # each against the CPU core on the CPU


@pytest.fixture(scope="module")
def photos():
    return photo_jpegs(["astronaut", "coffee", "chelsea", "rocket", "immunohistochemistry", "astronaut"],
                       [{}, {"h_samp": 1, "v_samp": 1}, {"progressive": True}, {"h_samp": 2, "v_samp": 1},
                        {"colorspace": "gray"}, {}], size=(160, 210), step=(9, 13))


def edge_boxes(datas, h, w, seed=0):
    rng = np.random.default_rng(seed)
    boxes = []
    for k, d in enumerate(datas):
        H, W = gpupipe.read_header(d)[:2]
        corner = k % 3
        if corner == 0:  # touching the right and bottom edges
            boxes.append((H - h, W - w, h, w))
        elif corner == 1:
            boxes.append((0, 0, h, w))
        else:
            boxes.append((int(rng.integers(0, H - h + 1)), int(rng.integers(0, W - w + 1)), h, w))
    return np.array(boxes)


@pytest.mark.parametrize("backend,device", CASES)
@pytest.mark.parametrize("mode", ["rgb", "gray"])
def test_crops_match_the_cpu_core(photos, backend, device, mode):
    boxes = edge_boxes(photos, 96, 120)
    ref = gpupipe.decode_crop_jpegs(photos, boxes, backend="cpu", mode=mode)
    got = gpupipe.decode_crop_jpegs(photos, boxes, backend=backend, device=device, mode=mode)
    assert got.backend == backend and got.images.device.type == device
    assert got.images.shape == ref.images.shape and got.ok.all() and not got.fallback
    assert_close_to_core(got.images, ref.images, backend, device)


@pytest.mark.parametrize("backend,device", BACKEND_DEVICES)
def test_boxes_not_of_the_output_size_without_a_resize_fail_per_sample(photos, backend, device):
    """An 8x32 box holds as many pixels as a 16x16 output: DALI delivered it reshaped, silently, and
    the nvImageCodec engines failed the whole batch. Every backend leaves it to the CPU core, which
    fails that sample alone."""
    from gpupipe import routing
    from gpupipe._backends import gpu_fallback
    from gpupipe.decode_types import DecodeOptions

    datas = photos[:3]
    boxes = np.array([[0, 0, 16, 16], [0, 0, 8, 32], [10, 10, 16, 16]])
    options = DecodeOptions(size=(16, 16), resize=False, backend=backend, device=torch.device(device))
    infos = routing.probe(routing.as_buffers(datas), options)
    infos.count_scans(datas)  # (a CPU-backend probe does not count them)
    assert gpu_fallback.gpu_eligible(infos, boxes, options).tolist() == [True, False, True]
    out = torch.full((3, 16, 16, 3), 7, dtype=torch.uint8, device=device)
    status = routing.decode_into(datas, boxes, out, options)
    assert status.kind.tolist()[1] == gpupipe.ErrorKind.INVALID_ARGUMENT and status.kind[[0, 2]].tolist() == [0, 0]
    ref = gpupipe.decode_crop_jpegs([datas[0], datas[2]], boxes[[0, 2]], backend="cpu").images.permute(0, 2, 3, 1)
    assert_close_to_core(out[[0, 2]].cpu().permute(0, 3, 1, 2), ref.permute(0, 3, 1, 2), backend, device)


@pytest.mark.parametrize("backend,device", CASES)
def test_resized_crops_are_close_to_the_cpu_core(photos, backend, device):
    rng = np.random.default_rng(1)
    boxes = []
    for d in photos:
        H, W = gpupipe.read_header(d)[:2]
        h, w = int(rng.integers(60, H + 1)), int(rng.integers(60, W + 1))
        boxes.append((H - h, W - w, h, w))
    boxes = np.array(boxes)
    ref = gpupipe.decode_crop_jpegs(photos, boxes, size=(56, 64), backend="cpu", dct_scaling=False)
    got = gpupipe.decode_crop_jpegs(photos, boxes, size=(56, 64), backend=backend, device=device, dct_scaling=False)
    diff = (got.images.cpu().float() - ref.images.float()).abs()
    if backend == "cpu":
        assert diff.max() == 0
    else:  # DALI's / torchvision's antialiased linear resize vs Pillow's BILINEAR: a close filter
        assert diff.mean() < 1.5, diff.mean()


@pytest.mark.parametrize("backend,device", CASES)
def test_a_bad_file_never_kills_the_batch(photos, backend, device):
    datas = list(photos)
    datas[1] = b"GIF89a not a jpeg"
    datas[3] = datas[3][: len(datas[3]) // 3]  # truncated: the GPU decoder may fail the batch
    H, W = gpupipe.read_header(photos[5])[:2]
    cmyk = np.concatenate([255 - photo(H, W), np.full((H, W, 1), 40, np.uint8)], axis=2)
    datas[5] = encode(cmyk, colorspace="cmyk")  # routed to the CPU core
    boxes = edge_boxes(photos, 64, 64)
    with pytest.warns(gpupipe.JpegWarning, match="sample 3: Premature end"):
        ref = gpupipe.decode_crop_jpegs(datas, boxes, backend="cpu", on_error="skip")
    with pytest.warns(gpupipe.JpegWarning, match="sample 3"):
        got = gpupipe.decode_crop_jpegs(datas, boxes, backend=backend, device=device, on_error="skip")
    assert 3 in got.warnings
    assert got.ok.tolist() == ref.ok.tolist() == [True, False, True, True, True, True]
    assert got.errors.keys() == {1} and "Not a JPEG" in got.errors[1]
    if backend != "cpu":
        assert 5 in got.fallback  # CMYK went to the CPU core, and the batch says so
    assert (got.images[1] == 0).all()
    np.testing.assert_array_equal(got.images[5].cpu().numpy(), ref.images[5].numpy())
    with pytest.raises(gpupipe.JpegError, match="sample 1: Not a JPEG"):
        gpupipe.decode_crop_jpegs(datas, boxes, backend=backend, device=device)


@pytest.mark.parametrize("backend,device", CASES)
def test_limits_apply_in_every_backend(photos, backend, device):
    datas = list(photos)
    datas[2] = patch_sof(datas[2], height=60000, width=60000)
    boxes = edge_boxes(photos, 32, 32)
    with pytest.raises(gpupipe.DecompressionBombError, match="sample 2: .*max_pixels"):
        gpupipe.decode_crop_jpegs(datas, boxes, backend=backend, device=device)


@pytest.mark.parametrize("backend,device", CASES)
def test_outputs_survive_the_next_batch_and_single_op(photos, backend, device):
    boxes = edge_boxes(photos, 48, 48)
    first = gpupipe.decode_crop_jpegs(photos, boxes, backend=backend, device=device)
    kept = first.images.clone()
    gpupipe.decode_crop_jpegs(photos[::-1], boxes[::-1], backend=backend, device=device)
    assert torch.equal(first.images, kept)
    one = gpupipe.decode_crop_jpeg(photos[0], *boxes[0], backend=backend, device=device)
    assert one.device.type == device
    assert_close_to_core(one, gpupipe.decode_crop_jpeg(photos[0], *boxes[0]), backend, device)


@pytest.mark.skipif(not AVAILABLE["dali"]["available"], reason=AVAILABLE["dali"]["reason"])
def test_dali_pipelines_are_built_once_per_shape(photos):
    boxes = edge_boxes(photos, 40, 40)
    dali_backend._pipelines.clear()
    for _ in range(3):
        gpupipe.decode_crop_jpegs(photos, boxes, backend="dali")
    gpupipe.decode_crop_jpegs(photos[:3], boxes[:3], backend="dali")  # same size bucket
    assert len(dali_backend._pipelines) == 1
    gpupipe.decode_crop_jpegs(photos, boxes, backend="dali", size=20)
    assert len(dali_backend._pipelines) == 2
    # many output sizes (multi-scale training) keep only the latest used: 64 sizes held 452 threads
    first = next(iter(dali_backend._pipelines.values()))
    threads = threading.active_count()
    for side in range(8, 8 + 2 * dali_backend.KEEP_PIPELINES + 2):
        gpupipe.decode_crop_jpegs(photos, boxes, backend="dali", size=side)
    gc.collect()
    assert len(dali_backend._pipelines) == dali_backend.KEEP_PIPELINES and first not in dali_backend._pipelines.values()
    assert threading.active_count() <= threads + 8 * dali_backend.KEEP_PIPELINES
    assert len(dali_backend.BUILD_MESSAGES) <= dali_backend.KEEP_BUILD_MESSAGES


def test_dalis_log_lines_are_recognised():
    """DALI's logger ("[ERROR] [component] ...", coloured or not; components such as nvjpeg-ext) and
    libjpeg's messages are DALI's; a line of the user's is not (it passes on to stderr)."""
    for line in ("\x1b[0;31m[ERROR] \x1b[0m[nvjpeg-ext] Failed to load nvJPEG library or retrieve version.",
                 "[WARNING] [nvjpeg2k_ext] Failed to load", "Corrupt JPEG data: 12 extraneous bytes before marker 0xd9",
                 # libjpeg-turbo 3's wording (DALI's bundled one; gpupipe's 2.1 says "progressive parameters")
                 "Invalid progressive/lossless parameters Ss=6 Se=5 Ah=0 Al=2"):
        assert dali_backend._is_decoder_message(line), line
    assert not dali_backend._is_decoder_message("my training step 12: loss 0.3")
    # two of DALI's threads failing at once (measured): one line starts two messages, the next is a fragment
    interleaved = ("\x1b[0;31m\x1b[0;31m[ERROR] \x1b[0m[jpeg_parser[ERROR] \x1b[0m[jpeg_parser] Unexpected number "
                   "of channels\n] Unexpected number of channels\n")
    assert dali_backend._is_decoder_message(interleaved.splitlines()[0])
    import os
    import tempfile

    with tempfile.TemporaryFile() as real:  # descriptor 2 for the test: what would reach the terminal
        saved = os.dup(2)
        os.dup2(real.fileno(), 2)
        try:
            with dali_backend._stderr_captured() as lines:
                os.write(2, interleaved.encode())
            with dali_backend._stderr_captured() as quiet:  # a run DALI said nothing in: the user's lines go on
                os.write(2, b"the user's own line\n[INFO] [train] epoch 3\n")
            with dali_backend._stderr_captured() as both:  # the user's line beside one of DALI's goes on too
                os.write(2, interleaved.encode() + b"[WARNING] [root] the user's warning\n")
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        real.seek(0)
        assert len(lines) == 2 and not quiet and len(both) == 2
        assert real.read() == b"the user's own line\n[INFO] [train] epoch 3\n[WARNING] [root] the user's warning\n"


def test_backend_selection_and_clear_errors(monkeypatch, photos):
    info = gpupipe.backends_available()
    assert set(info) == {"cpu", "hybrid", "dali", "nvjpeg", "cuda_kernels", "nvimgcodec"}
    assert info["cpu"]["available"] and all(isinstance(v["reason"], str) for v in info.values())
    boxes = edge_boxes(photos, 16, 16)
    assert gpupipe.decode_crop_jpegs(photos, boxes).backend == "cpu"  # auto on the CPU: the reference
    with pytest.raises(ValueError, match="backend must be one of"):
        gpupipe.decode_crop_jpegs(photos, boxes, backend="opencv")
    with pytest.raises(ValueError, match="device='cuda'"):
        gpupipe.decode_crop_jpegs(photos, boxes, backend="nvjpeg", device="cpu")
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="no CUDA device"):
            gpupipe.decode_crop_jpegs(photos, boxes, device="cuda")
    monkeypatch.setattr(dali_backend, "unavailable_reason",
                        lambda device=None: "NVIDIA DALI is not installed: pip install 'torch-gpupipe[dali]'")
    with pytest.raises(RuntimeError, match=r"pip install 'torch-gpupipe\[dali\]'"):
        gpupipe.decode_crop_jpegs(photos, boxes, backend="dali")


@pytest.mark.parametrize("backend,device", CASES)
def test_what_gpu_decoders_cannot_honour_goes_to_the_cpu_core(photos, backend, device):
    """A window resize (the GPU resizers crop first) and a strict decode (nvJPEG does not report
    recoverable corruption) are the CPU core's: same pixels, route cpu-fallback."""
    boxes = edge_boxes(photos, 64, 64).astype(np.float64) + [0.5, 0.25, -1.0, -0.5]
    ref = gpupipe.decode_crop_jpegs(photos, boxes, size=32, window=True, dct_scaling=False)
    got = gpupipe.decode_crop_jpegs(photos, boxes, size=32, window=True, dct_scaling=False, backend=backend, device=device)
    route = "cpu" if backend == "cpu" else "cpu-fallback"  # the CPU core with CUDA outputs falls back from nothing
    assert got.routes == [route] * len(photos) and torch.equal(got.images.cpu(), ref.images)
    strict = gpupipe.decode_crop_jpegs(photos, edge_boxes(photos, 16, 16), strict=True, backend=backend, device=device)
    assert set(strict.routes) == {route}


def jpeg_extent_reference(data: bytes) -> tuple:
    """(scans, bytes after the EOI that ends the JPEG, or -1) by a plain walk of the markers, as
    libjpeg reads them: segments with a length skipped whole, FF 00 and RSTn not markers."""
    scans, p = 0, 2
    while p < len(data) - 1:
        if data[p] != 0xFF:
            p += 1
            continue
        while p < len(data) and data[p] == 0xFF:
            p += 1
        if p >= len(data):
            break
        marker, p = data[p], p + 1
        if marker == 0xD9:
            return scans, len(data) - p
        if marker == 0xD8:  # a second SOI: libjpeg refuses the file
            break
        if marker in (0x00, 0x01) or 0xD0 <= marker <= 0xD7:
            continue
        if len(data) - p < 2 or int.from_bytes(data[p:p + 2], "big") > len(data) - p:
            break
        scans += marker == 0xDA
        p += max(int.from_bytes(data[p:p + 2], "big"), 2)
    return scans, -1


def trailed_variants():
    """(name, jpeg, what follows it) for every JPEG variant of the suite, each with bytes after its
    EOI (a trailer holding markers, an appended JPEG as Multi-Picture files have, an EXIF
    thumbnail's SOS and EOI inside APP1) and without."""
    from crafted import with_app1s
    from helpers import make_variants

    variants = make_variants(photo(64, 80))
    thumbnail = variants["ycbcr-4:2:0"]
    app1 = b"\xff\xe1" + (len(thumbnail) + 8).to_bytes(2, "big") + b"Exif\0\0" + thumbnail
    trailers = {"none": b"", "zeros": b"\0" * 8, "markers": b"\xff\xd9\xff\xda\x00\x08junk\xff",
                "appended-jpeg": variants["ycbcr-4:4:4-progressive"]}
    cases = [(f"{name}+{t}", jpeg, trailer) for name, jpeg in variants.items() for t, trailer in trailers.items()]
    return cases + [("thumbnail-in-app1+" + t, with_app1s(thumbnail, app1), trailer) for t, trailer in trailers.items()]


def test_the_header_table_finds_the_eoi_that_ends_the_jpeg():
    """The trailing column: the bytes after the EOI marker that ends the JPEG (libjpeg never reads
    them), -1 for a truncated file; scans counted up to it. Held to a plain walk of the markers,
    and to libjpeg: the CPU core decodes the file cut there bit for bit as the whole file."""
    from gpupipe.routing import probe

    cases = trailed_variants()
    datas = [jpeg + trailer for _, jpeg, trailer in cases]
    infos = probe(datas)
    for (name, jpeg, trailer), scans, trailing, data in zip(cases, infos.column("scans"), infos.column("trailing"), datas):
        assert (scans, trailing) == jpeg_extent_reference(data), name
        assert trailing == len(trailer) and scans == jpeg_extent_reference(jpeg)[0] >= 1, name
    cut = [d[:len(d) - t] for d, t in zip(datas, infos.column("trailing").tolist())]
    boxes = [(0, 0, 64, 80)] * len(datas)
    whole, trimmed = (gpupipe.decode_crop_jpegs(d, boxes, on_error="skip") for d in (datas, cut))
    assert torch.equal(whole.ok, trimmed.ok) and whole.ok.sum() >= len(datas) - 8  # (CMYK/YCCK fail in rgb)
    assert torch.equal(whole.images, trimmed.images) and whole.warnings == trimmed.warnings
    # truncated anywhere before its EOI, a file has none (its scans counted up to the cut); nor has one
    # whose cut is followed by another JPEG (libjpeg refuses its second SOI)
    data = datas[0][:-2]
    truncated = probe([data[:k] for k in range(len(data) - 1, 600, -97)] + [data[:len(data) // 2] + datas[1]])
    assert (truncated.column("trailing") == -1).all()


BUFFER_KINDS = {"bytes": bytes, "bytearray": bytearray, "memoryview": memoryview,
                "numpy": lambda d: np.frombuffer(d, np.uint8), "tensor": lambda d: torch.frombuffer(bytearray(d), dtype=torch.uint8)}


@pytest.mark.parametrize("kind", BUFFER_KINDS)
def test_gpu_decoders_are_given_each_file_up_to_its_eoi(photos, kind):
    """nvJPEG decodes a truncated file without a word: a file without an EOI ending it is the CPU
    core's, which reports it. One with bytes after its EOI goes to the GPU decoders cut there, as
    a view of the caller's buffer. Runs without a GPU: the routing decision and the inputs."""
    from gpupipe._backends import gpu_fallback
    from gpupipe.decode_types import DecodeOptions
    from gpupipe.routing import as_buffers, probe

    jpegs = list(photos[:4])
    datas = [jpegs[0], jpegs[1][: len(jpegs[1]) // 2], jpegs[2] + b"\0" * 8, jpegs[3] + jpegs[0]]
    typed = as_buffers([BUFFER_KINDS[kind](d) for d in datas])  # (as every decode call takes them)
    infos = probe(typed)  # (as a GPU backend probes: the scans counted)
    assert infos.column("trailing").tolist() == [0, -1, 8, len(jpegs[0])]
    assert gpu_fallback.refusals(infos, edge_boxes(datas, 16, 16), DecodeOptions(size=None)).tolist() == [0, 6, 0, 0]
    given = gpu_fallback.gpu_inputs(typed, infos)
    assert [bytes(g) for g in given] == [jpegs[0], datas[1], jpegs[2], jpegs[3]]
    assert given[0] is typed[0] and given[1] is typed[1]  # (only the files with bytes after them are views)
    untouched = typed[:2]
    assert gpu_fallback.gpu_inputs(untouched, infos.select([0, 1])) is untouched
    # the CPU backend's probe does not count scans (it reads each whole file): no GPU decoder may take such a row
    cpu_infos = probe(typed, DecodeOptions(size=None, backend="cpu"))
    assert (cpu_infos.column("scans") == -1).all() and (cpu_infos.column("trailing") == -1).all()
    assert not gpu_fallback.gpu_eligible(cpu_infos, edge_boxes(datas, 16, 16), DecodeOptions(size=None)).any()
    cpu_infos.count_scans(typed)  # what a GPU backend handed them does first
    assert np.array_equal(cpu_infos.table, infos.table)


def bad_progressions() -> dict:
    """Progressive files whose scan parameters libjpeg refuses ("Invalid progressive parameters":
    DALI's libjpeg-turbo 3 printed it to stderr in its own words), and a baseline file coded as
    progressive (its one scan Ss = 0, Se = 63)."""
    import io

    from PIL import Image

    img = Image.fromarray(photo(48, 64))
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=85, progressive=True)
    prog = buf.getvalue()
    scans = [i for i in range(2, len(prog) - 1) if prog[i] == 0xFF and prog[i + 1] == 0xDA]

    def edit(k: int, field: int, value: int) -> bytes:  # field 0: Ss, 1: Se, 2: Ah/Al of scan k
        at = scans[k] + 5 + 2 * prog[scans[k] + 4] + field
        return prog[:at] + bytes([value]) + prog[at + 1:]

    dc = next(k for k in range(len(scans)) if prog[scans[k] + 5 + 2 * prog[scans[k] + 4]] == 0)
    ac = next(k for k in range(len(scans)) if prog[scans[k] + 5 + 2 * prog[scans[k] + 4]] > 0)
    ss = prog[scans[ac] + 5 + 2 * prog[scans[ac] + 4]]
    baseline = io.BytesIO()
    img.save(baseline, "JPEG", quality=85)
    base = baseline.getvalue()
    sof = base.index(b"\xff\xc0")
    first_al = prog[scans[dc] + 7 + 2 * prog[scans[dc] + 4]] & 15
    later = scans[ac] + 5  # (the AC scan's component selector)
    return {"a progressive DC scan with Se = 5": edit(dc, 1, 5), "a progressive AC scan with Ss > Se": edit(ac, 1, ss - 1),
            "a progressive scan with Al = 14": edit(ac, 2, 0xEE), "a baseline scan in a progressive frame":
            base[:sof + 1] + b"\xc2" + base[sof + 2:],
            # (libjpeg's warning "Inconsistent progression sequence"; its error "Invalid component ID")
            "a progression out of sequence": edit(dc, 2, first_al + 1 if first_al < 13 else 0),
            "a later scan of a component the frame lacks": prog[:later] + b"\x09" + prog[later + 1:]}


def refused_tables() -> dict:
    """Files whose tables or scans libjpeg refuses or warns about though their header reads (a
    mutation soak handed thousands of such files to the GPU decoders)."""
    import io

    from PIL import Image

    def encoded(**kw) -> bytes:
        buf = io.BytesIO()
        Image.fromarray(photo(48, 64)).save(buf, "JPEG", quality=85, **kw)
        return buf.getvalue()

    def segments(data: bytes) -> list:  # (offset, marker, length) up to the first SOS
        out, p = [], 2
        while data[p + 1] != 0xDA:
            out.append((p, data[p + 1], int.from_bytes(data[p + 2:p + 4], "big")))
            p += 2 + out[-1][2]
        return out + [(p, 0xDA, int.from_bytes(data[p + 2:p + 4], "big"))]

    def at(data: bytes, marker: int) -> tuple:
        return next((p, n) for p, m, n in segments(data) if m == marker)

    def put(data: bytes, offset: int, value: int) -> bytes:
        return data[:offset] + bytes([value]) + data[offset + 1:]

    base, prog = encoded(), encoded(progressive=True)
    sof, _ = at(base, 0xC0)
    dht, _ = at(base, 0xC4)  # the first table: luma DC (Pillow's standard one, counts 0 1 5 1 1 1 1 1 1)
    sos, sos_length = at(base, 0xDA)
    counts = dht + 5
    bogus = put(put(base, counts, base[counts] + 2), counts + 2, base[counts + 2] - 2)  # 2 codes of 1 bit
    without_dht = b"".join([prog[:2]] + [prog[p:p + 2 + n] for p, m, n in segments(prog) if m not in (0xC4, 0xDA)]
                           + [prog[segments(prog)[-1][0]:]])
    arith = _C.encode_jpeg(photo(48, 64).tobytes(), 48, 64, 3, arithmetic=True)
    asos, _ = at(arith, 0xDA)
    return {"an undefined quantization table": put(base, sof + 12 + 3, 3),
            "a Huffman table with more codes than bits": bogus,
            "a DC Huffman value above 15": put(base, counts + 16, 16),
            "a progressive scan without its Huffman table": without_dht,
            "a component in two sequential scans": base[:-2] + base[sos:sos + 2 + sos_length] + b"\0" * 8 + b"\xff\xd9",
            "a DHT slot 4": put(base, dht + 4, 0x04),
            "a DQT slot 4": put(base, at(base, 0xDB)[0] + 4, 0x04),
            "a DRI of 5 bytes": base[:sos] + b"\xff\xdd\x00\x05\x00\x01\x00" + base[sos:],
            "a DAC value out of range": arith[:asos] + b"\xff\xcc\x00\x04\x00\x0f" + arith[asos:],
            "a fractional sampling": put(put(base, sof + 11, 0x31), sof + 14, 0x21),
            "more than 10 blocks in an interleaved MCU": put(base, sof + 11, 0x44)}


def test_a_component_sampled_more_finely_than_luma_is_the_cpu_cores():
    """Valid, rare files whose chroma is sampled more finely than luma: DALI's crop decode gave other
    pixels (up to 22 levels on narrow crops near the left edge). Marked (FINER_CHROMA), refused to the
    GPU decoders (9), decoded by the CPU core exactly as the full decode cropped; the usual
    samplings are not marked."""
    from gpupipe._backends import gpu_fallback
    from gpupipe.decode_types import DecodeOptions
    from gpupipe.routing import probe

    pixels = photo(40, 62)
    odd = [_C.encode_jpeg(pixels.tobytes(), 40, 62, 3, sampling=s) for s in ([(1, 1), (2, 2), (2, 2)],
                                                                           [(2, 1), (1, 1), (4, 1)],
                                                                           [(4, 1), (1, 2), (2, 2)])]
    usual = [_C.encode_jpeg(pixels.tobytes(), 40, 62, 3, sampling=s) for s in ([(2, 2), (1, 1), (1, 1)],
                                                                             [(2, 1), (1, 1), (1, 1)],
                                                                             [(1, 1), (1, 1), (1, 1)],
                                                                             [(4, 1), (1, 1), (1, 1)])]
    infos = probe(odd + usual)
    assert infos.column("malformed").tolist() == [_C.FINER_CHROMA] * 3 + [0] * 4
    boxes = np.array([[0, 0, 40, 2], [3, 0, 20, 3], [25, 1, 15, 5]] + [[0, 0, 8, 8]] * 4)
    codes = gpu_fallback.refusals(infos, boxes, DecodeOptions(size=None))
    assert codes.tolist() == [9] * 3 + [0] * 4 and "sampling" in gpu_fallback.REFUSALS[9]
    for backend in [b for b in ("cpu", "dali") if AVAILABLE[b]["available"]]:
        got = gpupipe.decode_crop_jpegs(odd, boxes[:3], size=(8, 8), backend=backend)
        assert got.ok.all()
        for k, (t, l, h, w) in enumerate(boxes[:3]):
            whole = gpupipe.decode_crop_jpegs([odd[k]], [[t, l, h, w]], size=(8, 8), backend="cpu")
            assert torch.equal(got.images[k], whole.images[0]), (backend, k)
        if backend == "dali":
            assert got.routes == ["cpu-fallback"] * 3 and all("sampling" in v for v in got.fallback.values())


def test_a_marker_layout_libjpeg_reads_only_with_a_warning_is_the_cpu_cores():
    """nvImageCodec 0.9's parser (DALI's too) killed the process on a file of the hostile corpus (a
    RST marker and bytes between the header's segments, a second SOF inside the scan). The marker
    walk marks such layouts; the GPU decoders never get them (refusal 8); clean files are not marked."""
    import crafted
    from gpupipe._backends import gpu_fallback
    from gpupipe.decode_types import DecodeOptions
    from gpupipe.routing import probe
    from helpers import make_variants

    clean = make_variants(photo(48, 64))
    base = crafted.gray_restart_jpeg()
    sos = crafted.sos_offset(base)
    sof = next(i for i in range(2, sos) if base[i] == 0xFF and base[i + 1] == 0xC0)
    sof_segment = base[sof:sof + 2 + int.from_bytes(base[sof + 2:sof + 4], "big")]
    odd = {"restart_walk_garbage": crafted.restart_walk_garbage(),
           "restart_walk_heap_overflow": crafted.restart_walk_heap_overflow(),
           "bytes before a marker": base[:sos] + b"\x00\x00" + base[sos:],
           "RST0 in the header": base[:sos] + b"\xff\xd0" + base[sos:],
           "a second SOF": base[:sos] + sof_segment + base[sos:],
           "an unknown marker": base[:sos] + b"\xff\xc8\x00\x04ab" + base[sos:],
           "a length below 2": base[:sos] + b"\xff\xfe\x00\x01" + base[sos:],
           "a sequential scan with Se = 62": base[:sos + 4 + 2 * base[sos + 4] + 2] + b"\x3e" + base[sos + 4 + 2 * base[sos + 4] + 3:],
           **bad_progressions(), **refused_tables()}
    with pytest.warns(gpupipe.JpegWarning, match="Invalid SOS parameters for sequential JPEG"):  # (libjpeg's)
        gpupipe.decode_crop_jpegs([odd["a sequential scan with Se = 62"]], [[0, 0, 8, 8]])
    for name, data in refused_tables().items():  # libjpeg errs or warns on each
        if name == "a component in two sequential scans":
            continue  # (its error, "Didn't expect more than one scan", is past the image the CPU core reads)
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            result = gpupipe.decode_crop_jpegs([data], [[0, 0, 8, 8]], on_error="skip")
        assert not result.ok[0] or any(issubclass(w.category, gpupipe.JpegWarning) for w in said), name
    infos = probe(list(clean.values()) + list(odd.values()))
    marked = dict(zip([*clean, *odd], infos.column("malformed").tolist()))
    assert {k for k, v in marked.items() if v} == set(odd), marked
    codes = gpu_fallback.refusals(infos, np.array([[0, 0, 8, 8]] * len(marked)), DecodeOptions(size=None))
    readable = infos.kind[len(clean):] == 0  # (libjpeg refuses some headers outright: refusal 2)
    assert readable.sum() >= 4 and (codes[len(clean):] == np.where(readable, 8, 2)).all()
    assert "marker layout" in gpu_fallback.REFUSALS[8]


@pytest.mark.parametrize("backend", [b for b in ("cpu", "dali", "hybrid", "nvjpeg") if AVAILABLE[b]["available"]])
def test_every_crafted_file_through_every_backend_in_batches(backend):
    """Each hostile file of tests/crafted.py, 32 copies a batch, 10 batches, in a child process: it
    must not die or write to stderr (DALI's process died on one)."""
    device = "cuda" if backend in ("hybrid", "nvjpeg") else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    run_child(f"""
        import gpupipe, crafted, inspect
        files = [f() for f in map(lambda n: getattr(crafted, n), crafted.__all__)
                 if not [p for p in inspect.signature(f).parameters.values() if p.default is p.empty]]
        files += [crafted.incomplete_progressive(crafted.gray_restart_jpeg())]
        for data in files:
            if not isinstance(data, bytes):
                continue
            for _ in range(10):
                gpupipe.decode_crop_jpegs([data] * 32, [[0, 0, 8, 8]] * 32, size=16, backend={backend!r},
                                          device={device!r}, on_error="skip", num_threads=2)
        print("survived", len(files))
    """, timeout=300)


@pytest.mark.parametrize("backend,device", CASES)
def test_files_with_bytes_after_their_eoi_are_decoded_by_the_gpu_decoders(photos, backend, device):
    """Bytes after the EOI (a trailer, an appended image) no longer send a file to the CPU core:
    the GPU decoder is given the JPEG up to its EOI and decodes it as the file without them."""
    datas = [d + trailer for d, trailer in zip(photos, [b"", b"\0" * 8, photos[0], b"\xff\xd9junk", b"", b"\xff"])]
    boxes = edge_boxes(photos, 48, 64)
    ref = gpupipe.decode_crop_jpegs(photos, boxes, backend=backend, device=device)
    got = gpupipe.decode_crop_jpegs(datas, boxes, backend=backend, device=device)
    assert got.routes == ref.routes and "cpu-fallback" not in got.routes and not got.fallback
    assert torch.equal(got.images, ref.images)


def test_plan_batch_needs_no_read_errors(photos):
    """routing.plan_batch (public): headers and boxes of a batch, read errors optional."""
    from gpupipe import crops
    from gpupipe.decode_types import DecodeOptions
    from gpupipe.routing import plan_batch

    datas = list(photos[:3])
    opts = DecodeOptions(size=(16, 16), resize=True)
    buffers, infos, boxes = plan_batch(datas, crops.CenterCrop(16), opts, seed=0, epoch=0, indices=[0, 1, 2])
    assert len(buffers) == 3 and infos.kind.tolist() == [0, 0, 0] and boxes.shape == (3, 4)
    _, failed, _ = plan_batch(datas, crops.CenterCrop(16), opts, seed=0, epoch=0, indices=[0, 1, 2],
                              read_errors={1: "read error: OSError: gone"})
    assert failed.kind.tolist()[1] != 0 and failed.messages[1] == "read error: OSError: gone"


@pytest.mark.parametrize("backend", ["cpu", "hybrid"])
def test_the_training_samplers_native_plan_equals_the_general_path(photos, backend, monkeypatch):
    """plan_batch with RandomResizedCrop reads the headers and draws the boxes in one native call:
    the same buffers, header table and boxes as the general path (probe, sizes, crop.plan), for
    any keys; a batch with a header that is not a readable JPEG's takes the general path."""
    import io

    from PIL import Image

    from gpupipe import crops
    from gpupipe.decode_types import DecodeOptions
    from gpupipe.routing import plan_batch

    class General(crops.RandomResizedCrop):  # (not the class itself: the general path)
        pass

    variants = [{"quality": 80, "progressive": True}, {"quality": 90, "h_samp": 1, "v_samp": 1}, {"quality": 70}]
    datas = list(photos) + list(photo_jpegs([PHOTOS[0]] * 3, variants))
    png = io.BytesIO()
    Image.fromarray(np.zeros((20, 30, 3), np.uint8)).save(png, "PNG")
    opts = DecodeOptions(size=(24, 24), resize=True, backend=backend)
    native, boxed = gpupipe._C.plan_random_resized_crops, []
    monkeypatch.setattr(gpupipe._C, "plan_random_resized_crops",
                        lambda *a: boxed.append(native(*a)[1] is not None) or native(*a))
    for batch in (datas, datas[:3] + [png.getvalue()] + datas[3:], datas[:2] + [b"\xff\xd8 truncated"]):
        for seed, epoch, indices in ((0, 0, None), (7, 3, np.arange(100, 100 + len(batch))),
                                     (-5, 2**63, -np.arange(len(batch)) - 2**40)):
            args = dict(seed=seed, epoch=epoch, indices=indices)
            fast = plan_batch(batch, crops.RandomResizedCrop(24, scale=(0.2, 0.9)), opts, **args)
            general = plan_batch(batch, General(24, scale=(0.2, 0.9)), opts, **args)
            assert fast[0] is batch or [bytes(a) for a in fast[0]] == [bytes(b) for b in general[0]]
            assert np.array_equal(fast[1].table, general[1].table) and fast[1].messages == general[1].messages
            assert fast[1].pillow == general[1].pillow and np.array_equal(fast[2], general[2])
            if batch is datas:
                scans = fast[1].column("scans")
                assert (scans == -1).all() if backend == "cpu" else (scans >= 1).all()
    # the native call drew the boxes of the JPEG batch, and only of it (one call per plan_batch, the
    # general path's own sampler is a subclass: never native)
    assert boxed == [True] * 3 + [False] * 6
