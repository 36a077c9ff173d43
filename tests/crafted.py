"""Crafted hostile files, each reproducing a report of the reliability issue (shared by the tests and
the fuzz corpora: tests/fuzz/make_corpus.py)."""

from __future__ import annotations

import struct
from typing import Optional

import numpy as np

from gpupipe import _C


def _segments(data: bytes):
    """(offset, marker) of the marker segments up to and including SOS."""
    i, out = 2, []
    while i + 4 <= len(data):
        m = data[i + 1]
        out.append((i, m))
        if m == 0xDA:
            break
        i += 2 + struct.unpack(">H", data[i + 2:i + 4])[0]
    return out


def sos_offset(data: bytes) -> int:
    return next(i for i, m in _segments(data) if m == 0xDA)


def gray_restart_jpeg(height: int = 64, width: int = 64, seed: int = 0) -> bytes:
    """A gray baseline JPEG with a restart marker every MCU row (DRI)."""
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width), dtype=np.uint8)
    return _C.encode_jpeg(pixels.tobytes(), height, width, 1, colorspace="gray", restart_rows=1)


def restart_walk_heap_overflow() -> bytes:
    """The 65 KB file of report 1: a standalone ``FF D0`` just before SOS makes a marker walk that
    reads every marker as having a length jump 0xFFDA bytes ahead, onto a planted
    ``FF C0 00 02 FF DA 00 02`` (an SOF and an SOS of length 2), followed by well-numbered restart
    markers and EOI, so that the walk "succeeds" with an SOF whose patch lands past the header
    copy: a one-byte heap write in the old build_sub_jpeg."""
    base = gray_restart_jpeg()
    sos = sos_offset(base)
    sos_len = struct.unpack(">H", base[sos + 2:sos + 4])[0]
    head = base[:sos] + b"\xff\xd0" + base[sos:sos + 2 + sos_len]
    rst = len(base[:sos])  # offset of the inserted FF D0
    landing = rst + 2 + 0xFFDA
    body = bytearray(head)
    body += b"\x00" * (landing - len(body))
    body += b"\xff\xc0\x00\x02\xff\xda\x00\x02"
    intervals = 64 // 8  # MCU rows of the 64x64 gray image, one interval each
    for k in range(intervals - 1):
        body += b"\x00\x00" + bytes([0xFF, 0xD0 + k % 8])
    body += b"\x00\xff\xd9"
    return bytes(body)


def restart_walk_garbage() -> bytes:
    """The small variant of report 1: ``FF D0 00 20`` and 30 bytes of garbage before SOS, which
    libjpeg skips (with a warning) but a length-reading walk takes for a 32-byte segment."""
    base = gray_restart_jpeg()
    sos = sos_offset(base)
    return base[:sos] + b"\xff\xd0\x00\x20" + bytes(range(1, 31)) + base[sos:]


def huge_declared_size(height: int = 30000, width: int = 30000) -> bytes:
    """A small valid-looking JPEG whose SOF claims height x width (report 2: 631 bytes)."""
    small = _C.encode_jpeg(bytes(8 * 8 * 3), 8, 8, 3, quality=50)
    b = bytearray(small)
    for i, m in _segments(small):
        if m in (0xC0, 0xC1, 0xC2):
            b[i + 5:i + 9] = struct.pack(">HH", height, width)
    return bytes(b)


def exif_app1(orientation: int) -> bytes:
    """An APP1 EXIF segment (big-endian TIFF) holding only the Orientation tag."""
    tiff = b"MM\x00\x2a" + struct.pack(">I", 8) + struct.pack(">H", 1)
    tiff += struct.pack(">HHIHH", 0x0112, 3, 1, orientation, 0) + struct.pack(">I", 0)
    payload = b"Exif\x00\x00" + tiff
    return b"\xff\xe1" + struct.pack(">H", len(payload) + 2) + payload


def xmp_app1(orientation: Optional[int] = None) -> bytes:
    """An APP1 XMP packet, with ``tiff:Orientation`` when given."""
    tag = b"" if orientation is None else b' tiff:Orientation="%d"' % orientation
    payload = b"http://ns.adobe.com/xap/1.0/\x00" + b'<x:xmpmeta xmlns:x="adobe:ns:meta/"%s></x:xmpmeta>' % tag
    return b"\xff\xe1" + struct.pack(">H", len(payload) + 2) + payload


