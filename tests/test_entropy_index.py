"""The entropy index (csrc/decode/entropy_index.h): a decode learns where the MCU rows it reaches
start, and a later decode of the same bytes starts from the row at its crop, passing nothing it does
not need. The pixels must be those of libjpeg alone, bit for bit, on every variant, at every DCT
scale, in gray and color, on damaged data; the index must really be used (MCUs coasted), never for
other bytes, and stay within its bound."""

import warnings

import numpy as np
import pytest
import torch

import gpupipe
from gpupipe import _C
from helpers import encode, full_decode, in_forked_child, photo, run_child, switched
from test_huffman_reader import LEFT, TAKEN, damaged, delta, reader


@pytest.fixture(autouse=True)
def fresh_index():
    """Each test starts with an empty index of the default bound, and leaves it so."""
    old = gpupipe.set_entropy_index_size(256 << 20)
    _C.clear_entropy_index()
    yield
    gpupipe.set_entropy_index_size(old)
    _C.clear_entropy_index()


def paused_index():
    """Decodes without the index, its rows kept."""
    return switched(_C._pause_entropy_index, True)


def random_boxes(h: int, w: int, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        t, l = int(rng.integers(0, h)), int(rng.integers(0, w))
        out.append((t, l, int(rng.integers(1, h - t + 1)), int(rng.integers(1, w - l + 1))))
    return np.array(out, dtype=np.int64)


def crops(data: bytes, boxes, mode: str = "rgb") -> list:
    """Each box of ``data`` cropped by a batch decode (the index's path), as HWC numpy."""
    out = []
    for box in np.asarray(boxes, dtype=np.int64).reshape(-1, 4):
        got = gpupipe.decode_crop_jpegs([data], box[None], num_threads=1, mode=mode)
        assert got.ok.all(), got.errors
        out.append(got.images[0].permute(1, 2, 0).numpy())
    return out


def same_size_boxes(h: int, w: int, n: int, seed: int) -> np.ndarray:
    """n boxes of one size (a batch without resizing), anywhere in the image."""
    rng = np.random.default_rng(seed)
    bh, bw = max(1, h // 3), max(1, w // 4)
    return np.array([(int(rng.integers(0, h - bh + 1)), int(rng.integers(0, w - bw + 1)), bh, bw) for _ in range(n)],
                    dtype=np.int64)


def batch(data: bytes, boxes: np.ndarray, threads: int = 1, **kw):
    """One batch decode of ``data`` at each (same-size) box: (HWC numpy [N, h, w, C], the result)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", gpupipe.JpegWarning)  # (damaged files: their warnings are compared)
        got = gpupipe.decode_crop_jpegs([data] * len(boxes), boxes, num_threads=threads, **kw)
    return got.images.permute(0, 2, 3, 1).numpy(), got


def learn_down_to_the_bottom(data: bytes, h: int, w: int) -> None:
    """One decode of the last rows: the rows above them all learned."""
    crops(data, [[h - 1, 0, 1, w]])


@pytest.mark.parametrize("name", TAKEN)
def test_crops_from_known_rows_equal_libjpeg_alone(variants, name):
    data = variants[name]
    ref = full_decode(data)
    h, w = ref.shape[:2]
    before = _C._huffman_reader_stats()
    first = crops(data, random_boxes(h, w, 12, seed=1))  # (learning, each decode from where the others got)
    learn_down_to_the_bottom(data, h, w)
    assert gpupipe.entropy_index_stats()["files"] == 1
    boxes = random_boxes(h, w, 40, seed=2)
    boxes[:3] = [[h - 1, w - 1, 1, 1], [h // 2, w - 1, h - h // 2, 1], [0, 0, h, w]]
    for got, (t, l, bh, bw) in zip(crops(data, boxes), boxes):
        np.testing.assert_array_equal(got, ref[t:t + bh, l:l + bw], err_msg=f"{name} {(t, l, bh, bw)}")
    for got, (t, l, bh, bw) in zip(first, random_boxes(h, w, 12, seed=1)):
        np.testing.assert_array_equal(got, ref[t:t + bh, l:l + bw])
    d = delta(before)
    assert d["coasted"] > 0 and d["rejected"] == 0, d  # the known rows were used
    assert gpupipe.entropy_index_stats()["found"] >= 40


@pytest.mark.parametrize("name", LEFT)
def test_other_codings_are_neither_indexed_nor_changed(variants, name):
    data = variants[name]
    ref = full_decode(data)
    h, w = ref.shape[:2]
    boxes = random_boxes(h, w, 8, seed=3)
    for _ in range(2):
        for got, (t, l, bh, bw) in zip(crops(data, boxes), boxes):
            np.testing.assert_array_equal(got, ref[t:t + bh, l:l + bw])
    assert gpupipe.entropy_index_stats()["files"] == 0


@pytest.mark.parametrize("name", ["ycbcr-4:2:0", "ycbcr-4:2:2", "gray", "pillow-4:2:0-q75", "cmyk"])
def test_resized_crops_at_every_dct_scale_equal_libjpeg_alone(variants, name):
    data = variants[name]
    h, w = full_decode(data).shape[:2]
    learn_down_to_the_bottom(data, h, w)
    for scale in range(1, 9):
        boxes = random_boxes(h, w, 6, seed=scale)
        for t, l, bh, bw in boxes:
            out = (max(1, int(bh) * scale // 8), max(1, int(bw) * scale // 8))
            box = np.array([[t, l, bh, bw]], dtype=np.int64)
            a = gpupipe.decode_crop_jpegs([data], box, size=out, num_threads=1).images
            with reader(False):
                b = gpupipe.decode_crop_jpegs([data], box, size=out, num_threads=1).images
            assert np.array_equal(a.numpy(), b.numpy()), (name, scale, (t, l, bh, bw), out)
    assert gpupipe.entropy_index_stats()["found"] > 0


@pytest.mark.parametrize("first, then", [("rgb", "gray"), ("gray", "rgb")])
def test_gray_output_uses_rows_color_learned_and_learns_none(variants, first, then):
    """Gray output of a color file keeps no DC predictions for Cb and Cr: it learns nothing (its rows
    would give the color decode wrong predictions), and uses what a color decode learned."""
    data = variants["ycbcr-4:2:0"]
    h, w = full_decode(data).shape[:2]
    boxes = random_boxes(h, w, 16, seed=5)
    crops(data, [[h - 1, 0, 1, w]], mode=first)
    assert gpupipe.entropy_index_stats()["files"] == (1 if first == "rgb" else 0)
    ref = full_decode(data, then)
    before = _C._huffman_reader_stats()
    (bottom,) = crops(data, [[h - 8, 0, 8, w]], mode=then)  # from the rows the first decode left, if any
    np.testing.assert_array_equal(bottom, ref[h - 8:])
    assert (delta(before)["coasted"] > 0) == (first == "rgb")
    for got, (t, l, bh, bw) in zip(crops(data, boxes, mode=then), boxes):
        np.testing.assert_array_equal(got, ref[t:t + bh, l:l + bw])


def test_only_the_files_the_reader_takes_are_hashed(variants):
    """A file is keyed (hashed) when gpupipe's Huffman reader takes its scan, not before: those it
    leaves to libjpeg (progressive, arithmetic, restart markers: the restart route) cost no hash."""
    from gpupipe.prepare import prepare_bytes

    def keyed(data: bytes) -> int:
        before = gpupipe.entropy_index_stats()["keyed"]
        crops(data, [[2, 3, 20, 30]])
        return gpupipe.entropy_index_stats()["keyed"] - before

    assert [keyed(variants[name]) for name in TAKEN] == [1] * len(TAKEN)
    assert [keyed(variants[name]) for name in LEFT] == [0] * len(LEFT)
    assert keyed(prepare_bytes(variants["ycbcr-4:2:0"])) == 0


def test_other_bytes_of_the_same_size_never_use_the_rows(variants):
    data = variants["ycbcr-4:2:0"]
    h, w = full_decode(data).shape[:2]
    learn_down_to_the_bottom(data, h, w)
    sos = data.index(b"\xff\xda")
    start = sos + 2 + int.from_bytes(data[sos + 2:sos + 4], "big")
    other = bytearray(data)
    other[start + 5] ^= 0x10  # the second row on starts elsewhere, or decodes to other pixels
    other = bytes(other)
    boxes = same_size_boxes(h, w, 12, seed=9)
    before = gpupipe.entropy_index_stats()["found"]
    batch(other, boxes[:1])
    assert gpupipe.entropy_index_stats()["found"] == before  # a new file: nothing known
    a, ra = batch(other, boxes)  # (from its own rows, as it learns them)
    with reader(False):
        b, rb = batch(other, boxes)
    assert np.array_equal(a, b) and ra.errors == rb.errors


def test_a_block_that_cancels_a_public_hash_constant_does_not_make_files_collide():
    """With public constants a 32-byte block starting with one (here the constant the first version
    xored its blocks with) zeroed the hash's state and its next 8 bytes: two files differing only
    there shared their rows (wrong pixels). The hash's secrets are drawn per process."""
    base = encode(photo(256, 256), quality=90)
    sos = base.index(b"\xff\xda")
    start = sos + 2 + int.from_bytes(base[sos + 2:sos + 4], "big")
    cancel = (0xe7037ed1a0b428db).to_bytes(8, "little")
    rng = np.random.default_rng(0)
    box = np.array([[240, 0, 16, 256]], dtype=np.int64)
    for _ in range(20):
        at = (start + 32 + 32 * int(rng.integers(0, (len(base) - start - 600) // 32))) & ~31
        a, b = (base[:at] + cancel + bytes(int(x) for x in rng.integers(0, 255, 8)) + base[at + 16:] for _ in range(2))
        _C.clear_entropy_index()
        batch(a, box)
        found = gpupipe.entropy_index_stats()["found"]
        got, _ = batch(b, box)
        assert gpupipe.entropy_index_stats()["found"] == found  # b is not a's
        with reader(False):
            ref, _ = batch(b, box)
        assert np.array_equal(got, ref)


def test_damaged_files_decode_as_libjpeg_alone_and_warned_decodes_teach_nothing(variants):
    rng = np.random.default_rng(11)
    sources = [variants["ycbcr-4:2:0"], variants["ycbcr-4:4:4"], variants["gray"], variants["pillow-4:2:0-q75"]]
    for i in range(60):
        data = damaged(sources[i % len(sources)], rng)
        h, w = full_decode(sources[i % len(sources)]).shape[:2]
        boxes = same_size_boxes(h, w, 4, seed=i)
        boxes[0, 0] = h - boxes[0, 2]  # (one reaches the bottom: where the damage usually is)
        a, ra = batch(data, boxes)
        again, rg = batch(data, boxes)
        with reader(False):
            b, rb = batch(data, boxes)
        for x, rx in ((a, ra), (again, rg)):
            assert np.array_equal(x, b), i
            assert rx.errors == rb.errors and rx.warnings == rb.warnings, i


def test_a_bad_code_near_libjpegs_switch_to_its_careful_decoder_warns_as_without_the_index():
    """libjpeg decodes the MCUs that start within 512 bytes per block of the data's end with its
    careful decoder, which alone warns of a bad code; which MCU that is follows the bytes left in
    its buffer when the reader hands over. The hand-over's position is a function of the bit
    position alone, so a decode from a known row warns (or, strict, fails) exactly as one from the
    scan's start (an audit found 3 in 1,200 that differed before)."""
    differed = compared = 0
    # the audit's cases first (a 236x114 4:2:0 photo at quality 54, a bad code planted at byte
    # 2856 or 2876; the rows learned from a crop higher up), then random ones of the same kind
    base = encode(photo(236, 114), quality=54, h_samp=2, v_samp=2)
    for at, pattern, box, learn in ((2856, b"\xff\x00\xff\x00", (191, 97, 45, 9), (117, 0, 16, 114)),
                                    (2876, b"\xff\x00" * 3, (202, 17, 34, 63), (111, 0, 16, 114)),
                                    (2876, b"\xff\x00" * 3, (168, 33, 68, 47), (107, 0, 16, 114))):
        data = base[:at] + pattern + base[at + len(pattern):]
        for strict in (False, True):
            _C.clear_entropy_index()
            batch(data, np.array([learn], dtype=np.int64))
            a, ra = batch(data, np.array([box], dtype=np.int64), strict=strict, on_error="skip")
            with paused_index():
                b, rb = batch(data, np.array([box], dtype=np.int64), strict=strict, on_error="skip")
            assert np.array_equal(a, b) and ra.errors == rb.errors and ra.warnings == rb.warnings, (at, box, strict)
    rng = np.random.default_rng(1)
    for f in range(6):
        h, w = int(rng.integers(64, 300)), int(rng.integers(64, 300))
        hs, vs = [(1, 1), (2, 1), (2, 2)][f % 3]
        base = encode(photo(h, w), quality=int(rng.integers(50, 100)), h_samp=hs, v_samp=vs)
        sos = base.index(b"\xff\xda")
        for _ in range(25):
            at = len(base) - 2 - 512 * (hs * vs + 2) + int(rng.integers(-300, 300))
            if at < sos + 200:
                continue
            pattern = [b"\xff\x00\xff\x00", b"\xff\x00\xff\x00\xff\x00", b"\xfe\xff\x00\xff\x00"][int(rng.integers(0, 3))]
            data = base[:at] + pattern + base[at + len(pattern):]
            top = int(rng.integers(h // 2, h))
            box = np.array([[top, int(rng.integers(0, w // 2)), h - top, w // 2]], dtype=np.int64)
            for strict in (False, True):
                _C.clear_entropy_index()
                batch(data, np.array([[int(rng.integers(0, h // 2)), 0, 1, w]], dtype=np.int64))  # rows learned
                a, ra = batch(data, box, strict=strict, on_error="skip")
                with paused_index():
                    b, rb = batch(data, box, strict=strict, on_error="skip")
                compared += 1
                differed += not (np.array_equal(a, b) and ra.errors == rb.errors and ra.warnings == rb.warnings)
    assert compared > 100 and differed == 0, (compared, differed)


def test_a_decode_that_warns_teaches_nothing(variants):
    """Its rows before the damage would be right (the reader stops learning where libjpeg's decoder
    takes over), but a warned decode is not learned from at all: the index only holds clean files."""
    data = variants["ycbcr-4:2:0"]
    h, w = full_decode(data).shape[:2]
    # a marker among the last rows' data (near the end, where the reader still takes the file)
    hurt = data[:len(data) - 200] + b"\xff\xd3" + data[len(data) - 200:]
    before = _C._huffman_reader_stats()
    got, result = batch(hurt, np.array([[h - 8, 0, 8, w]], dtype=np.int64))
    assert result.warnings and delta(before)["handed_back"] > 0 and gpupipe.entropy_index_stats()["files"] == 0
    batch(hurt, np.array([[h // 2, 0, 8, w]], dtype=np.int64))  # above the damage: clean, learned
    assert gpupipe.entropy_index_stats()["files"] == 1


def test_many_threads_learning_one_file_at_once(variants):
    data = variants["pillow-4:2:0-q75"]
    ref = full_decode(data)
    h, w = ref.shape[:2]
    boxes = same_size_boxes(h, w, 64, seed=13)
    for _ in range(3):  # learning in a race, then from what the race left
        got, _ = batch(data, boxes, threads=4)
        for k, (t, l, bh, bw) in enumerate(boxes):
            np.testing.assert_array_equal(got[k], ref[t:t + bh, l:l + bw])
    assert gpupipe.entropy_index_stats()["files"] == 1


def test_decodes_while_the_index_is_emptied_and_rebounded(variants):
    """Four decode threads learn and read several files' rows while another thread empties the index
    and changes its bound under them: every crop is libjpeg's alone (a decode holds a copy of its
    rows, never the index's block)."""
    import threading

    datas = [variants[n] for n in ("pillow-4:2:0-q75", "ycbcr-4:4:4", "gray")]
    refs = [full_decode(d) for d in datas]
    stop = threading.Event()

    def churn():
        bounds = [256 << 20, 700, 0, 4096]
        k = 0
        while not stop.is_set():
            gpupipe.set_entropy_index_size(bounds[k % len(bounds)])
            _C.clear_entropy_index() if k % 3 == 0 else None
            k += 1

    coasted = _C._huffman_reader_stats()["coasted"]
    churner = threading.Thread(target=churn)
    churner.start()
    try:
        for r in range(12):
            j = r % len(datas)
            h, w = refs[j].shape[:2]
            boxes = same_size_boxes(h, w, 32, seed=r)
            got, _ = batch(datas[j], boxes, threads=4)
            for k, (t, l, bh, bw) in enumerate(boxes):
                np.testing.assert_array_equal(got[k], refs[j][t:t + bh, l:l + bw])
    finally:
        stop.set()
        churner.join()
    assert _C._huffman_reader_stats()["coasted"] > coasted  # (rows were known and used meanwhile)


def coded_rows(rng, n: int, comps: int, extreme: bool = False) -> np.ndarray:
    """n row starts in order (offset, skip, 4 DC predictions), the predictions past ``comps`` 0:
    photo-like steps, or (extreme) steps over the whole range: 0, the largest offsets, int16's ends."""
    bits = np.cumsum(rng.integers(0, 1 << 31 if extreme else 1 << 16, n))
    if extreme:
        bits[-1] = (2**32 - 1) * 8 + 7  # the last bit a uint32 offset reaches
        bits = np.minimum(np.sort(bits), bits[-1])
    preds = rng.integers(-32768, 32768, (n, 4)) if extreme else np.cumsum(rng.integers(-60, 61, (n, 4)), axis=0)
    if extreme:
        preds[rng.random((n, 4)) < 0.3] = -32768
        preds[rng.random((n, 4)) < 0.3] = 32767
    preds[:, comps:] = 0
    return np.column_stack([bits >> 3, bits & 7, preds]).astype(np.int64)


@pytest.mark.parametrize("comps", [1, 3, 4])
@pytest.mark.parametrize("extreme", [False, True], ids=["photo", "extreme"])
def test_the_rows_compact_coding_gives_them_back_exactly(comps, extreme):
    """The index keeps rows as changes from the row before (varints); expanded, they are the rows
    recorded, whatever pieces the decodes appended them in, at int16's ends and uint32's last bit."""
    rng = np.random.default_rng(comps + 10 * extreme)
    for n in (1, 2, 7, 200):
        rows = coded_rows(rng, n, comps, extreme)
        for appends in ([], [1], sorted(int(a) for a in rng.integers(0, n + 1, 3))):
            got, size = _C._code_entropy_rows(rows, comps, appends)
            np.testing.assert_array_equal(got, rows)
            assert size <= n * (5 + 3 * comps)  # (a position's advance <= 5 bytes, a prediction's <= 3)
            if not extreme:
                assert size <= n * (3 + 2 * comps)


def test_the_rows_coding_refuses_what_a_decode_never_records():
    rows = coded_rows(np.random.default_rng(1), 10, 3)
    assert _C._code_entropy_rows(rows, 5, []) is None  # more predictions than a scan has
    back = rows.copy()
    back[6, :2] = back[5, :2]
    back[6, 1] -= 1  # a bit before its predecessor's
    if back[6, 1] < 0:
        back[6, 0] -= 1
        back[6, 1] = 7
    assert _C._code_entropy_rows(back, 3, []) is None
    assert _C._code_entropy_rows(back, 3, [6]) is None  # (refused in the second piece too)
    same = rows.copy()
    same[6, :2] = same[5, :2]  # the same position twice is a row the coding can hold
    assert _C._code_entropy_rows(same, 3, [3])[0].tolist() == same.tolist()


def test_coded_rows_that_no_append_made_are_refused_whole():
    """Expanding never trusts the bytes: a change past int16's range (which would overflow the sum),
    a varint past 64 bits, a truncated or overlong coding, or too few rows give None, not rows."""
    row = bytes([0x10, 0x0A])  # advance 16 bits, prediction +5
    assert _C._expand_entropy_rows(row, 1, 1).tolist() == [[2, 0, 5, 0, 0, 0]]
    huge = bytes([0xFE] + [0xFF] * 8 + [0x01])  # zigzag 2**64 - 2: a change of 2**63 - 1
    assert _C._expand_entropy_rows(row + b"\x00" + huge, 2, 1) is None
    assert _C._expand_entropy_rows(row + b"\x00" + bytes([0xFE, 0xFF, 0x07]), 2, 1) is None  # +65535: past 32767
    assert _C._expand_entropy_rows(bytes([0x80] * 9 + [0x7F]) + b"\x00", 1, 1) is None  # a 10th byte past bit 63
    assert _C._expand_entropy_rows(row[:1], 1, 1) is None  # truncated
    assert _C._expand_entropy_rows(row + b"\x00", 1, 1) is None  # a byte left over
    assert _C._expand_entropy_rows(row, 2, 1) is None  # a row missing
    for count in (2**24, 2**32 - 1):  # more rows than the bytes can code: refused before 256 MiB or 64 GiB is asked for
        assert _C._expand_entropy_rows(b"\x00\x00\x00", count, 3) is None
    assert _C._expand_entropy_rows(row, 1, 5) is None  # more predictions than a scan has
    assert _C._expand_entropy_rows(bytes([0x80, 0x00, 0x0A]), 1, 1).tolist() == [[0, 0, 5, 0, 0, 0]]  # (overlong: same value)
    rng = np.random.default_rng(3)
    for _ in range(3000):  # any bytes: rows that satisfy every bound, or None
        got = _C._expand_entropy_rows(rng.integers(0, 256, int(rng.integers(0, 40)), dtype=np.uint8).tobytes(),
                                      int(rng.integers(0, 8)), int(rng.integers(1, 5)))
        assert got is None or all(0 <= o < 2**32 and 0 <= sk < 8 and all(-32768 <= p < 32768 for p in ps)
                                  for o, sk, *ps in got)


def test_a_row_costs_a_few_bytes_in_the_index():
    """What a file's rows take, as the index counts it (its bound): about 6 bytes a row of an
    800x533 photo, where a checkpoint struct takes 16."""
    data = encode(photo(533, 800), quality=90)
    learn_down_to_the_bottom(data, 533, 800)
    s = gpupipe.entropy_index_stats()
    rows = -(-533 // 16)
    assert s["files"] == 1 and s["bytes"] <= 160 + 8 * rows, s


def test_the_bound_holds_and_zero_turns_it_off():
    datas = [encode(photo(64 + 8 * k, 96), quality=90) for k in range(12)]
    box = np.array([[63, 0, 1, 96]] * len(datas), dtype=np.int64)
    gpupipe.set_entropy_index_size(600)  # room for a couple of files' rows
    gpupipe.decode_crop_jpegs(datas, box, num_threads=1)
    s = gpupipe.entropy_index_stats()
    assert 0 < s["files"] < len(datas) and s["bytes"] <= 600 and s["full"] > 0, s
    for _ in range(3):  # the same files again: the index does not grow
        gpupipe.decode_crop_jpegs(datas, box, num_threads=1)
    assert gpupipe.entropy_index_stats()["bytes"] <= 600
    assert gpupipe.set_entropy_index_size(0) == 600
    s = gpupipe.entropy_index_stats()
    assert s["files"] == 0 and s["bytes"] == 0 and s["max_bytes"] == 0
    before = _C._huffman_reader_stats()
    gpupipe.decode_crop_jpegs(datas, box, num_threads=1)
    assert delta(before)["coasted"] == 0 and gpupipe.entropy_index_stats()["files"] == 0
    with pytest.raises(ValueError, match="non-negative int"):
        gpupipe.set_entropy_index_size(-1)


def test_a_decode_from_known_rows_is_cheaper():
    """Not a timing: the MCUs read. A crop at the bottom of a file whose rows are known passes none
    of the rows above it."""
    data = encode(photo(512, 512), quality=90)
    box = np.array([[480, 200, 32, 64]], dtype=np.int64)
    before = _C._huffman_reader_stats()
    crops(data, box)
    cold = delta(before)
    before = _C._huffman_reader_stats()
    crops(data, box)
    warm = delta(before)
    assert warm["decoded"] == cold["decoded"] and warm["coasted"] > 0
    assert warm["skipped"] < cold["skipped"] / 4, (cold, warm)


def _crops_in_child(data, boxes, queue):
    before = _C._huffman_reader_stats()["coasted"]
    got = gpupipe.decode_crop_jpegs([data] * len(boxes), boxes, num_threads=2)
    queue.put((got.images.permute(0, 2, 3, 1).numpy().tobytes(), _C._huffman_reader_stats()["coasted"] - before))


def test_a_forked_child_decodes_from_the_rows_its_parent_learned(variants):
    """The rows are valid in a forked child (the same bytes); the index's lock is taken around
    fork(), so a pool thread learning at that moment cannot leave it locked there."""
    data = variants["ycbcr-4:2:0"]
    h, w = full_decode(data).shape[:2]
    learn_down_to_the_bottom(data, h, w)
    boxes = same_size_boxes(h, w, 8, seed=17)
    expected, _ = batch(data, boxes, threads=2)
    pixels, coasted = in_forked_child(_crops_in_child, data, boxes)
    assert coasted > 0 and pixels == expected.tobytes()


def test_the_loaders_second_epoch_decodes_from_the_rows_its_first_learned(tmp_path):
    """The same batches as without the index, the rows found from the second epoch on, and the
    index's counts in stats()."""
    from loader_data import make_image_folder

    make_image_folder(tmp_path, per_class=8)

    def epochs():
        ld = gpupipe.Loader(gpupipe.sources.ImageFolder(tmp_path), batch_size=8, num_threads=2, seed=5,
                            crop=gpupipe.crops.RandomResizedCrop((24, 32)))
        out = []
        for e in range(3):
            ld.set_epoch(e)
            out.append([x.clone() for x, _ in ld])
        return out, ld.stats()

    with paused_index():
        ref, _ = epochs()
    got, st = epochs()
    assert all(torch.equal(a, b) for ea, eb in zip(ref, got) for a, b in zip(ea, eb))
    assert st["entropy_index"]["files"] > 0 and st["entropy_index"]["found"] > 0, st["entropy_index"]


def test_a_bad_size_in_the_environment_is_an_error_naming_it_until_a_size_is_set():
    run_child("""
        import numpy as np, pytest, gpupipe
        from helpers import encode, photo
        data = encode(photo(32, 32))
        box = np.array([[0, 0, 8, 8]], dtype=np.int64)
        for call in (lambda: gpupipe.decode_crop_jpegs([data], box), lambda: gpupipe.decode_crop_jpeg(data, 0, 0, 8, 8)):
            with pytest.raises(ValueError, match="GPUPIPE_ENTROPY_INDEX_MB must be a whole number of MiB.*'lots'"):
                call()
        assert gpupipe.entropy_index_stats()["max_bytes"] == 0
        gpupipe.set_entropy_index_size(1 << 20)
        assert gpupipe.decode_crop_jpegs([data], box).ok.all() and gpupipe.entropy_index_stats()["max_bytes"] == 1 << 20
        """, env={"GPUPIPE_ENTROPY_INDEX_MB": "lots"})
    out = run_child("""
        import gpupipe
        print(gpupipe.entropy_index_stats()["max_bytes"])
        """, env={"GPUPIPE_ENTROPY_INDEX_MB": "3"})
    assert out.stdout.strip() == str(3 << 20)


def test_a_buffer_refilled_during_a_decode_teaches_the_index_nothing():
    """A caller refilling its bytearray (the same size, other bytes) while a decode of it ran: the
    rows of the new bytes were learned under the old bytes' key, and every later decode of the old
    bytes, even from an immutable copy, gave other pixels. (Once in about 8 tries here, before.)"""
    import threading
    import time

    h, w = 1600, 2400
    x = encode(photo(h, w, "astronaut"), quality=95)
    sos = x.index(b"\xff\xda")
    start = sos + 2 + int.from_bytes(x[sos + 2:sos + 4], "big")
    y = bytearray(x)
    y[start + (len(x) - start) // 8] ^= 0x10  # an eighth into the entropy-coded data
    y = bytes(y)
    box = np.array([[h // 2, 0, 16, w]], dtype=np.int64)

    def crop(data):
        return gpupipe.decode_crop_jpegs([data], box, num_threads=1).images[0]

    with paused_index():
        want = crop(x)
    rng = np.random.default_rng(0)
    for attempt in range(120):
        _C.clear_entropy_index()
        buf = bytearray(x)
        delay = float(rng.uniform(0.0002, 0.0015))
        refill = threading.Thread(target=lambda: (time.sleep(delay), buf.__setitem__(slice(None), y)))
        refill.start()
        crop(buf)  # (its own pixels are the caller's race)
        refill.join()
        assert torch.equal(crop(x), want), f"attempt {attempt}: the index holds another file's rows for these bytes"
