"""Seed corpus for the fuzz harness: every JPEG variant of the test suite, restart-marker files,
with assorted 8-byte parameter prefixes."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests"))

from conftest import make_variants, photo  # noqa: E402

from gpupipe.prepare import prepare_bytes  # noqa: E402


def main(folder: str) -> None:
    os.makedirs(folder, exist_ok=True)
    files = make_variants(photo(37, 53))
    files.update({f"prepared-{k}": prepare_bytes(v) for k, v in list(files.items())[:4]})
    files.update({f"rows-{k}": prepare_bytes(v, restart_mcus=0) for k, v in list(files.items())[:2]})
    params = [bytes([0, 0, 255, 255, 0, 0, 0, 0]), bytes([7, 9, 20, 30, 1, 5, 5, 3]), bytes([3, 5, 40, 40, 24, 16, 16, 9]),
              bytes([1, 2, 3, 4, 12, 40, 20, 200])]
    for name, data in files.items():
        for k, prefix in enumerate(params):
            with open(os.path.join(folder, f"{name}-{k}"), "wb") as f:
                f.write(prefix + data)
    print(f"{len(files) * len(params)} corpus files in {folder}")


if __name__ == "__main__":
    main(sys.argv[1])
