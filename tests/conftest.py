"""Fixtures: real photos (scikit-image's bundled samples) re-encoded as every JPEG variant the decoder
must handle, at sizes that are not multiples of 8 or 16. The helpers they use live in helpers.py
(test modules import that, never this file)."""

from __future__ import annotations

import numpy as np
import pytest

from helpers import make_variants, photo

# tests/fuzz/ holds the fuzz harnesses' Python (the atheris harness, the corpus writer): scripts that
# tests/test_fuzz.py and csrc/fuzz/run.sh run, not test modules (--doctest-modules would import them).
collect_ignore = ["fuzz"]


@pytest.fixture(scope="session")
def pixels() -> np.ndarray:
    return photo()


@pytest.fixture(scope="session")
def variants(pixels) -> dict[str, bytes]:
    return make_variants(pixels)


@pytest.fixture(scope="session")
def jpeg(variants) -> bytes:
    return variants["ycbcr-4:2:0"]
