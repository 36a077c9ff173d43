"""What a benchmark reports: the environment (versions, CPU, cores, device), ``python -m gpupipe
info``, the results table, ``results.json`` and the plot (matplotlib optional)."""

from __future__ import annotations

import importlib.metadata
import json
import math
import os
import platform
import statistics
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

# Optional packages a user may want to see versions of: import name -> distribution names.
OPTIONAL = {"PIL": ("pillow",), "torchvision": ("torchvision",), "kornia": ("kornia",),
            "nvidia.dali": ("nvidia-dali-cuda120", "nvidia-dali-cuda130", "nvidia-dali-cuda110"),
            "skimage": ("scikit-image",), "matplotlib": ("matplotlib",), "tqdm": ("tqdm",),
            "simplejpeg": ("simplejpeg",), "spdl": ("spdl",)}


def _version(module: str) -> Optional[str]:
    """The version of an optional package without importing it (some take seconds): the imported
    module's ``__version__`` when already loaded (it tells CUDA builds apart), else the installed
    distribution's."""
    loaded = sys.modules.get(module)
    if loaded is not None and getattr(loaded, "__version__", None):
        return str(loaded.__version__)
    for dist in OPTIONAL.get(module, (module,)):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def libjpeg_turbo_version() -> str:
    """``"2.1.5"`` from the compiled module's ``LIBJPEG_TURBO_VERSION_NUMBER`` (2001005)."""
    from gpupipe import _C

    v = int(_C.libjpeg_turbo_version)
    return f"{v // 1000000}.{v // 1000 % 1000}.{v % 1000}"


def cpu_name() -> str:
    """The CPU's model name with its family and model numbers (a cloud VM may name only the vendor:
    "AMD EPYC (family 25 model 17)" is Zen 4)."""
    fields = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
                if not line.strip():
                    break
    except OSError:
        pass
    name = fields.get("model name") or platform.processor()
    if "cpu family" in fields and "model" in fields:
        name += f" (family {fields['cpu family']} model {fields['model']})"
    return name


def environment(threads: int) -> dict:
    """Versions, CPU, cores and device, saved with every result."""
    import numpy
    import torch

    import gpupipe

    env = {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu": cpu_name(),
        "cores_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "threads": threads,
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "numpy": numpy.__version__,
        "cuda_available": torch.cuda.is_available(),
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
        "gpupipe": gpupipe.__version__,
        # the instruction set each side's CPU kernels run at: ratios against torch differ by it
        "gpupipe_cpu_capability": gpupipe.cpu_capability()["active"],
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
    }
    env.update({module: _version(module) for module in OPTIONAL})
    env["libjpeg_turbo"] = gpupipe._C.libjpeg_turbo_version
    return env


def info() -> str:
    """The text of ``python -m gpupipe info``: versions, build, and what each backend needs here.

    Example:
        >>> from gpupipe.bench.report import info
        >>> "libjpeg-turbo" in info()
        True
    """
    import torch

    import gpupipe
    from gpupipe import _C
    from gpupipe.augment import cuda_kernel_available

    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none (torch.cuda.is_available() is False)"
    lines = [
        f"gpupipe {gpupipe.__version__} ({Path(gpupipe.__file__).parent})",
        f"libjpeg-turbo {libjpeg_turbo_version()} (libjpeg API {_C.jpeg_lib_version})",
        "CUDA kernels: " + ("built (gpupipe._C_cuda)" if cuda_kernel_available() else
                            "not built (no CUDA compiler when gpupipe was built)"),
        f"torch {torch.__version__}, CUDA device: {device}",
        f"CPU: {cpu_name()}, {environment(0)['cores_affinity']} cores available, "
        f"default decode threads {_C.default_num_threads()}",
        f"CPU kernels at {gpupipe.cpu_capability()['active']} (this CPU: {gpupipe.cpu_capability()['supported']}; "
        f"GPUPIPE_CPU_CAPABILITY lowers it), torch's at {torch.backends.cpu.get_cpu_capability()}",
        "",
        "| backend | available | devices | note |",
        "|---|---|---|---|",
    ]
    for name, b in gpupipe.backends_available().items():
        lines.append(f"| {name} | {'yes' if b['available'] else 'no'} | {', '.join(b['devices']) or '-'} | {b['reason']} |")
    present = [f"{OPTIONAL[m][0]} {v}" for m in OPTIONAL if (v := _version(m))]
    absent = [OPTIONAL[m][0] for m in OPTIONAL if not _version(m)]
    lines += ["", "optional packages: " + (", ".join(present) or "none")]
    if absent:
        lines.append("not installed: " + ", ".join(absent))
    return "\n".join(lines)


