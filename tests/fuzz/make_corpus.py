"""Seed corpora of the fuzz harnesses: every JPEG variant of the test suite, restart-marker files
and the crafted files of the reliability reports (tests/crafted.py), each behind the parameter
prefixes of a harness.

    python tests/fuzz/make_corpus.py OUT_DIR   # writes OUT_DIR/{decode,transcode,restart,api}/
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))  # tests/: crafted, helpers

import crafted  # noqa: E402
from helpers import encode, make_variants, photo  # noqa: E402

from gpupipe.prepare import prepare_bytes  # noqa: E402

PREFIXES = {
    "decode": [bytes([0, 0, 255, 255, 0, 0, 0, 0]), bytes([7, 9, 20, 30, 1, 5, 5, 3]), bytes([3, 5, 40, 40, 24, 16, 16, 9]),
               bytes([1, 2, 3, 4, 12, 40, 20, 200])],
    "transcode": [bytes([0, 8]), bytes([1, 0]), bytes([2, 5])],
    "restart": [bytes([0, 64, 0, 64, 0, 0, 0, 7, 0, 0, 0, 0]), bytes([0, 0, 0, 0, 0, 1, 1, 0, 0, 3, 1, 0x21]),
                bytes([0, 64, 0, 64, 0, 0, 0, 0, 1, 2, 0, 0x13])],
    "api": [bytes([0, 0, 0, 0, 0, 0, 0, 0]), bytes([9, 3, 200, 17, 5, 64, 2, 130])],
}


def files() -> dict:
    out = make_variants(photo(37, 53))
    out.update({f"prepared-{k}": prepare_bytes(v) for k, v in list(out.items())[:4]})
    out.update({f"rows-{k}": prepare_bytes(v, restart_mcus=0) for k, v in list(out.items())[:2]})
    out["gray-restart"] = crafted.gray_restart_jpeg()
    out["restart-walk-heap-overflow"] = crafted.restart_walk_heap_overflow()
    out["restart-walk-garbage"] = crafted.restart_walk_garbage()
    out["huge-declared-size"] = crafted.huge_declared_size()
    jpeg = out["ycbcr-4:2:0"]
    out["truncated"] = jpeg[: len(jpeg) * 2 // 3]
    out["xmp-then-exif"] = crafted.with_app1s(jpeg, crafted.xmp_app1(), crafted.exif_app1(6))
    out["xmp-orientation"] = crafted.with_app1s(jpeg, crafted.xmp_app1(8))
    out["exif-values-after-the-ifd"] = crafted.with_app1s(jpeg, crafted.exif_app1_values_after(3))
    out["progressive-large"] = encode(photo(96, 128, "coffee"), progressive=True)
    out["progressive-missing-scans"] = crafted.incomplete_progressive(out["progressive-large"])
    out["no-huffman-tables"] = crafted.without_segments(jpeg, 0xC4)
    for seed in range(3):  # codes of any length on any symbol (the Huffman reader's tables)
        out[f"random-huffman-tables-{seed}"] = crafted.gray_jpeg_with_random_tables(seed, short=(7, 1) if seed else ())
    return out


def main(folder: str) -> None:
    data = files()
    for harness, prefixes in PREFIXES.items():
        d = os.path.join(folder, harness)
        os.makedirs(d, exist_ok=True)
        for name, payload in data.items():
            for k, prefix in enumerate(prefixes):
                with open(os.path.join(d, f"{name}-{k}"), "wb") as f:
                    f.write(prefix + payload)
    print(f"{len(data)} files x {sum(map(len, PREFIXES.values()))} prefixes in {folder}")


if __name__ == "__main__":
    main(sys.argv[1])