def exif_app1_values_after(orientation: int) -> bytes:
    """An APP1 EXIF segment whose Orientation tag holds 3 LONGs, stored after the IFD (at an offset)."""
    tiff = b"II*\x00" + struct.pack("<I", 8) + struct.pack("<H", 1)
    tiff += struct.pack("<HHII", 0x0112, 4, 3, 26) + struct.pack("<I", 0) + struct.pack("<III", orientation, 1, 1)
    payload = b"Exif\x00\x00" + tiff
    return b"\xff\xe1" + struct.pack(">H", len(payload) + 2) + payload


def with_app1s(jpeg: bytes, *segments: bytes) -> bytes:
    """The JPEG with APP1 segments inserted right after SOI (report 6: XMP before EXIF)."""
    return jpeg[:2] + b"".join(segments) + jpeg[2:]


def incomplete_progressive(progressive: bytes, drop_scans: int = 2) -> bytes:
    """A progressive JPEG without its last scans: valid, decoded without a warning, but its missing
    coefficient bits are smoothed over by libjpeg's decoder (found by the transcode fuzzer: such a
    file cannot be transcoded to baseline losslessly)."""
    cut = len(progressive) - 2
    for _ in range(drop_scans):
        cut = progressive.rfind(b"\xff\xda", 0, cut)
    return progressive[:cut] + b"\xff\xd9"


def without_segments(jpeg: bytes, marker: int) -> bytes:
    """The JPEG with every header segment of one marker type removed (e.g. 0xC4: an "abbreviated"
    file whose Huffman tables must come from elsewhere; libjpeg-turbo then uses the standard ones)."""
    out, last = bytearray(), 0
    for i, m in _segments(jpeg):
        if m == marker:
            out += jpeg[last:i]
            last = i + 2 + struct.unpack(">H", jpeg[i + 2:i + 4])[0]
    return bytes(out + jpeg[last:])


def tar_member(name: str, payload: bytes) -> bytes:
    """One regular member of a tar archive: its header and its data padded to whole blocks."""
    import io
    import tarfile

    info = tarfile.TarInfo(name)
    info.size = len(payload)
    return info.tobuf(tarfile.GNU_FORMAT) + payload + bytes(-len(payload) % 512)


def sparse_tar_member(name: str, claimed_size: int, stored: bytes = b"\xff\xd8" + bytes(510)) -> bytes:
    """A GNU sparse member (type 'S') storing ``stored`` at offset 0 of a file claiming
    ``claimed_size`` bytes: tarfile expands it with zeros to the claimed size (report 3)."""
    import tarfile

    info = tarfile.TarInfo(name)
    info.size = len(stored)
    header = bytearray(info.tobuf(tarfile.GNU_FORMAT))
    header[156:157] = tarfile.GNUTYPE_SPARSE
    header[386:410] = tarfile.itn(0, 12, tarfile.GNU_FORMAT) + tarfile.itn(len(stored), 12, tarfile.GNU_FORMAT)
    header[482] = 0  # no extended sparse headers
    header[483:495] = tarfile.itn(claimed_size, 12, tarfile.GNU_FORMAT)
    header[148:156] = b" " * 8
    header[148:156] = b"%06o\0 " % sum(header)
    return bytes(header) + stored + bytes(-len(stored) % 512)


def tar_end() -> bytes:
    return bytes(1024)


def big_tiff(width: int = 32, height: int = 16, damaged: bool = True) -> bytes:
    """A little-endian BigTIFF (magic ``II+``), 8-bit gray, one deflate strip, its compressed data
    damaged: libtiff decodes it and reports the damage on stderr (report 6)."""
    import zlib

    pixels = bytes((x * 7 + y * 3) % 256 for y in range(height) for x in range(width))
    strip = bytearray(zlib.compress(pixels))
    if damaged:
        for k in range(2, len(strip) - 4):
            strip[k] ^= 0x5A
    entries = [(256, 4, width), (257, 4, height), (258, 3, 8), (259, 3, 8), (262, 3, 1), (273, 16, 0),
               (277, 3, 1), (278, 4, height), (279, 16, len(strip))]
    ifd_at = 16
    data_at = ifd_at + 8 + 20 * len(entries) + 8
    ifd = struct.pack("<Q", len(entries))
    for tag, kind, value in entries:
        ifd += struct.pack("<HHQQ", tag, kind, 1, data_at if tag == 273 else value)
    ifd += struct.pack("<Q", 0)
    return b"II+\x00" + struct.pack("<HHQ", 8, 0, ifd_at) + ifd + bytes(strip)