# --- results ---------------------------------------------------------------------------------------


@dataclass
class Result:
    """One pipeline's timed repeats: ``seconds[r]`` for ``images[r]`` images in ``batches`` batches
    of ``batch_size``; ``failed_samples[r]``: the samples of those batches that failed to decode and
    were left out of ``images[r]`` (None where the pipeline does not say)."""

    method: str
    note: str = ""
    seconds: list = field(default_factory=list)
    images: list = field(default_factory=list)
    waited: list = field(default_factory=list)  # seconds the consumer waited for batches, per repeat
    batches: int = 0
    skipped: Optional[str] = None
    batch_size: int = 0
    failed_samples: list = field(default_factory=list)

    def rates(self) -> list:
        return [n / s for n, s in zip(self.images, self.seconds) if s > 0]

    @property
    def images_per_s(self) -> float:
        return statistics.median(self.rates())

    @property
    def ms_per_batch(self) -> float:
        """Milliseconds per full batch: seconds per delivered image times the batch size, so that
        batches shortened by failed samples (or a stream's partial batches) do not look faster."""
        if not self.batch_size:
            return 1e3 * statistics.median(self.seconds) / self.batches
        return 1e3 * self.batch_size / self.images_per_s

    @property
    def failed(self) -> int:
        """Samples that failed to decode in the timed batches, all repeats (0 where unknown)."""
        return sum(n for n in self.failed_samples if n)

    @property
    def wait_fraction(self) -> float:
        return statistics.median(w / s for w, s in zip(self.waited, self.seconds))


def ratio(r: Result, baseline: Optional[Result]) -> Optional[float]:
    """Images/s of r over the baseline's (higher: r faster); None without a baseline."""
    if baseline is None or baseline.skipped or r.skipped:
        return None
    return r.images_per_s / baseline.images_per_s


def table(results: list, baseline: Optional[Result], step_ms: float = 0.0) -> str:
    """A markdown table: images/s (median, min-max), ms per batch, ratio to the baseline."""
    base = baseline.method if baseline else "baseline"
    head = f"| method | images/s (median) | min - max | ms/batch | vs {base} |"
    rule = "|---|---:|---:|---:|---:|"
    if step_ms:
        head, rule = head + " step waits for data |", rule + "---:|"
    out = [head, rule]
    for r in results:
        failed = f"{r.failed} samples failed to decode, not counted" if r.failed else ""
        note = "; ".join(filter(None, [r.note, failed]))
        name = f"{r.method} ({note})" if note else r.method
        if r.skipped:
            out.append(f"| {name} | skipped: {r.skipped} | | | |" + (" |" if step_ms else ""))
            continue
        q = ratio(r, baseline)
        row = (f"| {name} | {r.images_per_s:.0f} | {min(r.rates()):.0f} - {max(r.rates()):.0f} | "
               f"{r.ms_per_batch:.1f} | {'-' if q is None else f'{q:.2f}x'} |")
        out.append(row + (f" {100 * r.wait_fraction:.0f}% |" if step_ms else ""))
    return "\n".join(out)


def stage_table(stats: dict, batches: int) -> str:
    """The Loader's per-stage busy time and the consumer's wait, from ``Loader.stats()`` (read
    defensively: any stage names, any extra keys)."""
    wall = float(stats.get("wall_s") or 0.0)
    busy = stats.get("busy_s") or {}
    out = ["| Loader stage | busy s | ms/batch | % of wall |", "|---|---:|---:|---:|"]
    rows = [(str(k), float(v)) for k, v in busy.items() if isinstance(v, (int, float))]
    if isinstance(stats.get("wait_s"), (int, float)):
        rows.append(("consumer waited for a batch", float(stats["wait_s"])))
    for name, s in rows:
        share = f"{100 * s / wall:.0f}%" if wall > 0 else "-"
        out.append(f"| {name} | {s:.2f} | {1e3 * s / max(1, batches):.1f} | {share} |")
    pool, host = stats.get("decode_pool") or {}, stats.get("host_us_per_image")
    if isinstance(host, (int, float)) and isinstance(pool.get("utilisation"), (int, float)):
        out.append(f"\nhost CPU outside the decode pool: {host:.1f} us/image; decode pool ({pool.get('threads')} "
                   f"threads) busy {100 * pool['utilisation']:.0f}% of the time")
    shares, routes = stats.get("shares"), stats.get("routes") or {}
    if isinstance(shares, dict):  # the hybrid backend: how the last epoch split its batches
        split = ", ".join(f"{k} {100 * float(v):.0f}%" for k, v in shares.items())
        took = ", ".join(f"{k} {v}" for k, v in routes.items() if v)
        rates = ", ".join(f"{k} {float(e.get('images_per_s', 0)):.0f} img/s" for k, e in (stats.get("engines") or {}).items())
        lanes = ", ".join(f"{k} {v}" for k, v in (stats.get("calls_in_flight") or {}).items() if v != 1)
        failed = "; ".join(stats.get("lane_failures") or [])
        out.append(f"\nhybrid shares of the last epoch: {split}; samples by route: {took}" + (f"; GPU engines alone: {rates}" if rates else "")
                   + (f"; calls in flight: {lanes}" if lanes else "") + (f"; {failed}" if failed else "") + _engine_apis())
    return "\n".join(out)


