"""Every ```python block of the README and docs/ runs, in order, one namespace per file, in a folder
holding small ``train/`` and ``val/`` ImageFolders. The blocks are run as written except for the
scale a test can afford, each rewrite listed in SCALE: CUDA devices become this machine's device,
epochs become 1, batches 4 images, workers and threads 2 at most. A block that stops running (a
missing import, a renamed argument) fails here."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch

import gpupipe
from helpers import encode, photo

ROOT = Path(__file__).resolve().parents[1]
DOCS = ["README.md"] + sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md"))
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

SCALE = [
    (r'device="cuda"', f'device="{DEVICE}"'),
    (r"\.cuda\(non_blocking=True\)", f'.to("{DEVICE}", non_blocking=True)'),
    (r"\.cuda\(\)", f'.to("{DEVICE}")'),
    (r"range\((?:90|600|epochs)\)", "range(1)"),
    (r"batch_size=\d+", "batch_size=4"),
    (r"num_workers=\d+", "num_workers=2"),
    (r"num_threads=\d+", "num_threads=2"),
]


def python_blocks(path: Path) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", path.read_text(), flags=re.S | re.M)


def at_test_scale(code: str) -> str:
    for pattern, replacement in SCALE:
        code = re.sub(pattern, replacement, code)
    return code


@pytest.fixture
def dataset_dir(tmp_path, monkeypatch):
    """train/ and val/: two classes of six 96x128 photos each; the blocks' relative paths land here."""
    pixels = photo(96, 128)
    for split in ("train", "val"):
        for c in range(2):
            (tmp_path / split / f"class{c}").mkdir(parents=True)
            for i in range(6):
                img = np.roll(pixels, 7 * i + 31 * c, axis=1)
                (tmp_path / split / f"class{c}" / f"{i}.jpg").write_bytes(encode(np.ascontiguousarray(img)))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_the_docs_with_examples_still_have_them():
    """Guards the block pattern itself: a change that matched nothing would run no example."""
    assert all(python_blocks(ROOT / doc) for doc in ["README.md", "docs/recipes.md", "docs/migrating.md"])


@pytest.mark.parametrize("doc", DOCS)
def test_the_docs_links_lead_somewhere(doc):
    """Every relative link (and image) of the README and docs/ names a file of the repository."""
    text = (ROOT / doc).read_text()
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    missing = [t for t in targets if "://" not in t and not ((ROOT / doc).parent / t).exists()]
    assert not missing, f"{doc} links to missing files: {missing}"


@pytest.mark.parametrize("doc", DOCS)
def test_the_docs_python_blocks_run(doc, dataset_dir):
    namespace: dict = {"__name__": "__docs__"}
    for k, block in enumerate(python_blocks(ROOT / doc)):
        try:
            exec(compile(at_test_scale(block), f"{doc} python block {k + 1}", "exec"), namespace)
        except Exception as e:
            raise AssertionError(f"{doc}, python block {k + 1} failed: {type(e).__name__}: {e}\n{block}") from e
    assert gpupipe.cpu_capability()["active"]  # the package is still importable and sane afterwards


def test_the_readme_quickstart_runs_verbatim(dataset_dir):
    """No rewrite at all: 90 epochs of the 12-image train/ folder, on whatever device this is."""
    quickstart = python_blocks(ROOT / "README.md")[0]
    namespace: dict = {"__name__": "__docs__"}
    exec(compile(quickstart, "README.md quickstart", "exec"), namespace)
    assert namespace["loader"].stats()["images"] == 12 and (dataset_dir / "loader.pt").exists()


@pytest.mark.parametrize("name", ["Loader", "decode_crop_jpeg", "decode_crop_jpegs", "prepare",
                                  "data.DecodeCropDataset", "augment.BatchAugment", "augment.warp_affine"])
def test_the_api_table_names_every_argument(name):
    """docs/api.md writes out the signatures of the main calls: each of their arguments is there."""
    import inspect
    obj = gpupipe
    for part in name.split("."):
        obj = getattr(obj, part)
    row = next(line for line in (ROOT / "docs/api.md").read_text().splitlines() if f"`{name}(" in line)
    missing = [p for p in inspect.signature(obj).parameters if p not in row]
    assert not missing, f"docs/api.md's row of {name} lacks {missing}"