def tiff_with_other_magic(tiff: bytes) -> bytes:
    """A TIFF whose magic has its version bytes swapped (``II\\0*``), which Pillow still opens and
    libtiff refuses, saying so on stderr (report 6)."""
    return (b"II\x00*" if tiff[:2] == b"II" else b"MM*\x00") + tiff[4:]


__all__ = ["gray_restart_jpeg", "restart_walk_heap_overflow", "restart_walk_garbage", "huge_declared_size",
           "exif_app1", "xmp_app1", "exif_app1_values_after", "with_app1s", "sos_offset", "without_segments",
           "incomplete_progressive", "big_tiff", "tiff_with_other_magic", "tar_member", "sparse_tar_member",
           "tar_end"]


# --- a baseline gray JPEG written from its quantised coefficients, with any Huffman tables ---------

ZIGZAG = np.array([0, 1, 8, 16, 9, 2, 3, 10, 17, 24, 32, 25, 18, 11, 4, 5, 12, 19, 26, 33, 40, 48, 41, 34, 27, 20, 13,
                   6, 7, 14, 21, 28, 35, 42, 49, 56, 57, 50, 43, 36, 29, 22, 15, 23, 30, 37, 44, 51, 58, 59, 52, 45,
                   38, 31, 39, 46, 53, 60, 61, 54, 47, 55, 62, 63])


def _size(v: int) -> int:
    return int(abs(int(v))).bit_length()


def block_symbols(block: np.ndarray) -> list:
    """The AC symbols ((run << 4) | size, value) of one block in zigzag order, as an encoder writes
    them: ZRL for 16 zeros, EOB after the last nonzero coefficient unless it is the 63rd."""
    out, run = [], 0
    last = max([k for k in range(1, 64) if block[k]], default=0)
    for k in range(1, last + 1):
        v = int(block[k])
        if v == 0:
            run += 1
            continue
        while run > 15:
            out.append((0xF0, 0))
            run -= 16
        out.append((run << 4 | _size(v), v))
        run = 0
    if last < 63:
        out.append((0x00, 0))
    return out


