"""Memory under hostile input: 100,000 decodes, half of them corrupt (truncated, garbage, bad
headers, 12-bit), single op and batches; reports RSS growth after a warm-up (target < 5 MB).

    python -m benchmarks.memory [--decodes 100000]
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
import warnings

import numpy as np

import gpupipe
from benchmarks import datasets


def rss_mb() -> float:
    """This process's VmRSS in MB; an error where /proc has none (a growth of 0 would pass)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("/proc/self/status has no VmRSS line: this benchmark reads the resident memory there")


def main(argv=None) -> float:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--decodes", type=int, default=100_000)
    args = ap.parse_args(argv)
    good = datasets.load_set("seed", progress=False)[:8]
    bad = [good[0][: len(good[0]) // 2], good[1][:300], b"\xff\xd8\xff\xdb" + bytes(70), b"not an image",
           good[2][:200] + bytes(5000)]
    sof = bytearray(good[3])
    i = sof.find(b"\xff\xc0")
    sof[i + 4] = 12
    bad.append(bytes(sof))
    rng = np.random.default_rng(0)

    def run(n: int):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", gpupipe.JpegWarning)
            for k in range(n // 2):
                data = good[k % len(good)] if k % 2 else bad[k // 2 % len(bad)]
                try:
                    gpupipe.decode_crop_jpeg(data, int(rng.integers(0, 277)), int(rng.integers(0, 544)), 256, 256)
                except (gpupipe.JpegError, ValueError):
                    pass
            for k in range(n // 2 // 16):  # the same again through the batch engine, 16 at a time
                datas = [good[j % len(good)] if j % 2 else bad[j % len(bad)] for j in range(k, k + 16)]
                gpupipe.decode_crop_jpegs(datas, np.array([[10, 10, 64, 64]] * 16), on_error="skip", num_threads=2)

    run(10_000)
    gc.collect()
    before = rss_mb()
    t0 = time.perf_counter()
    run(args.decodes)
    gc.collect()
    growth = rss_mb() - before
    print(f"{args.decodes} decodes (half corrupt) in {time.perf_counter() - t0:.1f}s: RSS {before:.1f} MB -> "
          f"{before + growth:.1f} MB, growth {growth:+.2f} MB (target < 5 MB)")
    return growth


if __name__ == "__main__":
    sys.exit(0 if main() < 5.0 else 1)
