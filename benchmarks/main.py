"""The main job: makes the embedded datasets, runs every workload side by side, prints the table and
writes bench-results/<timestamp>/{results.json, results.md, results.png}.

    python -m benchmarks.main [--quick] [--workloads decode_crop ...] [--out DIR]
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from pathlib import Path

from benchmarks import augment, batch_decode, datasets, decode_crop, loader, loader_scale, policies, seed_experiment
from benchmarks.harness import Row, environment, save, table
from gpupipe import _C
from gpupipe.bench.report import output_folder
from gpupipe.bench.run import one_line

WORKLOADS = ("decode_crop", "restart", "batch_threads", "rrc", "huffman", "entropy_index", "backends", "augment",
             "policies", "loader", "recipe", "loader_scale", "seed")


def main(argv=None) -> Path:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer repeats (< 2 minutes)")
    ap.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=WORKLOADS)
    ap.add_argument("--out", type=Path, default=None, help="output folder (default bench-results/<timestamp>)")
    args = ap.parse_args(argv)
    out = args.out or Path("bench-results") / time.strftime("%Y%m%d-%H%M%S")
    try:  # before anything is measured: a bad --out must not cost the run
        output_folder(out)
    except ValueError as e:
        print(f"python -m benchmarks.main: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    repeats = 3 if args.quick else 9

    sets = {name: datasets.load_set(name) for name in datasets.SETS}
    for name, datas in sets.items():
        print(f"set {name}: {len(datas)} images, {datasets.bits_per_pixel(datas, datasets.SETS[name]):.2f} bpp")

    def without_index(run):
        """The decode workloads compare decoders on the same boxes call after call: without the
        entropy index, which would start every call after the first from rows the earlier ones
        learned (a training epoch draws new crops). Its own workload and the Loader's (epochs) run
        with it."""
        def paused():
            before = _C._pause_entropy_index(True)
            try:
                return run()
            finally:
                _C._pause_entropy_index(before)
        return paused

    extra = ""

    def seed():
        nonlocal extra
        _, extra = seed_experiment.run(steps=6 if args.quick else 12, n=512 if args.quick else 1024)
        return []

    loader_repeats, loader_n = (1, 256) if args.quick else (5, 512)
    runs = {  # in the order they run
        "decode_crop": without_index(lambda: decode_crop.run(sets, repeats=repeats)),
        "restart": without_index(lambda: decode_crop.restart_markers(sets["hd"], repeats=repeats)
                                 + decode_crop.restart_markers(sets["seed"], repeats=repeats, label="seed 800x533")),
        "batch_threads": without_index(lambda: batch_decode.thread_scaling(sets["seed"], repeats=repeats)),
        "rrc": without_index(lambda: batch_decode.random_resized_crop(sets["hd"], threads=1, repeats=repeats)
                             + batch_decode.random_resized_crop(sets["hd"], threads=2, repeats=repeats)),
        "huffman": without_index(lambda: batch_decode.huffman_reader({k: sets[k] for k in ("seed", "imagenet", "hd")},
                                                                     repeats=repeats)),
        "backends": without_index(lambda: batch_decode.backends(sets["seed"], sets["hd"], repeats=repeats)),
        "entropy_index": lambda: batch_decode.entropy_index({k: sets[k] for k in ("seed", "imagenet", "hd")},
                                                            repeats=repeats),
        "augment": lambda: augment.run(threads=1, repeats=repeats) + augment.run(threads=2, repeats=repeats),
        "policies": lambda: policies.run(repeats=repeats),
        "loader": lambda: loader.run(repeats=loader_repeats, n=loader_n),
        "recipe": lambda: loader.recipe(repeats=loader_repeats, n=loader_n),
        "loader_scale": lambda: loader_scale.run(repeats=1 if args.quick else 3, names=("160x120", "400x300") + (
            () if args.quick else ("seed", "hd"))),
        "seed": seed,
    }
    title = "gpupipe vs peers (CPU)"
    rows, failed = [], []
    for name, run in runs.items():
        if name not in args.workloads:
            continue
        try:
            rows += run()
        except Exception as e:  # one workload's failure costs its rows only: the others run and are saved
            traceback.print_exc()
            failed.append(name)
            rows.append(Row(name, "(the whole workload)", 1, skipped=f"failed: {one_line(e)}"))
        save(rows, environment(threads=1), out, title, "gpupipe")  # after each: a run cut short keeps what it measured
    print(table(rows, "gpupipe") + extra)
    if extra:
        with open(out / "results.md", "a") as f:
            f.write(extra + "\n")
    print(f"\nwrote {out}/results.json, results.md, results.png")
    if failed:
        print(f"python -m benchmarks.main: workloads failed: {', '.join(failed)} (their rows say why)", file=sys.stderr)
        raise SystemExit(1)
    return out


if __name__ == "__main__":
    main()