def random_huffman_table(symbols, rng: np.random.Generator, first=()) -> tuple:
    """(bits[1..16], huffval): a valid prefix code over ``symbols`` whose lengths are drawn at random,
    the shortest most often on the symbols of ``first`` (in that order), then on any (1-bit codes
    included; never the all-ones code)."""
    first = [int(s) for s in first if s in set(symbols)]
    symbols = first + [int(s) for s in rng.permutation(sorted(set(symbols) - set(first)))]
    budget, lengths = 1 << 16, []  # in units of 2^-16
    for i, _ in enumerate(symbols):
        rest = len(symbols) - i - 1
        fits = [n for n in range(1, 17) if budget - (1 << (16 - n)) >= rest + 1]
        n = int(rng.choice(fits[:2] if i < len(first) else fits[:max(1, len(fits) // 2)] if rng.random() < 0.6 else fits))
        lengths.append(n)
        budget -= 1 << (16 - n)
    order = sorted(range(len(symbols)), key=lambda i: lengths[i])
    bits = [0] * 16
    for i in order:
        bits[lengths[i] - 1] += 1
    return bits, [symbols[i] for i in order]


def _codes(table: tuple) -> dict:
    bits, values = table
    codes, code, k = {}, 0, 0
    for n in range(1, 17):
        for _ in range(bits[n - 1]):
            codes[values[k]] = (code, n)
            code, k = code + 1, k + 1
        code <<= 1
    return codes


def gray_jpeg_from_coefficients(blocks: np.ndarray, height: int, width: int, dc_table: tuple, ac_table: tuple) -> bytes:
    """A baseline gray JPEG (quantisers 1) of ``blocks`` ([rows * cols, 64] quantised coefficients
    in natural order, DC as values, not differences) coded with the given (bits, huffval) tables."""
    dc_codes, ac_codes = _codes(dc_table), _codes(ac_table)
    acc, nacc, out, pred = 0, 0, bytearray(), 0

    def put(value: int, n: int):
        nonlocal acc, nacc
        acc, nacc = acc << n | (value & ((1 << n) - 1)), nacc + n
        while nacc >= 8:
            byte = acc >> (nacc - 8) & 0xFF
            out.append(byte)
            if byte == 0xFF:
                out.append(0)
            nacc -= 8
            acc &= (1 << nacc) - 1

    def put_value(v: int, size: int):
        if size:
            put(v if v > 0 else v + (1 << size) - 1, size)

    for block in blocks:
        zz = np.asarray(block)[ZIGZAG]
        diff = int(zz[0]) - pred
        pred = int(zz[0])
        put(*dc_codes[_size(diff)])
        put_value(diff, _size(diff))
        for sym, v in block_symbols(zz):
            put(*ac_codes[sym])
            put_value(v, sym & 15)
    if nacc:
        put((1 << (8 - nacc)) - 1, 8 - nacc)
    return gray_jpeg_with_entropy(height, width, dc_table, ac_table, bytes(out))


def gray_jpeg_with_entropy(height: int, width: int, dc_table: tuple, ac_table: tuple, entropy: bytes) -> bytes:
    """A baseline gray JPEG (quantisers 1) whose scan is ``entropy`` (stuffed), coded with the given
    (bits, huffval) tables, then EOI."""
    def segment(marker: int, payload: bytes) -> bytes:
        return struct.pack(">BBH", 0xFF, marker, len(payload) + 2) + payload

    def dht(cls: int, table: tuple) -> bytes:
        return segment(0xC4, bytes([cls << 4]) + bytes(table[0]) + bytes(table[1]))

    return (b"\xff\xd8" + segment(0xDB, bytes([0]) + bytes([1] * 64))
            + segment(0xC0, struct.pack(">BHHB", 8, height, width, 1) + bytes([1, 0x11, 0]))
            + dht(0, dc_table) + dht(1, ac_table) + segment(0xDA, bytes([1, 1, 0x00, 0, 63, 0]))
            + entropy + b"\xff\xd9")


def random_coefficient_blocks(rng: np.random.Generator, count: int, favour=()) -> np.ndarray:
    """[count, 64] quantised coefficient blocks (natural order) of every shape: empty, a few, long
    zero runs (ZRL), full to the 63rd; magnitudes of sizes 1-15 (beyond 10 only in files no 8-bit
    encoder writes, as libjpeg decodes them), each block favouring a few (half of the blocks those
    of ``favour``)."""
    blocks = np.zeros((count, 64), np.int64)
    for b in blocks:
        b[0] = rng.integers(-1024, 1024)
        n = [0, int(rng.integers(1, 6)), int(rng.integers(6, 40)), 63][int(rng.integers(0, 4))]
        sizes = list(favour) if favour and rng.random() < 0.5 else rng.choice(np.arange(1, 16), size=3)
        for k in rng.choice(np.arange(1, 64), size=n, replace=False):
            s = int(rng.choice(sizes))
            b[ZIGZAG[k]] = int(rng.integers(1 << (s - 1), 1 << s)) * (1 if rng.random() < 0.5 else -1)
    return blocks


def gray_jpeg_with_random_tables(seed: int, height: int = 48, width: int = 72, short=()) -> bytes:
    """A gray JPEG (dimensions multiples of 8) of random coefficient blocks coded with random
    Huffman tables (:func:`random_huffman_table`); ``short``: magnitude sizes whose AC symbols get
    the shortest codes, in that order, and that half of the blocks are made of."""
    rng = np.random.default_rng([seed, 0x4A50])
    blocks = random_coefficient_blocks(rng, (height // 8) * (width // 8), favour=short)
    zz = blocks[:, ZIGZAG]
    dc = {_size(d) for d in np.diff(zz[:, 0], prepend=0)}
    ac = {s for b in zz for s, _ in block_symbols(b)}
    first = [int(rng.choice([s for s in ac if s & 15 == size] or [0])) for size in short]
    return gray_jpeg_from_coefficients(blocks, height, width, random_huffman_table(dc, rng),
                                       random_huffman_table(ac, rng, first))
