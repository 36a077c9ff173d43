"""Atheris harness over gpupipe's public Python API: ``read_header``, ``decode_crop_jpeg`` and
``decode_crop_jpegs`` with fuzzed boxes (inside, outside, fractional), sizes, modes, strictness and
thread counts, and ``prepare_bytes``. Invariants: only the documented exceptions (a
``gpupipe.JpegError`` subclass or ``ValueError``), outputs of the documented shape and dtype, a
batch with ``on_error="skip"`` never raises for bad data, and a transcode never changes pixels.
Input layout: 8 parameter bytes, then the file.

    python tests/fuzz/fuzz_api.py CORPUS_DIR [-atheris_runs=N] [libFuzzer flags]
"""

import inspect
import sys
import warnings

import atheris
import numpy as np

import gpupipe
from gpupipe.prepare import prepare_bytes

ERRORS = (gpupipe.JpegError, ValueError)


def instrument(package: str = "gpupipe") -> int:
    """Coverage feedback for the package's Python code: atheris' import hook does not rewrite
    modules loaded through an editable install's finder, so every function and method defined in
    the package is instrumented in place (its code object swapped). Returns how many."""
    count = 0
    for name, module in list(sys.modules.items()):
        if module is None or not (name == package or name.startswith(package + ".")):
            continue
        for obj in list(vars(module).values()):
            members = [obj] if inspect.isfunction(obj) else list(vars(obj).values()) if inspect.isclass(obj) else []
            for f in members:
                if inspect.isfunction(f) and f.__module__ == name and not getattr(f, "_atheris", False):
                    f.__code__ = atheris.instrument_func(f).__code__
                    f._atheris = True
                    count += 1
    return count


def check_crop(x, size, box, mode):
    channels = 1 if mode == "gray" else 3
    expected = (channels, *size) if size is not None else (channels, box[2], box[3])
    if tuple(x.shape) != expected or x.dtype.is_floating_point:
        raise AssertionError(f"crop of shape {tuple(x.shape)} {x.dtype}, expected {expected}")


@atheris.instrument_func
def one_input(buf: bytes) -> None:
    if len(buf) < 8:
        return
    p, data = buf[:8], buf[8:]
    try:
        info = gpupipe.read_header(data)
        h, w = info.height, info.width
    except gpupipe.JpegError:
        h, w = 64, 64
    # Boxes mostly inside the image, sometimes outside or fractional (with a resize).
    box = [p[0] % h, p[1] % w, 1 + p[2] % h, 1 + p[3] % w]
    if p[7] & 8:
        box[2] += p[5] % 7  # may run past the edge
    mode = "gray" if p[4] & 1 else "rgb"
    strict = bool(p[4] & 2)
    size = (1 + p[5] % 40, 1 + p[6] % 40) if p[4] & 4 else None
    if size is not None and p[4] & 8:
        box = [box[0] + (p[6] & 3) / 4, box[1], box[2] - (p[6] & 3) / 8, box[3]]
    window = size is not None and bool(p[4] & 32)
    oriented = bool(p[4] & 64)
    try:
        check_crop(gpupipe.decode_crop_jpeg(data, *box, mode=mode, strict=strict, size=size, window=window,
                                            dct_scaling=bool(p[4] & 16), apply_exif_orientation=oriented),
                   size, box, mode)
    except ERRORS:
        pass
    if size is None:  # a crop batch: every box of one size
        boxes = np.array([box, box], dtype=np.int64)
        expected = (int(box[2]), int(box[3]))
    else:
        boxes = np.array([box, [0, 0, 1, 1]], dtype=np.float64)
        expected = size
    batch = gpupipe.decode_crop_jpegs([data, data[: len(data) // 2]], boxes, size=size, window=window, mode=mode,
                                      strict=strict, on_error="skip", num_threads=1 + p[7] % 2,
                                      apply_exif_orientation=oriented)
    if tuple(batch.images.shape[2:]) != expected or len(batch.ok) != 2:
        raise AssertionError("batch of the wrong shape")
    if p[7] & 4:
        try:
            prepared = prepare_bytes(data)  # verifies pixel identity itself (RuntimeError if not)
        except ERRORS:
            return
        if gpupipe.read_header(prepared).restart_interval < 1:
            raise AssertionError("a prepared file without restart markers")


def main() -> None:
    gpupipe.set_limits(max_pixels=1 << 20, max_memory=256 << 20)  # single inputs stay fast
    warnings.simplefilter("ignore")  # JpegWarning is documented behaviour, not a finding
    instrument()
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