def _engine_apis() -> str:
    """"; nvImageCodec's API: hardware C, cuda C" for the engines this process started ("" if none)."""
    from gpupipe._backends import nvimgcodec

    said = [f"{e.kind} {e.api}" + (f" ({e.native_reason})" if e.native_reason else "") for e in nvimgcodec.started_engines()]
    return f"; nvImageCodec's API: {', '.join(said)}" if said else ""


def save_json(path: Path, *, args: dict, env: dict, data: dict, recipe: dict, results: list, baseline: Optional[Result],
              loader_stats: Optional[dict], fed_ms: Optional[float], batch_size: int) -> None:
    def row(r: Result) -> dict:
        d = asdict(r)
        if not r.skipped:
            d.update(images_per_s=r.images_per_s, ms_per_batch=r.ms_per_batch, ratio_vs_baseline=ratio(r, baseline))
        return d

    doc = {
        "args": args, "environment": env, "data": data, "recipe": recipe,
        "baseline": baseline.method if baseline else None,
        "results": [row(r) for r in results],
        "loader_stats": loader_stats,  # the Loader's timed batches, every repeat's added up
        "gpu_fed_down_to_ms_per_step": fed_ms, "batch_size": batch_size,
    }
    write_json(path, doc)


def write_json(path: Path, doc) -> None:
    """``doc`` as strict JSON (no NaN or Infinity, which most JSON readers refuse): non-finite
    numbers become null, unknown value types strings."""
    path.write_text(json.dumps(jsonable(doc), indent=2, allow_nan=False))


def jsonable(x):
    """``x`` (Loader.stats(), results) as JSON values: unknown value types become strings rather
    than failing the run, non-finite floats None."""
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    return str(x)


def output_folder(path: Path, option: str = "--out") -> Path:
    """Creates ``path`` (a folder, parents too) and checks that files can be written in it, before
    anything is measured: a run must not end in a traceback after its measurements. Raises
    ValueError with one line naming ``option`` otherwise."""
    from gpupipe.prepare import writable_folder

    try:
        return writable_folder(path, option)
    except OSError as e:
        raise ValueError(str(e)) from None


def plot(path: Path, results: list, baseline: Optional[Result], title: str, loader_stats: Optional[dict]) -> Optional[str]:
    """Images/s per pipeline (median, min-max) and the Loader's stage times; returns why no plot
    was written (matplotlib missing), else None."""
    try:
        import matplotlib
    except ImportError:
        return "matplotlib is not installed (pip install matplotlib): no plot"
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    live = [r for r in results if not r.skipped]
    busy = {k: float(v) for k, v in ((loader_stats or {}).get("busy_s") or {}).items() if isinstance(v, (int, float))}
    fig, axes = plt.subplots(1, 2 if busy else 1, figsize=(13 if busy else 7.5, 0.6 * max(3, len(live)) + 1.2),
                             squeeze=False)
    ax = axes[0, 0]
    med = [r.images_per_s for r in live]
    err = [[m - min(r.rates()) for m, r in zip(med, live)], [max(r.rates()) - m for m, r in zip(med, live)]]
    ax.barh([r.method for r in live], med, xerr=err, capsize=3,
            color=["tab:green" if r.method.startswith("gpupipe") else "tab:gray" for r in live])
    ax.invert_yaxis()
    ax.set_xlabel("images / s (median, min-max)")
    for i, r in enumerate(live):
        q = ratio(r, baseline)
        ax.text(med[i], i, f" {med[i]:.0f}" + (f" ({q:.2f}x)" if q is not None else ""), va="center", fontsize=8)
    if busy:
        ax2 = axes[0, 1]
        ax2.barh(list(busy), list(busy.values()), color="tab:green")
        ax2.invert_yaxis()
        ax2.set_xlabel("gpupipe Loader: busy seconds per stage (stages overlap)")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return None


__all__ = ["Result", "environment", "info", "jsonable", "libjpeg_turbo_version", "output_folder", "plot", "ratio",
           "save_json", "stage_table", "table", "write_json"]
