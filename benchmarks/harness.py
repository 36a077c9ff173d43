"""Timing and reporting shared by the benchmarks: peers side by side in one process, warm-up,
round-robin repeats (so drift on a shared machine hits every method alike), medians and spread.

``run_side_by_side`` times calls (a decode, an augmentation). Input pipelines (the Loader, a
DataLoader, DALI, SPDL) are the installed bench's runners timed by its ``measure``
(``gpupipe.bench.run``, as ``python -m gpupipe bench`` times them): see benchmarks/loader.py."""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Optional

from gpupipe.bench.report import environment  # noqa: F401  (re-exported: the benchmarks save it)
from gpupipe.bench.report import write_json
from gpupipe.bench.run import one_line


@dataclass
class Row:
    workload: str
    method: str
    unit_items: int  # items processed per call (images)
    times: list = field(default_factory=list)  # seconds per call, one per repeat
    skipped: Optional[str] = None  # reason, when the method is unavailable
    note: str = ""

    @property
    def median_ms_per_item(self) -> float:
        return 1e3 * statistics.median(self.times) / self.unit_items

    @property
    def spread_ms_per_item(self) -> tuple[float, float]:
        return (1e3 * min(self.times) / self.unit_items, 1e3 * max(self.times) / self.unit_items)

    @property
    def items_per_s(self) -> float:
        return self.unit_items / statistics.median(self.times)


def run_side_by_side(
    workload: str,
    methods: dict[str, Optional[Callable[[], object]]],
    unit_items: int,
    repeats: int = 7,
    warmup: int = 1,
    skipped: Optional[dict[str, str]] = None,
    notes: Optional[dict[str, str]] = None,
) -> list[Row]:
    """Times each callable (one call processes ``unit_items`` items) ``repeats`` times, round robin.
    A method that raises is reported in its row (``skipped``: "failed: ..."), not fatal: the
    others go on."""
    rows = {name: Row(workload, name, unit_items, note=(notes or {}).get(name, "")) for name in methods}
    for name, reason in (skipped or {}).items():
        rows[name] = Row(workload, name, unit_items, skipped=reason)
    live = {k: v for k, v in methods.items() if v is not None}

    def call(name: str, fn: Callable) -> Optional[float]:
        t0 = time.perf_counter()
        try:
            fn()
        except Exception as e:  # a broken peer (an install, an input it cannot take)
            rows[name].skipped, rows[name].times = f"failed: {one_line(e)}", []
            del live[name]
            return None
        return time.perf_counter() - t0

    for name, fn in list(live.items()):
        for _ in range(warmup):
            if call(name, fn) is None:
                break
    for _ in range(repeats):
        for name, fn in list(live.items()):
            seconds = call(name, fn)
            if seconds is not None:
                rows[name].times.append(seconds)
    return list(rows.values())


def table(rows: list[Row], reference: str, baseline_note: str = "") -> str:
    """A markdown table per workload: ms/item (median, min-max), items/s and speedup of the
    reference method over each peer (peer time / reference time)."""
    out = []
    by_workload: dict[str, list[Row]] = {}
    for r in rows:
        by_workload.setdefault(r.workload, []).append(r)
    for workload, group in by_workload.items():
        ref = next((r for r in group if r.method == reference and not r.skipped), None) or next(
            (r for r in group if r.method.startswith(reference) and not r.skipped), None)
        out.append(f"\n### {workload}\n")
        out.append(f"| method | ms/img (median) | min - max | img/s | speedup of {ref.method if ref else reference} |")
        out.append("|---|---:|---:|---:|---:|")
        for r in group:
            if r.skipped:
                out.append(f"| {r.method} | skipped: {r.skipped} | | | |")
                continue
            lo, hi = r.spread_ms_per_item
            ratio = f"{r.median_ms_per_item / ref.median_ms_per_item:.2f}x" if ref else "-"
            name = f"{r.method} ({r.note})" if r.note else r.method
            out.append(f"| {name} | {r.median_ms_per_item:.3f} | {lo:.3f} - {hi:.3f} | {r.items_per_s:.0f} | {ratio} |")
    return "\n".join(out)


def save(rows: list[Row], env: dict, out_dir: Path, title: str, reference: str) -> Path:
    """results.json (strict JSON), results.md and results.png in ``out_dir`` (checked before the
    run: ``gpupipe.bench.report.output_folder``)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    data = {
        "title": title,
        "environment": env,
        "results": [
            {**asdict(r), "median_ms_per_item": None if r.skipped else r.median_ms_per_item,
             "items_per_s": None if r.skipped else r.items_per_s}
            for r in rows
        ],
    }
    write_json(out_dir / "results.json", data)
    (out_dir / "results.md").write_text(f"# {title}\n" + table(rows, reference) + "\n")
    plot(rows, out_dir / "results.png", title)
    return out_dir


def plot(rows: list[Row], path: Path, title: str) -> None:
    """Images/s per method per workload (median, min-max error bars), gpupipe in green, two columns."""
    import math

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = list(dict.fromkeys(r.workload for r in rows))
    ncols = 2 if len(workloads) > 1 else 1
    nrows = max(1, math.ceil(len(workloads) / ncols))  # no workload (the seed experiment alone): a blank plot
    fig, axes = plt.subplots(nrows, ncols, figsize=(7.5 * ncols, 2.9 * nrows), squeeze=False)
    for ax in axes.flat[len(workloads):]:
        ax.axis("off")
    for ax, workload in zip(axes.flat, workloads):
        group = [r for r in rows if r.workload == workload and not r.skipped]
        names = [r.method for r in group]
        med = [r.items_per_s for r in group]
        lo = [r.unit_items / max(r.times) for r in group]
        hi = [r.unit_items / min(r.times) for r in group]
        err = [[max(0.0, m - l) for m, l in zip(med, lo)], [max(0.0, h - m) for m, h in zip(med, hi)]]
        colors = ["tab:green" if n.startswith("gpupipe") else "tab:gray" for n in names]
        ax.barh(names, med, xerr=err, color=colors, capsize=3)
        ax.invert_yaxis()
        ax.set_title(workload, fontsize=9)
        ax.tick_params(axis="y", labelsize=8)
        ax.set_xlabel("images / s (median, min-max)", fontsize=8)
        for i, m in enumerate(med):
            ax.text(m, i, f" {m:.0f}", va="center", fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def plot_json(json_path: Path, png_path: Path) -> None:
    """Redraws the plot of a saved results.json (plotting is a separate step from measuring)."""
    data = json.loads(Path(json_path).read_text())
    fields = ("workload", "method", "unit_items", "times", "skipped", "note")
    rows = [Row(**{k: r[k] for k in fields}) for r in data["results"]]
    plot(rows, Path(png_path), data["title"])


def at_cpu_capability(name: str, fn: Callable) -> Callable:
    """fn, run with gpupipe's CPU kernels capped at `name` (gpupipe.set_cpu_capability): the row a
    narrower CPU would get from the same code, beside the CPU's own in one run."""
    import gpupipe

    def run():
        before = gpupipe.cpu_capability()["active"]
        gpupipe.set_cpu_capability(name)
        try:
            return fn()
        finally:
            gpupipe.set_cpu_capability(before)

    return run


def wider_than_avx2() -> bool:
    """Whether this CPU's kernels run above AVX2 (then the benchmarks add an AVX2 row)."""
    import gpupipe

    return gpupipe.cpu_capability()["active"] in ("avx512", "avx512_vbmi")


if __name__ == "__main__":
    import sys

    plot_json(Path(sys.argv[1]), Path(sys.argv[2]))
